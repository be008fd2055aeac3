"""The documentation: the MkDocs site under docs/ builds with ``--strict`` (a broken link, a missing
anchor, a page left out of the navigation or a missing included file fails it); every alert's
runbook link reaches an anchor of the built site; every ``DESIGN.md`` citation in the code names
an invariant or a section that the repository's DESIGN.md has; the README stays a front page;
one version is shared by the package, the chart, the image and the changelog; the pictures'
generators work. The generated PostgresIngestion reference (docs/reference.md) is checked with
the CRD in tests/test_crd.py.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

import lakeslot
from lakeslot.api import reference, validation
from tests.support import chart
from tests.test_helm_monitoring import _defined as defined_metrics

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "DESIGN.md"
README = ROOT / "README.md"
CHANGELOG = ROOT / "CHANGELOG.md"
# What the site is built from (mkdocs.yml includes DESIGN.md, CHANGELOG.md and the README's pitch
# from the root).
SITE_SOURCES = ("mkdocs.yml", "docs", "DESIGN.md", "CHANGELOG.md", "README.md")
# Where DESIGN.md is cited: the code, its tests, the benchmarks, the chart.
CITING = ("lakeslot", "operator", "spark_jobs", "tests", "bench", "helm")


class _MkDocsLoader(yaml.SafeLoader):
    """Reads mkdocs.yml, whose ``!!python/name:`` tags name Python objects (not loaded here)."""


_MkDocsLoader.add_multi_constructor("tag:yaml.org,2002:python/name:", lambda loader, suffix, node: suffix)


def mkdocs_config() -> dict:
    return yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=_MkDocsLoader)


def build(source: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` (not ``--quiet``: it hides the warnings, and strict mode then
    passes a build it should fail)."""
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
                          cwd=source, capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    built = tmp_path_factory.mktemp("site")
    result = build(ROOT, built)
    assert result.returncode == 0, result.stdout + result.stderr
    return built


def test_the_site_builds_strictly(site):
    nav_pages = set(re.findall(r"[\w/-]+\.md", yaml.safe_dump(mkdocs_config()["nav"])))
    on_disk = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert nav_pages == on_disk
    for page in on_disk:
        built = site / (page.removesuffix(".md").removesuffix("index") + "/index.html").lstrip("/")
        assert built.exists(), page
    overview = (site / "index.html").read_text()
    assert 'class="mermaid"' in overview and "--8&lt;--" not in overview  # the README's pitch and picture
    architecture = (site / "architecture" / "index.html").read_text()
    assert 'class="mermaid"' in architecture and 'id="invariants"' in architecture
    assert "--8&lt;--" not in architecture and "--8<--" not in architecture  # the snippet was included
    reference = (site / "reference" / "index.html").read_text()
    assert "\\|" not in reference and "&amp;#124;" not in reference  # CEL's || reads as ||
    assert "|| (has(self.schemas)" in html.unescape(reference)


def test_a_broken_anchor_fails_the_build(tmp_path):
    for name in SITE_SOURCES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, tmp_path / name)
        else:
            shutil.copy(source, tmp_path / name)
    page = tmp_path / "docs" / "troubleshooting.md"
    page.write_text(page.read_text() + "\nSee [a section](operations.md#no-such-section).\n")
    result = build(tmp_path, tmp_path / "site")
    assert result.returncode != 0
    assert "no-such-section" in result.stdout + result.stderr


def test_every_runbook_url_points_at_an_anchor_of_the_built_site(site):
    site_url = mkdocs_config()["site_url"]
    rules = chart.alert_rules(chart.render(chart.VALUE_SETS["monitoring"]))
    assert rules
    for name, rule in rules.items():
        link = rule["annotations"]["runbook_url"]
        assert link.startswith(site_url), (name, link)
        parts = urlsplit(link)
        page = site / parts.path.removeprefix(urlsplit(site_url).path) / "index.html"
        assert page.exists(), (name, link)
        assert parts.fragment and f'id="{parts.fragment}"' in page.read_text(), (name, link)


def documented_metrics() -> set[str]:
    """The metric names of the operations page's metrics table; a cell may shorten names after
    its first (`lakeslot_reader_durable_lsn`, `_received_lsn`)."""
    page = (ROOT / "docs" / "operations.md").read_text()
    section = page.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for cell in re.findall(r"^\| (.+?) \|", section, re.MULTILINE):
        prefix = None
        for token in re.findall(r"`([^`]+)`", cell):
            name = token.split("{")[0]
            if name.startswith("lakeslot_"):
                names.add(name)
                prefix = "_".join(name.split("_")[:2])
            elif name.startswith("_") and prefix:
                names.add(prefix + name)
    return names


def test_every_metric_has_a_row_on_the_operations_page():
    samples = defined_metrics()
    families = set()
    for name in samples:
        if name.endswith("_created"):
            continue
        histogram = next((name.removesuffix(s) for s in ("_bucket", "_count", "_sum")
                          if name.endswith(s) and name.removesuffix(s) + "_bucket" in samples), None)
        families.add(histogram or name)
    assert len(families) > 30
    assert families - documented_metrics() == set()


# DESIGN.md "Scale", DESIGN.md rule 3, DESIGN.md rules 4–6, DESIGN.md invariants 1 and 2,
# DESIGN.md, deletion — the forms the code cites it in (a citation may wrap onto the next line).
_CITATION = re.compile(r'DESIGN\.md(?:\s*,\s*(?P<word>[a-z]+)|\s+"(?P<section>[^"]+)"|'
                       r"\s+(?:#\s*)?(?:rules?|invariants?)\s+(?P<numbers>\d+(?:\s*(?:[–,-]|and)\s*\d+)*))?")


def _design() -> tuple[set[str], set[int]]:
    """DESIGN.md's section headings (lower case) and the numbers of its invariants."""
    text = DESIGN.read_text()
    headings = {h.strip().lower() for h in re.findall(r"^#+ (.+)$", text, re.MULTILINE)}
    invariants = text.split("## Invariants", 1)[1].split("\n## ", 1)[0]
    return headings, {int(n) for n in re.findall(r"^(\d+)\. ", invariants, re.MULTILINE)}


def _numbers(text: str) -> set[int]:
    found: set[int] = set()
    for low, high in re.findall(r"(\d+)(?:\s*[–-]\s*(\d+))?", text):
        found.update(range(int(low), int(high or low) + 1))
    return found


def citations() -> list[tuple[str, re.Match[str]]]:
    found = []
    for folder in CITING:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and path.suffix in (".py", ".yaml", ".tpl", ".txt", ".json", ".lua"):
                text = path.read_text(errors="replace")
                found += [(str(path.relative_to(ROOT)), m) for m in _CITATION.finditer(text)]
    return found


def test_every_design_citation_resolves_to_the_repository_design():
    assert DESIGN.exists()
    headings, invariants = _design()
    assert invariants == set(range(1, 10))
    cited = citations()
    assert len(cited) > 25  # the code does cite it; a pattern that no longer matches would pass vacuously
    unresolved = []
    for where, match in cited:
        if match["numbers"] and not _numbers(match["numbers"]) <= invariants:
            unresolved.append((where, match[0]))
        section = match["section"] or match["word"]
        if section and section.lower() not in headings:
            unresolved.append((where, match[0]))
    assert unresolved == []


def test_the_design_citation_pattern_reads_every_form():
    forms = {'DESIGN.md "Scale"': ("Scale", None), "DESIGN.md rule 3": (None, {3}),
             "DESIGN.md rules 4–6": (None, {4, 5, 6}), "DESIGN.md invariants 1 and 2": (None, {1, 2}),
             "DESIGN.md\n   invariant 8": (None, {8}), "DESIGN.md, deletion": ("deletion", None)}
    for text, (section, numbers) in forms.items():
        match = _CITATION.search(text)
        assert match, text
        assert (match["section"] or match["word"]) == section, text
        assert (_numbers(match["numbers"]) if match["numbers"] else None) == numbers, text


# Pieces of the messages docs/troubleshooting.md quotes, each as one string literal of the code: a
# message reworded in the code fails here until the page quotes the new words.
QUOTED_MESSAGES = (
    "logical decoding needs 'logical'",
    "lacks the REPLICATION attribute",
    "cannot create a publication in database ",
    "cannot SELECT from it",
    "does not own it (owner: ",
    "set spec.source.publicationManagement: ",
    ", so none of its changes ",
    ", which the mirror holds: ",
    "updates and deletes cannot be replicated (and adding ",
    "REPLICA IDENTITY FULL without a primary key: the mirror ",
    "which is not in the mirror table; the value cannot ",
    "set REPLICA IDENTITY FULL on the table (the old tuple then carries every value), ",
    "outside 0001-01-01 .. 9999-12-31 (±infinity, BC, or a year after 9999)",
    "lost WAL it needed (wal_status = lost): PostgreSQL removed ",
    "Changes are missing: fix the cause (e.g. raise ",
    "the slot's WAL is beyond max_slot_wal_keep_size and about to be ",
    "nothing is confirmed to PostgreSQL until it is ",
    "is active for this ingestion ",
    "terminated backend ",
    "; the other tables go on, this one's changes wait in ",
)


def test_the_troubleshooting_page_quotes_messages_the_code_prints():
    page = " ".join((ROOT / "docs" / "troubleshooting.md").read_text().split())
    code = "".join(p.read_text() for folder in ("lakeslot", "operator") for p in (ROOT / folder).rglob("*.py"))
    missing = [m for m in QUOTED_MESSAGES if m not in code or " ".join(m.split()) not in page]
    assert missing == []


def test_the_readme_is_a_front_page():
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    # The two commands, exactly.
    assert "./dev demo     # the demo: the whole pipeline against an embedded PostgreSQL with sample data\n" in text
    assert "./dev test     # the whole test suite (what CI runs: .ci/run)\n" in text
    assert "```mermaid" in text
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if not re.match(r"[a-z]+://", target):
            assert (ROOT / target).exists(), target
    performance = (ROOT / "docs" / "performance.md").read_text()
    headline = re.findall(r"`(\.venv/bin/python -m bench\.[^`]+)`", text)
    assert len(headline) == 5
    for command in headline:
        assert command in performance, command  # a headline figure is one of the page's


CELL_MAX = reference.CELL_MAX  # characters of a table cell's source: a short paragraph; more goes below the table


def table_cells(text: str) -> list[tuple[int, str]]:
    """Every cell of the Markdown tables in ``text`` (line number, text), code blocks skipped."""
    cells: list[tuple[int, str]] = []
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and line.lstrip().startswith("|"):
            cells += [(number, cell.strip()) for cell in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
    return cells


def test_the_table_cell_reader_reads_cells():
    text = "| a | b \\| c |\n| --- | --- |\n```\n| not | a table |\n```\n| `x` | y |\n"
    assert table_cells(text) == [(1, "a"), (1, "b \\| c"), (2, "---"), (2, "---"), (6, "`x`"), (6, "y")]


def test_no_table_cell_is_longer_than_a_short_paragraph():
    pages = [README, *sorted((ROOT / "docs").rglob("*.md"))]
    assert len(pages) > 10
    long = [f"{page.relative_to(ROOT)}:{number} ({len(cell)} characters)"
            for page in pages for number, cell in table_cells(page.read_text()) if len(cell) > CELL_MAX]
    assert long == []


def test_every_ingestion_the_docs_show_is_valid():
    examples = {}
    for page in sorted([README, *(ROOT / "docs").rglob("*.md")]):
        for i, block in enumerate(re.findall(r"```yaml\n(.*?)```", page.read_text(), re.DOTALL)):
            if "kind: PostgresIngestion" in block:
                examples[f"{page.relative_to(ROOT)} #{i}"] = block
    assert len(examples) >= 2
    for name, block in examples.items():
        reports = validation.validate_text(block)
        assert validation.all_valid(reports), validation.render(name, reports)


def test_the_chart_values_the_kubernetes_page_shows_render():
    page = (ROOT / "docs" / "getting-started" / "kubernetes.md").read_text()
    values = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", page, re.DOTALL) if "kind:" not in b]
    assert values
    for shown in values:
        manifests = chart.render({**shown, "spark": {**chart.SERVED["spark"], **shown.get("spark", {})}})
        assert chart.of_kind(manifests, "ServiceAccount")  # rendered, values.schema.json accepted them


def test_one_version_for_the_package_the_chart_the_image_and_the_changelog():
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert lakeslot.__version__ == version
    shown = subprocess.run([sys.executable, "-m", "lakeslot.cli", "--version"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.strip()
    assert shown == f"lakeslot {version}"
    meta = chart.chart_metadata()
    assert (meta["version"], meta["appVersion"]) == (version, version)
    repository = yaml.safe_load((chart.CHART / "values.yaml").read_text())["image"]["repository"]
    tags = re.findall(r"docker build -t (\S+):(\S+) \.", (ROOT / "Dockerfile").read_text())
    assert tags == [(repository, version)]
    releases = re.findall(r"^## \[([^\]]+)\]", CHANGELOG.read_text(), re.MULTILINE)
    assert releases[0] == "Unreleased" and version in releases
    assert re.search(rf"^\[{re.escape(version)}\]: https://", CHANGELOG.read_text(), re.MULTILINE)


def test_the_latency_figure_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    from bench import plots

    committed = [1000 + i / 100 for i in range(3000)]
    latencies = [1.5 + (i % 7) / 10 for i in range(3000)]
    for name in ("latency.svg", "latency.png"):
        path = plots.latency_figure(tmp_path / name, committed, latencies, "a test run")
        assert path.stat().st_size > 1000
    svg = (tmp_path / "latency.svg").read_text()
    assert "p50 1.80 s" in svg and "commit time" in svg  # text stays text (svg.fonttype none)
    assert plots.latency_figure(tmp_path / "again.svg", committed, latencies, "a test run").read_text() == svg


def test_the_screenshot_is_a_frame_of_the_live_display():
    from bench import screenshot

    frame = ["lakeslot run shop/orders   phase Streaming   ready True   12 s",
             "durable 0/1A2B (reader lag 0 B)   applied 0/1A2B (lag 0 B, 0 s behind)   last commit 0.4 s ago",
             "table          state      snapshot rows  mirror rows  applied LSN  staged  behind",
             'public."a<b"   Streaming  -              10           0/1A2B       0       0 s']
    recording = ("setup output\r\n" + "\r\n".join(frame).replace("ready True", "ready False (Snapshotting)")
                 + "\r\n\x1b[4F\x1b[J" + "\r\n".join(frame) + "\r\n\r\nRESULT: every table is equal\r\n")
    found = screenshot.frames(recording)
    assert found == [frame]
    svg = screenshot.svg(screenshot.pick(found, None))
    assert svg.startswith("<svg") and "public.&quot;a&lt;b&quot;" not in svg and 'public."a&lt;b"' in svg
    assert (ROOT / "docs" / "assets" / "lakeslot-run.svg").read_text().count("<text") >= 6
