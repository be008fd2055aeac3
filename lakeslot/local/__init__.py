"""Local mode: one ingestion on one machine, without Kubernetes (``lakeslot run``, ``lakeslot
status``, ``lakeslot demo``).

- ``config``: the ingestion file, secrets from the environment or an env file, the state directory.
- ``run``: the pipeline — the operator's steps (:mod:`lakeslot.control.steps`), then the reader as a
  child process, the snapshot and the apply job in a Spark ``local[*]`` session; graceful stop.
- ``reader_process`` / ``deathsig``: the reader child, which never outlives the run.
- ``state``: the run lock (one run per ingestion) and what the active run started.
- ``observe``: the status model computed from the source, staging, Iceberg and the state directory.
- ``display``: live progress on a terminal, log lines otherwise.
- ``verify``: the command line of ``lakeslot verify`` (the checks are :mod:`lakeslot.verify`).
- ``demo``: the README's demo command on an embedded PostgreSQL.
"""
