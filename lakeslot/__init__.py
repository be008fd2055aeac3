"""lakeslot: PostgreSQL change-data-capture into Apache Iceberg, driven by a Kubernetes operator.

Package map (the layout is the architecture, see DESIGN.md):

- ``lakeslot`` (this package): the plain-Python core shared by every component — the command
  line, local clusters for demos and tests, the Spark runtime (jars and sessions).
- ``lakeslot_operator`` (folder ``operator/``): the kopf control plane.
- ``spark_jobs``: PySpark entry points (snapshot, apply).
"""

__version__ = "0.1.0"
