"""The PostgresIngestion API: the models, what is derived from them (the CRD, the reference page,
offline validation) and every name derived from a resource. Spark-free.

- :mod:`.models` — the resource (``lakeslot.io/v1alpha1``): the single source of every field,
  default, description and rule; built from :mod:`.types` (scalar field types with their
  constraints) and :mod:`.partitioning` (the grammar of ``partitionBy``).
- :mod:`.rules` — a validation rule declared once, enforced by Kubernetes (CEL) and offline
  (pydantic) alike; :mod:`.cluster` — the rules for what a real cluster would refuse later
  (names, volume names, Spark conf).
- :mod:`.catalog_types` — the catalog types (``sink.catalog.type``): what each needs and how
  Spark and pyiceberg open it, the one list the rules and both translations derive from.
- :mod:`.naming` — source table names and the names derived from the resource (publication,
  slot, Iceberg tables: ``IngestionNames``).
- :mod:`.validation` — ``lakeslot validate``: every problem with its field path, what is wrong and
  how to fix it; :mod:`.paths` — Kubernetes' dotted field paths.
- :mod:`.crd` — the CRD's structural schema generated from the models; :mod:`.reference` — the
  reference page generated from it; :mod:`.generated` — every checked-in generated file
  (``lakeslot crd --write``, and the test that compares them).
- :mod:`.conditions` — status conditions (metav1.Condition semantics, pure);
  :mod:`.annotations` — the annotations a user sets to ask for something once.
"""
