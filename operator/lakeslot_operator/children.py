"""The Kubernetes objects an ingestion owns, built by pure functions.

Each builder takes the validated ingestion, the operator's configuration and the workload's
command line (built by ``lakeslot.workloads``, which local mode shares) and returns a plain dict
ready for the API. Nothing here talks to a cluster.

Invariants:

- Every child carries an ownerReference to its PostgresIngestion (so Kubernetes garbage-collects
  it with the ingestion) and only lakeslot's own labels (``app.kubernetes.io/*`` and
  ``lakeslot.io/ingestion``); the operator finds its children by those labels.
- Names are deterministic: the same ingestion always builds the same names, so a restarted
  operator finds what it created instead of creating duplicates. The snapshot application's
  name carries its snapshot generation, so a re-snapshot is a new object while a retried
  reconcile is the same one.
- Credentials never appear in an object: the password and the CA come from the user's Secret
  through ``secretKeyRef`` env vars (the reader) or Spark's Secret-backed conf
  (``spark.kubernetes.{driver,executor}.secretKeyRef.*``, honoured by Spark itself, without
  the spark-operator's webhook).
- The reader is a singleton: one replica, ``Recreate`` strategy (never two readers during a
  rollout), a restricted security context, and ``POD_NAME`` from the downward API so its
  ``application_name`` identifies the pod (the slot's legitimate holder).
- SparkApplications use ``restartPolicy: OnFailure`` (``Always`` would rerun a finished
  snapshot; FACTS.md) and a ``timeToLiveSeconds`` so finished apps are cleaned up after the
  operator recorded their outcome.
- The verification Job (``lakeslot verify`` for one request token, named after it) runs once:
  ``backoffLimit: 0`` and ``restartPolicy: Never`` (a failed check is reported, not retried:
  a new token asks again), ``activeDeadlineSeconds`` bounds it (a pod that never starts, e.g.
  a missing Secret key, ends as failed), ``ttlSecondsAfterFinished`` removes it after the
  operator read its result from staging. Its credentials arrive like the reader's, by
  reference, plus the catalog's Secret-backed properties (it reads the mirror with pyiceberg).
- Pods meet the ``restricted`` Pod Security Standard: non-root user 10001, no privilege
  escalation, every capability dropped, read-only root file system (``/tmp`` is an emptyDir),
  ``RuntimeDefault`` seccomp, no service account token. The Spark driver and executors get the
  same contexts (their root file system stays writable: Spark writes its work directory) through
  the SparkApplication's ``securityContext`` / ``podSecurityContext``, which spark-operator's
  mutating webhook applies; with ``OperatorConfig.spark_pod_templates`` (for a spark-operator
  ≥ 2.1 without its webhook) also through ``spec.{driver,executor}.template``, a pod template
  Spark builds the pod on, keeping both contexts. Both at once agree (the webhook sets what the
  template already says); spark-operator before 2.1 has no template field and would prune it, so
  templates are never the default. Every pod lists the operator's ``imagePullSecrets`` (the
  chart's, since they run the same image).
- A job's input document (:mod:`lakeslot.workloads`) reaches it in a ConfigMap of lakeslot's
  (:func:`job_input_config_map`, owned by the child, so deleted with it; no credential in it),
  mounted at :data:`lakeslot.workloads.JOB_INPUT_DIR` — never in a Secret, so the operator needs
  no right to write Secrets. Spark has no setting that mounts a ConfigMap: the driver gets it from
  spark-operator's mutating webhook (``spec.driver.configMaps``), or with
  ``OperatorConfig.spark_pod_templates`` from its pod template alone (a volume and its mount; the
  webhook then adds nothing, so the two never mount it twice). The verification Job mounts it as
  a volume of its own.
- Spark mounts the CA Secret whole, each key a file of its own name, so the Spark pods get
  ``LAKESLOT_SOURCE_CA_FILE`` pointing at ``<mount>/<key>`` (``spark.kubernetes.driverEnv.*`` and
  ``spark.executorEnv.*``, honoured by Spark itself); the reader and the verification Job mount
  only that key, as ``ca.crt``.
- Names: the ingestion's name is a DNS-1035 label of at most 40 characters (an admission rule,
  :mod:`lakeslot.api.cluster`); :func:`child_name` still cuts a longer derived name with a hash, to
  63 characters, and to :data:`SPARK_NAME_MAX` for SparkApplications (spark-operator derives the
  Service ``<name>-ui-svc`` from it, a DNS-1035 label).

Failure modes: none here (pure); what the API server refuses is reported by the reconcile.
"""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass

from lakeslot.api.annotations import VERIFY
from lakeslot.api.models import API_VERSION, GROUP, KIND, DriverSpec, ExecutorSpec, PostgresIngestion
from lakeslot.api.naming import namespace_of
from lakeslot.spark.conf import iceberg_conf
from lakeslot.workloads import (
    CA_FILE,
    CA_FILE_ENV,
    JOB_INPUT_DIR,
    JOB_INPUT_KEY,
    PASSWORD_ENV,
    READER_METRICS_PORT,
    catalog_secret_env,
)

INGESTION_LABEL = f"{GROUP}/ingestion"
COMPONENT_LABEL = "app.kubernetes.io/component"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "lakeslot-operator"
SPARK_API_VERSION = "sparkoperator.k8s.io/v1beta2"
CA_MOUNT = posixpath.dirname(CA_FILE)
NAME_MAX = 63
SPARK_NAME_MAX = NAME_MAX - len("-ui-svc")
# spark-operator's webhook names the volume of a ConfigMap in spec.driver.configMaps <name>-vol
# (cut to 63 characters: a name of at most 59 is never cut).
SPARK_CONFIG_MAP_VOLUME_SUFFIX = "-vol"
JOB_INPUT_VOLUME = "job-input"  # the input's volume in a pod template or the verification Job
RUN_AS_USER = 10001
# The Spark containers' names, as spark-operator passes them to Spark for its pod templates.
SPARK_CONTAINERS = {"driver": "spark-kubernetes-driver", "executor": "spark-kubernetes-executor"}
SNAPSHOT_TTL_SECONDS = 3600
VERIFY_TTL_SECONDS = 3600
VERIFY_DEADLINE_SECONDS = 6 * 3600


@dataclass(frozen=True)
class OperatorConfig:
    """Defaults the operator applies where the spec leaves a choice open."""

    image: str = "ghcr.io/lakeslot/lakeslot:0.1.0"
    spark_service_account: str = "lakeslot-spark"
    image_pull_policy: str = "IfNotPresent"
    image_pull_secrets: tuple[str, ...] = ()  # names of Secrets in each ingestion's namespace
    reader_service_account: str | None = None  # None: the namespace's default service account
    # Pod templates for the Spark driver and executors, for a spark-operator (>= 2.1) that runs
    # without its mutating webhook: without either, their pods get no security context.
    spark_pod_templates: bool = False
    # The reader's resources unless spec.reader.resources says otherwise: from the reader benchmark
    # (docs/performance.md: peak RSS 156 MB through a 1 GiB transaction, about one core at full
    # speed). No CPU limit: the reader must keep up with the walsender.
    reader_resources: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
        ("requests", (("cpu", "250m"), ("memory", "256Mi"))),
        ("limits", (("memory", "512Mi"),)),
    )

    def pull_secrets(self) -> list[dict[str, str]]:
        return [{"name": name} for name in self.image_pull_secrets]


def labels(ingestion: PostgresIngestion, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "lakeslot",
        "app.kubernetes.io/instance": ingestion.metadata.name,
        MANAGED_BY_LABEL: MANAGED_BY,
        COMPONENT_LABEL: component,
        INGESTION_LABEL: ingestion.metadata.name,
    }


def owner_reference(ingestion: PostgresIngestion, uid: str) -> dict[str, object]:
    return {"apiVersion": ingestion.api_version, "kind": ingestion.kind,
            "name": ingestion.metadata.name, "uid": uid, "controller": True,
            "blockOwnerDeletion": True}


def owned_by_ingestion(ingestion: str) -> dict:
    """What every child of the ingestion named ``ingestion`` carries, as :func:`is_ours` reads it
    (for deleting a child by name, with no desired object at hand)."""
    return {"metadata": {"labels": {INGESTION_LABEL: ingestion, MANAGED_BY_LABEL: MANAGED_BY},
                         "ownerReferences": [{"apiVersion": API_VERSION, "kind": KIND, "name": ingestion}]}}


def _owner_key(reference: Mapping) -> tuple[str, str, str]:
    return (str(reference.get("apiVersion", "")).rpartition("/")[0], str(reference.get("kind")),
            str(reference.get("name")))


def is_ours(live: Mapping, wanted: Mapping) -> bool:
    """Whether the live object is lakeslot's object that ``wanted`` (a desired object, or
    :func:`owned_by_ingestion`) stands for: it carries wanted's ingestion and managed-by labels
    and an owner reference to wanted's owner — the same API group, kind and name; the uid may be
    an earlier incarnation's (a child re-created under its name, an ingestion re-created under
    its name), whose objects lakeslot takes over. A user's object of the same name lacks them."""
    live_meta, meta = live["metadata"], wanted["metadata"]
    labels = live_meta.get("labels") or {}
    if any(labels.get(key) != meta["labels"][key] for key in (INGESTION_LABEL, MANAGED_BY_LABEL)):
        return False
    owners = {_owner_key(o) for o in live_meta.get("ownerReferences") or []}
    return any(_owner_key(o) in owners for o in meta["ownerReferences"])


def purpose(child: Mapping) -> str:
    """What lakeslot needs the object ``child`` for, for messages."""
    meta = child["metadata"]
    if child["kind"] == "ConfigMap":
        owner = meta["ownerReferences"][0]
        return f"the job input of {owner['kind']} {owner['name']}"
    component = meta["labels"].get(COMPONENT_LABEL, "")
    return f"the {component} {child['kind']} of PostgresIngestion {meta['labels'][INGESTION_LABEL]}"


def _metadata(ingestion: PostgresIngestion, uid: str, name: str, component: str) -> dict:
    return {"name": name, "namespace": namespace_of(ingestion.metadata.namespace),
            "labels": labels(ingestion, component),
            "ownerReferences": [owner_reference(ingestion, uid)]}


def child_name(ingestion: PostgresIngestion, suffix: str, limit: int = NAME_MAX) -> str:
    """``<ingestion>-<suffix>``, shortened with a stable hash to at most ``limit`` characters."""
    return _bounded(f"{ingestion.metadata.name}-{suffix}", limit)


def _bounded(name: str, limit: int) -> str:
    """``name``, or when longer than ``limit``, cut and given a stable hash of the whole."""
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[:limit - len(digest) - 1].rstrip('-.')}-{digest}"


def spark_name(ingestion: PostgresIngestion, suffix: str) -> str:
    """A SparkApplication's name: :func:`child_name` within :data:`SPARK_NAME_MAX`."""
    return child_name(ingestion, suffix, SPARK_NAME_MAX)


def input_name(child: str) -> str:
    """The ConfigMap holding the job document of the child named ``child``: short enough for the
    name of the volume spark-operator mounts it as (``<name>-vol``, a DNS-1123 label)."""
    return _bounded(f"{child}-input", NAME_MAX - len(SPARK_CONFIG_MAP_VOLUME_SUFFIX))


def job_input_config_map(child: dict, document: str, child_uid: str) -> dict:
    """The job document of ``child`` (a SparkApplication or Job), mounted at
    :data:`lakeslot.workloads.JOB_INPUT_DIR`; it holds no credential. Owned by the child, so it
    is deleted with it (spark-operator's time to live included), and labelled as the child is."""
    metadata = child["metadata"]
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": input_name(metadata["name"]), "namespace": metadata["namespace"],
                     "labels": dict(metadata["labels"]),
                     "ownerReferences": [{"apiVersion": child["apiVersion"], "kind": child["kind"],
                                          "name": metadata["name"], "uid": child_uid,
                                          "controller": True, "blockOwnerDeletion": False}]},
        "data": {JOB_INPUT_KEY: document},
    }


def _input_volume(child: str) -> tuple[dict, dict]:
    """The volume of ``child``'s input ConfigMap and its mount at ``JOB_INPUT_DIR``."""
    return ({"name": JOB_INPUT_VOLUME, "configMap": {"name": input_name(child)}},
            {"name": JOB_INPUT_VOLUME, "mountPath": JOB_INPUT_DIR, "readOnly": True})


# pods ------------------------------------------------------------------------------------

def _secret_env(ingestion: PostgresIngestion, *, catalog: bool) -> list[dict]:
    """Environment variables from the user's Secrets, by reference: the source password,
    (``catalog``) the catalog's Secret-backed properties, and ``spec.secretEnv``."""
    spec = ingestion.spec
    refs = {PASSWORD_ENV: spec.source.password_secret_ref} if spec.source.password_secret_ref else {}
    if catalog:
        refs.update((catalog_secret_env(key), ref)
                    for key, ref in spec.sink.catalog.secret_properties.items())
    refs.update((e.name, e.secret_key_ref) for e in spec.secret_env)
    return [{"name": name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}
            for name, ref in refs.items()]


def _source_ca(ingestion: PostgresIngestion) -> tuple[list[dict], list[dict]]:
    """The CA Secret's key as a volume, and its mount at :data:`CA_MOUNT` (none without
    ``caSecretRef``)."""
    ref = ingestion.spec.source.ca_secret_ref
    if ref is None:
        return [], []
    return ([{"name": "source-ca", "secret": {
                "secretName": ref.name, "items": [{"key": ref.key, "path": posixpath.basename(CA_FILE)}]}}],
            [{"name": "source-ca", "mountPath": CA_MOUNT, "readOnly": True}])


def _container_security() -> dict:
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"}}


def _pod_security() -> dict:
    return {"runAsNonRoot": True, "runAsUser": RUN_AS_USER, "fsGroup": RUN_AS_USER,
            "seccompProfile": {"type": "RuntimeDefault"}}


def _spark_container_security() -> dict:
    """The restricted profile for Spark's containers; the root file system stays writable."""
    return {**_container_security(), "readOnlyRootFilesystem": False, "runAsUser": RUN_AS_USER}


def _spark_pod(role: str, resources: DriverSpec, role_labels: dict[str, str], account: str,
               config: OperatorConfig, job_input: str | None = None) -> dict:
    """A SparkApplication's ``driver`` or ``executor``: resources, labels, the service account
    and the restricted security contexts, for the webhook and (``spark_pod_templates``) as a pod
    template whose container has the name spark-operator tells Spark to build on
    (``spark.kubernetes.{role}.podTemplateContainerName``); with ``job_input`` (the driver: its
    application's name) the input ConfigMap, for the webhook or in the template (see the
    module's invariants)."""
    pod: dict[str, object] = {"cores": resources.cores, "memory": resources.memory}
    if isinstance(resources, ExecutorSpec):
        pod["instances"] = resources.instances
    pod.update({"labels": role_labels, "serviceAccount": account,
                "securityContext": _spark_container_security(), "podSecurityContext": _pod_security()})
    if config.spark_pod_templates:
        container: dict[str, object] = {"name": SPARK_CONTAINERS[role],
                                        "securityContext": _spark_container_security()}
        template: dict[str, object] = {"securityContext": _pod_security(), "containers": [container]}
        if job_input is not None:
            volume, mount = _input_volume(job_input)
            template["volumes"], container["volumeMounts"] = [volume], [mount]
        pod["template"] = {"spec": template}
    elif job_input is not None:
        pod["configMaps"] = [{"name": input_name(job_input), "path": JOB_INPUT_DIR}]
    return pod


def _reader_resources(ingestion: PostgresIngestion, config: OperatorConfig) -> dict:
    if ingestion.spec.reader.resources is not None:
        return ingestion.spec.reader.resources.model_dump(mode="json", exclude_none=True)
    return {kind: dict(values) for kind, values in config.reader_resources}


def _identity(ingestion: PostgresIngestion, config: OperatorConfig) -> dict:
    """The pod's service account (when one is configured) and image pull secrets."""
    account = ingestion.spec.reader.service_account or config.reader_service_account
    spec: dict[str, object] = {"serviceAccountName": account} if account else {}
    if config.image_pull_secrets:
        spec["imagePullSecrets"] = config.pull_secrets()
    return spec


# reader ----------------------------------------------------------------------------------

def reader_deployment(ingestion: PostgresIngestion, uid: str, config: OperatorConfig,
                      command: list[str], *, replicas: int) -> dict:
    spec = ingestion.spec
    env = [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
           *_secret_env(ingestion, catalog=False)]
    volumes, mounts = _source_ca(ingestion)
    pod_labels = labels(ingestion, "reader")
    container = {
        "name": "reader",
        "image": spec.reader.image or config.image,
        "imagePullPolicy": config.image_pull_policy,
        "command": command,
        "env": env,
        "ports": [{"name": "metrics", "containerPort": READER_METRICS_PORT}],
        "resources": _reader_resources(ingestion, config),
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "metrics"},
                          "periodSeconds": 20, "failureThreshold": 6},
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": "metrics"},
                           "periodSeconds": 10},
        "securityContext": _container_security(),
        "volumeMounts": [*mounts, {"name": "tmp", "mountPath": "/tmp"}],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(ingestion, uid, reader_name(ingestion), "reader"),
        "spec": {
            "replicas": replicas,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {INGESTION_LABEL: ingestion.metadata.name,
                                         COMPONENT_LABEL: "reader"}},
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    **_identity(ingestion, config),
                    "automountServiceAccountToken": False,
                    "terminationGracePeriodSeconds": 60,
                    "securityContext": _pod_security(),
                    "containers": [container],
                    "volumes": [*volumes, {"name": "tmp", "emptyDir": {}}],
                },
            },
        },
    }


# verification ----------------------------------------------------------------------------

def verify_name(ingestion: PostgresIngestion, token: str) -> str:
    """The Job of one verification request: a new token, a new Job."""
    return child_name(ingestion, f"verify-{hashlib.sha256(token.encode()).hexdigest()[:10]}")


def verify_job(ingestion: PostgresIngestion, uid: str, config: OperatorConfig,
               command: list[str], *, token: str) -> dict:
    """The Job running ``command`` (``lakeslot verify`` for the request ``token``) once; the image
    and credentials of the reader, plus the catalog's Secret-backed properties."""
    spec = ingestion.spec
    env = _secret_env(ingestion, catalog=True)
    if spec.source.ca_secret_ref is not None:
        env.append({"name": CA_FILE_ENV, "value": CA_FILE})  # a path: the file is the Secret
    volumes, mounts = _source_ca(ingestion)
    name = verify_name(ingestion, token)
    volume, mount = _input_volume(name)
    volumes.append(volume)
    mounts.append(mount)
    metadata = _metadata(ingestion, uid, name, "verify")
    metadata["annotations"] = {VERIFY: token}
    container = {
        "name": "verify",
        "image": spec.reader.image or config.image,
        "imagePullPolicy": config.image_pull_policy,
        "command": command,
        "env": env,
        "securityContext": _container_security(),
        "volumeMounts": [*mounts, {"name": "tmp", "mountPath": "/tmp"}],
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": VERIFY_DEADLINE_SECONDS,
            "ttlSecondsAfterFinished": VERIFY_TTL_SECONDS,
            "template": {
                "metadata": {"labels": labels(ingestion, "verify")},
                "spec": {
                    **_identity(ingestion, config),
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "securityContext": _pod_security(),
                    "containers": [container],
                    "volumes": [*volumes, {"name": "tmp", "emptyDir": {}}],
                },
            },
        },
    }


# Spark -----------------------------------------------------------------------------------

def _secret_conf(ingestion: PostgresIngestion) -> dict[str, str]:
    """Spark-native Secret wiring: env vars and mounted files for driver and executors."""
    source = ingestion.spec.source
    conf: dict[str, str] = {}
    for role in ("driver", "executor"):
        if source.password_secret_ref is not None:
            ref = source.password_secret_ref
            conf[f"spark.kubernetes.{role}.secretKeyRef.{PASSWORD_ENV}"] = f"{ref.name}:{ref.key}"
        if source.ca_secret_ref is not None:
            conf[f"spark.kubernetes.{role}.secrets.{source.ca_secret_ref.name}"] = CA_MOUNT
            # Spark mounts the whole Secret, each key a file of its own name.
            env_prefix = "spark.kubernetes.driverEnv." if role == "driver" else "spark.executorEnv."
            conf[env_prefix + CA_FILE_ENV] = spark_ca_file(ingestion)
        variables = {catalog_secret_env(key): ref
                     for key, ref in ingestion.spec.sink.catalog.secret_properties.items()}
        variables.update((e.name, e.secret_key_ref) for e in ingestion.spec.secret_env)
        for name, ref in variables.items():
            conf[f"spark.kubernetes.{role}.secretKeyRef.{name}"] = f"{ref.name}:{ref.key}"
    return conf


def spark_ca_file(ingestion: PostgresIngestion) -> str:
    """Where the CA is in a Spark pod: the mounted Secret's key, a file of its own name."""
    ref = ingestion.spec.source.ca_secret_ref
    assert ref is not None
    return posixpath.join(CA_MOUNT, ref.key)


def _spark_application(ingestion: PostgresIngestion, uid: str, config: OperatorConfig, *,
                       name: str, component: str, main_file: str, arguments: list[str],
                       driver, executor, restart: dict, ttl: int | None) -> dict:
    spark = ingestion.spec.spark
    role_labels = labels(ingestion, component)
    account = spark.service_account or config.spark_service_account  # executors too: workload identity
    spec: dict[str, object] = {
        "type": "Python",
        "pythonVersion": "3",
        "mode": "cluster",
        "image": spark.image or config.image,
        "imagePullPolicy": config.image_pull_policy,
        "mainApplicationFile": main_file,
        "arguments": arguments,
        "sparkVersion": spark.spark_version,
        "restartPolicy": restart,
        "sparkConf": {**iceberg_conf(ingestion.spec.sink.catalog), **_secret_conf(ingestion),
                      **spark.spark_conf},
        "driver": _spark_pod("driver", driver, role_labels, account, config, job_input=name),
        "executor": _spark_pod("executor", executor, role_labels, account, config),
    }
    if config.image_pull_secrets:
        spec["imagePullSecrets"] = list(config.image_pull_secrets)
    if spark.jars:
        spec["deps"] = {"jars": list(spark.jars)}
    if ttl is not None:
        spec["timeToLiveSeconds"] = ttl
    return {
        "apiVersion": SPARK_API_VERSION,
        "kind": "SparkApplication",
        "metadata": _metadata(ingestion, uid, name, component),
        "spec": spec,
    }


def snapshot_name(ingestion: PostgresIngestion, generation: str) -> str:
    return spark_name(ingestion, f"snapshot-{generation}")


def snapshot_application(ingestion: PostgresIngestion, uid: str, config: OperatorConfig,
                         arguments: list[str], *, generation: str) -> dict:
    spark = ingestion.spec.spark
    return _spark_application(
        ingestion, uid, config, name=snapshot_name(ingestion, generation), component="snapshot",
        main_file="local:///opt/lakeslot/spark_jobs/snapshot.py", arguments=arguments,
        driver=spark.driver, executor=spark.executor,
        restart={"type": "OnFailure", "onFailureRetries": 3, "onFailureRetryInterval": 30,
                 "onSubmissionFailureRetries": 5, "onSubmissionFailureRetryInterval": 30},
        ttl=SNAPSHOT_TTL_SECONDS)


def apply_name(ingestion: PostgresIngestion) -> str:
    return spark_name(ingestion, "apply")


def reader_name(ingestion: PostgresIngestion) -> str:
    return child_name(ingestion, "reader")


def apply_application(ingestion: PostgresIngestion, uid: str, config: OperatorConfig,
                      arguments: list[str]) -> dict:
    spark, apply = ingestion.spec.spark, ingestion.spec.apply
    return _spark_application(
        ingestion, uid, config, name=apply_name(ingestion), component="apply",
        main_file="local:///opt/lakeslot/spark_jobs/apply.py", arguments=arguments,
        driver=apply.driver or spark.driver, executor=apply.executor or spark.executor,
        restart={"type": "OnFailure", "onFailureRetries": 1_000_000, "onFailureRetryInterval": 30,
                 "onSubmissionFailureRetries": 1_000_000, "onSubmissionFailureRetryInterval": 30},
        ttl=None)
