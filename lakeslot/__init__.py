"""lakeslot: PostgreSQL change-data-capture into Apache Iceberg, driven by a Kubernetes operator.

Package map (the layout is the architecture: DESIGN.md "Layout constraints", checked by
``tests/test_layout.py``), lowest layer first:

- The root: plain helpers with no lakeslot imports (``lsn``, ``exits``, ``filesystems``,
  ``cadence``), how each workload is invoked (``workloads``) and the command line (``cli``).
- ``lakeslot.api``: the resource and every name derived from it (``IngestionNames``).
- Shared contracts, each in a room that producers and consumers both import:
  ``lakeslot.staging`` (the segment format and store: reader → apply) and ``lakeslot.mirror``
  (the mirror-table contract, type mapping, catalog access, progress, maintenance decisions:
  jobs → operator, local mode; Spark-free).
- ``lakeslot.source``: what lakeslot does to PostgreSQL.
- ``lakeslot.observability``: the status report, the reader's status document, metrics and
  freshness.
- ``lakeslot.spark``: everything that needs a JVM (jars, conf, sessions, the mirror tables
  through Spark, partition layout, maintenance actions).
- The data plane: ``lakeslot.reader``, ``lakeslot.snapshot``, ``lakeslot.apply``,
  ``lakeslot.verify``. A consumer never imports a producer's internals.
- ``lakeslot.control``: the control steps and decisions shared by the operator and local mode.
- ``lakeslot.local``: everything on one machine (``lakeslot run``, the demo, local clusters).
- ``lakeslot_operator`` (folder ``operator/``): the kopf control plane; ``spark_jobs``: PySpark
  entry points (snapshot, apply). The library never imports an entry point.
"""

__version__ = "0.1.0"
