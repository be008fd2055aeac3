"""The checked-in files generated from the models: the CRD, the Helm chart's copy of it, and the
README reference region.

:func:`generated_files` maps each path to the content it must have; ``lakeslot crd --write``
writes them and a test compares them with the checkout. The chart carries a generated copy (not a
symlink: Argo CD refuses links that leave the repository path it renders), so the two CRD files
are byte-identical by construction and a stale one fails the same test. Only the README text
between the markers is generated; the rest of the README is left as it is. A README without both
markers is an error (the region would silently go missing otherwise).
"""

from __future__ import annotations

from pathlib import Path

from lakeslot.api.crd import CRD_NAME, crd_yaml
from lakeslot.api.reference import reference_markdown

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "crds" / f"{CRD_NAME}.yaml"
CHART_CRD_PATH = ROOT / "helm" / "lakeslot" / "crds" / f"{CRD_NAME}.yaml"
README_PATH = ROOT / "README.md"
BEGIN_MARKER = "<!-- BEGIN CR REFERENCE"
END_MARKER = "<!-- END CR REFERENCE -->"


def replace_region(readme: str, body: str) -> str:
    """``readme`` with the text between the reference markers replaced by ``body``."""
    begin = readme.find(BEGIN_MARKER)
    end = readme.find(END_MARKER)
    if begin < 0 or end < begin:
        raise ValueError(f"README has no {BEGIN_MARKER} ... {END_MARKER} region")
    body_start = readme.index("\n", begin) + 1
    return readme[:body_start] + body + readme[end:]


def generated_files() -> dict[Path, str]:
    return {
        CRD_PATH: crd_yaml(),
        CHART_CRD_PATH: crd_yaml(),
        README_PATH: replace_region(README_PATH.read_text(), reference_markdown()),
    }


def write_generated() -> list[Path]:
    """Writes every generated file that differs from its checked-in content; returns those paths."""
    written = []
    for path, content in generated_files().items():
        if not path.exists() or path.read_text() != content:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
            written.append(path)
    return written
