"""The lakeslot control plane (kopf). Lives in the folder ``operator/`` under this name because
``operator`` is a Python standard-library module. Handlers are thin; the decisions are plain
modules that tests call without kopf.

- :mod:`.main` — ``lakeslot operator``: connects, watches, serves liveness and metrics, peers.
- :mod:`.handlers` — the kopf handlers, each one call into a module of its own.
- :mod:`.reconcile` — one idempotent, level-based reconcile: the world read, one step towards the
  spec, the complete status and the events to tell; :mod:`.kube` — its Kubernetes access (a
  child rewritten only when what is wanted changed).
- :mod:`.children` — the Kubernetes objects an ingestion owns, built by pure functions;
  :mod:`.child_health` — what a child's state or a refused write means (waiting, or someone must
  act).
- :mod:`.snapshot_lifecycle` — the snapshot SparkApplication's lifecycle (pure);
  :mod:`.verification` — verifications on request (the ``lakeslot.io/verify`` annotation → a Job
  → ``Verified``).
- :mod:`.reader_status` — asking a running reader pod how it is (``GET /status``).
- :mod:`.deletion` — deleting an ingestion: its children, and its source per ``deletionPolicy``.
- :mod:`.metrics` — the operator's Prometheus metrics, computed from each reconcile's status;
  :mod:`.peering` — which replica acts (kopf peering, a distinct priority per process).
"""
