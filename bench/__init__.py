"""Benchmarks that print ratios against the physical limit measured in the same run.

Run each as a module from the repository root, e.g. ``.venv/bin/python -m bench.reader_bench``
(``--help`` lists its options); they import the installed ``lakeslot`` like any other client.
Each starts a throwaway PostgreSQL (``lakeslot.local.pgcluster``) and exits non-zero when the requested
version is not installed. Numbers, not assertions: nothing imports this package and no test runs
it (mypy and ruff check it, which keeps it in step with the code).
"""
