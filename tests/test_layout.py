"""The layout's rules (DESIGN.md "Layout constraints"), checked on the import graph itself: the intended
architecture is the data below — the layers, lowest first, and the rooms in each — and the tests
hold the tree to it: no import runs upward or sideways into a peer room, no import circle, a
small package root, a Spark-free ``mirror`` and ``api``; a consumer never imports a producer's
internals, and the library never imports an entry point. Every room's map (its ``__init__``
docstring) lists exactly the modules and subpackages the room holds."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "lakeslot"
OPERATOR = ROOT / "operator" / "lakeslot_operator"

# The layers, lowest first. A module imports from its own room and from rooms of lower layers
# only: never from a higher layer, never from another room of its own layer.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base: plain helpers with no lakeslot imports",
     ("lakeslot", "lakeslot.lsn_text", "lakeslot.exits", "lakeslot.errors", "lakeslot.filesystems",
      "lakeslot.cadence")),
    ("the resource and every name derived from it", ("lakeslot.api",)),
    ("shared contracts: staging (reader → apply) and the mirror tables (jobs → readers)",
     ("lakeslot.staging", "lakeslot.mirror")),
    ("what lakeslot does to PostgreSQL", ("lakeslot.source",)),
    ("how workloads are invoked, and how their state is observed",
     ("lakeslot.workloads", "lakeslot.observability")),
    ("everything that needs a JVM", ("lakeslot.spark",)),
    ("the data plane", ("lakeslot.reader", "lakeslot.snapshot", "lakeslot.apply", "lakeslot.verify")),
    ("the control steps and decisions shared by the operator and local mode", ("lakeslot.control",)),
    ("local mode: everything on one machine", ("lakeslot.local",)),
    ("the command line", ("lakeslot.cli",)),
)
ROOT_MODULES_MAX = 10  # loose modules in the package root (the rest live in rooms)
SPARK_FREE = ("lakeslot.api", "lakeslot.mirror", "lakeslot.staging", "lakeslot.source",
              "lakeslot.observability", "lakeslot.control")  # importable without pyspark


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports (``from a.b import c`` counts as ``a.b`` and ``a.b.c``),
    lazy imports inside functions included."""
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


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in LIBRARY.rglob("*.py")}
GRAPH = {name: {i for i in imports(path) if i in MODULES and i != name}
         for name, path in MODULES.items()}
ROOMS = {room: layer for layer, (_, rooms) in enumerate(LAYERS) for room in rooms}


def room_of(module: str) -> str:
    """The longest room of :data:`LAYERS` that ``module`` is or lies in."""
    found = [r for r in ROOMS if module == r or module.startswith(r + ".")]
    assert found, f"{module} is in no room of LAYERS: give it one"
    return max(found, key=len)


def test_every_module_has_a_room():
    assert [m for m in MODULES if not any(m == r or m.startswith(r + ".") for r in ROOMS)] == []


def test_no_import_runs_upward_or_into_a_peer_room():
    offenders = sorted(
        f"{module} ({room_of(module)}) imports {target} ({room_of(target)})"
        for module, targets in GRAPH.items() for target in targets
        if room_of(target) != room_of(module)
        and ROOMS[room_of(target)] >= ROOMS[room_of(module)]
        and not module.startswith(target + "."))  # a package's own __init__ above it
    assert offenders == []


def test_no_import_circle():
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(MODULES):
        if module not in index:
            visit(module)
    assert circles == []


def test_the_package_root_stays_small():
    loose = sorted(p.name for p in LIBRARY.glob("*.py") if p.name != "__init__.py")
    assert len(loose) <= ROOT_MODULES_MAX, loose


def test_the_spark_free_rooms_import_without_pyspark():
    names = sorted(m for m in MODULES if any(m == r or m.startswith(r + ".") for r in SPARK_FREE))
    code = ("import sys; sys.modules['pyspark'] = None; sys.modules['py4j'] = None\n"
            "import importlib\n"
            f"for name in {names!r}: importlib.import_module(name)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_library_never_imports_an_entry_point():
    offenders = {str(p.relative_to(ROOT)): sorted(i for i in imports(p) if i.startswith("spark_jobs"))
                 for p in modules(".")}
    assert {p: i for p, i in offenders.items() if i} == {}


@pytest.mark.parametrize("consumer", ["apply", "observability", "local", "snapshot", "control",
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


# Every package of the library and the operator: a room, whose ``__init__`` docstring is its map.
PACKAGES = sorted(p.parent for top in (LIBRARY, OPERATOR) for p in top.rglob("__init__.py"))


def room_map(package: Path) -> set[str]:
    """The names a room's map lists: the ``:mod:`.name``` references of its ``__init__`` docstring."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    return set(re.findall(r":mod:`\.(\w+)`", doc))


def room_contents(package: Path) -> set[str]:
    """The modules and subpackages a room holds."""
    return ({p.stem for p in package.glob("*.py") if p.name != "__init__.py"}
            | {p.parent.name for p in package.glob("*/__init__.py")})


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_is_on_its_rooms_map(package):
    assert sorted(room_contents(package) - room_map(package)) == []


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_name_on_a_rooms_map_is_a_module_of_it(package):
    assert sorted(room_map(package) - room_contents(package)) == []


def _aliased_module_imports() -> list[tuple[str, str, str]]:
    """``(file, module, alias)`` of every ``from P import m as a`` of a module of ours."""
    found = []
    for path in [*ROOT.joinpath("lakeslot").rglob("*.py"), *ROOT.joinpath("operator").rglob("*.py"),
                 *ROOT.joinpath("tests").rglob("*.py"), *ROOT.joinpath("bench").rglob("*.py"),
                 *ROOT.joinpath("spark_jobs").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.ImportFrom) and node.module and not node.level
                    and node.module.split(".")[0] in ("lakeslot", "lakeslot_operator", "tests", "bench")):
                continue
            base = ROOT / "operator" if node.module.startswith("lakeslot_operator") else ROOT
            for alias in node.names:
                target = base.joinpath(*node.module.split("."), alias.name)
                if alias.asname and (target.with_suffix(".py").exists() or (target / "__init__.py").exists()):
                    found.append((str(path.relative_to(ROOT)), f"{node.module}.{alias.name}", alias.asname))
    return found


def test_modules_are_imported_under_their_own_names():
    """``from lakeslot.mirror import catalogs``, not ``… as cats``: a grep for a module's name
    finds its callers. The one alias allowed tells two modules of one name apart by their room:
    ``from lakeslot.snapshot import job as snapshot_job``."""
    renamed = [(path, module, alias) for path, module, alias in _aliased_module_imports()
               if alias != "_".join(module.split(".")[-2:])]
    assert renamed == [], "import these under their own names (or <room>_<module>)"
    assert _aliased_module_imports(), "the check finds the allowed aliases, so it reads imports"
