"""What spark-operator and Spark do with a SparkApplication, replayed offline from their published
rules (neither can run here), for tests/test_spark_operator_contract.py.

- ``SCHEMAS``: the vendored SparkApplication schema excerpts (tests/data/spark-operator/, each
  file's header names its source repository, path, commit and version); ``schema_problems`` checks
  an application against one strictly: JSON-schema errors, plus every field the API server would
  prune (not declared by the schema).
- ``webhook_problems``: the checks of spark-operator's validating webhook that depend on what
  lakeslot writes — ``validateObjectName`` (kubeflow/spark-operator internal/webhook/validation.go:
  the name must be a DNS-1035 label, since the operator derives Service names from it, e.g. the UI
  Service ``<name>-ui-svc``) and ``validateSparkConf`` (internal/webhook/sparkconf_validator.go:
  denied keys, and ``spark.kubernetes.namespace`` only equal to the application's namespace).
- ``pod_view``: the driver or executor pod Spark 3.5 and spark-operator make of an application, as
  far as lakeslot's settings go: the role's pod template when there is one (spark-operator ≥ 2.1
  writes ``spec.{driver,executor}.template`` to a file for ``spark.kubernetes.{role}.podTemplateFile``
  and names the container to build on, ``spark-kubernetes-{role}``, in
  ``podTemplateContainerName``; Spark keeps the template's security contexts and falls back to the
  first container when none has that name), environment variables from
  ``spark.kubernetes.driverEnv.*`` / ``spark.executorEnv.*`` and ``secretKeyRef``s, a Secret named
  in ``spark.kubernetes.{driver,executor}.secrets.<name>=<path>`` mounted whole as the volume
  ``<name>-volume`` (Spark's MountSecretsFeatureStep) with one file per key, the template's own
  volumes and the mounts of its container (Spark keeps them), and, with ``webhook``
  (spark-operator's mutating webhook running: internal/webhook/sparkpod_defaulter.go), the role's
  ``securityContext`` (the container) and ``podSecurityContext`` (the pod) set over whatever the
  template said, and each ConfigMap of the role's ``configMaps`` mounted at its path as the volume
  ``<name>-vol`` cut to 63 characters (``addGeneralConfigMaps``), one file per key.
- ``submit_command``, ``pod_environment`` and ``spark_home``: an application's driver run here as
  spark-operator submits it (tests/test_multi_executor.py) — its ``spark-submit`` command line, the
  pod's environment with the values of the Secrets it names, and a ``SPARK_HOME`` laid out like the
  image's.
"""

from __future__ import annotations

import copy
import os
import posixpath
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from lakeslot.api.cluster import DENIED_SPARK_CONF
from tests.support.kube_emulator import prune, to_json_schema

DATA = Path(__file__).resolve().parents[1] / "data" / "spark-operator"
SCHEMAS = {path.name.removeprefix("sparkapplication-").removesuffix(".schema.yaml"): path
           for path in sorted(DATA.glob("sparkapplication-*.schema.yaml"))}
DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
UI_SERVICE_SUFFIX = "-ui-svc"
SECRET_VOLUME_SUFFIX = "-volume"
CONFIG_MAP_VOLUME_SUFFIX = "-vol"  # spark-operator's webhook, cut to 63 characters
SECRET_REF = "secretKeyRef:"  # pod_view's form of an environment variable from a Secret
IMAGE_ROOT = "local:///opt/lakeslot/"  # the Spark jobs' main files in the image (Dockerfile)


def load_schema(version: str) -> dict[str, Any]:
    return yaml.safe_load(SCHEMAS[version].read_text())


def schema_problems(app: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    problems = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
                for e in jsonschema.Draft202012Validator(to_json_schema(schema)).iter_errors(app)]
    kept = prune(copy.deepcopy(app), schema, object_meta=True)
    if kept != app:
        problems.append(f"fields the API server would prune: {_pruned(app, kept)}")
    return problems


def _pruned(full: Any, kept: Any, path: str = "") -> list[str]:
    if isinstance(full, dict) and isinstance(kept, dict):
        return [p for key in full for p in
                ([f"{path}.{key}"] if key not in kept else _pruned(full[key], kept[key], f"{path}.{key}"))]
    return []


def is_dns1035_label(name: str) -> bool:
    return len(name) <= 63 and DNS1035_LABEL.fullmatch(name) is not None


def webhook_problems(app: dict[str, Any]) -> list[str]:
    name, namespace = app["metadata"]["name"], app["metadata"]["namespace"]
    problems = []
    if not is_dns1035_label(name):
        problems.append(f"metadata.name {name!r} is not a DNS-1035 label")
    if not is_dns1035_label(name + UI_SERVICE_SUFFIX):
        problems.append(f"the UI Service {name + UI_SERVICE_SUFFIX!r} is not a DNS-1035 label")
    for key, value in (app["spec"].get("sparkConf") or {}).items():
        if key == "spark.kubernetes.namespace":
            if value != namespace:
                problems.append(f"sparkConf key {key!r} must equal the application namespace")
        elif key in DENIED_SPARK_CONF:
            problems.append(f"sparkConf key {key!r} is not allowed")
    return problems


def pod_view(app: dict[str, Any], role: str, secrets: dict[str, dict[str, str]], *,
             webhook: bool = True, config_maps: Mapping[str, Mapping[str, str]] | None = None
             ) -> dict[str, Any]:
    """The ``role`` ("driver"/"executor") pod: ``env`` (name → value, or ``secretKeyRef`` text),
    ``files`` (path → content from mounted Secrets and ConfigMaps, given as ``secrets`` and
    ``config_maps``: name → key → value; one not given adds no file), ``volumes`` (names),
    ``mounts`` (the container's mount paths, in order), ``pod`` (a pod spec with the security
    contexts, volumes and mounts the template and, with ``webhook``, spark-operator's mutating
    webhook give it)."""
    config_maps = config_maps or {}
    conf = app["spec"].get("sparkConf") or {}
    env_prefix = "spark.kubernetes.driverEnv." if role == "driver" else "spark.executorEnv."
    env = {key.removeprefix(env_prefix): value for key, value in conf.items() if key.startswith(env_prefix)}
    ref_prefix = f"spark.kubernetes.{role}.secretKeyRef."
    env.update({key.removeprefix(ref_prefix): f"{SECRET_REF}{value}"
                for key, value in conf.items() if key.startswith(ref_prefix)})
    spec = app["spec"][role]
    name = f"spark-kubernetes-{role}"
    template = copy.deepcopy((spec.get("template") or {}).get("spec") or {})
    containers = template.get("containers") or [{}]
    base = next((c for c in containers if c.get("name") == name), containers[0])
    container = {**base, "name": name, "image": app["spec"]["image"]}
    volumes, mounts = list(template.get("volumes") or []), list(container.get("volumeMounts") or [])
    secret_prefix = f"spark.kubernetes.{role}.secrets."
    for key, path in conf.items():
        if key.startswith(secret_prefix):
            secret = key.removeprefix(secret_prefix)
            volumes.append({"name": secret + SECRET_VOLUME_SUFFIX, "secret": {"secretName": secret}})
            mounts.append({"name": secret + SECRET_VOLUME_SUFFIX, "mountPath": path})
    pod: dict[str, Any] = {**template, "containers": [container], "serviceAccountName": spec.get("serviceAccount")}
    if webhook:
        if "securityContext" in spec:
            container["securityContext"] = spec["securityContext"]
        if "podSecurityContext" in spec:
            pod["securityContext"] = spec["podSecurityContext"]
        for entry in spec.get("configMaps") or []:
            volume = (entry["name"] + CONFIG_MAP_VOLUME_SUFFIX)[:63]
            volumes.append({"name": volume, "configMap": {"name": entry["name"]}})
            mounts.append({"name": volume, "mountPath": entry["path"], "readOnly": True})
    by_name = {v["name"]: v for v in volumes}
    files: dict[str, str] = {}
    for mount in mounts:
        volume = by_name[mount["name"]]
        items = (secrets.get(volume["secret"]["secretName"]) if "secret" in volume
                 else config_maps.get(volume["configMap"]["name"])) or {}
        files.update({posixpath.join(mount["mountPath"], key): value for key, value in items.items()})
    if mounts:
        container["volumeMounts"] = mounts
    pod["volumes"] = volumes
    if app["spec"].get("imagePullSecrets"):
        pod["imagePullSecrets"] = [{"name": secret} for secret in app["spec"]["imagePullSecrets"]]
    return {"env": env, "files": files, "volumes": [v["name"] for v in volumes],
            "mounts": [m["mountPath"] for m in mounts], "pod": pod}


def pod_environment(app: dict[str, Any], role: str, secrets: dict[str, dict[str, str]]) -> dict[str, str]:
    """The variables Spark sets in the ``role`` pod of ``app`` (:func:`pod_view`), each
    ``secretKeyRef`` replaced by its value in ``secrets`` (name → key → value; KeyError when the
    application names a Secret or key that is not there)."""
    def resolved(value: str) -> str:
        if not value.startswith(SECRET_REF):
            return value
        secret, key = value.removeprefix(SECRET_REF).split(":", 1)
        return secrets[secret][key]

    return {name: resolved(value) for name, value in pod_view(app, role, secrets)["env"].items()}


def submit_command(app: dict[str, Any], *, spark_submit: str, master: str, root: Path,
                   conf: Mapping[str, str] | None = None) -> list[str]:
    """The ``spark-submit`` command spark-operator runs for ``app`` — the application's name, each
    ``sparkConf`` key, ``deps.jars``, the main application file and ``arguments`` — with ``master``
    instead of the cluster's and ``conf`` on top (settings of this machine). The main file, a path
    in the image (:data:`IMAGE_ROOT`), is taken at the same place under ``root`` (the checkout).
    What only pods have (cores, memory, instances, labels, security contexts, mounted Secrets) has
    no part in it: ``master`` says how many executors of which size."""
    spec = app["spec"]
    main = spec["mainApplicationFile"]
    assert main.startswith(IMAGE_ROOT), main
    settings = {"spark.app.name": app["metadata"]["name"], **(spec.get("sparkConf") or {}), **(conf or {})}
    command = [spark_submit, "--master", master]
    for key, value in settings.items():
        command += ["--conf", f"{key}={value}"]
    if (spec.get("deps") or {}).get("jars"):
        command += ["--jars", ",".join(spec["deps"]["jars"])]
    return [*command, str(root / main.removeprefix(IMAGE_ROOT)), *spec["arguments"]]


def spark_home(directory: Path, jars: Sequence[Path]) -> Path:
    """``directory`` made a ``SPARK_HOME`` like the image's (Dockerfile: the installed pyspark
    package, Iceberg's ``jars`` added to its ``jars/``), of links to that package: a
    ``local-cluster`` master's workers put their work directories (each executor's files and logs)
    in ``$SPARK_HOME/work`` — Spark's LocalSparkCluster gives them no other outside Spark's own
    tests — which must not be the installed package."""
    import pyspark

    package = Path(pyspark.__file__).parent
    directory.mkdir(parents=True, exist_ok=True)
    for entry in package.iterdir():
        if entry.name not in ("jars", "work"):
            (directory / entry.name).symlink_to(entry)
    (directory / "jars").mkdir()
    for jar in [*(package / "jars").iterdir(), *jars]:
        (directory / "jars" / os.path.basename(jar)).symlink_to(jar)
    return directory
