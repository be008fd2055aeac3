"""`lakeslot validate` and `lakeslot crd`: the real command line for a few cases, the module for all.

Every invalid case of ``tests/api_cases.py`` must be rejected with a problem that names the
expected field and carries a fix; the examples must pass.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lakeslot.api import validation
from lakeslot.api.crd import crd_manifest
from lakeslot.api.reference import reference_markdown
from tests.api_cases import BAD_NAMES, DELETE, EXAMPLES, GOOD_NAMES, INVALID_CASES, apply_edits, base_document

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # the exit status is part of what the tests check
        [sys.executable, "-m", "lakeslot.cli", *args],
        input=stdin, capture_output=True, text=True, cwd=ROOT, timeout=60, check=False,
    )


def problems(document: object) -> list[validation.Problem]:
    return [
        problem for report in validation.validate_text(yaml.safe_dump_all([document])) for problem in report.problems
    ]


def test_examples_are_valid_on_the_command_line():
    result = run_cli("validate", *[arg for path in EXAMPLES for arg in ("-f", str(path))])
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count(": valid (publication ") == 2


@pytest.mark.parametrize("case", INVALID_CASES, ids=lambda case: case.id)
def test_invalid_case_is_rejected_naming_the_field(case):
    found = problems(case.document())
    assert case.path in [problem.path for problem in found], "\n".join(map(str, found))
    assert all(problem.problem and problem.fix for problem in found)


@pytest.mark.parametrize("name", BAD_NAMES.values(), ids=list(BAD_NAMES))
def test_names_a_cluster_would_refuse_in_the_children_are_rejected(name):
    found = problems(apply_edits(base_document(), (("metadata.name", name),)))
    assert [problem.path for problem in found] == ["metadata.name"], "\n".join(map(str, found))
    assert "DNS-1035 label of at most 40 characters" in found[0].problem and found[0].fix


@pytest.mark.parametrize("name", GOOD_NAMES)
def test_dns_1035_names_up_to_the_limit_are_accepted(name):
    assert problems(apply_edits(base_document(), (("metadata.name", name),))) == []


@pytest.mark.parametrize(
    "case_id", ["port-too-large", "publication-64-bytes", "verify-full-without-ca", "unknown-field-typo"]
)
def test_invalid_document_on_stdin_fails_with_path_problem_and_fix(case_id):
    case = next(case for case in INVALID_CASES if case.id == case_id)
    result = run_cli("validate", "-f", "-", stdin=yaml.safe_dump(case.document()))
    assert result.returncode == 1
    assert f"  {case.path}: " in result.stdout
    assert "fix: " in result.stdout


def test_messages_for_humans():
    typo = problems(apply_edits(base_document(), (("spec.source.slotNmae", "x"),)))
    assert (
        str(typo[0])
        == "spec.source.slotNmae: unknown field\n    fix: did you mean slotName? Rename slotNmae to slotName"
    )
    snake = problems(apply_edits(base_document(), (("spec.source.slot_name", "x"),)))
    assert snake[0].fix == "rename it to slotName (documents use camelCase)"
    port = problems(apply_edits(base_document(), (("spec.source.port", 70000),)))
    assert port[0].problem.endswith("(got 70000)")
    assert port[0].fix.startswith("use an integer from 1 to 65535 (TCP port")
    null = problems(apply_edits(base_document(), (("spec.source.host", None),)))
    assert null[0].fix.startswith("use a string of 1 to 253 characters")
    bad_key = problems(apply_edits(base_document(), (("spec.source.options", {1: "x"}),)))
    assert (bad_key[0].path, bad_key[0].fix) == ("spec.source.options", "quote the key")
    missing = problems(apply_edits(base_document(), (("apiVersion", DELETE),)))
    assert str(missing[0]) == (
        "apiVersion: required field is missing\n"
        "    fix: add apiVersion: one of `lakeslot.io/v1alpha1` (API version of the resource: lakeslot.io/v1alpha1.)"
    )


def test_every_broken_rule_of_an_object_is_reported_at_once():
    document = apply_edits(base_document(), (("spec.source.tables", []), ("spec.source.sslMode", "verify-ca")))
    assert {problem.path for problem in problems(document)} == {"spec.source.tables", "spec.source.caSecretRef"}


def test_multi_document_file_skips_other_kinds(tmp_path):
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "shop-postgres"},
        "stringData": {"password": "x"},
    }
    path = tmp_path / "bundle.yaml"
    path.write_text(yaml.safe_dump_all([secret, None, base_document()]))
    result = run_cli("validate", "-f", str(path))
    assert result.returncode == 0, result.stdout
    assert "document 1: Secret default/shop-postgres: skipped" in result.stdout
    assert "document 3: PostgresIngestion default/orders: valid" in result.stdout


def test_one_invalid_document_fails_the_file():
    bad = apply_edits(base_document(), (("spec.source.port", 0),))
    reports = validation.validate_text(yaml.safe_dump_all([base_document(), bad]))
    assert [bool(report.problems) for report in reports] == [False, True]
    assert not validation.all_valid(reports)


def test_a_file_without_ingestion_fails(tmp_path):
    path = tmp_path / "secret.yaml"
    path.write_text("apiVersion: v1\nkind: Secret\nmetadata: {name: s}\n")
    result = run_cli("validate", "-f", str(path))
    assert result.returncode == 1
    assert "no PostgresIngestion document found" in result.stdout


def test_wrong_version_of_our_group_is_reported_not_skipped():
    found = problems(apply_edits(base_document(), (("apiVersion", "lakeslot.io/v1"),)))
    assert [problem.path for problem in found] == ["apiVersion"]


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("apiVersion: lakeslot.io/v1alpha1\nkind: [unclosed\n", "line 3"),
        ("spec:\n  suspend: true\n  suspend: false\n", "line 3"),
    ],
    ids=["syntax", "duplicate-key"],
)
def test_yaml_errors_name_the_line(text, where):
    (report,) = validation.validate_text(text)
    assert report.problems[0].path.startswith(where), report.problems[0]
    assert not validation.all_valid([report])


def test_yaml_is_read_like_kubernetes_reads_it():
    (document,) = validation.load_documents("at: 2024-05-01T12:00:00Z\nflag: yes\n")
    assert document == {"at": "2024-05-01T12:00:00Z", "flag": True}


def test_unreadable_file_fails(tmp_path):
    result = run_cli("validate", "-f", str(tmp_path / "missing.yaml"))
    assert result.returncode == 1
    assert "cannot read" in result.stderr


def test_crd_command_prints_the_generated_crd_and_reference():
    assert yaml.safe_load(run_cli("crd").stdout) == crd_manifest()
    assert run_cli("crd", "--reference").stdout == reference_markdown()


def _tables(count: int, **options: object) -> list[dict[str, object]]:
    """``count`` tables whose schema and table names are 63 bytes long (the most PostgreSQL allows)."""
    return [{"schema": f"s{i % 10:02d}".ljust(63, "s"), "name": f"t{i:05d}".ljust(63, "t"), **options}
            for i in range(count)]


def test_size_limits_say_what_to_do():
    # 1,000 listed tables at the longest names: valid, and small enough for a plain kubectl apply
    largest = apply_edits(base_document(), (("spec.source.tables", _tables(1000)),))
    (report,) = validation.validate_text(yaml.safe_dump(largest))
    assert report.resource is not None and report.notes == ()
    # with options of their own: still valid, but over what kubectl's last-applied annotation holds
    keyed = apply_edits(base_document(), (("spec.source.tables", _tables(1000, keyColumns=[c * 63 for c in "ab"])),))
    (report,) = validation.validate_text(yaml.safe_dump(keyed))
    assert report.resource is not None and report.problems == ()
    (note,) = report.notes
    assert "kubectl apply --server-side" in note and "spec.source.schemas" in note and "KiB" in note
    assert "note: the document is" in validation.render("x.yaml", [report])
    # over what lakeslot accepts (the API server's 1.5 MiB per object, the status included)
    huge = apply_edits(base_document(), (("spec.source.tables", _tables(1000, keyColumns=[c * 63 for c in "abcdef"])),))
    (problem,) = problems(huge)
    assert problem.path == "spec" and "over the 512 KiB lakeslot accepts" in problem.problem
    assert "1.5 MiB" in problem.problem and "spec.source.schemas" in problem.fix
