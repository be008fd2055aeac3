"""Kubernetes RBAC evaluated offline, what the operator calls, and a recorder of the API requests
a process makes.

- ``kube_calls()`` / ``kopf_calls()`` / ``expected_grants(values)``: the (verb, group, resource)
  the operator's code calls, derived as described below, and the grants the chart should give
  for a set of values. tests/test_rbac.py compares them with the rendered rules;
  tests/test_helm_operator.py checks the kopf part against the requests the real operator makes.
- ``request_attributes(method, path, query)`` turns an HTTP request to the API server into the
  attributes RBAC authorizes (verb, API group, resource[/subresource], namespace), as
  kube-apiserver's request-info resolution does; ``None`` for non-resource URLs.
- ``grants(manifests, account)`` expands the Roles/ClusterRoles that the rendered bindings give
  to a service account into single ``Grant``s; ``allowed(grants, attributes)`` decides a request.
  Only what the chart uses is modelled: no wildcards, ``resourceNames`` or aggregation
  (tests/test_rbac.py asserts the chart uses none of them).
- ``RecordingProxy`` is a reverse proxy in front of the Kubernetes API emulator that records every
  request line passing through it. A process pointed at the proxy (its kubeconfig) has exactly
  its own requests recorded, apart from the test's own calls, which go to the emulator directly.

How the operator's calls are derived:

- lakeslot's own calls: every Kubernetes call the operator makes goes through
  ``lakeslot_operator.kube.Kube`` (module invariant). Its source is parsed: each
  ``self.core|apps|batch.<verb>_namespaced_<kind>[_status]`` and
  ``self.custom.<verb>_namespaced_custom_object[_status]`` call becomes a permission, the verb
  from the method (read/get → get, replace → update, ...), the resource from the kind (plurals as
  the API server names them, from the emulator's table of built-in kinds) or, for custom objects,
  from ``kube.SPARK``.
- what the children's ownerReferences need (``owner_reference_calls``): ``update`` on
  ``postgresingestions/finalizers``, asked by OwnerReferencesPermissionEnforcement for
  ``blockOwnerDeletion: true`` (OpenShift enables it; the emulator does not enforce RBAC).
- kopf's calls, read from kopf's source (kopf/_core/reactor/observation.py, _core/engines/
  peering.py, _cogs/clients/{watching,patching,events}.py): it lists and watches the handled
  resource, merge- and JSON-patches it (finalizer, progress annotations) and its status
  subresource, posts core/v1 events, lists and watches CRDs (resource observation), lists and
  watches namespaces when it serves listed namespaces (namespace observation; not cluster-wide),
  and with peering lists, watches and patches its peering objects.

Failure modes: the proxy answers 502 when the upstream is unreachable; a client that disconnects
mid-stream (a watch cut by the process stopping) ends that request quietly.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import inspect
import json
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import aiohttp
import aiohttp.web

from lakeslot.api.models import GROUP, PLURAL, PostgresIngestion
from lakeslot_operator import children, kube
from tests.api_cases import base_document
from tests.support.kube_emulator import BUILTIN_RESOURCES

# Non-resource URLs every authenticated identity may GET (ClusterRoles system:discovery and
# system:public-info-viewer): API discovery and the server version.
DISCOVERY_PREFIXES = ("/api", "/apis", "/version", "/openapi")
NAMESPACE_SUBRESOURCES = ("status", "finalize")
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host",
               "upgrade", "proxy-connection", "te", "trailer"}


@dataclasses.dataclass(frozen=True, order=True)
class Attributes:
    verb: str
    group: str
    resource: str  # "plural" or "plural/subresource"
    namespace: str | None  # None: a cluster-scoped object, or a collection across namespaces


@dataclasses.dataclass(frozen=True, order=True)
class Grant:
    namespace: str | None  # None: cluster-wide (a ClusterRole bound by a ClusterRoleBinding)
    verb: str
    group: str
    resource: str


API_GROUPS = {"CoreV1Api": "", "AppsV1Api": "apps", "BatchV1Api": "batch"}
Admission = Callable[[str, str, Any], "tuple[int, dict[str, Any]] | None"]


def status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    """A metav1.Status as the API server answers a refused request."""
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


def owner_references_enforcement(granted: set[Grant]) -> Admission:
    """OwnerReferencesPermissionEnforcement (kube-apiserver admission, on in OpenShift): creating
    or replacing an object whose ownerReference sets ``blockOwnerDeletion`` needs ``update`` on
    the owner's ``finalizers``; without it the server answers 403 with this message."""
    def admit(method: str, path: str, body: Any) -> tuple[int, dict[str, Any]] | None:
        if method not in ("POST", "PUT") or not isinstance(body, dict):
            return None
        attributes = request_attributes(method, path, {})
        for reference in (body.get("metadata") or {}).get("ownerReferences") or []:
            group = reference["apiVersion"].rpartition("/")[0]
            needed = Attributes("update", group, f"{PLURAL}/finalizers",
                                attributes.namespace if attributes else None)
            if reference.get("blockOwnerDeletion") and not allowed(granted, needed):
                kind = attributes.resource if attributes else "object"
                return 403, status_body(403, "Forbidden", (
                    f'{kind} "{body["metadata"].get("name")}" is forbidden: cannot set '
                    "blockOwnerDeletion if an ownerReference refers to a resource you can't set "
                    f'finalizers on: cannot update resource "{needed.resource}" in API group '
                    f'"{group}" in the namespace "{needed.namespace}", <nil>'))
        return None
    return admit
CLIENT_VERBS = {"read": "get", "get": "get", "list": "list", "create": "create",
                "replace": "update", "patch": "patch", "delete": "delete"}


def _kube_clients() -> dict[str, str]:
    """``self.<attribute>`` → client class name, from ``Kube.__init__``."""
    clients = {}
    for node in ast.walk(ast.parse(inspect.getsource(kube.Kube.__init__).strip())):
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Attribute)):
            (target,) = node.targets
            assert isinstance(target, ast.Attribute), ast.unparse(node)  # self.<attribute> = ...
            clients[target.attr] = node.value.func.attr
    return clients


def _plural(group: str, kind: str) -> str:
    (found,) = [rt.plural for rt in BUILTIN_RESOURCES
                if rt.group == group and rt.kind.lower() == kind.replace("_", "")]
    return found


def kube_calls() -> set[tuple[str, str, str]]:
    """(verb, group, resource) of every Kubernetes API call in ``Kube``."""
    clients = _kube_clients()
    calls = set()
    for node in ast.walk(ast.parse(inspect.getsource(kube))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Attribute)
                and isinstance(node.func.value.value, ast.Name) and node.func.value.value.id == "self"
                and node.func.value.attr in clients):
            continue
        client, method = clients[node.func.value.attr], node.func.attr
        verb, _, rest = method.partition("_namespaced_")
        assert verb in CLIENT_VERBS and rest, f"Kube calls {client}.{method}: not a namespaced call"
        subresource = "/status" if rest.endswith("_status") else ""
        kind = rest.removesuffix("_status")
        if client == "CustomObjectsApi":
            assert kind == "custom_object" and ast.unparse(node.args[0]) == "*SPARK[:2]", ast.unparse(node)
            group, resource = kube.SPARK[0], kube.SPARK[2]
        else:
            group = API_GROUPS[client]
            resource = _plural(group, kind)
        calls.add((CLIENT_VERBS[verb], group, resource + subresource))
    return calls


def kopf_calls(*, clusterwide: bool, peering: bool) -> tuple[set, set]:
    """kopf's (verb, group, resource): (cluster-scoped ones, ones in each served namespace)."""
    cluster = {("list", "apiextensions.k8s.io", "customresourcedefinitions"),
               ("watch", "apiextensions.k8s.io", "customresourcedefinitions")}
    if not clusterwide:
        cluster |= {("list", "", "namespaces"), ("watch", "", "namespaces")}
    served = {("list", GROUP, PLURAL), ("watch", GROUP, PLURAL), ("patch", GROUP, PLURAL),
              ("patch", GROUP, f"{PLURAL}/status"), ("create", "", "events")}
    if peering:
        target = cluster if clusterwide else served
        target |= {(verb, "kopf.dev", "clusterkopfpeerings" if clusterwide else "kopfpeerings")
                   for verb in ("list", "watch", "patch")}
    return cluster, served


def owner_reference_calls() -> set[tuple[str, str, str]]:
    """What the children's ownerReferences need: ``blockOwnerDeletion: true`` makes the API
    server's OwnerReferencesPermissionEnforcement admission (on by default in OpenShift) ask for
    ``update`` on the owner's ``finalizers`` subresource when a child is created or changed."""
    reference = children.owner_reference(PostgresIngestion.model_validate(base_document()), "uid")
    return {("update", GROUP, f"{PLURAL}/finalizers")} if reference.get("blockOwnerDeletion") else set()


def expected_grants(values: dict) -> set[Grant]:
    namespaces = values.get("watchNamespaces", [])
    cluster, served = kopf_calls(clusterwide=not namespaces, peering=values.get("replicaCount", 1) > 1)
    served |= kube_calls() | owner_reference_calls()
    if not namespaces:
        return {Grant(None, *call) for call in cluster | served}
    return {Grant(None, *call) for call in cluster} | \
        {Grant(namespace, *call) for namespace in namespaces for call in served}


def request_attributes(method: str, path: str, query: Mapping[str, str]) -> Attributes | None:
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 3 and parts[0] == "api":
        group, rest = "", parts[2:]
    elif len(parts) >= 4 and parts[0] == "apis":
        group, rest = parts[1], parts[3:]
    else:
        return None
    namespace = None
    if rest[0] == "namespaces" and len(rest) >= 2:
        namespace = rest[1]
        if len(rest) > 2 and rest[2] not in NAMESPACE_SUBRESOURCES:
            rest = rest[2:]
    resource = "/".join([rest[0], *rest[2:3]])
    named = len(rest) > 1
    if method == "GET":
        verb = "watch" if query.get("watch") in ("true", "1") else "get" if named else "list"
    elif method == "DELETE":
        verb = "delete" if named else "deletecollection"
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}[method]
    return Attributes(verb, group, resource, namespace)


def is_discovery(method: str, path: str) -> bool:
    return method == "GET" and any(path == p or path.startswith(p + "/") for p in DISCOVERY_PREFIXES)


def _binds(binding: Mapping[str, Any], account: tuple[str, str]) -> bool:
    namespace, name = account
    return any(s["kind"] == "ServiceAccount" and s["name"] == name and s.get("namespace") == namespace
               for s in binding.get("subjects", []))


def _expand(role: Mapping[str, Any], namespace: str | None) -> set[Grant]:
    return {Grant(namespace, verb, group, resource)
            for rule in role.get("rules", [])
            for group in rule["apiGroups"] for resource in rule["resources"] for verb in rule["verbs"]}


def grants(manifests: Iterable[Mapping[str, Any]], account: tuple[str, str]) -> set[Grant]:
    """Every (scope, verb, group, resource) the rendered RBAC gives the service account
    ``account`` = (namespace, name)."""
    manifests = list(manifests)
    roles = {(m["kind"], m["metadata"].get("namespace"), m["metadata"]["name"]): m
             for m in manifests if m["kind"] in ("Role", "ClusterRole")}
    found: set[Grant] = set()
    for binding in manifests:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding") or not _binds(binding, account):
            continue
        ref = binding["roleRef"]
        scope = binding["metadata"].get("namespace") if binding["kind"] == "RoleBinding" else None
        role_namespace = scope if ref["kind"] == "Role" else None
        found |= _expand(roles[(ref["kind"], role_namespace, ref["name"])], scope)
    return found


def allowed(granted: Iterable[Grant], attributes: Attributes) -> bool:
    return any(g.verb == attributes.verb and g.group == attributes.group
               and g.resource == attributes.resource
               and (g.namespace is None or g.namespace == attributes.namespace)
               for g in granted)


class RecordingProxy:
    """A reverse proxy on ``127.0.0.1:<free port>`` (``url``) in front of ``upstream``; every
    request is appended to ``requests`` as (method, path, query) before it is forwarded.
    Responses are streamed, so watches work through it. Runs its own event loop in a thread;
    use as a context manager.

    ``admit`` stands in for an admission step the emulator lacks (a webhook, Pod Security,
    OwnerReferencesPermissionEnforcement): called with (method, path, JSON body or None) before
    forwarding, it returns None to let the request through, or (HTTP status, Status body) to
    answer with instead, as the API server would."""

    def __init__(self, upstream: str, admit: Admission | None = None) -> None:
        self.upstream = upstream.rstrip("/")
        self.admit = admit
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="recording-proxy",
                                        daemon=True)
        self._runner: aiohttp.web.ServerRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    def __enter__(self) -> RecordingProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(30)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    async def _start(self) -> None:
        self._session = aiohttp.ClientSession(auto_decompress=False,
                                              timeout=aiohttp.ClientTimeout(total=None))
        self._runner = aiohttp.web.ServerRunner(aiohttp.web.Server(self._forward), shutdown_timeout=1.0)
        await self._runner.setup()
        site = aiohttp.web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def _stop(self) -> None:
        assert self._runner is not None and self._session is not None
        await self._session.close()
        await self._runner.cleanup()
        # Handlers of streams whose client went away may still wait on their connection.
        pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def _forward(self, request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        assert self._session is not None
        self.requests.append((request.method, request.path, dict(request.query)))
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        data = await request.read()
        if self.admit is not None:
            try:
                body = json.loads(data) if data else None
            except ValueError:
                body = None
            refusal = self.admit(request.method, request.path, body)
            if refusal is not None:
                return aiohttp.web.json_response(refusal[1], status=refusal[0])
        try:
            upstream = await self._session.request(request.method, self.upstream + request.raw_path,
                                                   headers=headers, data=data)
        except aiohttp.ClientError as e:
            return aiohttp.web.Response(status=502, text=f"upstream unreachable: {e}")
        async with upstream:
            response = aiohttp.web.StreamResponse(status=upstream.status, headers={
                k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_BY_HOP})
            try:
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
            except (ConnectionError, aiohttp.ClientError):
                pass  # either side went away (a watch cut when the process stopped)
        return response
