"""Local mode: one ingestion on one machine, without Kubernetes (``lakeslot run``, ``lakeslot
status``, ``lakeslot demo``).

- ``config``: the ingestion file, secrets from the environment or an env file, the state directory.
- ``run``: the pipeline — the operator's steps (:mod:`lakeslot.control.steps`), then the reader as a
  child process, the snapshot and the apply job in a Spark ``local[*]`` session; graceful stop.
  Its collaborators: ``processes`` (the reader child, the Spark session, the job threads),
  ``selection`` (the selected tables, watched while streaming), ``schedule`` (what the apply job
  handles and what is copied online: the operator's :mod:`lakeslot.control.scheduling`),
  ``apply_loop`` (the apply job, restarted as needed), ``live_status`` (the status each tick:
  shown, and served on ``/metrics``).
- ``reader_process`` / ``deathsig``: the reader child, which never outlives the run.
- ``state``: the run lock (one run per ingestion) and what the active run started.
- ``observe``: the status model computed from the source, staging, Iceberg and the state directory.
- ``display``: live progress on a terminal, log lines otherwise.
- ``verify``: the command line of ``lakeslot verify`` (the checks are :mod:`lakeslot.verify`).
- ``demo``: the README's demo command on an embedded PostgreSQL.
"""
