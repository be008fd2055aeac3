"""The ``lakeslot`` command line.

Each subcommand is a thin translation from arguments to a call into a plain module; nothing here
holds domain logic. Credentials are never accepted as arguments (they would show in ``ps`` and
shell history): they come from Secrets or the environment.
"""

from __future__ import annotations

import argparse
import sys

from lakeslot import __version__


def _provision_jars(args: argparse.Namespace) -> int:
    from lakeslot import iceberg_jars

    try:
        jars = iceberg_jars.ensure_jars(refresh=args.refresh)
    except iceberg_jars.JarProvisioningError as e:
        print(f"lakeslot provision-jars: {e}", file=sys.stderr)
        return 1
    for path in jars:
        print(path)
    return 0


def _demo(args: argparse.Namespace) -> int:
    print(
        "lakeslot demo: not yet available — the local pipeline (`lakeslot run`) lands with the\n"
        "local-mode issue. `./dev test` exercises every part that exists today.",
        file=sys.stderr,
    )
    return 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lakeslot",
        description="PostgreSQL change-data-capture into Apache Iceberg, on Kubernetes or one machine.",
    )
    parser.add_argument("--version", action="version", version=f"lakeslot {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser(
        "provision-jars",
        help="download or build the Iceberg Spark runtime jars into the cache and print their paths",
    )
    p.add_argument("--refresh", action="store_true", help="rebuild even when cached")
    p.set_defaults(func=_provision_jars)

    p = sub.add_parser("demo", help="run the whole pipeline against an embedded PostgreSQL with sample data")
    p.set_defaults(func=_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
