"""lakeslot: PostgreSQL change-data-capture into Apache Iceberg, driven by a Kubernetes operator.

Package map (the layout is the architecture, see DESIGN.md):

- ``lakeslot`` (this package): the plain-Python core shared by every component — the command
  line, local clusters for demos and tests, the Spark runtime (jars and sessions).
- Shared contracts, each in a room of its own that producers and consumers both import:
  ``lakeslot.api`` (the resource, and every derived name: ``IngestionNames``),
  ``lakeslot.staging`` (the segment format and store: reader → apply), ``lakeslot.mirror`` (the
  mirror-table contract, catalog access and progress: jobs → operator, local mode),
  ``lakeslot.workloads`` (how each workload is invoked) and ``lakeslot.exits`` (exit codes).
- Control plane steps: ``lakeslot.source`` (what lakeslot does to PostgreSQL),
  ``lakeslot.control`` (the sequence of source steps) and ``lakeslot.status`` (the report).
- Data plane: ``lakeslot.reader``, ``lakeslot.snapshot``, ``lakeslot.apply``; ``lakeslot.local``
  runs them all on one machine. A consumer never imports a producer's internals, and the
  library never imports an entry point.
- ``lakeslot_operator`` (folder ``operator/``): the kopf control plane.
- ``spark_jobs``: PySpark entry points (snapshot, apply).
"""

__version__ = "0.1.0"
