"""Admission rules for what a real cluster would reject later: names, volume names, Spark conf.

Each is a :class:`~lakeslot.api.rules.Rule` row (CEL for the API server, a predicate for
``lakeslot validate``), declared here once and attached to the model it constrains in
:mod:`lakeslot.api.models`. They exist because the failure would otherwise surface only inside a
reconcile, as a child the API server or spark-operator's webhook refuses.

Invariants (each one a rule below):

- **The ingestion's name** is a DNS-1035 label (``[a-z]([-a-z0-9]*[a-z0-9])?``) of at most
  :data:`INGESTION_NAME_MAX` characters. spark-operator ≥ 2.4's webhook rejects SparkApplication
  names that are not DNS-1035 labels (it derives Service names from them); the name is the value
  of two labels on every child (≤ 63); and :data:`INGESTION_NAME_MAX` leaves room for lakeslot's
  longest fixed suffix (``-verify-<10 hex>``, 18 characters) within 63 and for spark-operator's
  ``-ui-svc`` Service after ``<name>-apply``, so the children keep readable names (longer
  derived names are still cut with a hash by ``lakeslot_operator.children.child_name``).
- **The CA Secret's name** becomes a volume name: Spark mounts the Secret named in
  ``spark.kubernetes.{driver,executor}.secrets.<name>`` as a volume ``<name>-volume``, which must be
  a DNS-1123 label — so the Secret's name must be a DNS-1123 label of at most
  :data:`CA_SECRET_NAME_MAX` (56) characters (no dots).
- **``spec.spark.sparkConf``** may set neither a key spark-operator 2.5's webhook denies
  (:data:`DENIED_SPARK_CONF`, from kubeflow/spark-operator ``internal/webhook/sparkconf_validator.go``;
  it also denies a ``spark.kubernetes.namespace`` other than the application's, and lakeslot runs
  every application in its ingestion's namespace, so the key is refused whatever its value) nor a
  key lakeslot sets itself (:data:`RESERVED_SPARK_CONF`, :data:`RESERVED_SPARK_CONF_PREFIXES`, and
  ``spark.sql.catalog.<sink.catalog.name>`` with its sub-keys), which a user value would silently
  replace: the catalog, the Secret wiring, the UTC settings, and what keeps Secret-backed values
  out of Spark's logs (``spark.redaction.regex``, ``spark.scheduler.listenerbus.logSlowEvent``).
- **Secret references** (``source.passwordSecretRef``, ``source.caSecretRef``, ``secretEnv``,
  ``sink.catalog.secretProperties``) may not name an object lakeslot names after the ingestion
  (:data:`RESERVED_NAME_SUFFIXES`, :data:`RESERVED_NAME_PREFIXES`: its children and their input
  ConfigMaps, and the input Secrets lakeslot before 0.2 wrote and owned by a child, which
  Kubernetes deletes with it). lakeslot writes no Secret; a name it uses is still no place for
  a credential. The snapshot's names are cut with a hash for long ingestion names, after at
  least ``<name>-snapsh``: that is the prefix reserved.

Failure mode: a document breaking any of these is refused by the API server (HTTP 422, the message
and fix below) and by ``lakeslot validate``; nothing reaches the operator.
"""

from __future__ import annotations

import re

from lakeslot.api.rules import Rule

INGESTION_NAME_MAX = 40
DNS1035_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
DNS1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
VOLUME_SUFFIX = "-volume"  # Spark: the volume of a mounted Secret is "<secret>-volume"
CA_SECRET_NAME_MAX = 63 - len(VOLUME_SUFFIX)

# kubeflow/spark-operator internal/webhook/sparkconf_validator.go (v2.5): key → its reason.
DENIED_SPARK_CONF: dict[str, str] = {
    "spark.kubernetes.authenticate.driver.serviceAccountName": "set spec.spark.serviceAccount instead",
    "spark.kubernetes.authenticate.executor.serviceAccountName": "set spec.spark.serviceAccount instead",
    "spark.kubernetes.authenticate.oauthTokenFile": "credentials are managed by spark-operator",
    "spark.kubernetes.authenticate.oauthToken": "credentials are managed by spark-operator",
    "spark.kubernetes.authenticate.driver.oauthTokenFile": "credentials are managed by spark-operator",
    "spark.kubernetes.authenticate.driver.oauthToken": "credentials are managed by spark-operator",
    "spark.kubernetes.authenticate.executor.oauthTokenFile": "credentials are managed by spark-operator",
    "spark.kubernetes.authenticate.executor.oauthToken": "credentials are managed by spark-operator",
    "spark.master": "spark-operator sets it",
    "spark.kubernetes.driver.master": "spark-operator sets it",
    "spark.kubernetes.container.image": "set spec.spark.image instead",
    "spark.kubernetes.driver.container.image": "set spec.spark.image instead",
    "spark.kubernetes.executor.container.image": "set spec.spark.image instead",
    "spark.kubernetes.namespace": "applications run in the ingestion's namespace",
}

# Defaults ``sparkConf`` may override (the reference page's "Spark configuration keys" lists them):
TUNING = {
    # Python workers start without the archives Spark puts on their path (25 ms less a task)
    "spark.python.daemon.module": "lakeslot.spark.daemon",
    # the apply job's MERGE joins the mirror (right outer) with the changes: a shuffled hash
    # join building the changes' side when every partition of it is at most this (64 MB,
    # AQE's advisory partition size, the least it takes), not a sort of both sides — 5M-row
    # table, 100k changes: 2.0 s against 3.3-4.0 s; a bigger side sorts as before
    "spark.sql.adaptive.maxShuffledHashJoinLocalMapThreshold": "64m",
}

# Settings that keep the catalog's Secret-backed properties out of Spark's logs and event log
# (lakeslot.spark.conf says why); unlike TUNING, reserved: a sparkConf may not set them.
REDACTION_CONF = "spark.redaction.regex"  # this default, with those properties' session keys added
SPARK_REDACTION_REGEX = r"(?i)secret|password|token|access[.]key"  # Spark 3.5's default
QUIET_SLOW_EVENTS = {"spark.scheduler.listenerbus.logSlowEvent": "false"}

# Keys lakeslot writes into every SparkApplication (lakeslot.spark.conf.iceberg_conf and the
# operator's Secret and environment wiring).
RESERVED_SPARK_CONF = (
    "spark.sql.extensions",
    "spark.sql.session.timeZone",
    "spark.sql.caseSensitive",
    "spark.driver.extraJavaOptions",
    "spark.executor.extraJavaOptions",
    REDACTION_CONF,
    *QUIET_SLOW_EVENTS,
)
RESERVED_SPARK_CONF_PREFIXES = (
    "spark.kubernetes.driver.secretKeyRef.",
    "spark.kubernetes.executor.secretKeyRef.",
    "spark.kubernetes.driver.secrets.",
    "spark.kubernetes.executor.secrets.",
    "spark.kubernetes.driverEnv.LAKESLOT_",
    "spark.executorEnv.LAKESLOT_",
)
CATALOG_CONF_PREFIX = "spark.sql.catalog."


def _cel_list(values: tuple[str, ...] | list[str]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


ingestion_name = Rule(
    cel=f"size(self.metadata.name) <= {INGESTION_NAME_MAX} && self.metadata.name.matches('{DNS1035_LABEL}')",
    message=f"metadata.name must be a DNS-1035 label of at most {INGESTION_NAME_MAX} characters "
    "(it names the reader and the SparkApplications, and labels every child)",
    fix="use lower-case letters, digits and '-', starting with a letter and ending with a letter "
    f"or digit (no dots), at most {INGESTION_NAME_MAX} characters",
    check=lambda ingestion: len(ingestion.metadata.name) <= INGESTION_NAME_MAX
    and re.fullmatch(DNS1035_LABEL, ingestion.metadata.name) is not None,
    offline_path=".metadata.name",
)

ca_secret_volume_name = Rule(
    cel=f"!has(self.caSecretRef) || (size(self.caSecretRef.name) <= {CA_SECRET_NAME_MAX} "
    f"&& self.caSecretRef.name.matches('{DNS1123_LABEL}'))",
    message="the CA Secret's name must be a DNS-1123 label of at most "
    f"{CA_SECRET_NAME_MAX} characters (Spark mounts it as the volume <name>{VOLUME_SUFFIX})",
    fix="copy the CA into a Secret whose name has no dots and at most "
    f"{CA_SECRET_NAME_MAX} characters, and name that one",
    check=lambda source: source.ca_secret_ref is None
    or (len(source.ca_secret_ref.name) <= CA_SECRET_NAME_MAX
        and re.fullmatch(DNS1123_LABEL, source.ca_secret_ref.name) is not None),
    field_path=".caSecretRef.name",
)

denied_spark_conf = Rule(
    cel=" && ".join(f"!('{key}' in self)" for key in DENIED_SPARK_CONF),
    message="sparkConf sets a key that spark-operator's webhook denies",
    fix=f"remove {', '.join(DENIED_SPARK_CONF)}: lakeslot sets the image, service account and "
    "namespace from the spec",
    check=lambda conf: not set(conf) & set(DENIED_SPARK_CONF),
)


def _reserved(key: str, catalog: str) -> bool:
    own_catalog = CATALOG_CONF_PREFIX + catalog
    return (key in RESERVED_SPARK_CONF or key.startswith(RESERVED_SPARK_CONF_PREFIXES)
            or key == own_catalog or key.startswith(own_catalog + "."))


def reserved_spark_conf_keys(conf: dict[str, str], catalog: str) -> list[str]:
    """The keys of ``conf`` lakeslot sets itself (with the Iceberg catalog named ``catalog``)."""
    return sorted(key for key in conf if _reserved(key, catalog))


_OWN_CATALOG = f"'{CATALOG_CONF_PREFIX}' + self.sink.catalog.name"
reserved_spark_conf = Rule(
    cel="!has(self.spark.sparkConf) || self.spark.sparkConf.all(k, "
    + " && ".join(f"k != '{key}'" for key in RESERVED_SPARK_CONF)
    + " && " + " && ".join(f"!k.startsWith('{p}')" for p in RESERVED_SPARK_CONF_PREFIXES)
    + f" && k != {_OWN_CATALOG} && !k.startsWith({_OWN_CATALOG} + '.'))",
    message="sparkConf sets a key lakeslot sets itself (the Iceberg catalog, Secret wiring, "
    "LAKESLOT_ variables, the UTC settings, case-sensitive names or the redaction of secrets "
    "from Spark's logs)",
    fix=f"remove {', '.join(RESERVED_SPARK_CONF)}, the keys starting with "
    f"{', '.join(RESERVED_SPARK_CONF_PREFIXES)} and spark.sql.catalog.<sink.catalog.name>(.*); "
    "configure the catalog in sink.catalog and Secrets in secretEnv",
    check=lambda spec: not reserved_spark_conf_keys(spec.spark.spark_conf, spec.sink.catalog.name),
    field_path=".spark.sparkConf",
)


# Names lakeslot gives objects of an ingestion named <name>: <name><suffix>, <name><prefix>...
RESERVED_NAME_SUFFIXES = ("-reader", "-apply")
RESERVED_NAME_PREFIXES = ("-apply-", "-snapsh", "-verify-")


def is_reserved_name(name: str, ingestion: str) -> bool:
    """Whether ``name`` is one lakeslot gives an object of the ingestion named ``ingestion``."""
    return name in {ingestion + suffix for suffix in RESERVED_NAME_SUFFIXES} or \
        name.startswith(tuple(ingestion + prefix for prefix in RESERVED_NAME_PREFIXES))


def _cel_reserved(name: str) -> str:
    """CEL: ``name`` (an expression) is reserved for the ingestion ``self``."""
    return "(" + " || ".join(
        [f"{name} == self.metadata.name + '{suffix}'" for suffix in RESERVED_NAME_SUFFIXES]
        + [f"{name}.startsWith(self.metadata.name + '{prefix}')" for prefix in RESERVED_NAME_PREFIXES]) + ")"


def referenced_secret_names(ingestion) -> list[str]:
    """The Secret names the spec of ``ingestion`` (a PostgresIngestion) references."""
    spec = ingestion.spec
    refs = [spec.source.password_secret_ref, spec.source.ca_secret_ref,
            *(e.secret_key_ref for e in spec.secret_env), *spec.sink.catalog.secret_properties.values()]
    return [ref.name for ref in refs if ref is not None]


_PROPERTIES = "self.spec.sink.catalog.secretProperties"
reserved_secret_names = Rule(
    cel=" && ".join([
        f"(!has(self.spec.source.{field}) || !{_cel_reserved(f'self.spec.source.{field}.name')})"
        for field in ("passwordSecretRef", "caSecretRef")] + [
        f"(!has(self.spec.secretEnv) || self.spec.secretEnv.all(e, !{_cel_reserved('e.secretKeyRef.name')}))",
        f"(!has({_PROPERTIES}) || {_PROPERTIES}.all(k, !{_cel_reserved(f'{_PROPERTIES}[k].name')}))"]),
    message="a Secret reference names an object lakeslot names after the ingestion: <name>"
    + ", <name>".join(RESERVED_NAME_SUFFIXES) + " or a name starting with <name>"
    + ", <name>".join(RESERVED_NAME_PREFIXES) + " (its children and their job inputs)",
    fix="rename that Secret (and the reference): lakeslot may create or delete objects of those "
    "names with the ingestion",
    check=lambda ingestion: not any(is_reserved_name(name, ingestion.metadata.name)
                                    for name in referenced_secret_names(ingestion)),
    field_path=".spec",
)
