"""The checked-in files generated from the models: the CRD, the Helm chart's copy of it, and the
reference region of the documentation's reference page (``docs/reference.md``).

:func:`generated_files` maps each path to the content it must have; ``lakeslot crd --write``
writes them and a test compares them with the checkout. The chart carries a generated copy (not a
symlink: Argo CD refuses links that leave the repository path it renders), so the two CRD files
are byte-identical by construction and a stale one fails the same test. Only the page's text
between the markers is generated; the rest of the page is left as it is. A page without both
markers is an error (the region would silently go missing otherwise).
"""

from __future__ import annotations

from pathlib import Path

from lakeslot.api.crd import CRD_NAME, crd_yaml
from lakeslot.api.reference import reference_markdown

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "crds" / f"{CRD_NAME}.yaml"
CHART_CRD_PATH = ROOT / "helm" / "lakeslot" / "crds" / f"{CRD_NAME}.yaml"
REFERENCE_PATH = ROOT / "docs" / "reference.md"
BEGIN_MARKER = "<!-- BEGIN CR REFERENCE"
END_MARKER = "<!-- END CR REFERENCE -->"


def replace_region(page: str, body: str) -> str:
    """``page`` with the text between the reference markers replaced by ``body``."""
    begin = page.find(BEGIN_MARKER)
    end = page.find(END_MARKER)
    if begin < 0 or end < begin:
        raise ValueError(f"{REFERENCE_PATH.name} has no {BEGIN_MARKER} ... {END_MARKER} region")
    body_start = page.index("\n", begin) + 1
    return page[:body_start] + body + page[end:]


def generated_files() -> dict[Path, str]:
    return {
        CRD_PATH: crd_yaml(),
        CHART_CRD_PATH: crd_yaml(),
        REFERENCE_PATH: replace_region(REFERENCE_PATH.read_text(), reference_markdown()),
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
