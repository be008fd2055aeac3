"""lakeslot: PostgreSQL change-data-capture into Apache Iceberg, driven by a Kubernetes operator.

The package map, lowest layer first. The layout is the architecture (DESIGN.md "Layout constraints",
checked by ``tests/test_layout.py``); each room's own map is its ``__init__`` docstring.

- Plain helpers with no lakeslot imports: :mod:`.lsn_text` (LSNs as integers, their text form),
  :mod:`.exits` (the exit codes of every process), :mod:`.errors` (definite or transient: one rule
  for every process), :mod:`.filesystems` (a pyarrow filesystem from a URI or a path) and
  :mod:`.cadence` (one wall-clock grid for the reader's seals and the apply job's passes).
- :mod:`.api`: the resource and every name derived from it (``IngestionNames``).
- Shared contracts, each in a room that producers and consumers both import: :mod:`.staging`
  (the segment format and store: reader → apply) and :mod:`.mirror` (the mirror-table contract,
  type mapping, catalog access, progress, maintenance decisions: jobs → operator, local mode;
  Spark-free).
- :mod:`.source`: what lakeslot does to PostgreSQL.
- :mod:`.workloads`: how each workload is invoked (one definition for the operator and local
  mode); :mod:`.observability`: the status report, the reader's status document, metrics and
  freshness.
- :mod:`.spark`: everything that needs a JVM (jars, conf, sessions, the mirror tables through
  Spark, partition layout, maintenance actions).
- The data plane: :mod:`.reader`, :mod:`.snapshot`, :mod:`.apply`, :mod:`.verify`. A consumer
  never imports a producer's internals.
- :mod:`.control`: the control steps and decisions shared by the operator and local mode.
- :mod:`.local`: everything on one machine (``lakeslot run``, the demo, local clusters).
- :mod:`.cli`: the ``lakeslot`` command line, thin translations into the modules above.

Outside this package: ``lakeslot_operator`` (folder ``operator/``), the kopf control plane, and
``spark_jobs``, the PySpark entry points (snapshot, apply). The library never imports an entry
point.
"""

__version__ = "0.1.0"
