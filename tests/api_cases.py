"""Invalid PostgresIngestion documents and updates, shared by every test of the API contract.

Each case starts from the minimal example (``examples/ingestion.yaml``, which lists two tables),
applies edits (Kubernetes dotted path → new value, or :data:`DELETE`), and names the field that
both ``lakeslot validate`` and the API server (with the generated CRD) must blame, in the dotted
form of the API server's messages (``spec.source.tables[0].name``).

``server_status`` is the HTTP status the API server answers a create with: 422 (Invalid) for
schema, CEL and list-type violations. Unknown fields are the exception: the server prunes them
silently, or answers 400 (BadRequest) when the client asks for ``fieldValidation=Strict``
(kubectl's default); ``lakeslot validate`` always rejects them.

:data:`UPDATE_CASES` are valid documents that become invalid as an *update* of a stored object
(transition rules: immutable or monotonic fields): create ``old()``, then update to ``new()``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from lakeslot.api.paths import parse_path

EXAMPLES_DIR = Path(__file__).resolve().parents[1] / "examples"
BASE_PATH = EXAMPLES_DIR / "ingestion.yaml"
EXAMPLES = [BASE_PATH, EXAMPLES_DIR / "ingestion-full.yaml"]  # the valid documents: minimal and full
DELETE = object()

Edits = tuple[tuple[str, Any], ...]


def base_document() -> dict[str, Any]:
    return yaml.safe_load(BASE_PATH.read_text())


def apply_edits(document: dict[str, Any], edits: Edits) -> dict[str, Any]:
    """A copy of ``document`` with each (path, value) set, creating missing objects on the way."""
    result = copy.deepcopy(document)
    for path, value in edits:
        *parents, last = parse_path(path)
        node: Any = result  # a dict or a list on the way down
        for part in parents:
            node = node[part] if isinstance(part, int) else node.setdefault(part, {})
        if value is DELETE:
            del node[last]
        else:
            node[last] = copy.deepcopy(value)
    return result


@dataclass(frozen=True)
class InvalidCase:
    id: str
    edits: Edits
    path: str
    server_status: int = 422

    def document(self) -> dict[str, Any]:
        return apply_edits(base_document(), self.edits)


@dataclass(frozen=True)
class UpdateCase:
    id: str
    before: Edits
    after: Edits
    path: str

    def old(self) -> dict[str, Any]:
        return apply_edits(base_document(), self.before)

    def new(self) -> dict[str, Any]:
        return apply_edits(self.old(), self.after)


INVALID_CASES = [
    InvalidCase("missing-host", (("spec.source.host", DELETE),), "spec.source.host"),
    InvalidCase("missing-database", (("spec.source.database", DELETE),), "spec.source.database"),
    InvalidCase("missing-sink", (("spec.sink", DELETE),), "spec.sink"),
    InvalidCase(
        "missing-secret-key", (("spec.source.passwordSecretRef", {"name": "pg"}),), "spec.source.passwordSecretRef.key"
    ),
    InvalidCase("port-too-large", (("spec.source.port", 70000),), "spec.source.port"),
    InvalidCase("port-zero", (("spec.source.port", 0),), "spec.source.port"),
    InvalidCase("port-as-string", (("spec.source.port", "5432"),), "spec.source.port"),
    InvalidCase("ssl-mode-unknown", (("spec.source.sslMode", "verify_full"),), "spec.source.sslMode"),
    InvalidCase("slot-name-upper-case", (("spec.source.slotName", "Orders_Slot"),), "spec.source.slotName"),
    InvalidCase("slot-name-hyphen", (("spec.source.slotName", "orders-slot"),), "spec.source.slotName"),
    InvalidCase("slot-name-64-bytes", (("spec.source.slotName", "s" * 64),), "spec.source.slotName"),
    # 32 characters but 64 bytes: only the byte rule (CEL size(bytes(self))) catches it.
    InvalidCase("publication-64-bytes", (("spec.source.publicationName", "é" * 32),), "spec.source.publicationName"),
    InvalidCase("table-name-empty", (("spec.source.tables[0].name", ""),), "spec.source.tables[0].name"),
    InvalidCase("table-name-66-bytes", (("spec.source.tables[0].name", "表" * 22),), "spec.source.tables[0].name"),
    InvalidCase(
        "key-column-64-characters",
        (("spec.source.tables[0].keyColumns", ["k" * 64]),),
        "spec.source.tables[0].keyColumns[0]",
    ),
    InvalidCase(
        "duplicate-table",
        (("spec.source.tables", [{"schema": "public", "name": "orders"}] * 2),),
        "spec.source.tables[1]",
    ),
    InvalidCase("duplicate-schema", (("spec.source.schemas", ["sales", "sales"]),), "spec.source.schemas[1]"),
    InvalidCase("tables-as-string", (("spec.source.tables", "public.orders"),), "spec.source.tables"),
    InvalidCase("no-tables", (("spec.source.tables", DELETE),), "spec.source.tables"),
    InvalidCase("verify-full-without-ca", (("spec.source.sslMode", "verify-full"),), "spec.source.caSecretRef"),
    InvalidCase(
        "ca-with-ssl-disabled",
        (("spec.source.sslMode", "disable"), ("spec.source.caSecretRef", {"name": "ca", "key": "ca.crt"})),
        "spec.source.sslMode",
    ),
    InvalidCase("password-in-options", (("spec.source.options", {"password": "hunter2"}),), "spec.source.options"),
    InvalidCase("host-list-to-any-server", (("spec.source.host", "pg-a,pg-b"),
                                            ("spec.source.options", {"target_session_attrs": "any"})),
                "spec.source.options"),
    # What a real cluster refuses later (lakeslot.api.cluster): Spark's volume for the CA Secret,
    # spark-operator's denied sparkConf keys, and keys lakeslot sets itself.
    InvalidCase(
        "ca-secret-name-with-a-dot",
        (("spec.source.sslMode", "verify-full"), ("spec.source.caSecretRef", {"name": "shop.ca", "key": "ca.crt"})),
        "spec.source.caSecretRef.name",
    ),
    InvalidCase(
        "ca-secret-name-too-long-for-a-volume",
        (("spec.source.sslMode", "verify-full"), ("spec.source.caSecretRef", {"name": "c" * 57, "key": "ca.crt"})),
        "spec.source.caSecretRef.name",
    ),
    InvalidCase("spark-conf-master", (("spec.spark.sparkConf", {"spark.master": "local[2]"}),), "spec.spark.sparkConf"),
    InvalidCase("spark-conf-image", (("spec.spark.sparkConf", {"spark.kubernetes.container.image": "x"}),),
                "spec.spark.sparkConf"),
    InvalidCase("spark-conf-namespace", (("spec.spark.sparkConf", {"spark.kubernetes.namespace": "other"}),),
                "spec.spark.sparkConf"),
    InvalidCase("spark-conf-oauth-token",
                (("spec.spark.sparkConf", {"spark.kubernetes.authenticate.driver.oauthToken": "t"}),),
                "spec.spark.sparkConf"),
    InvalidCase("spark-conf-own-catalog",
                (("spec.spark.sparkConf", {"spark.sql.catalog.lakeslot.warehouse": "s3://elsewhere"}),),
                "spec.spark.sparkConf"),
    InvalidCase("spark-conf-secret-wiring",
                (("spec.spark.sparkConf", {"spark.kubernetes.executor.secrets.other": "/etc/x"}),),
                "spec.spark.sparkConf"),
    InvalidCase("spark-conf-lakeslot-env",
                (("spec.spark.sparkConf", {"spark.executorEnv.LAKESLOT_SOURCE_CA_FILE": "/x"}),),
                "spec.spark.sparkConf"),
    InvalidCase("spark-conf-utc", (("spec.spark.sparkConf", {"spark.sql.session.timeZone": "CET"}),),
                "spec.spark.sparkConf"),
    InvalidCase("spark-conf-redaction", (("spec.spark.sparkConf", {"spark.redaction.regex": "nothing"}),),
                "spec.spark.sparkConf"),
    InvalidCase("spark-conf-slow-event-log",
                (("spec.spark.sparkConf", {"spark.scheduler.listenerbus.logSlowEvent": "true"}),),
                "spec.spark.sparkConf"),
    # Secret references to names lakeslot gives the ingestion's objects (its children, their inputs)
    *[InvalidCase(f"secret-ref-reserved-{case}", (edit,), "spec") for case, edit in (
        ("password", ("spec.source.passwordSecretRef", {"name": "orders-apply-input", "key": "password"})),
        ("ca", ("spec.source.caSecretRef", {"name": "orders-snapshot-g0-0123abcd-input", "key": "ca.crt"})),
        ("env", ("spec.secretEnv", [{"name": "AWS_REGION",
                                     "secretKeyRef": {"name": "orders-verify-0123456789-input", "key": "r"}}])),
        ("catalog", ("spec.sink.catalog.secretProperties", {"token": {"name": "orders-reader", "key": "t"}})),
        ("apply", ("spec.source.passwordSecretRef", {"name": "orders-apply", "key": "password"})),
        ("cut-snapshot", ("spec.source.passwordSecretRef", {"name": "orders-snapsh-0123abcd", "key": "p"})))],
    # credentials in plain catalog properties
    *[InvalidCase(f"catalog-property-{key.replace('.', '-')}", (("spec.sink.catalog.properties", {key: "x"}),),
                  "spec.sink.catalog.properties")
      for key in ("s3.secret-access-key", "jdbc.password", "credential", "token", "s3.session-token",
                  "Client.Secret", "JDBC.PASSWORD")],
    InvalidCase("secret-env-reserved",
                (("spec.secretEnv", [{"name": "LAKESLOT_SOURCE_PASSWORD",
                                      "secretKeyRef": {"name": "s", "key": "k"}}]),),
                "spec.secretEnv[0].name"),
    InvalidCase("secret-env-duplicate",
                (("spec.secretEnv", [{"name": "AWS_REGION", "secretKeyRef": {"name": "s", "key": "a"}},
                                     {"name": "AWS_REGION", "secretKeyRef": {"name": "s", "key": "b"}}]),),
                "spec.secretEnv[1]"),
    InvalidCase("secret-env-bad-name",
                (("spec.secretEnv", [{"name": "AWS-REGION", "secretKeyRef": {"name": "s", "key": "a"}}]),),
                "spec.secretEnv[0].name"),
    InvalidCase("hadoop-without-warehouse",
                (("spec.sink.catalog.type", "hadoop"), ("spec.sink.catalog.warehouse", DELETE)),
                "spec.sink.catalog.warehouse"),
    *[InvalidCase(f"hadoop-on-{scheme}", (("spec.sink.catalog.type", "hadoop"),
                                          ("spec.sink.catalog.warehouse", f"{scheme}://lake/warehouse")),
                  "spec.sink.catalog.warehouse")
      for scheme in ("s3", "S3A", "gs", "abfss")],
    InvalidCase("rest-without-uri", (("spec.sink.catalog.uri", DELETE),), "spec.sink.catalog.uri"),
    InvalidCase("catalog-type-unknown", (("spec.sink.catalog.type", "nessie"),), "spec.sink.catalog.type"),
    InvalidCase(
        "template-without-table", (("spec.sink.tableNameTemplate", "{schema}"),), "spec.sink.tableNameTemplate"
    ),
    InvalidCase("staging-ftp", (("spec.staging.uri", "ftp://lake/staging"),), "spec.staging.uri"),
    InvalidCase("retention-negative", (("spec.staging.retentionSeconds", -5),), "spec.staging.retentionSeconds"),
    InvalidCase("snapshot-mode-unknown", (("spec.snapshot.mode", "full"),), "spec.snapshot.mode"),
    InvalidCase("parallelism-zero", (("spec.snapshot.parallelism", 0),), "spec.snapshot.parallelism"),
    InvalidCase("range-size-negative", (("spec.snapshot.targetRangeBytes", -1),), "spec.snapshot.targetRangeBytes"),
    InvalidCase("executors-negative", (("spec.spark.executor.instances", -1),), "spec.spark.executor.instances"),
    InvalidCase("driver-memory-format", (("spec.spark.driver.memory", "1 GB"),), "spec.spark.driver.memory"),
    InvalidCase(
        "cpu-not-a-quantity",
        (("spec.reader.resources.requests", {"cpu": "one"}),),
        "spec.reader.resources.requests.cpu",
    ),
    InvalidCase("feedback-too-often", (("spec.reader.feedbackIntervalMs", 10),), "spec.reader.feedbackIntervalMs"),
    InvalidCase(
        "deletion-policy-lower-case", (("spec.policies.deletionPolicy", "delete"),), "spec.policies.deletionPolicy"
    ),
    InvalidCase("suspend-not-boolean", (("spec.suspend", "maybe"),), "spec.suspend"),
    InvalidCase("unknown-field-typo", (("spec.source.slotNmae", "orders"),), "spec.source.slotNmae", server_status=400),
]

UPDATE_CASES = [
    UpdateCase("database-changed", (), (("spec.source.database", "shop2"),), "spec.source.database"),
    UpdateCase(
        "slot-name-changed",
        (("spec.source.slotName", "orders_a"),),
        (("spec.source.slotName", "orders_b"),),
        "spec.source.slotName",
    ),
    UpdateCase(
        "slot-name-removed",
        (("spec.source.slotName", "orders_a"),),
        (("spec.source.slotName", DELETE),),
        "spec.source.slotName",
    ),
    UpdateCase(
        "publication-name-changed",
        (("spec.source.publicationName", "orders"),),
        (("spec.source.publicationName", "Orders"),),
        "spec.source.publicationName",
    ),
    UpdateCase(
        "resnapshot-generation-decreased",
        (("spec.snapshot.resnapshotGeneration", 3),),
        (("spec.snapshot.resnapshotGeneration", 2),),
        "spec.snapshot.resnapshotGeneration",
    ),
]


# Ingestion names a real cluster refuses in the children (lakeslot.api.cluster): reported at
# metadata.name by `lakeslot validate`; the API server answers 422 with the same message (a rule of
# the whole resource, since the CRD schema says nothing about metadata).
BAD_NAMES = {
    "dotted": "orders.v2",
    "leading-digit": "2orders",
    "too-long": "a" * 41,
    "long-with-a-dot": "a" * 54 + ".bcdefgh",
    "longest-label": "a" * 63,
}
GOOD_NAMES = ("orders", "a", "a" * 40, "orders-v2")

