"""A Kubernetes API server emulator on localhost, built on kmock, for kopf and the official client.

What it emulates
================
One in-memory cluster served over plain HTTP on ``127.0.0.1:<free port>`` by a background thread
with its own event loop (so synchronous tests, the official ``kubernetes`` client and a kopf
operator in yet another thread all talk to it over real sockets):

* the REST verbs on resources: get, list, watch, create (POST), replace (PUT), patch (JSON patch,
  merge patch, strategic merge patch, server-side apply), delete, deletecollection; the ``status``
  subresource; label selectors and field selectors on list, watch and deletecollection;
  ``limit``/``continue`` paging; ``generateName``;
* discovery (``/api``, ``/api/v1``, ``/apis``, ``/apis/<group>``, ``/apis/<group>/<version>``) and
  ``/version``;
* built-in kinds an operator needs (see ``BUILTIN_RESOURCES``) and CustomResourceDefinitions, which
  register their resources when created and unregister them when gone;
* validation of custom resources against the CRD version's ``openAPIV3Schema`` (structural pruning,
  defaulting, JSON-schema keywords via ``jsonschema``, ``x-kubernetes-list-type`` set/map
  uniqueness, ``x-kubernetes-validations`` CEL rules via
  the small evaluator at the end of this module), and metadata validation for every object
  (name format, label keys/values, annotation keys, ownerReference fields);
* the effects of the built-in controllers that an operator relies on, done synchronously inside
  the request that causes them: ownerReference garbage collection (background and orphan),
  namespace termination (its contents are deleted, then the namespace) and CRD termination (its
  custom resources are deleted, then the CRD).

Invariants
==========
* ``metadata.resourceVersion`` comes from one global counter; every stored change gets a strictly
  greater one, is appended to its resource's event history and is offered to live watches in the
  same atomic step. All state changes happen synchronously on the emulator's event loop, so each
  request is atomic and watches observe changes in resourceVersion order, without gaps.
* ``uid``, ``creationTimestamp``, ``generation``, ``deletionTimestamp`` and ``resourceVersion`` are
  server-owned: clients cannot set or change them. ``generation`` starts at 1 and grows by one on
  each change outside ``metadata`` (and outside ``status`` when the status subresource is enabled,
  as in Kubernetes: otherwise status changes count too) and when deletion starts.
* With the status subresource, writes to the main resource keep the stored ``status`` and writes
  to ``/status`` change only ``status``. A write that changes nothing stores nothing (no new
  resourceVersion, no event).
* An object with finalizers (or a namespace/CRD with remaining contents) is only marked with
  ``deletionTimestamp`` on delete; it disappears in the request that empties its last blocker.
  No new finalizers can be added once deletion has started.
* A watch started at resourceVersion N replays exactly the kept events newer than N; if events
  after N were dropped (history cap, ``reset()``), it gets ``410 Gone`` as an ERROR event.
* Only failures of the emulator itself answer HTTP 500; they are recorded and exposed by
  ``KubeEmulator.pop_internal_errors()`` (the ``kube`` fixture fails a test that caused any).

Deliberately not emulated (and why)
===================================
* Authentication, authorization (RBAC objects are stored, not enforced), admission webhooks,
  API priority and fairness, protobuf/CBOR encodings, ``dryRun`` (answered with 400 so that no
  caller silently persists), ``managedFields``: tests of an operator do not need them.
* Controllers that act on workloads: nothing schedules pods, fills a Deployment's status, assigns
  Service cluster IPs or issues ServiceAccount tokens. Tests set such status themselves (through
  ``/status``) to simulate those controllers. No ``scale`` subresource.
* Schema validation of built-in kinds (only their metadata is validated): use
  ``kubernetes-validate`` on manifests for that. CRD conversion webhooks: multi-version CRDs are
  served with strategy ``None`` (only ``apiVersion`` changes), as Kubernetes does without a webhook.
* Server-side apply has no field ownership: ``apply-patch+yaml`` creates the object if missing and
  otherwise merges like a strategic merge patch (built-ins) or a JSON merge patch (custom
  resources); it never removes fields and never reports conflicts. Strategic merge merges keyed
  lists by field name (``STRATEGIC_MERGE_KEYS``), not by the per-kind OpenAPI extensions, and
  supports only the ``$patch: replace|delete`` and ``$deleteFromPrimitiveList`` directives.
* ``propagationPolicy=Foreground`` behaves like ``Background``. Garbage collection is
  synchronous (dependents are gone when the owner's DELETE answers), unlike the real, eventual one.
* Namespaces are auto-created (as ``Active``) when an object is created in a missing namespace,
  instead of answering 404: tests need not create namespaces first. Creating into a terminating
  namespace is forbidden (403) like in Kubernetes.
* List paging is served from the live state (an object created between pages, after the last key
  served, appears on a later page); ``resourceVersion``/``resourceVersionMatch`` on lists are
  ignored (lists are always current); ``shardSelector`` is ignored; watch bookmarks are sent only
  to end ``sendInitialEvents`` streams, never periodically.
* Core ``v1`` events and ``events.k8s.io/v1`` events are stored separately (Kubernetes converts
  between them). Defaults of a CRD schema are applied on writes, not when reading old objects.
  ``fieldValidation`` is ignored: unknown fields are pruned silently. Every kind gets
  ``metadata.generation`` (in Kubernetes some built-ins, e.g. ConfigMap, have none).
* Scale: state changes are cheap, but each removal scans all objects for dependents (O(objects))
  and each watch start scans its resource's event history; fine for thousands of objects.
* CEL: see the CEL section below for the supported subset. Rules using anything else make the CRD
  creation fail with 422 naming the rule, so a missing feature is visible, never silently skipped.
  Transition rules (``oldSelf``) are correlated through object properties and
  ``x-kubernetes-list-type: map`` keys only; no cost limits; ``optionalOldSelf`` is unsupported.

kmock parts relied on
=====================
``kmock.KubernetesScaffold`` (subclassed by ``ApiServer``) provides the HTTP entry point
``RawHandler.__call__`` with request parsing and error accumulation (``errors``: the source of
``pop_internal_errors()``), the ``kmock.KubernetesError`` exception, the 500 rendering with a
traceback, and the DSL routes for ``/``, ``/api``, ``/apis...`` and ``/version``; ``ApiServer``
overrides the discovery data methods (``_serve_api``, ``_serve_apis``, ``_serve_group``,
``_serve_version``, ``_get_resources``) to serve from its registry, and ``_render_error`` to
render Status bodies without tracebacks. Tests can still add kmock DSL reactions for
non-resource paths (``KubeEmulator.server``, from ``run_in_loop``).

Resource paths are served directly, not through the DSL: kmock matches every request by
replaying the whole recorded history through each reaction's filters (O(n) per request, O(n²)
overall), so ``ApiServer`` keeps that history to a short deque (``_requests``), serves resource
requests without recording them, and clears the reactions' records on ``reset()``.
kmock's ``KubernetesEmulator`` (its store has no uids/resourceVersions and applies every write as
a merge: each behaviour above would be an override), ``Server`` (its ``AiohttpInterceptor`` patches
aiohttp's resolver process-wide, which would leak into a kopf operator running in another
thread) and path parser (fails on ``/api/v1/namespaces``) are not used.
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import collections
import contextlib
import copy
import dataclasses
import datetime
import functools
import ipaddress
import itertools
import json
import logging
import math
import random
import re
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import jsonpointer
import jsonschema
import kmock
import kubernetes.client
import yaml

logger = logging.getLogger(__name__)

TypeKey = tuple[str, str]  # (group, plural): one storage per resource, shared by its versions
ObjectKey = tuple[str, str]  # (namespace or '', name)

NAMESPACES: TypeKey = ('', 'namespaces')
CRDS: TypeKey = ('apiextensions.k8s.io', 'customresourcedefinitions')
SECRETS: TypeKey = ('', 'secrets')
DEFAULT_NAMESPACES = ('default', 'kube-system', 'kube-public', 'kube-node-lease')
EVENT_HISTORY_LIMIT = 10_000  # per resource; older watch resourceVersions get 410 Gone
WATCH_POLL_SECONDS = 1.0  # how often an idle watch checks for a disconnected client


# ================================================================================================
# Errors in the shape of the Kubernetes Status object
# ================================================================================================

def api_error(code: int, reason: str, message: str, **details: Any) -> kmock.KubernetesError:
    return kmock.KubernetesError(status=code, reason=reason, message=message, details=details)


def bad_request(message: str) -> kmock.KubernetesError:
    return api_error(400, 'BadRequest', message)


def status_body(error: kmock.KubernetesError) -> dict[str, Any]:
    body: dict[str, Any] = {'kind': 'Status', 'apiVersion': 'v1', 'metadata': {}, 'status': 'Failure',
                            'message': error.message, 'reason': error.reason, 'code': error.status}
    if error.details:
        body['details'] = error.details
    return body


_FIELD_ERROR_REASONS = {
    'Invalid value': 'FieldValueInvalid',
    'Required value': 'FieldValueRequired',
    'Unsupported value': 'FieldValueNotSupported',
    'Too long': 'FieldValueTooLong',
    'Too many': 'FieldValueTooMany',
    'Duplicate value': 'FieldValueDuplicate',
    'Forbidden': 'FieldValueForbidden',
}
_CEL_REASON_TYPES = {reason: type_ for type_, reason in _FIELD_ERROR_REASONS.items()}
_NO_VALUE = object()


@dataclasses.dataclass(frozen=True)
class FieldError:
    """One cause of a 422 Invalid answer, formatted like Kubernetes' ``field.Error``."""
    field: str
    type: str  # a key of _FIELD_ERROR_REASONS
    detail: str = ''
    value: Any = _NO_VALUE

    @property
    def body(self) -> str:
        parts = [self.type]
        if self.value is not _NO_VALUE:
            parts.append(go_value(self.value))
        if self.detail:
            parts.append(self.detail)
        return ': '.join(parts)

    def __str__(self) -> str:
        return f'{self.field}: {self.body}' if self.field else self.body

    def cause(self) -> dict[str, str]:
        return {'reason': _FIELD_ERROR_REASONS[self.type], 'message': self.body, 'field': self.field}


def go_value(value: Any) -> str:
    """Render a value the way Kubernetes prints it in field errors."""
    if isinstance(value, bool):
        return 'true' if value else 'false'
    if value is None:
        return 'null'
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(value, separators=(',', ':'))


def type_name(value: Any) -> str:
    """The OpenAPI type name of a JSON value."""
    if isinstance(value, bool):
        return 'boolean'
    return {dict: 'object', list: 'array', str: 'string', int: 'integer', float: 'number',
            bytes: 'bytes'}.get(type(value), 'null')


def field_path(parts: Iterable[str | int]) -> str:
    text = ''
    for part in parts:
        text += f'[{part}]' if isinstance(part, int) else (f'.{part}' if text else part)
    return text


# ================================================================================================
# Resource types: built-ins and those defined by CRDs
# ================================================================================================

@dataclasses.dataclass(frozen=True)
class VersionSpec:
    name: str
    subresources: frozenset[str] = frozenset()
    schema: Mapping[str, Any] | None = None  # openAPIV3Schema of a custom resource version
    validator: jsonschema.protocols.Validator | None = dataclasses.field(default=None, compare=False)


@dataclasses.dataclass(frozen=True)
class ResourceType:
    group: str
    plural: str
    kind: str
    namespaced: bool
    versions: tuple[VersionSpec, ...]  # served versions, the preferred one first
    storage_version: str
    singular: str = ''
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    name_format: str = 'subdomain'  # a key of NAME_FORMATS
    field_labels: tuple[str, ...] = ()  # field selectors beyond metadata.name/namespace
    crd: str | None = None  # the defining CRD's name, for custom resources

    @property
    def key(self) -> TypeKey:
        return self.group, self.plural

    @property
    def qualified(self) -> str:  # as in messages: "configmaps", "widgets.example.com"
        return f'{self.plural}.{self.group}' if self.group else self.plural

    @property
    def qualified_kind(self) -> str:  # as in Invalid messages: "ConfigMap", "Widget.example.com"
        return f'{self.kind}.{self.group}' if self.group else self.kind

    def api_version(self, version: str) -> str:
        return f'{self.group}/{version}' if self.group else version

    def version(self, name: str) -> VersionSpec | None:
        return next((spec for spec in self.versions if spec.name == name), None)

    def not_found(self, name: str) -> kmock.KubernetesError:
        return api_error(404, 'NotFound', f'{self.qualified} "{name}" not found',
                         name=name, group=self.group, kind=self.plural)

    def conflict(self, name: str, why: str) -> kmock.KubernetesError:
        return api_error(409, 'Conflict', f'Operation cannot be fulfilled on {self.qualified} "{name}": {why}',
                         name=name, group=self.group, kind=self.plural)

    def invalid(self, name: str, errors: list[FieldError]) -> kmock.KubernetesError:
        causes = errors[0] if len(errors) == 1 else f"[{', '.join(map(str, errors))}]"
        return api_error(422, 'Invalid', f'{self.qualified_kind} "{name}" is invalid: {causes}',
                         name=name, group=self.group, kind=self.kind,
                         causes=[error.cause() for error in errors])


def _builtin(api_version: str, plural: str, kind: str, *, namespaced: bool = True,
             short: tuple[str, ...] = (), status: bool = False, categories: tuple[str, ...] = (),
             name_format: str = 'subdomain', field_labels: tuple[str, ...] = ()) -> ResourceType:
    group, _, version = api_version.rpartition('/')
    subresources = frozenset({'status'}) if status else frozenset()
    return ResourceType(group=group, plural=plural, kind=kind, namespaced=namespaced,
                        versions=(VersionSpec(version, subresources),), storage_version=version,
                        singular=kind.lower(), short_names=short, categories=categories,
                        name_format=name_format, field_labels=field_labels)


BUILTIN_RESOURCES: tuple[ResourceType, ...] = (
    _builtin('v1', 'namespaces', 'Namespace', namespaced=False, short=('ns',), status=True,
             name_format='label', field_labels=('status.phase',)),
    _builtin('v1', 'pods', 'Pod', short=('po',), status=True, categories=('all',),
             field_labels=('spec.nodeName', 'spec.serviceAccountName', 'status.phase')),
    _builtin('v1', 'services', 'Service', short=('svc',), status=True, categories=('all',),
             name_format='dns1035'),
    _builtin('v1', 'serviceaccounts', 'ServiceAccount', short=('sa',)),
    _builtin('v1', 'configmaps', 'ConfigMap', short=('cm',)),
    _builtin('v1', 'secrets', 'Secret', field_labels=('type',)),
    _builtin('v1', 'events', 'Event', short=('ev',), field_labels=(
        'involvedObject.kind', 'involvedObject.namespace', 'involvedObject.name',
        'involvedObject.uid', 'involvedObject.apiVersion', 'reason', 'type', 'source')),
    _builtin('events.k8s.io/v1', 'events', 'Event', short=('ev',), field_labels=(
        'regarding.kind', 'regarding.namespace', 'regarding.name', 'regarding.uid',
        'reason', 'type', 'reportingController')),
    _builtin('apps/v1', 'deployments', 'Deployment', short=('deploy',), status=True, categories=('all',)),
    _builtin('batch/v1', 'jobs', 'Job', status=True, categories=('all',)),
    _builtin('rbac.authorization.k8s.io/v1', 'roles', 'Role'),
    _builtin('rbac.authorization.k8s.io/v1', 'rolebindings', 'RoleBinding'),
    _builtin('rbac.authorization.k8s.io/v1', 'clusterroles', 'ClusterRole', namespaced=False),
    _builtin('rbac.authorization.k8s.io/v1', 'clusterrolebindings', 'ClusterRoleBinding', namespaced=False),
    _builtin('coordination.k8s.io/v1', 'leases', 'Lease'),
    _builtin('apiextensions.k8s.io/v1', 'customresourcedefinitions', 'CustomResourceDefinition',
             namespaced=False, short=('crd', 'crds'), status=True),
)
RETURNS_DELETED_OBJECT = frozenset({('', 'pods'), ('', 'services')})  # others answer a Status
VERBS = ('create', 'delete', 'deletecollection', 'get', 'list', 'patch', 'update', 'watch')
SUBRESOURCE_VERBS = ('get', 'patch', 'update')

_KUBE_VERSION = re.compile(r'^v(\d+)(?:(alpha|beta)(\d+))?$')


def version_priority(version: str) -> tuple[Any, ...]:
    """Sort key putting the preferred version first: GA > beta > alpha, higher numbers first."""
    match = _KUBE_VERSION.match(version)
    if match is None:
        return 1, version
    stage = {None: 0, 'beta': 1, 'alpha': 2}[match.group(2)]
    return 0, stage, -int(match.group(1)), -int(match.group(3) or 0)


def resource_type_from_crd(crd: Mapping[str, Any]) -> ResourceType:
    spec = crd['spec']
    names = spec['names']
    served = sorted((v for v in spec['versions'] if v.get('served', True)),
                    key=lambda v: version_priority(v['name']))
    return ResourceType(
        group=spec['group'], plural=names['plural'], kind=names['kind'],
        namespaced=spec.get('scope', 'Namespaced') == 'Namespaced',
        versions=tuple(_crd_version(v) for v in served),
        storage_version=next(v['name'] for v in spec['versions'] if v.get('storage')),
        singular=names.get('singular') or names['kind'].lower(),
        short_names=tuple(names.get('shortNames') or ()),
        categories=tuple(names.get('categories') or ()),
        field_labels=tuple(f['jsonPath'].lstrip('.') for v in served for f in v.get('selectableFields') or ()),
        crd=crd['metadata']['name'],
    )


def _crd_version(version: Mapping[str, Any]) -> VersionSpec:
    schema = (version.get('schema') or {}).get('openAPIV3Schema') or {}
    subresources = frozenset({'status'} & set(version.get('subresources') or {}))
    validator = jsonschema.Draft202012Validator(to_json_schema(schema), format_checker=FORMATS)
    return VersionSpec(version['name'], subresources, schema, validator)


class Registry:
    """The resource types currently served, by storage key and by (group, version, plural)."""

    def __init__(self, types: Iterable[ResourceType]) -> None:
        self._types: dict[TypeKey, ResourceType] = {rt.key: rt for rt in types}

    def __iter__(self) -> Iterator[ResourceType]:
        return iter(list(self._types.values()))

    def add(self, rt: ResourceType) -> None:
        self._types[rt.key] = rt

    def remove(self, key: TypeKey) -> None:
        self._types.pop(key, None)

    def by_key(self, key: TypeKey) -> ResourceType | None:
        return self._types.get(key)

    def resolve(self, group: str, version: str, plural: str) -> tuple[ResourceType, VersionSpec] | None:
        rt = self._types.get((group, plural))
        spec = rt.version(version) if rt is not None else None
        return (rt, spec) if rt is not None and spec is not None else None

    def group_versions(self) -> dict[str, list[str]]:
        """Served versions per API group (core group '' included), the preferred version first."""
        groups: dict[str, set[str]] = collections.defaultdict(set)
        for rt in self:
            groups[rt.group].update(spec.name for spec in rt.versions)
        return {group: sorted(versions, key=version_priority) for group, versions in groups.items()}

    def discovery(self, group: str, version: str) -> list[dict[str, Any]]:
        resources = []
        for rt in self:
            spec = rt.version(version) if rt.group == group else None
            if spec is None:
                continue
            resources.append({'name': rt.plural, 'singularName': rt.singular, 'kind': rt.kind,
                              'namespaced': rt.namespaced, 'verbs': list(VERBS),
                              'shortNames': list(rt.short_names), 'categories': list(rt.categories)})
            resources.extend({'name': f'{rt.plural}/{sub}', 'singularName': '', 'kind': rt.kind,
                              'namespaced': rt.namespaced, 'verbs': list(SUBRESOURCE_VERBS)}
                             for sub in sorted(spec.subresources))
        return resources


# ================================================================================================
# Label and field selectors
# ================================================================================================

_SELECTOR_SPLIT = re.compile(r',(?![^()]*\))')
_REQ_NOT_EXISTS = re.compile(r'^!\s*(?P<key>[^\s!=(),]+)$')
_REQ_SET = re.compile(r'^(?P<key>[^\s!=(),]+)\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)$')
_REQ_EQUALITY = re.compile(r'^(?P<key>[^\s!=(),]+)\s*(?P<op>==|=|!=)\s*(?P<value>[^\s!=(),]*)$')
_REQ_EXISTS = re.compile(r'^(?P<key>[^\s!=(),]+)$')

Predicate = Callable[[Mapping[str, Any]], bool]


def parse_label_selector(text: str) -> list[Predicate]:
    """Predicates over a labels dict, one per requirement; 400 BadRequest if unparsable."""
    return [_label_requirement(part.strip()) for part in _SELECTOR_SPLIT.split(text) if part.strip()]


def _label_requirement(text: str) -> Predicate:
    if match := _REQ_NOT_EXISTS.match(text):
        key = match['key']
        return lambda labels: key not in labels
    if match := _REQ_SET.match(text):
        key, values = match['key'], {v.strip() for v in match['values'].split(',') if v.strip()}
        if match['op'] == 'in':
            return lambda labels: labels.get(key) in values
        return lambda labels: key not in labels or labels[key] not in values
    if match := _REQ_EQUALITY.match(text):
        key, value = match['key'], match['value']
        if match['op'] == '!=':
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    if match := _REQ_EXISTS.match(text):
        key = match['key']
        return lambda labels: key in labels
    raise bad_request(f'unable to parse requirement: {text!r}')


def parse_field_selector(text: str, rt: ResourceType) -> list[Predicate]:
    """Predicates over a whole object; only metadata.name/namespace and the type's field labels."""
    supported = ('metadata.name', 'metadata.namespace', *rt.field_labels)
    predicates = []
    for part in filter(None, (p.strip() for p in text.split(','))):
        match = _REQ_EQUALITY.match(part)
        if match is None:
            raise bad_request(f'invalid selector: {text!r}; can\'t understand {part!r}')
        if match['key'] not in supported:
            raise bad_request(f'field label not supported: {match["key"]}')
        predicates.append(_field_requirement(match['key'].split('.'), match['op'] == '!=', match['value']))
    return predicates


def _field_requirement(path: list[str], negate: bool, value: str) -> Predicate:
    def check(obj: Mapping[str, Any]) -> bool:
        current: Any = obj
        for part in path:
            current = current.get(part) if isinstance(current, Mapping) else None
        return (str(current if current is not None else '') == value) != negate
    return check


@dataclasses.dataclass(frozen=True)
class Selector:
    """Which objects a list/watch/deletecollection request addresses."""
    namespace: str | None = None  # None: all namespaces
    labels: tuple[Predicate, ...] = ()
    fields: tuple[Predicate, ...] = ()

    def matches(self, obj: Mapping[str, Any]) -> bool:
        meta = obj.get('metadata', {})
        if self.namespace is not None and meta.get('namespace') != self.namespace:
            return False
        labels = meta.get('labels') or {}
        return all(p(labels) for p in self.labels) and all(p(obj) for p in self.fields)


# ================================================================================================
# Patches
# ================================================================================================

# Strategic merge: keyed lists by field name (first candidate key present in an item wins) and
# primitive lists merged as sets. Kubernetes takes these from per-path OpenAPI extensions.
STRATEGIC_MERGE_KEYS: dict[str, tuple[str, ...]] = {
    'containers': ('name',), 'initContainers': ('name',), 'ephemeralContainers': ('name',),
    'volumes': ('name',), 'env': ('name',), 'volumeMounts': ('mountPath',),
    'volumeDevices': ('devicePath',), 'imagePullSecrets': ('name',), 'hostAliases': ('ip',),
    'ports': ('containerPort', 'port'), 'ownerReferences': ('uid',), 'conditions': ('type',),
}
STRATEGIC_MERGE_SETS = frozenset({'finalizers'})


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch; returns a new value and never mutates its inputs."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """A merge patch that merges known keyed lists and honours ``$patch``/``$deleteFromPrimitiveList``."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get('$patch') == 'replace':
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != '$patch'}
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith('$deleteFromPrimitiveList/'):
            name = key.split('/', 1)[1]
            result[name] = [item for item in result.get(name) or [] if item not in value]
        elif key.startswith('$'):
            continue  # $retainKeys, $setElementOrder/...: ordering/retention hints, not emulated
        elif value is None or (isinstance(value, dict) and value.get('$patch') == 'delete'):
            result.pop(key, None)
        elif isinstance(value, list) and key in STRATEGIC_MERGE_SETS:
            current = result.get(key) or []
            result[key] = current + [item for item in value if item not in current]
        elif isinstance(value, list) and key in STRATEGIC_MERGE_KEYS:
            result[key] = _merge_keyed_list(result.get(key) or [], value, STRATEGIC_MERGE_KEYS[key])
        else:
            result[key] = strategic_merge_patch(result.get(key), value)
    return result


def _merge_keyed_list(current: list[Any], patch: list[Any], candidates: tuple[str, ...]) -> list[Any]:
    result = list(current)
    for item in patch:
        key = next((k for k in candidates if isinstance(item, dict) and k in item), None)
        index = next((i for i, old in enumerate(result)
                      if key is not None and isinstance(old, dict) and old.get(key) == item[key]), None)
        if isinstance(item, dict) and item.get('$patch') == 'delete':
            if index is not None:
                del result[index]
        elif index is not None:
            result[index] = strategic_merge_patch(result[index], item)
        else:
            result.append(strategic_merge_patch(None, item) if isinstance(item, dict) else item)
    return result


def json_patch(target: Mapping[str, Any], operations: Any) -> dict[str, Any]:
    """RFC 6902 JSON patch; a failing ``test`` or a bad path is 422 Invalid, like Kubernetes."""
    if not isinstance(operations, list):
        raise bad_request('a JSON patch must be a list of operations')
    try:
        return jsonpatch.apply_patch(target, operations, in_place=False)
    except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException, TypeError, KeyError) as e:
        raise api_error(422, 'Invalid', f'the server rejected our request due to an error in our request: {e}') from e


# ================================================================================================
# Metadata validation (all objects)
# ================================================================================================

_DNS_LABEL = '[a-z0-9]([-a-z0-9]*[a-z0-9])?'
_DNS_SUBDOMAIN = rf'{_DNS_LABEL}(\.{_DNS_LABEL})*'
_DNS_1035 = '[a-z]([-a-z0-9]*[a-z0-9])?'
NAME_FORMATS: dict[str, tuple[str, int, str]] = {  # regex, max length, message
    'subdomain': (_DNS_SUBDOMAIN, 253, (
        "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
        "and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
        f"validation is '{_DNS_SUBDOMAIN}')")),
    'label': (_DNS_LABEL, 63, (
        "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
        f"start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for "
        f"validation is '{_DNS_LABEL}')")),
    'dns1035': (_DNS_1035, 63, (
        "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
        "alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', "
        f"regex used for validation is '{_DNS_1035}')")),
}
_QUALIFIED_NAME = '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]'
_LABEL_VALUE = f'({_QUALIFIED_NAME})?'


def dns_name_errors(field: str, name: Any, name_format: str) -> list[FieldError]:
    regex, limit, message = NAME_FORMATS[name_format]
    if not isinstance(name, str):
        return [FieldError(field, 'Invalid value', 'must be a string', name)]
    errors = []
    if len(name) > limit:
        errors.append(FieldError(field, 'Invalid value', f'must be no more than {limit} characters', name))
    if not re.fullmatch(regex, name):
        errors.append(FieldError(field, 'Invalid value', message, name))
    return errors


def qualified_name_errors(field: str, key: Any) -> list[FieldError]:
    if not isinstance(key, str):
        return [FieldError(field, 'Invalid value', 'must be a string', key)]
    prefix, _, name = key.rpartition('/')
    if prefix and dns_name_errors(field, prefix, 'subdomain'):
        return [FieldError(field, 'Invalid value', 'prefix part ' + NAME_FORMATS['subdomain'][2], key)]
    if not re.fullmatch(_QUALIFIED_NAME, name) or len(name) > 63:
        return [FieldError(field, 'Invalid value', (
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
            "with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used "
            f"for validation is '{_QUALIFIED_NAME}'), and be no more than 63 characters"), key)]
    return []


def label_value_errors(field: str, value: Any) -> list[FieldError]:
    if isinstance(value, str) and re.fullmatch(_LABEL_VALUE, value) and len(value) <= 63:
        return []
    return [FieldError(field, 'Invalid value', (
        "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
        "and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or "
        f"'12345', regex used for validation is '{_LABEL_VALUE}'), and be no more than 63 characters"),
        value)]


ANNOTATIONS_MAX_BYTES = 256 * 1024  # an object's annotations, keys and values together


def metadata_errors(rt: ResourceType, obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[FieldError]:
    meta = obj['metadata']
    errors = dns_name_errors('metadata.name', meta['name'], rt.name_format)
    for key, value in (meta.get('labels') or {}).items():
        errors += qualified_name_errors('metadata.labels', key) + label_value_errors('metadata.labels', value)
    annotations = meta.get('annotations') or {}
    for key, value in annotations.items():
        errors += qualified_name_errors('metadata.annotations', key)
        if not isinstance(value, str):
            errors.append(FieldError('metadata.annotations', 'Invalid value', 'must be a string', value))
    size = sum(len(k) + len(v) for k, v in annotations.items() if isinstance(v, str))
    if size > ANNOTATIONS_MAX_BYTES:  # apimachinery's ValidateAnnotationsSize
        errors.append(FieldError('metadata.annotations', 'Too long',
                                 f'must have at most {ANNOTATIONS_MAX_BYTES} bytes'))
    for index, ref in enumerate(meta.get('ownerReferences') or []):
        errors += [FieldError(f'metadata.ownerReferences[{index}].{name}', 'Required value')
                   for name in ('apiVersion', 'kind', 'name', 'uid') if not ref.get(name)]
    if old is not None and old['metadata'].get('deletionTimestamp'):
        added = [f for f in meta.get('finalizers') or [] if f not in old['metadata'].get('finalizers') or []]
        if added:
            errors.append(FieldError('metadata.finalizers', 'Forbidden',
                                     f'no new finalizers can be added if the object is being deleted, '
                                     f'found new finalizers {json.dumps(added)}'))
    return errors


# ================================================================================================
# Custom resources: structural schema pruning, defaulting and validation
# ================================================================================================

FORMATS = jsonschema.FormatChecker(formats=())
_RFC3339 = re.compile(r'^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$')
_GO_DURATION = re.compile(r'^[-+]?(0|((\d+(\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h))+)$')
_UUID = re.compile(r'^[0-9a-fA-F]{8}-([0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}$')


def _string_format(name: str, check: Callable[[str], Any]) -> None:
    """Register a Kubernetes string format; unknown formats are not checked (like Kubernetes)."""
    def checker(value: Any) -> bool:
        if not isinstance(value, str):
            return True
        try:
            return check(value) is not False
        except ValueError:
            return False
    FORMATS.checks(name)(checker)


_string_format('byte', lambda v: base64.b64decode(v, validate=True))
_string_format('date', lambda v: re.fullmatch(r'\d{4}-\d{2}-\d{2}', v) and datetime.date.fromisoformat(v))
_string_format('date-time', lambda v: bool(_RFC3339.match(v)))
_string_format('datetime', lambda v: bool(_RFC3339.match(v)))
_string_format('duration', lambda v: bool(_GO_DURATION.match(v)))
_string_format('uuid', lambda v: bool(_UUID.match(v)))
_string_format('ipv4', ipaddress.IPv4Address)
_string_format('ipv6', ipaddress.IPv6Address)
_string_format('hostname', lambda v: not dns_name_errors('', v, 'subdomain'))

_COPIED_KEYWORDS = ('enum', 'pattern', 'minimum', 'maximum', 'minLength', 'maxLength', 'minItems',
                    'maxItems', 'minProperties', 'maxProperties', 'multipleOf', 'uniqueItems',
                    'format', 'required')
_OBJECT_META_KEYS = ('apiVersion', 'kind', 'metadata')


def to_json_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Translate an OpenAPI v3 structural schema into JSON Schema 2020-12 for ``jsonschema``."""
    result: dict[str, Any] = {k: schema[k] for k in _COPIED_KEYWORDS if k in schema}
    nullable = bool(schema.get('nullable'))
    if schema.get('x-kubernetes-int-or-string'):
        result['type'] = ['integer', 'string'] + (['null'] if nullable else [])
    elif 'type' in schema:
        result['type'] = [schema['type'], 'null'] if nullable else schema['type']
    if nullable and 'enum' in result:
        result['enum'] = [*result['enum'], None]
    for bound in ('Minimum', 'Maximum'):  # OpenAPI 3.0 booleans -> JSON Schema numbers
        if schema.get(f'exclusive{bound}') and bound.lower() in result:
            result[f'exclusive{bound}'] = result.pop(bound.lower())
    if 'properties' in schema:
        result['properties'] = {k: to_json_schema(v) for k, v in schema['properties'].items()}
    if isinstance(schema.get('items'), Mapping):
        result['items'] = to_json_schema(schema['items'])
    if isinstance(schema.get('additionalProperties'), Mapping):
        result['additionalProperties'] = to_json_schema(schema['additionalProperties'])
    for combinator in ('allOf', 'anyOf', 'oneOf'):
        if combinator in schema:
            result[combinator] = [to_json_schema(s) for s in schema[combinator]]
    if 'not' in schema:
        result['not'] = to_json_schema(schema['not'])
    return result


def prune(value: Any, schema: Mapping[str, Any], *, object_meta: bool = False) -> Any:
    """Drop fields the schema does not know, unless under x-kubernetes-preserve-unknown-fields.

    ``object_meta`` keeps apiVersion/kind/metadata (the root and embedded resources). Mutates dicts
    and lists in place and returns the value.
    """
    object_meta = object_meta or bool(schema.get('x-kubernetes-embedded-resource'))
    if isinstance(value, dict):
        additional = schema.get('additionalProperties')
        if isinstance(additional, Mapping):
            for key in value:
                value[key] = prune(value[key], additional)
            return value
        properties = schema.get('properties') or {}
        preserve = schema.get('x-kubernetes-preserve-unknown-fields') or additional is True
        for key in list(value):
            if object_meta and key in _OBJECT_META_KEYS:
                continue  # ObjectMeta is the server's, never pruned by the CRD schema
            if key in properties:
                value[key] = prune(value[key], properties[key])
            elif not preserve:
                del value[key]
    elif isinstance(value, list) and isinstance(schema.get('items'), Mapping):
        value[:] = [prune(item, schema['items']) for item in value]
    return value


def apply_defaults(value: Any, schema: Mapping[str, Any]) -> None:
    """Structural defaulting: nulls of non-nullable fields are dropped, then defaults fill gaps."""
    if isinstance(value, dict):
        for key, sub in (schema.get('properties') or {}).items():
            if key in value and value[key] is None and not sub.get('nullable'):
                del value[key]
            if key not in value and 'default' in sub:
                value[key] = copy.deepcopy(sub['default'])
            if key in value:
                apply_defaults(value[key], sub)
        if isinstance(schema.get('additionalProperties'), Mapping):
            for item in value.values():
                apply_defaults(item, schema['additionalProperties'])
    elif isinstance(value, list) and isinstance(schema.get('items'), Mapping):
        for item in value:
            apply_defaults(item, schema['items'])


def schema_errors(validator: jsonschema.protocols.Validator, obj: Mapping[str, Any]) -> list[FieldError]:
    errors: list[FieldError] = []
    for error in validator.iter_errors(obj):
        for field_error in _translate_schema_error(error):
            if field_error not in errors:
                errors.append(field_error)
    return sorted(errors, key=lambda e: e.field)


def _translate_schema_error(error: jsonschema.ValidationError) -> list[FieldError]:
    """Word a jsonschema error like kube-openapi does ("<path> in body should ...")."""
    parts = list(error.absolute_path)
    # Always set on the errors a validator yields (the stubs also allow hand-made, unset ones).
    value: Any = error.instance
    limit: Any = error.validator_value
    validator: Any = error.validator
    path = field_path(parts)
    match validator:
        case 'required':
            return [FieldError(field_path([*parts, name]), 'Required value')
                    for name in limit if name not in value]
        case 'type':
            expected = ','.join(limit) if isinstance(limit, list) else limit
            return [FieldError(path, 'Invalid value', f'{path} in body must be of type {expected}: '
                                                      f'"{type_name(value)}"', type_name(value))]
        case 'enum':
            return [FieldError(path, 'Unsupported value', 'supported values: ' +
                               ', '.join(go_value(v) for v in limit), value)]
        case 'maxLength':
            return [FieldError(path, 'Too long', f'may not be longer than {limit}')]
        case 'maxItems' | 'maxProperties':
            return [FieldError(path, 'Too many', f'must have at most {limit} items', len(value))]
        case 'uniqueItems':
            return [FieldError(path, 'Duplicate value', '', value)]
    detail = {
        'maximum': f'should be less than or equal to {limit}',
        'exclusiveMaximum': f'should be less than {limit}',
        'minimum': f'should be greater than or equal to {limit}',
        'exclusiveMinimum': f'should be greater than {limit}',
        'minLength': f'should be at least {limit} chars long',
        'minItems': f'should have at least {limit} items',
        'minProperties': f'should have at least {limit} properties',
        'pattern': f"should match '{limit}'",
        'multipleOf': f'should be a multiple of {limit}',
        'format': f'must be of type {limit}: {go_value(value)}',
    }.get(validator)
    if detail is None:
        return [FieldError(path, 'Invalid value', error.message, value)]
    return [FieldError(path, 'Invalid value', f'{path} in body {detail}', value)]


def cel_errors(value: Any, old: Any, has_old: bool, schema: Mapping[str, Any],
               parts: list[str | int]) -> list[FieldError]:
    """Evaluate x-kubernetes-validations at every node present in ``value``.

    ``old``/``has_old`` carry the correlated previous value (on updates) for transition rules;
    correlation follows object properties and the keys of ``x-kubernetes-list-type: map`` lists.
    """
    errors = [error for rule in schema.get('x-kubernetes-validations') or []
              for error in _rule_errors(rule, value, old, has_old, parts)]
    if isinstance(value, dict):
        additional = schema.get('additionalProperties')
        children = schema.get('properties') or {}
        for key, item in value.items():
            sub = children.get(key, additional if isinstance(additional, Mapping) else None)
            if sub is not None:
                correlated = has_old and isinstance(old, dict) and key in old
                errors += cel_errors(item, old.get(key) if correlated else None, correlated, sub, [*parts, key])
    elif isinstance(value, list) and isinstance(schema.get('items'), Mapping):
        keys = schema.get('x-kubernetes-list-map-keys') if schema.get('x-kubernetes-list-type') == 'map' else None
        old_items: dict[tuple[Any, ...] | None, Any] = \
            {_map_key(item, keys): item for item in old if isinstance(item, dict)} \
            if keys and has_old and isinstance(old, list) else {}
        for index, item in enumerate(value):
            key = _map_key(item, keys) if keys and isinstance(item, dict) else None
            errors += cel_errors(item, old_items.get(key), key in old_items, schema['items'], [*parts, index])
    return errors


def _map_key(item: Mapping[str, Any], keys: list[str] | None) -> tuple[Any, ...]:
    return tuple(json.dumps(item.get(k)) for k in keys or ())


def _rule_errors(rule: Mapping[str, Any], value: Any, old: Any, has_old: bool,
                 parts: list[str | int]) -> list[FieldError]:
    program = compile_cel(rule['rule'])
    if program.uses_old_self and not has_old:
        return []  # transition rules apply only to updates of an existing (correlated) value
    extra = [p.strip("'\"") for p in re.split(r'\.|\[|\]', rule.get('fieldPath', '')) if p]
    field = field_path(parts + extra)
    error_type = _CEL_REASON_TYPES.get(rule.get('reason', 'FieldValueInvalid'), 'Invalid value')
    env = {'self': value, 'oldSelf': old}
    try:
        result = program.evaluate(env)
    except CelError as e:
        return [FieldError(field, 'Invalid value', f'{e} evaluating rule: {rule["rule"]}', type_name(value))]
    if result is True:
        return []
    if result is not False:
        return [FieldError(field, 'Invalid value', f'rule did not evaluate to a bool: {rule["rule"]}',
                           type_name(value))]
    message = rule.get('message') or f'failed rule: {rule["rule"]}'
    if rule.get('messageExpression'):
        with contextlib.suppress(CelError):
            message = str(compile_cel(rule['messageExpression']).evaluate(env))
    if error_type == 'Invalid value':
        return [FieldError(field, error_type, message, type_name(value))]
    return [FieldError(field, error_type, message)]


def custom_resource_errors(spec: VersionSpec, obj: dict[str, Any], old: dict[str, Any] | None) -> list[FieldError]:
    """Prune and default ``obj`` in place, then validate it with the schema and its CEL rules."""
    assert spec.schema is not None and spec.validator is not None
    prune(obj, spec.schema, object_meta=True)
    apply_defaults(obj, spec.schema)
    return (schema_errors(spec.validator, obj) + list_type_errors(obj, spec.schema, [])
            + cel_errors(obj, old, old is not None, spec.schema, []))


def list_type_errors(value: Any, schema: Mapping[str, Any], parts: list[str | int]) -> list[FieldError]:
    """``x-kubernetes-list-type: set`` items and ``map`` keys must be unique: like kube-apiserver,
    each repeat is a ``Duplicate value`` at its own index."""
    errors: list[FieldError] = []
    if isinstance(value, dict):
        for key, item in value.items():
            sub = (schema.get('properties') or {}).get(key)
            if sub is None and isinstance(schema.get('additionalProperties'), Mapping):
                sub = schema['additionalProperties']
            if sub is not None:
                errors += list_type_errors(item, sub, [*parts, key])
    elif isinstance(value, list):
        list_type, keys = schema.get('x-kubernetes-list-type'), schema.get('x-kubernetes-list-map-keys')
        seen: list[Any] = []
        for index, item in enumerate(value):
            identity = ({k: item.get(k) for k in keys} if list_type == 'map' and keys
                        and isinstance(item, dict) else item)
            if list_type in ('set', 'map') and identity in seen:
                errors.append(FieldError(field_path([*parts, index]), 'Duplicate value', '', identity))
            seen.append(identity)
            if isinstance(schema.get('items'), Mapping):
                errors += list_type_errors(item, schema['items'], [*parts, index])
    return errors


def crd_errors(crd: Mapping[str, Any]) -> list[FieldError]:
    """What the real server checks on a CRD that matters for serving it."""
    spec = crd.get('spec') or {}
    names = spec.get('names') or {}
    versions = spec.get('versions') or []
    errors = [FieldError(f'spec.{path}', 'Required value')
              for path, present in (('group', spec.get('group')), ('names.plural', names.get('plural')),
                                    ('names.kind', names.get('kind')), ('versions', versions)) if not present]
    if spec.get('scope') not in ('Namespaced', 'Cluster'):
        errors.append(FieldError('spec.scope', 'Unsupported value', 'supported values: "Cluster", "Namespaced"',
                                 spec.get('scope')))
    if versions and sum(bool(v.get('storage')) for v in versions) != 1:
        errors.append(FieldError('spec.versions', 'Invalid value',
                                 'must have exactly one version marked as storage version', versions))
    expected_name = f"{names.get('plural')}.{spec.get('group')}"
    if crd['metadata']['name'] != expected_name:
        errors.append(FieldError('metadata.name', 'Invalid value', 'must be spec.names.plural+"."+spec.group',
                                 crd['metadata']['name']))
    for index, version in enumerate(versions):
        schema = (version.get('schema') or {}).get('openAPIV3Schema')
        path = f'spec.versions[{index}].schema.openAPIV3Schema'
        if not isinstance(schema, Mapping):
            errors.append(FieldError(path, 'Required value', 'schemas are required'))
        else:
            errors += _rule_compile_errors(schema, path)
    return errors


def _rule_compile_errors(schema: Mapping[str, Any], path: str) -> list[FieldError]:
    errors = []
    for index, rule in enumerate(schema.get('x-kubernetes-validations') or []):
        for key in ('rule', 'messageExpression'):
            if key in rule:
                try:
                    compile_cel(rule[key])
                except CelSyntaxError as e:
                    errors.append(FieldError(f'{path}.x-kubernetes-validations[{index}].{key}', 'Invalid value',
                                             f'compilation failed: {e}', rule[key]))
    for name, sub in (schema.get('properties') or {}).items():
        errors += _rule_compile_errors(sub, f'{path}.properties[{name}]')
    for key in ('items', 'additionalProperties'):
        if isinstance(schema.get(key), Mapping):
            errors += _rule_compile_errors(schema[key], f'{path}.{key}')
    return errors


# ================================================================================================
# The cluster state
# ================================================================================================

def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%dT%H:%M:%SZ')


def object_key(obj: Mapping[str, Any]) -> ObjectKey:
    meta = obj['metadata']
    return meta.get('namespace') or '', meta['name']


@dataclasses.dataclass(frozen=True)
class WatchEvent:
    resource_version: int
    type: str  # ADDED, MODIFIED, DELETED
    obj: Mapping[str, Any]
    old: Mapping[str, Any] | None  # the previous state, to turn selector transitions into ADDED/DELETED


class Gone(Exception):
    """The requested resourceVersion is older than the kept event history."""


class EventLog:
    """The recent events of one resource; ``floor``: events at or below it may be missing."""

    def __init__(self, floor: int) -> None:
        self.floor = floor
        self.events: collections.deque[WatchEvent] = collections.deque()

    def append(self, event: WatchEvent) -> None:
        self.events.append(event)
        if len(self.events) > EVENT_HISTORY_LIMIT:
            self.floor = self.events.popleft().resource_version

    def since(self, resource_version: int) -> list[WatchEvent]:
        if resource_version < self.floor:
            raise Gone(f'too old resource version: {resource_version} ({self.floor})')
        return [event for event in self.events if event.resource_version > resource_version]


class Watcher:
    """One live watch: a queue of events (``None`` closes it) and what it selects."""

    def __init__(self, selector: Selector) -> None:
        self.selector = selector
        self.queue: asyncio.Queue[WatchEvent | None] = asyncio.Queue()

    def translate(self, event: WatchEvent) -> tuple[str, Mapping[str, Any]] | None:
        """The event as this watch sees it: objects entering/leaving the selection are ADDED/DELETED."""
        now = self.selector.matches(event.obj)
        before = event.old is not None and self.selector.matches(event.old)
        if event.type == 'MODIFIED' and now != before:
            return ('ADDED' if now else 'DELETED'), event.obj
        return (event.type, event.obj) if now or (event.type == 'MODIFIED' and before) else None


class Cluster:
    """The emulated cluster's state and the semantics of every write.

    All methods are synchronous and must run on the emulator's event loop: each call is one atomic
    step. Stored objects are never mutated: every change stores a new dict, so objects handed to
    watches and responses stay as they were.
    """

    def __init__(self) -> None:
        self.registry = Registry(BUILTIN_RESOURCES)
        self._rv = 0
        self._objects: dict[TypeKey, dict[ObjectKey, dict[str, Any]]] = collections.defaultdict(dict)
        self._uids: dict[str, tuple[TypeKey, ObjectKey]] = {}
        self._logs: dict[TypeKey, EventLog] = {rt.key: EventLog(0) for rt in BUILTIN_RESOURCES}
        self._watchers: dict[TypeKey, set[Watcher]] = collections.defaultdict(set)
        self._create_default_namespaces()

    @property
    def resource_version(self) -> int:
        """The latest resourceVersion given to any change."""
        return self._rv

    # ---- reading ------------------------------------------------------------------------------

    def get(self, rt: ResourceType, namespace: str | None, name: str) -> dict[str, Any]:
        obj = self._objects[rt.key].get((namespace or '', name))
        if obj is None:
            raise rt.not_found(name)
        return obj

    # From here on, `list` in this class's annotations is this method: they say builtins.list.
    def list(self, rt: ResourceType, selector: Selector, limit: int | None,
             continue_token: str | None) -> tuple[list[dict[str, Any]], str, str]:
        """Matching objects ordered by (namespace, name), the list's resourceVersion, a continue token."""
        resource_version, after = str(self._rv), None
        if continue_token:
            resource_version, after = _decode_continue(continue_token)
        objects = self._objects[rt.key]
        keys = sorted(key for key in objects if (after is None or key > after) and selector.matches(objects[key]))
        if limit and len(keys) > limit:
            keys = keys[:limit]
            return [objects[k] for k in keys], resource_version, _encode_continue(resource_version, keys[-1])
        return [objects[k] for k in keys], resource_version, ''

    def watch(self, rt: ResourceType, selector: Selector,
              since: str | None) -> tuple[builtins.list[WatchEvent], Watcher]:
        """Subscribe, and return the events to send first: current objects, or those after ``since``."""
        watcher = Watcher(selector)
        if not since or since == '0':
            initial = [WatchEvent(int(obj['metadata']['resourceVersion']), 'ADDED', obj, None)
                       for _, obj in sorted(self._objects[rt.key].items())]
        else:
            if not since.isdigit():
                raise bad_request(f'invalid resource version: {since!r}')
            initial = self._logs[rt.key].since(int(since))
        self._watchers[rt.key].add(watcher)
        return initial, watcher

    def unwatch(self, rt: ResourceType, watcher: Watcher) -> None:
        self._watchers[rt.key].discard(watcher)

    # ---- writing: create, replace, patch ---------------------------------------------------------

    def create(self, rt: ResourceType, version: VersionSpec, namespace: str | None,
               body: Any) -> dict[str, Any]:
        obj = self._typed_copy(rt, body)
        meta = obj['metadata']
        if rt.namespaced:
            if meta.get('namespace') not in (None, '', namespace):
                raise bad_request('the namespace of the provided object does not match the namespace '
                                  'sent on the request')
            meta['namespace'] = namespace
        else:
            meta.pop('namespace', None)
        if not meta.get('name'):
            if not meta.get('generateName'):
                raise rt.invalid('', [FieldError('metadata.name', 'Required value',
                                                 'name or generateName is required')])
            meta['name'] = self._generate_name(rt, namespace, meta['generateName'])
        if object_key(obj) in self._objects[rt.key]:
            raise api_error(409, 'AlreadyExists', f'{rt.qualified} "{meta["name"]}" already exists',
                            name=meta['name'], group=rt.group, kind=rt.plural)
        for server_field in ('resourceVersion', 'deletionTimestamp', 'deletionGracePeriodSeconds', 'selfLink'):
            meta.pop(server_field, None)
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339(), generation=1)
        if 'status' in version.subresources:
            obj.pop('status', None)
        self._initialize(rt, obj)
        self._admit(rt, version, obj, None)
        if rt.namespaced:
            self._ensure_namespace(namespace)
        return self._store(rt, obj, None)

    def replace(self, rt: ResourceType, version: VersionSpec, namespace: str | None, name: str,
                body: Any, subresource: str | None) -> dict[str, Any]:
        old = self.get(rt, namespace, name)
        obj = self._typed_copy(rt, body)
        meta = obj['metadata']
        if meta.get('name') != name:
            raise bad_request(f'the name of the object ({meta.get("name")}) does not match the name '
                              f'on the URL ({name})')
        if rt.namespaced and meta.get('namespace') not in (None, '', namespace):
            raise bad_request('the namespace of the provided object does not match the namespace '
                              'sent on the request')
        if not meta.get('resourceVersion') and rt.crd is not None:
            raise rt.invalid(name, [FieldError('metadata.resourceVersion', 'Invalid value',
                                               'must be specified for an update', 0)])
        return self._update(rt, version, old, obj, subresource)

    def patch(self, rt: ResourceType, version: VersionSpec, namespace: str | None, name: str,
              content_type: str, body: Any, subresource: str | None) -> tuple[dict[str, Any], bool]:
        """Patch an object; returns it and whether it was created (server-side apply only)."""
        old = self._objects[rt.key].get((namespace or '', name))
        if old is None and content_type == 'application/apply-patch+yaml' and subresource is None:
            if isinstance(body, dict):
                body.setdefault('metadata', {}).setdefault('name', name)
            return self.create(rt, version, namespace, body), True
        if old is None:
            raise rt.not_found(name)
        current = dict(old, apiVersion=rt.api_version(version.name), kind=rt.kind)
        if content_type == 'application/json-patch+json':
            patched = json_patch(current, body)
        elif content_type == 'application/merge-patch+json' or (
                content_type == 'application/apply-patch+yaml' and rt.crd is not None):
            patched = merge_patch(current, body)
        elif rt.crd is None:  # strategic merge patch and apply on built-ins
            patched = strategic_merge_patch(current, body)
        else:
            raise api_error(415, 'UnsupportedMediaType',
                            'the body of the request was in an unknown format - accepted media types '
                            'include: application/json-patch+json, application/merge-patch+json, '
                            'application/apply-patch+yaml')
        return self._update(rt, version, old, self._typed_copy(rt, patched), subresource), False

    def _update(self, rt: ResourceType, version: VersionSpec, old: dict[str, Any], obj: dict[str, Any],
                subresource: str | None) -> dict[str, Any]:
        meta, old_meta = obj['metadata'], old['metadata']
        if meta.get('resourceVersion') not in (None, '', old_meta['resourceVersion']):
            raise rt.conflict(old_meta['name'], 'the object has been modified; please apply your changes '
                                                'to the latest version and try again')
        if meta.get('uid') not in (None, '', old_meta['uid']):
            raise rt.conflict(old_meta['name'], f'Precondition failed: UID in precondition: {meta["uid"]}, '
                                                f'UID in object meta: {old_meta["uid"]}')
        obj = self._keep_server_fields(version, old, obj, subresource)
        self._admit(rt, version, obj, old)
        if obj == old:
            return old  # no-op writes store nothing: no new resourceVersion, no event
        if _spec_of(version, obj) != _spec_of(version, old):
            obj['metadata']['generation'] = old_meta.get('generation', 1) + 1
        stored = self._store(rt, obj, old)
        self._remove_if_released(rt, object_key(stored))
        return stored

    @staticmethod
    def _keep_server_fields(version: VersionSpec, old: dict[str, Any], obj: dict[str, Any],
                            subresource: str | None) -> dict[str, Any]:
        if subresource == 'status':
            obj = dict(copy.deepcopy(old), status=obj.get('status'))
            if obj['status'] is None:
                del obj['status']
            return obj
        if 'status' in version.subresources:
            obj.pop('status', None)
            if 'status' in old:
                obj['status'] = copy.deepcopy(old['status'])
        meta = obj['metadata']
        for server_field in ('name', 'namespace', 'uid', 'creationTimestamp', 'generation', 'resourceVersion',
                             'deletionTimestamp', 'deletionGracePeriodSeconds'):
            meta.pop(server_field, None)
            if server_field in old['metadata']:
                meta[server_field] = old['metadata'][server_field]
        return obj

    def _typed_copy(self, rt: ResourceType, body: Any) -> dict[str, Any]:
        """A private copy of a request body, checked to be an object of this resource type."""
        if not isinstance(body, dict) or not isinstance(body.get('metadata', {}), dict):
            raise bad_request(f'the body is not a valid {rt.kind} object')
        if not all(isinstance(body.get('metadata', {}).get(key, ''), str) for key in _STRING_METADATA):
            raise bad_request(f'metadata fields {", ".join(_STRING_METADATA)} must be strings')
        if body.get('kind') not in (None, '', rt.kind):
            raise bad_request(f'the kind of the provided object ({body["kind"]}) does not match the '
                              f'resource ({rt.kind})')
        obj = copy.deepcopy(body)
        obj.setdefault('metadata', {})
        obj['apiVersion'] = rt.api_version(rt.storage_version)
        obj['kind'] = rt.kind
        return obj

    def _admit(self, rt: ResourceType, version: VersionSpec, obj: dict[str, Any],
               old: dict[str, Any] | None) -> None:
        """Validate (and for custom resources prune and default) ``obj`` in place, or raise 422.
        A Secret's write-only ``stringData`` is folded into ``data`` (base64), as the server does."""
        if rt.key == SECRETS and isinstance(obj.get('stringData'), dict):
            data = obj.setdefault('data', {}) or {}
            data.update({k: base64.b64encode(str(v).encode()).decode()
                         for k, v in obj.pop('stringData').items()})
            obj['data'] = data
        errors = metadata_errors(rt, obj, old)
        if version.schema is not None:
            errors += custom_resource_errors(version, obj, old)
        if rt.key == CRDS:
            errors += crd_errors(obj)
        if errors:
            raise rt.invalid(obj['metadata']['name'], errors)

    def _initialize(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        """Fields the real server's built-in logic fills in at creation."""
        if rt.key == NAMESPACES:
            obj.setdefault('spec', {}).setdefault('finalizers', ['kubernetes'])
            obj['status'] = {'phase': 'Active'}
        elif rt.key == CRDS:
            spec, now = obj.get('spec') or {}, now_rfc3339()
            obj['status'] = {
                'acceptedNames': spec.get('names') or {},
                'storedVersions': [v.get('name') for v in spec.get('versions') or [] if v.get('storage')],
                'conditions': [
                    {'type': 'NamesAccepted', 'status': 'True', 'reason': 'NoConflicts',
                     'message': 'no conflicts found', 'lastTransitionTime': now},
                    {'type': 'Established', 'status': 'True', 'reason': 'InitialNamesAccepted',
                     'message': 'the initial names have been accepted', 'lastTransitionTime': now},
                ],
            }

    def _generate_name(self, rt: ResourceType, namespace: str | None, prefix: str) -> str:
        while True:
            name = prefix + ''.join(random.choices('bcdfghjklmnpqrstvwxz2456789', k=5))
            if (namespace or '', name) not in self._objects[rt.key]:
                return name

    def _ensure_namespace(self, namespace: str | None) -> None:
        ns = self._objects[NAMESPACES].get(('', namespace or ''))
        if ns is None:
            self._create_namespace(namespace or '')
        elif ns['metadata'].get('deletionTimestamp'):
            raise api_error(403, 'Forbidden', f'{namespace} is forbidden: unable to create new content in '
                                              f'namespace {namespace} because it is being terminated',
                            name=namespace, kind='namespaces')

    def _create_namespace(self, name: str) -> None:
        rt = self.registry.by_key(NAMESPACES)
        assert rt is not None
        self.create(rt, rt.versions[0], None, {'metadata': {'name': name}})

    def _create_default_namespaces(self) -> None:
        for name in DEFAULT_NAMESPACES:
            self._create_namespace(name)

    # ---- writing: deletion, garbage collection, termination ----------------------------------------

    def delete(self, rt: ResourceType, namespace: str | None, name: str,
               options: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
        """Delete an object; returns its latest state and whether it is gone (not just terminating)."""
        obj = self.get(rt, namespace, name)
        preconditions = options.get('preconditions') or {}
        for field in ('uid', 'resourceVersion'):
            expected = preconditions.get(field)
            if expected and expected != obj['metadata'][field]:
                raise rt.conflict(name, f'Precondition failed: {field} in precondition: {expected}, '
                                        f'{field} in object meta: {obj["metadata"][field]}')
        return self._delete(rt, obj, _propagation_policy(options))

    def delete_collection(self, rt: ResourceType, selector: Selector,
                          options: Mapping[str, Any]) -> builtins.list[dict[str, Any]]:
        policy = _propagation_policy(options)
        items, _, _ = self.list(rt, selector, None, None)
        deleted = []
        for obj in items:
            current = self._current(rt, obj)  # an earlier deletion's cascade may have changed or removed it
            if current is not None:
                deleted.append(self._delete(rt, current, policy)[0])
        return deleted

    def _delete(self, rt: ResourceType, obj: dict[str, Any], policy: str) -> tuple[dict[str, Any], bool]:
        if policy == 'Orphan':
            self._orphan_dependents(obj['metadata']['uid'])
        if not obj['metadata'].get('deletionTimestamp') and not self._blockers(rt, obj):
            self._remove(rt, obj)
            return obj, True
        if not obj['metadata'].get('deletionTimestamp'):
            obj = self._edit(rt, obj, _mark_deleted)
            for content_rt, content in self._contents(rt, obj):
                current = self._current(content_rt, content)
                if current is not None:
                    self._delete(content_rt, current, 'Background')
            self._remove_if_released(rt, object_key(obj))
        current = self._current(rt, obj)
        return (current, False) if current is not None else (obj, True)

    def _blockers(self, rt: ResourceType, obj: Mapping[str, Any]) -> bool:
        return bool(obj['metadata'].get('finalizers')) or bool(self._contents(rt, obj))

    def _contents(self, rt: ResourceType, obj: Mapping[str, Any]) -> builtins.list[tuple[ResourceType, dict[str, Any]]]:
        """What must be deleted before a namespace (its objects) or a CRD (its custom resources)."""
        if rt.key == NAMESPACES:
            name = obj['metadata']['name']
            return [(other, item) for other in self.registry if other.namespaced
                    for (ns, _), item in sorted(self._objects[other.key].items()) if ns == name]
        if rt.key == CRDS:
            crd_rt = next((other for other in self.registry if other.crd == obj['metadata']['name']), None)
            return [(crd_rt, item) for _, item in sorted(self._objects[crd_rt.key].items())] if crd_rt else []
        return []

    def _remove_if_released(self, rt: ResourceType, key: ObjectKey) -> None:
        obj = self._objects[rt.key].get(key)
        if obj is not None and obj['metadata'].get('deletionTimestamp') and not self._blockers(rt, obj):
            self._remove(rt, obj)

    def _remove(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        """Remove an object for good, then run what Kubernetes' controllers do after that."""
        meta = obj['metadata']
        del self._objects[rt.key][object_key(obj)]
        del self._uids[meta['uid']]
        self._rv += 1
        gone = dict(obj, metadata=dict(meta, resourceVersion=str(self._rv)))
        self._publish(rt, WatchEvent(self._rv, 'DELETED', gone, obj))
        if rt.key == CRDS:
            self._unregister(rt_key=(obj['spec']['group'], obj['spec']['names']['plural']))
        self._collect_garbage(meta['uid'])
        namespaces = self.registry.by_key(NAMESPACES)
        if rt.namespaced and namespaces is not None:
            self._remove_if_released(namespaces, ('', meta['namespace']))
        crds = self.registry.by_key(CRDS)
        if rt.crd is not None and crds is not None:
            self._remove_if_released(crds, ('', rt.crd))

    def _collect_garbage(self, owner_uid: str) -> None:
        """Background propagation: delete dependents left without any existing owner."""
        for rt, dependent in self._dependents(owner_uid):
            current = self._current(rt, dependent)
            if current is None:
                continue  # removed by an earlier cascade step
            refs = current['metadata']['ownerReferences']
            if any(ref.get('uid') != owner_uid and ref.get('uid') in self._uids for ref in refs):
                self._edit(rt, current, functools.partial(_drop_owner, owner_uid))
            else:
                self._delete(rt, current, 'Background')

    def _orphan_dependents(self, owner_uid: str) -> None:
        for rt, dependent in self._dependents(owner_uid):
            self._edit(rt, dependent, functools.partial(_drop_owner, owner_uid))

    def _dependents(self, owner_uid: str) -> builtins.list[tuple[ResourceType, dict[str, Any]]]:
        return [(rt, obj) for rt in self.registry for obj in list(self._objects[rt.key].values())
                if any(ref.get('uid') == owner_uid for ref in obj['metadata'].get('ownerReferences') or [])]

    def _current(self, rt: ResourceType, obj: Mapping[str, Any]) -> dict[str, Any] | None:
        current = self._objects[rt.key].get(object_key(obj))
        return current if current is not None and current['metadata']['uid'] == obj['metadata']['uid'] else None

    # ---- storing and publishing ------------------------------------------------------------------

    def _edit(self, rt: ResourceType, obj: dict[str, Any], change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        """A server-side change of a stored object (by the emulated controllers)."""
        new = copy.deepcopy(obj)
        change(new)
        return self._store(rt, new, obj)

    def _store(self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> dict[str, Any]:
        self._rv += 1
        obj['metadata']['resourceVersion'] = str(self._rv)
        self._objects[rt.key][object_key(obj)] = obj
        self._uids[obj['metadata']['uid']] = (rt.key, object_key(obj))
        self._publish(rt, WatchEvent(self._rv, 'ADDED' if old is None else 'MODIFIED', obj, old))
        if rt.key == CRDS:
            self._register(obj)
        return obj

    def _publish(self, rt: ResourceType, event: WatchEvent) -> None:
        self._logs[rt.key].append(event)
        for watcher in self._watchers[rt.key]:
            watcher.queue.put_nowait(event)

    def _register(self, crd: dict[str, Any]) -> None:
        rt = resource_type_from_crd(crd)
        self.registry.add(rt)
        self._logs.setdefault(rt.key, EventLog(self._rv))

    def _unregister(self, rt_key: TypeKey) -> None:
        self.registry.remove(rt_key)
        for watcher in self._watchers.pop(rt_key, set()):
            watcher.queue.put_nowait(None)
        self._objects.pop(rt_key, None)
        self._logs.pop(rt_key, None)

    # ---- lifecycle ---------------------------------------------------------------------------------

    def close_watches(self) -> None:
        for watchers in self._watchers.values():
            for watcher in watchers:
                watcher.queue.put_nowait(None)
        self._watchers.clear()

    def reset(self) -> None:
        """Drop all objects and CRD-defined types; keep the resourceVersion counter monotonic."""
        self.close_watches()
        for rt in self.registry:
            if rt.crd is not None:
                self._unregister(rt.key)
        self._objects.clear()
        self._uids.clear()
        self._logs = {rt.key: EventLog(self._rv) for rt in self.registry}
        self._create_default_namespaces()


_STRING_METADATA = ('name', 'generateName', 'namespace', 'uid', 'resourceVersion')


def _spec_of(version: VersionSpec, obj: Mapping[str, Any]) -> dict[str, Any]:
    """The part of an object whose changes increment metadata.generation."""
    ignored = {'apiVersion', 'kind', 'metadata'} | ({'status'} if 'status' in version.subresources else set())
    return {key: value for key, value in obj.items() if key not in ignored}


def _mark_deleted(obj: dict[str, Any]) -> None:
    meta = obj['metadata']
    meta['deletionTimestamp'] = now_rfc3339()
    meta['deletionGracePeriodSeconds'] = 0
    meta['generation'] = meta.get('generation', 1) + 1
    if obj.get('kind') == 'Namespace':
        obj['status'] = dict(obj.get('status') or {}, phase='Terminating')


def _drop_owner(owner_uid: str, obj: dict[str, Any]) -> None:
    refs = [ref for ref in obj['metadata'].get('ownerReferences') or [] if ref.get('uid') != owner_uid]
    if refs:
        obj['metadata']['ownerReferences'] = refs
    else:
        obj['metadata'].pop('ownerReferences', None)


def _propagation_policy(options: Mapping[str, Any]) -> str:
    policy = options.get('propagationPolicy') or ('Orphan' if options.get('orphanDependents') else 'Background')
    if policy not in ('Background', 'Foreground', 'Orphan'):
        raise bad_request(f'propagationPolicy: Unsupported value: {policy!r}')
    return policy


def _encode_continue(resource_version: str, last: ObjectKey) -> str:
    return base64.urlsafe_b64encode(json.dumps([resource_version, *last]).encode()).decode()


def _decode_continue(token: str) -> tuple[str, ObjectKey]:
    try:
        resource_version, namespace, name = json.loads(base64.urlsafe_b64decode(token.encode()))
    except ValueError as e:
        raise bad_request(f'invalid continue token: {token!r}') from e
    return resource_version, (namespace, name)


# ================================================================================================
# HTTP: the kmock-based server
# ================================================================================================

@dataclasses.dataclass(frozen=True)
class ApiPath:
    """A resource URL: /api/v1/... or /apis/<group>/<version>/... down to an object's subresource."""
    group: str
    version: str
    plural: str
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None

    @classmethod
    def parse(cls, path: str) -> ApiPath | None:
        """None for everything that is not a resource URL (discovery, /version, other paths)."""
        parts = path.strip('/').split('/')
        if len(parts) >= 3 and parts[0] == 'api':
            group, version, rest = '', parts[1], parts[2:]
        elif len(parts) >= 4 and parts[0] == 'apis':
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return None
        namespace = None
        if rest[0] == 'namespaces' and len(rest) >= 3 and not (len(rest) == 3 and rest[2] in ('status', 'finalize')):
            namespace, rest = rest[1], rest[2:]
        return cls(group, version, rest[0], namespace, rest[1] if len(rest) > 1 else None,
                   '/'.join(rest[2:]) or None)


@attrs.define(kw_only=True)
class ApiServer(kmock.KubernetesScaffold):
    """kmock's Kubernetes scaffold serving the ``Cluster``: resource URLs directly, the rest via kmock."""

    cluster: Cluster = attrs.field(factory=Cluster)

    # kmock re-filters this whole history for every request it routes: keep only recent requests.
    # (kmock declares it a list; it only appends to it and iterates it)
    _requests: collections.deque[kmock.Request] = attrs.field(  # type: ignore[assignment]
        factory=lambda: collections.deque(maxlen=32), init=False)

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        if raw_request.path != '/' and raw_request.path.endswith('/'):  # e.g. the client's "/apis/"
            raw_request = raw_request.clone(rel_url=raw_request.rel_url.with_path(raw_request.path.rstrip('/')))
        path = ApiPath.parse(raw_request.path)
        if path is None:
            return await super().__call__(raw_request)
        try:
            return await self._serve(raw_request, path)
        except kmock.KubernetesError as e:
            return await self._render_error(e)
        except Exception as e:  # a bug of the emulator: answer 500 and keep it for pop_internal_errors()
            logger.exception('Kubernetes emulator failed on %s %s', raw_request.method, raw_request.path_qs)
            self.errors.append(e)
            return await self._render_error(e)

    def forget_requests(self) -> None:
        """Drop kmock's records of served requests (kept by every reaction for assertions)."""
        self._requests.clear()
        for reaction in self._payloads:
            reaction._requests.clear()

    # ---- discovery: kmock routes these, the data comes from the registry ----------------------------

    def _get_resources(self) -> list[kmock.resource]:
        return [kmock.resource(rt.group, spec.name, rt.plural) for rt in self.cluster.registry for spec in rt.versions]

    async def _serve_api(self, request: kmock.Request) -> dict[str, Any]:
        host = request.url.host or '127.0.0.1'
        return {'kind': 'APIVersions', 'versions': ['v1'], 'serverAddressByClientCIDRs': [
            {'clientCIDR': '0.0.0.0/0', 'serverAddress': f'{host}:{request.url.port}'}]}

    async def _serve_apis(self, request: kmock.Request) -> dict[str, Any]:
        groups = self.cluster.registry.group_versions()
        return {'kind': 'APIGroupList', 'apiVersion': 'v1',
                'groups': [_api_group(name, versions) for name, versions in sorted(groups.items()) if name]}

    async def _serve_group(self, request: kmock.Request) -> dict[str, Any]:
        assert request.resource is not None
        versions = self.cluster.registry.group_versions().get(request.resource.group or '')
        if not versions or not request.resource.group:
            raise api_error(404, 'NotFound', 'the server could not find the requested resource')
        return _api_group(request.resource.group, versions)

    async def _serve_version(self, request: kmock.Request) -> dict[str, Any]:
        assert request.resource is not None
        group, version = request.resource.group or '', request.resource.version or ''
        if version not in self.cluster.registry.group_versions().get(group, []):
            raise api_error(404, 'NotFound', 'the server could not find the requested resource')
        return {'kind': 'APIResourceList', 'apiVersion': 'v1',
                'groupVersion': f'{group}/{version}' if group else version,
                'resources': self.cluster.registry.discovery(group, version)}

    async def _render_error(self, exc: Exception) -> aiohttp.web.StreamResponse:
        if isinstance(exc, kmock.KubernetesError):
            return aiohttp.web.json_response(status_body(exc), status=exc.status)
        return await super()._render_error(exc)

    # ---- resources ------------------------------------------------------------------------------

    async def _serve(self, raw_request: aiohttp.web.BaseRequest, path: ApiPath) -> aiohttp.web.StreamResponse:
        resolved = self.cluster.registry.resolve(path.group, path.version, path.plural)
        if resolved is None:
            raise api_error(404, 'NotFound', 'the server could not find the requested resource')
        rt, version = resolved
        if not _is_served_path(rt, version, path):
            raise api_error(404, 'NotFound', 'the server could not find the requested resource')
        query = raw_request.query
        if 'dryRun' in query:
            raise bad_request('dryRun is not supported by the Kubernetes emulator')
        method = raw_request.method
        if method == 'GET' and query.get('watch') in ('true', '1'):
            return await self._serve_watch(raw_request, rt, version, path)
        if path.name is None:
            return await self._serve_collection(raw_request, rt, version, path)
        return await self._serve_object(raw_request, rt, version, path)

    async def _serve_collection(self, raw_request: aiohttp.web.BaseRequest, rt: ResourceType,
                                version: VersionSpec, path: ApiPath) -> aiohttp.web.StreamResponse:
        method, query = raw_request.method, raw_request.query
        if method == 'GET':
            limit = _int_param(query, 'limit')
            items, rv, token = self.cluster.list(rt, _selector(rt, path, query), limit, query.get('continue'))
            return _json({'kind': f'{rt.kind}List', 'apiVersion': rt.api_version(version.name),
                          'metadata': {'resourceVersion': rv, **({'continue': token} if token else {})},
                          'items': [_present(rt, version, obj) for obj in items]})
        if method == 'POST' and (path.namespace is not None or not rt.namespaced):
            created = self.cluster.create(rt, version, path.namespace, await _json_body(raw_request))
            return _json(_present(rt, version, created), status=201)
        if method == 'DELETE' and (path.namespace is not None or not rt.namespaced):
            options = await _delete_options(raw_request)
            deleted = self.cluster.delete_collection(rt, _selector(rt, path, query), options)
            return _json({'kind': f'{rt.kind}List', 'apiVersion': rt.api_version(version.name),
                          'metadata': {'resourceVersion': str(self.cluster.resource_version)},
                          'items': [_present(rt, version, obj) for obj in deleted]})
        raise api_error(405, 'MethodNotAllowed', 'the server does not allow this method on the requested resource')

    async def _serve_object(self, raw_request: aiohttp.web.BaseRequest, rt: ResourceType,
                            version: VersionSpec, path: ApiPath) -> aiohttp.web.StreamResponse:
        assert path.name is not None
        method, cluster = raw_request.method, self.cluster
        if method == 'GET':
            return _json(_present(rt, version, cluster.get(rt, path.namespace, path.name)))
        if method == 'PUT':
            body = await _json_body(raw_request)
            obj = cluster.replace(rt, version, path.namespace, path.name, body, path.subresource)
            return _json(_present(rt, version, obj))
        if method == 'PATCH':
            content_type, body = await _patch_body(raw_request)
            obj, created = cluster.patch(rt, version, path.namespace, path.name, content_type, body, path.subresource)
            return _json(_present(rt, version, obj), status=201 if created else 200)
        if method == 'DELETE' and path.subresource is None:
            obj, gone = cluster.delete(rt, path.namespace, path.name, await _delete_options(raw_request))
            if gone and rt.crd is None and rt.key not in RETURNS_DELETED_OBJECT:
                return _json({'kind': 'Status', 'apiVersion': 'v1', 'metadata': {}, 'status': 'Success',
                              'details': {'name': path.name, 'group': rt.group, 'kind': rt.plural,
                                          'uid': obj['metadata']['uid']}})
            return _json(_present(rt, version, obj))
        raise api_error(405, 'MethodNotAllowed', 'the server does not allow this method on the requested resource')

    async def _serve_watch(self, raw_request: aiohttp.web.BaseRequest, rt: ResourceType,
                           version: VersionSpec, path: ApiPath) -> aiohttp.web.StreamResponse:
        query = raw_request.query
        fields = query.get('fieldSelector', '')
        if path.name is not None:  # a watch on one object: the deprecated form of a name selector
            fields = ','.join(filter(None, [fields, f'metadata.name={path.name}']))
        selector = _selector(rt, path, {**query, 'fieldSelector': fields})
        timeout_seconds = _int_param(query, 'timeoutSeconds')
        response = aiohttp.web.StreamResponse(headers={'Content-Type': 'application/json'})
        try:
            initial, watcher = self.cluster.watch(rt, selector, query.get('resourceVersion'))
        except Gone as e:
            await response.prepare(raw_request)
            await response.write(_json_line({'type': 'ERROR', 'object': {
                'kind': 'Status', 'apiVersion': 'v1', 'metadata': {}, 'status': 'Failure',
                'message': str(e), 'reason': 'Expired', 'code': 410}}))
            await response.write_eof()
            return response
        try:
            await response.prepare(raw_request)
            for event in initial:
                await self._send(response, rt, version, watcher, event)
            if query.get('sendInitialEvents') == 'true':
                await response.write(_json_line({'type': 'BOOKMARK', 'object': {
                    'kind': rt.kind, 'apiVersion': rt.api_version(version.name), 'metadata': {
                        'resourceVersion': str(self.cluster.resource_version),
                        'annotations': {'k8s.io/initial-events-end': 'true'}}}}))
            await self._stream(raw_request, response, rt, version, watcher, timeout_seconds)
            await response.write_eof()
        except ConnectionError:
            pass  # the client went away
        finally:
            self.cluster.unwatch(rt, watcher)
        return response

    async def _stream(self, raw_request: aiohttp.web.BaseRequest, response: aiohttp.web.StreamResponse,
                      rt: ResourceType, version: VersionSpec, watcher: Watcher, timeout_seconds: int | None) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_seconds if timeout_seconds else math.inf
        while raw_request.transport is not None and not raw_request.transport.is_closing():
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            try:
                event = await asyncio.wait_for(watcher.queue.get(), min(remaining, WATCH_POLL_SECONDS))
            except TimeoutError:
                continue
            if event is None:
                return  # closed by the server: the resource was unregistered, reset() or shutdown
            await self._send(response, rt, version, watcher, event)

    @staticmethod
    async def _send(response: aiohttp.web.StreamResponse, rt: ResourceType, version: VersionSpec,
                    watcher: Watcher, event: WatchEvent) -> None:
        translated = watcher.translate(event)
        if translated is not None:
            event_type, obj = translated
            await response.write(_json_line({'type': event_type, 'object': _present(rt, version, obj)}))


def _is_served_path(rt: ResourceType, version: VersionSpec, path: ApiPath) -> bool:
    """Whether the URL fits the resource's scope and subresources.

    Cluster-scoped resources have no namespace in their URLs. Namespaced objects need one; their
    collections may omit it to list/watch all namespaces (other verbs there are 405).
    """
    if path.subresource is not None and (path.name is None or path.subresource not in version.subresources):
        return False
    if not rt.namespaced:
        return path.namespace is None
    return path.namespace is not None or path.name is None


def _api_group(name: str, versions: list[str]) -> dict[str, Any]:
    entries = [{'groupVersion': f'{name}/{version}', 'version': version} for version in versions]
    return {'kind': 'APIGroup', 'apiVersion': 'v1', 'name': name, 'versions': entries,
            'preferredVersion': entries[0]}


def _present(rt: ResourceType, version: VersionSpec, obj: Mapping[str, Any]) -> dict[str, Any]:
    """The object as served in the requested version (conversion strategy None)."""
    return dict(obj, apiVersion=rt.api_version(version.name), kind=rt.kind)


def _json(body: Any, status: int = 200) -> aiohttp.web.Response:
    return aiohttp.web.json_response(body, status=status)


def _json_line(body: Any) -> bytes:
    return json.dumps(body).encode() + b'\n'


def _int_param(query: Mapping[str, str], name: str) -> int | None:
    value = query.get(name)
    if not value:
        return None
    if not value.isdigit():
        raise bad_request(f'{name}: invalid value {value!r}')
    return int(value)


def _selector(rt: ResourceType, path: ApiPath, query: Mapping[str, str]) -> Selector:
    return Selector(namespace=path.namespace,
                    labels=tuple(parse_label_selector(query.get('labelSelector', ''))),
                    fields=tuple(parse_field_selector(query.get('fieldSelector', ''), rt)))


async def _json_body(raw_request: aiohttp.web.BaseRequest) -> Any:
    try:
        return json.loads(await raw_request.read() or b'null')
    except ValueError as e:
        raise bad_request(f'the request body is not valid JSON: {e}') from e


async def _patch_body(raw_request: aiohttp.web.BaseRequest) -> tuple[str, Any]:
    content_type = raw_request.content_type
    if content_type == 'application/apply-patch+yaml':
        if not raw_request.query.get('fieldManager'):
            raise api_error(422, 'Invalid', 'PatchOptions.meta.k8s.io "" is invalid: fieldManager: '
                                            'Required value: is required for apply patch')
        try:
            return content_type, yaml.safe_load(await raw_request.text())
        except yaml.YAMLError as e:
            raise bad_request(f'the request body is not valid YAML: {e}') from e
    if content_type not in ('application/json-patch+json', 'application/merge-patch+json',
                            'application/strategic-merge-patch+json'):
        raise api_error(415, 'UnsupportedMediaType', f'the body of the request was in an unknown format - '
                                                     f'{content_type!r} is not a patch media type')
    return content_type, await _json_body(raw_request)


async def _delete_options(raw_request: aiohttp.web.BaseRequest) -> dict[str, Any]:
    options = await _json_body(raw_request) or {}
    if not isinstance(options, dict):
        raise bad_request('DeleteOptions must be an object')
    if 'propagationPolicy' in raw_request.query:
        options['propagationPolicy'] = raw_request.query['propagationPolicy']
    return options


# ================================================================================================
# The public entry point: a server in a background thread
# ================================================================================================

class KubeEmulator:
    """The emulated API server on ``127.0.0.1:<free port>``, served by a background thread.

    The thread runs its own event loop (aiohttp server + the ``Cluster``), so synchronous tests,
    the official client and kopf operators in other threads use it like a remote cluster.
    Use as a context manager; ``reset()`` empties it between tests.
    """

    def __init__(self, host: str = '127.0.0.1') -> None:
        self._host = host
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name='kube-emulator', daemon=True)
        self._server: ApiServer | None = None
        self._runner: aiohttp.web.ServerRunner | None = None
        self.url = ''

    def __enter__(self) -> KubeEmulator:
        self._thread.start()
        try:
            self._call(self._start())
        except BaseException:
            self._stop_loop()
            raise
        return self

    def __exit__(self, *exc_info: Any) -> None:
        try:
            self._call(self._stop())
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    async def _start(self) -> None:
        self._server = ApiServer()
        await self._server.__aenter__()  # kmock: starts its stream feeder, begins collecting errors
        self._runner = aiohttp.web.ServerRunner(aiohttp.web.Server(self._server), shutdown_timeout=1.0)
        await self._runner.setup()
        site = aiohttp.web.TCPSite(self._runner, self._host, 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f'http://{self._host}:{port}'

    async def _stop(self) -> None:
        assert self._server is not None and self._runner is not None
        self._server.cluster.close_watches()
        await self._runner.cleanup()
        await self._server.__aexit__(None, None, None)

    def _call(self, coro: Any, timeout: float = 60.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    @property
    def server(self) -> ApiServer:
        """The kmock handler (for kmock's DSL on non-resource paths); touch only via ``run_in_loop``."""
        assert self._server is not None, 'the emulator is not running'
        return self._server

    def run_in_loop(self, fn: Callable[[Cluster], Any]) -> Any:
        """Run ``fn(cluster)`` atomically on the emulator's loop (e.g. to inspect state directly)."""
        async def call() -> Any:
            return fn(self.server.cluster)
        return self._call(call())

    def reset(self) -> None:
        """Drop all objects and CRDs (built-in resources stay registered); close all watches."""
        def reset(cluster: Cluster) -> None:
            cluster.reset()
            self.server.forget_requests()
        self.run_in_loop(reset)

    def pop_internal_errors(self) -> list[Exception]:
        """Failures of the emulator itself (answered with HTTP 500) since the last call."""
        def pop(_: Cluster) -> list[Exception]:
            errors = [e for e in self.server.errors if not isinstance(e, kmock.KubernetesError)]
            self.server.errors.clear()
            return errors
        return self.run_in_loop(pop)

    def api_client(self) -> kubernetes.client.ApiClient:
        configuration = kubernetes.client.Configuration()
        configuration.host = self.url
        return kubernetes.client.ApiClient(configuration)

    def write_kubeconfig(self, path: str | Path) -> Path:
        return write_kubeconfig(self.url, path)


def write_kubeconfig(server: str, path: str | Path) -> Path:
    """A kubeconfig at ``path`` for the API server at ``server`` (the emulator, or a proxy in
    front of it)."""
    path = Path(path)
    path.write_text(yaml.safe_dump({
        'apiVersion': 'v1', 'kind': 'Config', 'preferences': {},
        'clusters': [{'name': 'kube-emulator', 'cluster': {'server': server}}],
        'users': [{'name': 'kube-emulator', 'user': {}}],
        'contexts': [{'name': 'kube-emulator', 'context': {
            'cluster': 'kube-emulator', 'user': 'kube-emulator', 'namespace': 'default'}}],
        'current-context': 'kube-emulator',
    }))
    return path


# ================================================================================================
# CEL: a small evaluator for the subset CRD validation rules commonly use
# ================================================================================================
#
# Supported: literals (int, uint as int, double, string incl. raw/triple-quoted, bool, null,
# lists, maps; bytes values come only from bytes(), no b'' literals); variables ``self``/``oldSelf``
# and macro variables; ``.field``, ``[index]``, ``[key]``; ``! - * / % + - < <= > >= == != in
# && || ?:`` with CEL's error-absorbing ``&&``/``||``; macros ``has()``, ``all``, ``exists``,
# ``exists_one``, ``map`` (2 and 3 args), ``filter``; the functions in CEL_FUNCTIONS (global) and
# CEL_METHODS (receiver-style). Not supported (the CRD is rejected at creation, naming the rule):
# timestamps/durations, bytes literals, optionals (``?.``, ``optionalOldSelf``), type(),
# Kubernetes libraries (quantity, url, ip, cidr, format, regex find, authz), and anything else
# not listed. Typing is dynamic: int and double mix in arithmetic (a real server would reject
# such a rule at CRD creation), and there is no cost limit.
# To extend: add a function to CEL_FUNCTIONS / CEL_METHODS, or a node to CelParser/_evaluate.

class CelError(Exception):
    """A runtime evaluation error (no such key, no such overload, division by zero, ...)."""


class CelSyntaxError(ValueError):
    """The expression cannot be parsed, or uses something outside the supported subset."""


def _cel_size(value: Any) -> int:
    if isinstance(value, (str, bytes, list, dict)):
        return len(value)
    raise CelError('no such overload: size')


def _cel_str(value: Any) -> str:
    if not isinstance(value, str):
        raise CelError('no such overload: expected a string')
    return value


def _cel_list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise CelError('no such overload: expected a list')
    return value


def _cel_int(value: Any) -> int:
    if isinstance(value, bool):
        raise CelError('no such overload: int(bool)')
    try:
        return int(value)
    except (TypeError, ValueError) as e:
        raise CelError(f'cannot convert {value!r} to int') from e


def _cel_double(value: Any) -> float:
    if isinstance(value, bool):
        raise CelError('no such overload: double(bool)')
    try:
        return float(value)
    except (TypeError, ValueError) as e:
        raise CelError(f'cannot convert {value!r} to double') from e


def _cel_string(value: Any) -> str:
    if isinstance(value, bool):
        return 'true' if value else 'false'
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError as e:
            raise CelError('invalid UTF-8 in bytes') from e
    if isinstance(value, (str, int, float)):
        return str(value)
    raise CelError('no such overload: string()')


def _cel_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    return _cel_str(value).encode()


def _cel_sorted(items: Any) -> bool:
    items = _cel_list(items)
    return all(_cel_compare('<=', a, b) for a, b in itertools.pairwise(items))


CEL_FUNCTIONS: dict[str, Callable[..., Any]] = {
    'size': _cel_size,
    'int': _cel_int,
    'uint': _cel_int,
    'double': _cel_double,
    'string': _cel_string,
    'bytes': _cel_bytes,
    'dyn': lambda value: value,
    'matches': lambda s, pattern: re.search(_cel_str(pattern), _cel_str(s)) is not None,
}
CEL_METHODS: dict[str, Callable[..., Any]] = {
    'size': _cel_size,
    'startsWith': lambda s, prefix: _cel_str(s).startswith(_cel_str(prefix)),
    'endsWith': lambda s, suffix: _cel_str(s).endswith(_cel_str(suffix)),
    'contains': lambda s, part: _cel_str(part) in _cel_str(s),
    'matches': lambda s, pattern: re.search(_cel_str(pattern), _cel_str(s)) is not None,
    'lowerAscii': lambda s: ''.join(c.lower() if c.isascii() else c for c in _cel_str(s)),
    'upperAscii': lambda s: ''.join(c.upper() if c.isascii() else c for c in _cel_str(s)),
    'trim': lambda s: _cel_str(s).strip(),
    'split': lambda s, sep: _cel_str(s).split(_cel_str(sep)),
    'join': lambda items, sep='': _cel_str(sep).join(_cel_str(item) for item in _cel_list(items)),
    'indexOf': lambda s, part: _cel_str(s).find(_cel_str(part)),
    'lastIndexOf': lambda s, part: _cel_str(s).rfind(_cel_str(part)),
    'substring': lambda s, start, end=None: _cel_str(s)[start:end],
    'replace': lambda s, old, new, n=-1: _cel_str(s).replace(_cel_str(old), _cel_str(new), n),
    'isSorted': _cel_sorted,
    'sum': lambda items: sum(_cel_list(items)),
    'min': lambda items: min(_cel_list(items)) if items else _raise(CelError('min of an empty list')),
    'max': lambda items: max(_cel_list(items)) if items else _raise(CelError('max of an empty list')),
}
CEL_MACROS = frozenset({'all', 'exists', 'exists_one', 'map', 'filter'})


def _raise(error: Exception) -> Any:
    raise error


_CEL_TOKEN = re.compile(r'''
    (?P<space>\s+)
  | (?P<float>(?:\d+\.\d+(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+))
  | (?P<int>0[xX][0-9a-fA-F]+[uU]?|\d+[uU]?)
  | (?P<string>[rR]?(?:"""[\s\S]*?"""|\'\'\'[\s\S]*?\'\'\'|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'))
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>\|\||&&|==|!=|<=|>=|[-+*/%!<>?:.,\[\](){}])
''', re.VERBOSE)
_CEL_ESCAPE = re.compile(r'\\(u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|x[0-9a-fA-F]{2}|[0-7]{3}|.)')
_CEL_SIMPLE_ESCAPES = {'n': '\n', 'r': '\r', 't': '\t', 'a': '\a', 'b': '\b', 'f': '\f', 'v': '\v'}


def _cel_string_literal(text: str) -> str:
    raw = text[0] in 'rR'
    text = text[1:] if raw else text
    body = text[3:-3] if text[:3] in ('"""', "'''") else text[1:-1]
    if raw:
        return body

    def unescape(match: re.Match[str]) -> str:
        code = match.group(1)
        if code[0] in 'uUx':
            return chr(int(code[1:], 16))
        if code[0].isdigit():
            return chr(int(code, 8))
        return _CEL_SIMPLE_ESCAPES.get(code, code)
    return _CEL_ESCAPE.sub(unescape, body)


def _cel_tokens(text: str) -> list[tuple[str, str]]:
    tokens, position = [], 0
    while position < len(text):
        match = _CEL_TOKEN.match(text, position)
        if match is None:
            raise CelSyntaxError(f'unexpected character {text[position]!r} at {position}')
        position = match.end()
        if match.lastgroup != 'space':
            tokens.append((match.lastgroup or '', match.group()))
    return [*tokens, ('end', '')]


class CelParser:
    """Recursive descent over CEL's grammar, producing tuples: (node kind, *operands)."""

    _RELATIONS = ('<', '<=', '>', '>=', '==', '!=')

    def __init__(self, text: str) -> None:
        self._tokens = _cel_tokens(text)
        self._position = 0

    def parse(self) -> tuple[Any, ...]:
        node = self._expression()
        if self._peek()[0] != 'end':
            raise CelSyntaxError(f'unexpected {self._peek()[1]!r}')
        return node

    def _peek(self) -> tuple[str, str]:
        return self._tokens[self._position]

    def _take(self) -> tuple[str, str]:
        token = self._tokens[self._position]
        self._position += 1
        return token

    def _accept(self, text: str) -> bool:
        if self._peek()[1] == text and self._peek()[0] in ('op', 'ident'):
            self._position += 1
            return True
        return False

    def _expect(self, text: str) -> None:
        if not self._accept(text):
            raise CelSyntaxError(f'expected {text!r}, found {self._peek()[1]!r}')

    def _expression(self) -> tuple[Any, ...]:
        condition = self._binary_chain(self._and, '||', 'or')
        if self._accept('?'):
            if_true = self._binary_chain(self._and, '||', 'or')
            self._expect(':')
            return 'cond', condition, if_true, self._expression()
        return condition

    def _binary_chain(self, operand: Callable[[], tuple[Any, ...]], op: str, kind: str) -> tuple[Any, ...]:
        node = operand()
        while self._accept(op):
            node = kind, node, operand()
        return node

    def _and(self) -> tuple[Any, ...]:
        return self._binary_chain(self._relation, '&&', 'and')

    def _relation(self) -> tuple[Any, ...]:
        node = self._addition()
        while self._peek()[1] in (*self._RELATIONS, 'in'):
            node = 'binary', self._take()[1], node, self._addition()
        return node

    def _addition(self) -> tuple[Any, ...]:
        node = self._multiplication()
        while self._peek()[1] in ('+', '-') and self._peek()[0] == 'op':
            node = 'binary', self._take()[1], node, self._multiplication()
        return node

    def _multiplication(self) -> tuple[Any, ...]:
        node = self._unary()
        while self._peek()[1] in ('*', '/', '%') and self._peek()[0] == 'op':
            node = 'binary', self._take()[1], node, self._unary()
        return node

    def _unary(self) -> tuple[Any, ...]:
        if self._accept('!'):
            return 'not', self._unary()
        if self._accept('-'):
            return 'neg', self._unary()
        return self._member()

    def _member(self) -> tuple[Any, ...]:
        node = self._primary()
        while True:
            if self._accept('.'):
                kind, name = self._take()
                if kind != 'ident':
                    raise CelSyntaxError(f'expected a field name after ".", found {name!r}')
                node = self._method(node, name, self._arguments()) if self._accept('(') else ('select', node, name)
            elif self._accept('['):
                index = self._expression()
                self._expect(']')
                node = 'index', node, index
            else:
                return node

    def _arguments(self, closing: str = ')') -> list[tuple[Any, ...]]:
        items: list[tuple[Any, ...]] = []
        while not self._accept(closing):
            items.append(self._expression())
            if not self._accept(','):
                self._expect(closing)
                break
        return items

    def _method(self, target: tuple[Any, ...], name: str, args: list[tuple[Any, ...]]) -> tuple[Any, ...]:
        if name in CEL_MACROS:
            if len(args) not in (2, 3) or args[0][0] != 'ident' or (len(args) == 3 and name != 'map'):
                raise CelSyntaxError(f'invalid arguments to the macro {name}()')
            return 'macro', name, target, args[0][1], *args[1:]
        if name not in CEL_METHODS:
            raise CelSyntaxError(f'function {name!r} is not supported by the Kubernetes emulator\'s CEL subset')
        return 'method', name, target, args

    def _primary(self) -> tuple[Any, ...]:
        kind, text = self._take()
        if kind == 'int':
            return 'literal', int(text.rstrip('uU'), 0)
        if kind == 'float':
            return 'literal', float(text)
        if kind == 'string':
            return 'literal', _cel_string_literal(text)
        if kind == 'ident':
            return self._identifier(text)
        if text == '(':
            node = self._expression()
            self._expect(')')
            return node
        if text == '[':
            return 'list', self._arguments(']')
        if text == '{':
            return 'map', self._map_entries()
        raise CelSyntaxError(f'unexpected {text or "end of expression"!r}')

    def _identifier(self, name: str) -> tuple[Any, ...]:
        literals = {'true': True, 'false': False, 'null': None}
        if name in literals:
            return 'literal', literals[name]
        if not self._accept('('):
            return 'ident', name
        args = self._arguments()
        if name == 'has':
            if len(args) != 1 or args[0][0] != 'select':
                raise CelSyntaxError('has() needs a field selection, e.g. has(self.field)')
            return 'has', args[0][1], args[0][2]
        if name not in CEL_FUNCTIONS:
            raise CelSyntaxError(f'function {name!r} is not supported by the Kubernetes emulator\'s CEL subset')
        return 'call', name, args

    def _map_entries(self) -> list[tuple[tuple[Any, ...], tuple[Any, ...]]]:
        entries = []
        while not self._accept('}'):
            key = self._expression()
            self._expect(':')
            entries.append((key, self._expression()))
            if not self._accept(','):
                self._expect('}')
                break
        return entries


@dataclasses.dataclass(frozen=True)
class CelProgram:
    source: str
    tree: tuple[Any, ...]

    @property
    def uses_old_self(self) -> bool:
        return _mentions(self.tree, 'oldSelf')

    def evaluate(self, env: Mapping[str, Any]) -> Any:
        return _evaluate(self.tree, env)


@functools.cache
def compile_cel(source: str) -> CelProgram:
    return CelProgram(source, CelParser(source).parse())


def _mentions(node: Any, name: str) -> bool:
    if isinstance(node, tuple) and node[:2] == ('ident', name):
        return True
    return isinstance(node, (tuple, list)) and any(_mentions(child, name) for child in node)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _cel_equals(a: Any, b: Any) -> bool:
    if _is_number(a) and _is_number(b):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_cel_equals(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_cel_equals(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _cel_compare(op: str, a: Any, b: Any) -> bool:
    comparable = (_is_number(a) and _is_number(b)) or (type(a) is type(b) and isinstance(a, (str, bytes, bool)))
    if not comparable:
        raise CelError(f'no such overload: {type_name(a)} {op} {type_name(b)}')
    return {'<': a < b, '<=': a <= b, '>': a > b, '>=': a >= b}[op]


def _cel_arithmetic(op: str, a: Any, b: Any) -> Any:
    if _is_number(a) and _is_number(b):
        if op in ('/', '%') and b == 0:
            raise CelError('division by zero' if op == '/' else 'modulus by zero')
        if op == '/' and isinstance(a, int) and isinstance(b, int):
            quotient = abs(a) // abs(b)
            return quotient if (a >= 0) == (b > 0) else -quotient
        if op == '%':
            if not (isinstance(a, int) and isinstance(b, int)):
                raise CelError('no such overload: double % double')
            return a - b * _cel_arithmetic('/', a, b)  # the sign of the dividend, like C and Go
        return {'+': lambda: a + b, '-': lambda: a - b, '*': lambda: a * b, '/': lambda: a / b}[op]()
    if op == '+' and type(a) is type(b) and isinstance(a, (str, bytes, list)):
        return a + b
    raise CelError(f'no such overload: {type_name(a)} {op} {type_name(b)}')


def _cel_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise CelError(f'no such overload: expected a bool, got {type_name(value)}')
    return value


def _evaluate(node: tuple[Any, ...], env: Mapping[str, Any]) -> Any:
    kind = node[0]
    if kind == 'literal':
        return node[1]
    if kind == 'ident':
        if node[1] not in env:
            raise CelError(f'undeclared reference to {node[1]!r}')
        return env[node[1]]
    if kind == 'select':
        target = _evaluate(node[1], env)
        if not isinstance(target, dict):
            raise CelError(f'no such overload: field selection on {type_name(target)}')
        if node[2] not in target:
            raise CelError(f'no such key: {node[2]}')
        return target[node[2]]
    if kind == 'has':
        target = _evaluate(node[1], env)
        if not isinstance(target, dict):
            raise CelError(f'no such overload: has() on {type_name(target)}')
        return node[2] in target
    if kind == 'index':
        return _cel_index(_evaluate(node[1], env), _evaluate(node[2], env))
    if kind == 'list':
        return [_evaluate(item, env) for item in node[1]]
    if kind == 'map':
        return {_evaluate(key, env): _evaluate(value, env) for key, value in node[1]}
    if kind == 'not':
        return not _cel_bool(_evaluate(node[1], env))
    if kind == 'neg':
        value = _evaluate(node[1], env)
        if not _is_number(value):
            raise CelError(f'no such overload: -{type_name(value)}')
        return -value
    if kind in ('and', 'or'):
        return _cel_logical(kind == 'or', node[1], node[2], env)
    if kind == 'cond':
        return _evaluate(node[2] if _cel_bool(_evaluate(node[1], env)) else node[3], env)
    if kind == 'binary':
        return _cel_binary(node[1], _evaluate(node[2], env), _evaluate(node[3], env))
    if kind == 'call':
        return _cel_apply(node[1], CEL_FUNCTIONS[node[1]], [_evaluate(arg, env) for arg in node[2]])
    if kind == 'method':
        target = _evaluate(node[2], env)
        return _cel_apply(node[1], CEL_METHODS[node[1]], [target] + [_evaluate(arg, env) for arg in node[3]])
    if kind == 'macro':
        return _cel_macro(node[1], _evaluate(node[2], env), node[3], node[4:], env)
    raise CelError(f'unknown node {kind!r}')  # pragma: no cover  (the parser makes no other nodes)


def _cel_index(target: Any, index: Any) -> Any:
    if isinstance(target, list):
        if not _is_number(index) or int(index) != index or not 0 <= index < len(target):
            raise CelError(f'index out of range: {index}')
        return target[int(index)]
    if isinstance(target, dict):
        if index not in target:
            raise CelError(f'no such key: {index}')
        return target[index]
    raise CelError(f'no such overload: index on {type_name(target)}')


def _cel_binary(op: str, a: Any, b: Any) -> Any:
    if op == '==':
        return _cel_equals(a, b)
    if op == '!=':
        return not _cel_equals(a, b)
    if op == 'in':
        if isinstance(b, list):
            return any(_cel_equals(a, item) for item in b)
        if isinstance(b, dict):
            return a in b
        raise CelError(f'no such overload: in {type_name(b)}')
    if op in ('<', '<=', '>', '>='):
        return _cel_compare(op, a, b)
    return _cel_arithmetic(op, a, b)


def _cel_logical(is_or: bool, left: tuple[Any, ...], right: tuple[Any, ...], env: Mapping[str, Any]) -> bool:
    """CEL's commutative && / ||: a deciding operand wins over an error in the other one."""
    errors = []
    for operand in (left, right):
        try:
            if _cel_bool(_evaluate(operand, env)) == is_or:
                return is_or
        except CelError as e:
            errors.append(e)
    if errors:
        raise errors[0]
    return not is_or


def _cel_apply(name: str, fn: Callable[..., Any], args: list[Any]) -> Any:
    try:
        return fn(*args)
    except CelError:
        raise
    except (TypeError, ValueError, re.error) as e:
        raise CelError(f'no such overload: {name}: {e}') from e


def _cel_macro(name: str, target: Any, var: str, args: tuple[Any, ...], env: Mapping[str, Any]) -> Any:
    if isinstance(target, dict):
        items = list(target)
    elif isinstance(target, list):
        items = target
    else:
        raise CelError(f'no such overload: {name}() on {type_name(target)}')
    scoped = [{**env, var: item} for item in items]
    if name == 'map':
        predicate, transform = (args[0], args[1]) if len(args) == 2 else (None, args[0])
        return [_evaluate(transform, e) for e in scoped if predicate is None or _cel_bool(_evaluate(predicate, e))]
    if name == 'filter':
        return [item for item, e in zip(items, scoped, strict=True) if _cel_bool(_evaluate(args[0], e))]
    results, errors = [], []
    for e in scoped:
        try:
            results.append(_cel_bool(_evaluate(args[0], e)))
        except CelError as error:
            errors.append(error)
    if name == 'all' and False in results:
        return False
    if name == 'exists' and True in results:
        return True
    if errors:
        raise errors[0]
    return {'all': True, 'exists': False, 'exists_one': results.count(True) == 1}[name]
