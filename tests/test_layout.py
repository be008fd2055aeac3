"""The layout's rules (DESIGN.md "Layout constraints"), checked on the import graph itself: the
shared contracts have rooms of their own, a consumer never imports a producer's internals, and
the library never imports an entry point."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "lakeslot"


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports (``from a.b import c`` counts as ``a.b`` and ``a.b.c``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def modules(*parts: str) -> list[Path]:
    paths = []
    for part in parts:
        target = LIBRARY / part
        paths += sorted(target.rglob("*.py")) if target.is_dir() else [target]
    return paths


def test_the_library_never_imports_an_entry_point():
    offenders = {str(p.relative_to(ROOT)): sorted(i for i in imports(p) if i.startswith("spark_jobs"))
                 for p in modules(".")}
    assert {p: i for p, i in offenders.items() if i} == {}


@pytest.mark.parametrize("consumer", ["apply", "status.py", "local", "snapshot", "control.py",
                                      "mirror", "verify"])
def test_consumers_of_staging_do_not_reach_into_the_reader(consumer):
    offenders = {str(p.relative_to(ROOT)): sorted(i for i in imports(p)
                                                  if i.startswith("lakeslot.reader"))
                 for p in modules(consumer)}
    assert {p: i for p, i in offenders.items() if i} == {}


@pytest.mark.parametrize(("room", "forbidden"), [
    ("staging", ("lakeslot.reader", "lakeslot.apply", "lakeslot.local")),
    ("mirror", ("lakeslot.snapshot", "lakeslot.apply", "lakeslot.local")),
    ("apply", ("lakeslot.snapshot",)),
    ("snapshot", ("lakeslot.apply",)),
    ("verify", ("lakeslot.apply", "lakeslot.local", "lakeslot_operator")),
])
def test_shared_rooms_and_jobs_import_no_producer_internals(room, forbidden):
    offenders = {str(p.relative_to(ROOT)): sorted(i for i in imports(p) if i.startswith(forbidden))
                 for p in modules(room)}
    assert {p: i for p, i in offenders.items() if i} == {}


def test_the_default_namespace_is_decided_in_one_place():
    sources = [p for p in [*LIBRARY.rglob("*.py"), *(ROOT / "operator").rglob("*.py")]
               if 'or "default"' in p.read_text()]
    assert [str(p.relative_to(ROOT)) for p in sources] == ["lakeslot/api/naming.py"]
