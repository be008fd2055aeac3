"""The control steps and decisions shared by the operator and local mode (``lakeslot run``,
``lakeslot status``), so both act and report alike. Spark-free.

- :mod:`.steps` — the steps against the source (connect, check the source, ensure the slot, read
  the current WAL LSN), taken by every reconcile, every ``lakeslot run`` start and (read-only) by
  ``lakeslot status``.
- :mod:`.scheduling` — which tables a snapshot copies, from which LSN, and how long a failed
  copy waits (pure).
- :mod:`.resnapshot` — which tables are copied again, alone and online, and which the loop
  guard holds back (pure).
- :mod:`.jobs` — the one skeleton of the Spark jobs' entry points (``spark_jobs/``): arguments,
  the job document, exit codes.
"""
