"""A picture of ``lakeslot run``'s live display, from a real run recorded on a terminal.

    script -qfec "stty cols 110 rows 40; .venv/bin/lakeslot demo --scale 3" demo.typescript
    .venv/bin/python -m bench.screenshot demo.typescript docs/assets/lakeslot-run.svg [--frame N]

On a terminal the display (:mod:`lakeslot.local.display`) redraws its frame in place: it moves the
cursor up over the previous frame and erases it (``ESC [ n F``, ``ESC [ J``). This splits the
recorded output at those sequences, takes one frame — ``--frame N`` (as listed by ``--list``), by
default the last one drawn while the ingestion was Ready — and writes it as an SVG of a terminal
window: the frame's own text, monospaced, nothing retouched. No dependency beyond the standard
library.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from xml.sax.saxutils import escape

REDRAW = re.compile(r"\x1b\[\d+F\x1b\[J")
OTHER_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
HEADER = "lakeslot run "
CHAR_W, LINE_H, PAD = 7.8, 17, 14  # px per character (13 px monospace), per line, around the text


def frames(recording: str) -> list[list[str]]:
    """The display's frames in a terminal recording, each as its lines (without escapes)."""
    text = recording.replace("\r\n", "\n").replace("\r", "")
    found = []
    for part in REDRAW.split(text):
        lines = OTHER_ESCAPES.sub("", part).split("\n")
        if lines[0].startswith(HEADER):
            # the frame ends where the program's next output (a blank line, a report) begins
            end = next((i for i, line in enumerate(lines) if not line.strip()), len(lines))
            found.append(lines[:end])
    return found


def pick(found: list[list[str]], index: int | None) -> list[str]:
    if index is not None:
        return found[index]
    ready = [f for f in found if " ready True " in f[0]]
    return (ready or found)[-1]


def svg(lines: list[str], title: str = "lakeslot run") -> str:
    """An SVG of a terminal window showing ``lines``."""
    columns = max(len(line) for line in lines)
    width = round(columns * CHAR_W + 2 * PAD)
    bar = 26
    height = bar + len(lines) * LINE_H + 2 * PAD
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">',
        f'<rect width="{width}" height="{height}" rx="8" fill="#1e1e2e"/>',
        f'<rect width="{width}" height="{bar}" rx="8" fill="#313244"/>',
        f'<rect y="{bar - 8}" width="{width}" height="8" fill="#313244"/>',
        *(f'<circle cx="{16 + 18 * i}" cy="{bar // 2}" r="5.5" fill="{color}"/>'
          for i, color in enumerate(("#f38ba8", "#f9e2af", "#a6e3a1"))),
        f'<text x="{width // 2}" y="{bar // 2 + 4}" fill="#a6adc8" font-family="sans-serif" '
        f'font-size="12" text-anchor="middle">{escape(title)}</text>',
        '<g font-family="DejaVu Sans Mono, Menlo, Consolas, monospace" font-size="13" '
        'fill="#cdd6f4" xml:space="preserve">',
    ]
    for i, line in enumerate(lines):
        y = bar + PAD + (i + 1) * LINE_H - 4
        style = ' font-weight="bold" fill="#89b4fa"' if i == 0 or line.startswith("table ") else ""
        out.append(f'<text x="{PAD}" y="{y}"{style}>{escape(line)}</text>')
    out += ["</g>", "</svg>", ""]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.screenshot",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("recording", type=Path, help="a terminal recording (script -f) of lakeslot run or demo")
    parser.add_argument("output", type=Path, nargs="?", help="the SVG to write")
    parser.add_argument("--frame", type=int, help="which frame (default: the last one while Ready)")
    parser.add_argument("--list", action="store_true", help="list the frames' first lines and exit")
    args = parser.parse_args()
    found = frames(args.recording.read_bytes().decode("utf-8", "replace"))
    if not found:
        raise SystemExit(f"{args.recording}: no frame of lakeslot run's display found")
    if args.list or args.output is None:
        for i, frame in enumerate(found):
            print(f"{i:3}  {frame[0]}")
        return
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(svg(pick(found, args.frame)))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
