"""Local mode: one ingestion on one machine, without Kubernetes (``lakeslot run``, ``lakeslot
status``, ``lakeslot demo``).

- :mod:`.config` — the ingestion file, secrets from the environment or an env file, the state
  directory.
- :mod:`.run` — the pipeline: the operator's steps (:mod:`lakeslot.control.steps`), then the reader
  as a child process, the snapshot and the apply job in a Spark ``local[*]`` session; graceful
  stop. Its collaborators: :mod:`.processes` (the reader child, the Spark session, the job
  threads), :mod:`.selection` (the selected tables, watched while streaming), :mod:`.schedule`
  (what the apply job handles and what is copied online: the operator's
  :mod:`lakeslot.control.scheduling`), :mod:`.apply_loop` (the apply job, restarted as needed),
  :mod:`.outages` (staging or the catalog unreachable: waited out, each attempt announced),
  :mod:`.live_status` (the status each tick: shown, and served on ``/metrics``),
  :mod:`.time_share` (the mirrors' reads of both kept to a share of the run's time).
- :mod:`.reader_process` / :mod:`.deathsig` — the reader child, which never outlives the run;
  :mod:`.tree` — the processes below a process (nothing left behind).
- :mod:`.state` — the run lock (one run per ingestion) and what the active run started.
- :mod:`.observe` — the status model computed from the source, staging, Iceberg and the state
  directory; :mod:`.display` — live progress on a terminal, log lines otherwise.
- :mod:`.verify` — the command line of ``lakeslot verify`` (the checks are :mod:`lakeslot.verify`).
- :mod:`.demo` — the README's demo command on an embedded PostgreSQL, with throwaway services
  the tests use too: :mod:`.pgcluster` (PostgreSQL clusters and standbys) and :mod:`.objectstore`
  (SeaweedFS: S3 and an Iceberg REST catalog).
"""
