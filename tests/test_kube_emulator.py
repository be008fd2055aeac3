"""The Kubernetes API emulator behaves like an API server for the official client (and kopf).

One test per behaviour; each would fail on plain kmock (see shared/FACTS.md) or on a broken
emulator. The official client is used throughout; raw HTTP only where it cannot express the call
(discovery of a custom API group). No test asserts on time: waits poll with generous deadlines.
"""

import json
import urllib.error
import urllib.request
from typing import Any

import kubernetes.client
import kubernetes.config
import pytest
from kubernetes import watch
from kubernetes.client import ApiException
from kubernetes.dynamic import DynamicClient

from tests.support import kube_emulator
from tests.support.fixtures_kube import kopf_peering_crds
from tests.support.kube_emulator import CelError, CelSyntaxError, compile_cel

GROUP, VERSION, PLURAL, KIND = 'example.com', 'v1', 'widgets', 'Widget'

WIDGET_SCHEMA = {
    'type': 'object',
    'properties': {
        'metadata': {'type': 'object'},  # as generated CRDs declare it: ObjectMeta must not be pruned
        'spec': {
            'type': 'object',
            'required': ['source'],
            'x-kubernetes-validations': [
                {'rule': 'has(self.table) || has(self.tables)', 'message': 'either table or tables is required'},
                {'rule': 'self.minReplicas <= self.maxReplicas', 'fieldPath': '.minReplicas',
                 'message': 'minReplicas must not exceed maxReplicas'},
            ],
            'properties': {
                'source': {
                    'type': 'object',
                    'required': ['host'],
                    'properties': {
                        'host': {'type': 'string', 'minLength': 1, 'x-kubernetes-validations': [
                            {'rule': 'self == oldSelf', 'message': 'host is immutable'}]},
                        'port': {'type': 'integer', 'minimum': 1, 'maximum': 65535, 'default': 5432},
                    },
                },
                'table': {'type': 'string', 'pattern': '^[a-z_]+$'},
                'tables': {'type': 'array', 'maxItems': 3, 'items': {'type': 'string'},
                           'x-kubernetes-validations': [{'rule': 'size(self) > 0',
                                                         'message': 'tables must not be empty'}]},
                'mode': {'type': 'string', 'enum': ['snapshot', 'cdc'], 'default': 'cdc'},
                'minReplicas': {'type': 'integer', 'default': 1},
                'maxReplicas': {'type': 'integer', 'default': 1},
                'interval': {'type': 'string', 'format': 'duration'},
                'size': {'x-kubernetes-int-or-string': True},
                'note': {'type': 'string', 'nullable': True},
                'extra': {'type': 'object', 'x-kubernetes-preserve-unknown-fields': True},
            },
        },
        'status': {'type': 'object', 'properties': {
            'phase': {'type': 'string', 'enum': ['Pending', 'Ready']},
            'observedGeneration': {'type': 'integer'},
        }},
    },
}


def make_crd(group: str = GROUP, plural: str = PLURAL, kind: str = KIND, *, scope: str = 'Namespaced',
             schema: dict[str, Any] | None = None, status: bool = True, versions: tuple[str, ...] = (VERSION,),
             short_names: tuple[str, ...] = ('wd',), categories: tuple[str, ...] = ('all',)) -> dict[str, Any]:
    return {
        'apiVersion': 'apiextensions.k8s.io/v1', 'kind': 'CustomResourceDefinition',
        'metadata': {'name': f'{plural}.{group}'},
        'spec': {
            'group': group, 'scope': scope,
            'names': {'plural': plural, 'singular': kind.lower(), 'kind': kind,
                      'shortNames': list(short_names), 'categories': list(categories)},
            'versions': [{'name': version, 'served': True, 'storage': version == versions[0],
                          'subresources': {'status': {}} if status else {},
                          'schema': {'openAPIV3Schema': schema or WIDGET_SCHEMA}} for version in versions],
        },
    }


def widget(name: str, **spec: Any) -> dict[str, Any]:
    spec.setdefault('source', {'host': 'db'})
    if 'tables' not in spec:
        spec.setdefault('table', 'orders')
    return {'apiVersion': f'{GROUP}/{VERSION}', 'kind': KIND, 'metadata': {'name': name}, 'spec': spec}


def configmap(name: str, labels: dict[str, str] | None = None, **meta: Any) -> dict[str, Any]:
    return {'metadata': {'name': name, 'labels': labels or {}, **meta}, 'data': {'key': name}}


def status_of(raised: pytest.ExceptionInfo[ApiException]) -> dict[str, Any]:
    body = raised.value.body
    assert body is not None, raised.value
    return json.loads(body)


def _dict(response: object) -> dict[str, Any]:
    """An answer of the custom-objects API: typed ``object`` by the client, a dict at run time."""
    assert isinstance(response, dict), type(response)
    return response


def raw_get(kube, path: str) -> dict[str, Any]:
    with urllib.request.urlopen(kube.url + path) as response:
        return json.load(response)


@pytest.fixture
def api(kube):
    with kube.api_client() as api_client:
        yield api_client


@pytest.fixture
def core(api):
    return kubernetes.client.CoreV1Api(api)


@pytest.fixture
def custom(api):
    return kubernetes.client.CustomObjectsApi(api)


@pytest.fixture
def crds(api):
    return kubernetes.client.ApiextensionsV1Api(api)


@pytest.fixture
def widgets(crds, custom):
    """The Widget CRD is created; returns a helper bound to the default namespace."""
    crds.create_custom_resource_definition(make_crd())
    return Widgets(custom)


class Widgets:
    def __init__(self, custom: kubernetes.client.CustomObjectsApi) -> None:
        self.api = custom

    def create(self, body: dict[str, Any], namespace: str = 'default') -> dict[str, Any]:
        return _dict(self.api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body))

    def get(self, name: str, namespace: str = 'default') -> dict[str, Any]:
        return _dict(self.api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name))

    def patch(self, name: str, body: Any, **kwargs: Any) -> Any:
        """The patched object, a dict; None after a server-side apply that created it (201)."""
        return self.api.patch_namespaced_custom_object(GROUP, VERSION, 'default', PLURAL, name, body, **kwargs)

    def replace(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return _dict(self.api.replace_namespaced_custom_object(GROUP, VERSION, 'default', PLURAL, name, body))

    def get_status(self, name: str) -> dict[str, Any]:
        return _dict(self.api.get_namespaced_custom_object_status(GROUP, VERSION, 'default', PLURAL, name))

    def patch_status(self, name: str, body: Any) -> dict[str, Any]:
        return _dict(self.api.patch_namespaced_custom_object_status(GROUP, VERSION, 'default', PLURAL, name, body))

    def replace_status(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return _dict(self.api.replace_namespaced_custom_object_status(GROUP, VERSION, 'default', PLURAL, name, body))

    def delete(self, name: str, **kwargs: Any) -> dict[str, Any]:
        return _dict(self.api.delete_namespaced_custom_object(GROUP, VERSION, 'default', PLURAL, name, **kwargs))

    def exists(self, name: str) -> bool:
        try:
            self.get(name)
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        return True


def invalid_message(widgets: Widgets, body: dict[str, Any]) -> str:
    with pytest.raises(ApiException) as raised:
        widgets.create(body)
    assert raised.value.status == 422
    return status_of(raised)['message']


# ---- CRDs and discovery -------------------------------------------------------------------------

def test_crd_is_discoverable_and_served_at_once(kube, crds, custom):
    crds.create_custom_resource_definition(make_crd())

    groups = {g.name: g for g in kubernetes.client.ApisApi(custom.api_client).get_api_versions().groups}
    preferred = groups[GROUP].preferred_version
    assert preferred is not None and preferred.version == VERSION
    assert raw_get(kube, f'/apis/{GROUP}')['versions'] == [{'groupVersion': f'{GROUP}/{VERSION}', 'version': VERSION}]
    resources = {r.name: r for r in custom.get_api_resources(GROUP, VERSION).resources}
    assert set(resources) == {PLURAL, f'{PLURAL}/status'}
    assert resources[PLURAL].namespaced is True
    assert resources[PLURAL].kind == KIND and resources[PLURAL].singular_name == 'widget'
    assert resources[PLURAL].short_names == ['wd'] and resources[PLURAL].categories == ['all']
    assert set(resources[PLURAL].verbs) == set(kube_emulator.VERBS)

    created = custom.create_namespaced_custom_object(GROUP, VERSION, 'default', PLURAL, widget('w1'))
    assert created['metadata']['name'] == 'w1'


def test_crd_preferred_version_and_served_versions(kube, crds, custom):
    crds.create_custom_resource_definition(make_crd(versions=('v1', 'v1beta1', 'v2alpha1')))

    assert raw_get(kube, f'/apis/{GROUP}')['preferredVersion']['version'] == 'v1'
    created = custom.create_namespaced_custom_object(GROUP, 'v1', 'default', PLURAL, widget('w1'))
    seen_as_beta = custom.get_namespaced_custom_object(GROUP, 'v1beta1', 'default', PLURAL, 'w1')
    assert seen_as_beta['apiVersion'] == f'{GROUP}/v1beta1'
    assert seen_as_beta['metadata']['uid'] == created['metadata']['uid']


def test_deleting_crd_deletes_its_objects_and_unregisters_it(kube, crds, widgets):
    widgets.create(widget('w1'))

    crds.delete_custom_resource_definition(f'{PLURAL}.{GROUP}')

    with pytest.raises(ApiException) as raised:
        widgets.get('w1')
    assert raised.value.status == 404
    with pytest.raises(ApiException) as raised:
        widgets.api.get_api_resources(GROUP, VERSION)
    assert raised.value.status == 404
    assert GROUP not in {g.name for g in kubernetes.client.ApisApi(widgets.api.api_client).get_api_versions().groups}


def test_crd_deletion_waits_for_finalizers_of_its_objects(kube, crds, widgets):
    widgets.create(dict(widget('w1'), metadata={'name': 'w1', 'finalizers': ['test/hold']}))

    crds.delete_custom_resource_definition(f'{PLURAL}.{GROUP}')

    assert crds.read_custom_resource_definition(f'{PLURAL}.{GROUP}').metadata.deletion_timestamp
    assert widgets.get('w1')['metadata']['deletionTimestamp']
    widgets.patch('w1', {'metadata': {'finalizers': None}})
    with pytest.raises(ApiException) as raised:
        crds.read_custom_resource_definition(f'{PLURAL}.{GROUP}')
    assert raised.value.status == 404


def test_invalid_crd_is_rejected(crds):
    crd = make_crd()
    crd['metadata']['name'] = 'wrong.example.com'

    with pytest.raises(ApiException) as raised:
        crds.create_custom_resource_definition(crd)

    assert raised.value.status == 422
    assert 'metadata.name: Invalid value: "wrong.example.com": must be spec.names.plural+"."+spec.group' \
        in status_of(raised)['message']


def test_kopf_peering_crds_can_be_created_and_used(kube, crds, custom):
    for crd in kopf_peering_crds():
        crds.create_custom_resource_definition(crd)

    custom.create_namespaced_custom_object('kopf.dev', 'v1', 'default', 'kopfpeerings', {
        'apiVersion': 'kopf.dev/v1', 'kind': 'KopfPeering', 'metadata': {'name': 'example'},
        'status': {'operator-1': {'priority': 0}}})
    custom.create_cluster_custom_object('kopf.dev', 'v1', 'clusterkopfpeerings', {
        'apiVersion': 'kopf.dev/v1', 'kind': 'ClusterKopfPeering', 'metadata': {'name': 'example'}})

    peering = custom.get_namespaced_custom_object('kopf.dev', 'v1', 'default', 'kopfpeerings', 'example')
    assert peering['status'] == {'operator-1': {'priority': 0}}
    resources = {r.name: r for r in custom.get_api_resources('kopf.dev', 'v1').resources}
    assert resources['kopfpeerings'].namespaced is True
    assert resources['clusterkopfpeerings'].namespaced is False


def test_version_and_core_discovery(kube, api):
    assert kubernetes.client.VersionApi(api).get_code().major == '1'
    assert kubernetes.client.CoreApi(api).get_api_versions().versions == ['v1']
    core_resources = {r.name for r in kubernetes.client.CoreV1Api(api).get_api_resources().resources}
    assert {'namespaces', 'pods', 'pods/status', 'services', 'serviceaccounts', 'configmaps', 'secrets',
            'events'} <= core_resources


# ---- server-side metadata ---------------------------------------------------------------------

def test_server_sets_metadata_and_takes_namespace_from_url(core):
    created = core.create_namespaced_config_map('ns1', configmap('c1'))

    meta = created.metadata
    assert meta.namespace == 'ns1'
    assert len(meta.uid) == 36
    assert meta.resource_version.isdigit()
    assert meta.creation_timestamp is not None
    assert meta.generation == 1


def test_namespace_in_body_must_match_url(core):
    with pytest.raises(ApiException) as raised:
        core.create_namespaced_config_map('ns1', configmap('c1', namespace='other'))
    assert raised.value.status == 400


def test_resource_versions_come_from_one_increasing_counter(core, widgets):
    versions = [
        int(core.create_namespaced_config_map('default', configmap('c1')).metadata.resource_version),
        int(widgets.create(widget('w1'))['metadata']['resourceVersion']),
        int(core.patch_namespaced_config_map('c1', 'default', {'data': {'a': 'b'}}).metadata.resource_version),
        int(widgets.patch('w1', {'spec': {'table': 'items'}})['metadata']['resourceVersion']),
    ]
    assert versions == sorted(set(versions))


def test_unchanged_write_stores_nothing(core):
    created = core.create_namespaced_config_map('default', configmap('c1'))
    patched = core.patch_namespaced_config_map('c1', 'default', {'data': {'key': 'c1'}})
    assert patched.metadata.resource_version == created.metadata.resource_version


def test_generation_counts_only_spec_changes(widgets):
    widgets.create(widget('w1'))

    labelled = widgets.patch('w1', {'metadata': {'labels': {'a': 'b'}}})
    assert labelled['metadata']['generation'] == 1
    changed = widgets.patch('w1', {'spec': {'table': 'items'}})
    assert changed['metadata']['generation'] == 2
    with_status = widgets.patch_status('w1', {'status': {'phase': 'Ready'}})
    assert with_status['metadata']['generation'] == 2


def test_status_subresource_separates_status_from_main_writes(widgets):
    created = widgets.create(dict(widget('w1'), status={'phase': 'Ready'}))
    assert 'status' not in created, 'status is ignored on create with the status subresource'

    widgets.patch_status('w1', {'status': {'phase': 'Pending'}, 'spec': {'table': 'ignored'}})
    assert widgets.get('w1')['spec']['table'] == 'orders'
    assert widgets.get_status('w1')['status'] == {'phase': 'Pending'}

    widgets.patch('w1', {'status': {'phase': 'Ready'}, 'spec': {'table': 'items'}})
    assert widgets.get('w1')['status'] == {'phase': 'Pending'}

    current = widgets.get('w1')
    replaced = widgets.replace_status('w1', dict(current, status={'phase': 'Ready', 'observedGeneration': 2}))
    assert replaced['status'] == {'phase': 'Ready', 'observedGeneration': 2}
    assert replaced['spec']['table'] == 'items'


def test_status_subresource_is_404_when_not_declared(kube, core):
    core.create_namespaced_config_map('default', configmap('c1'))
    with pytest.raises(urllib.error.HTTPError) as raised:  # the typed client has no such call
        raw_get(kube, '/api/v1/namespaces/default/configmaps/c1/status')
    assert raised.value.code == 404


def test_name_uniqueness_is_409_already_exists(core):
    core.create_namespaced_config_map('default', configmap('c1'))

    with pytest.raises(ApiException) as raised:
        core.create_namespaced_config_map('default', configmap('c1'))

    assert raised.value.status == 409
    assert status_of(raised)['reason'] == 'AlreadyExists'
    assert status_of(raised)['message'] == 'configmaps "c1" already exists'
    core.create_namespaced_config_map('other', configmap('c1'))  # names are unique per namespace


def test_generate_name(core):
    body = {'metadata': {'generateName': 'job-'}}
    names = {core.create_namespaced_config_map('default', body).metadata.name for _ in range(5)}

    assert len(names) == 5
    assert all(name.startswith('job-') and len(name) == len('job-') + 5 for name in names)


@pytest.mark.parametrize(('meta', 'field'), [
    ({'name': 'Upper_Case'}, 'metadata.name'),
    ({'name': 'x' * 254}, 'metadata.name'),
    ({'name': 'ok', 'labels': {'bad key!': 'v'}}, 'metadata.labels'),
    ({'name': 'ok', 'labels': {'k': 'v' * 64}}, 'metadata.labels'),
    ({'name': 'ok', 'annotations': {'a/b/c': 'v'}}, 'metadata.annotations'),
    ({'name': 'ok', 'ownerReferences': [{'apiVersion': 'v1', 'kind': 'ConfigMap', 'name': 'x'}]},
     'metadata.ownerReferences[0].uid'),
])
def test_invalid_metadata_is_422(widgets, meta, field):
    with pytest.raises(ApiException) as raised:  # an untyped client: the typed one checks some locally
        widgets.create(dict(widget('any'), metadata=meta))
    assert raised.value.status == 422
    assert [cause['field'] for cause in status_of(raised)['details']['causes']][:1] == [field]


# ---- deletion -------------------------------------------------------------------------------------

def test_finalizers_hold_deletion_until_emptied(core):
    core.create_namespaced_config_map('default', configmap('c1', finalizers=['test/a', 'test/b']))

    core.delete_namespaced_config_map('c1', 'default')
    held = core.read_namespaced_config_map('c1', 'default')
    assert held.metadata.deletion_timestamp is not None
    assert held.metadata.generation == 2

    with pytest.raises(ApiException) as raised:
        core.patch_namespaced_config_map('c1', 'default', {'metadata': {'finalizers': ['test/a', 'test/b', 'test/c']}})
    assert raised.value.status == 422

    core.patch_namespaced_config_map('c1', 'default', {'metadata': {'$deleteFromPrimitiveList/finalizers': ['test/a']}})
    assert core.read_namespaced_config_map('c1', 'default').metadata.finalizers == ['test/b']
    core.patch_namespaced_config_map('c1', 'default', {'metadata': {'$deleteFromPrimitiveList/finalizers': ['test/b']}})
    with pytest.raises(ApiException) as raised:
        core.read_namespaced_config_map('c1', 'default')
    assert raised.value.status == 404


def owner_reference(obj: Any) -> dict[str, str]:
    return {'apiVersion': 'v1', 'kind': 'ConfigMap', 'name': obj.metadata.name, 'uid': obj.metadata.uid}


def test_owner_garbage_collection_cascades(core, widgets):
    owner = core.create_namespaced_config_map('default', configmap('owner'))
    child = core.create_namespaced_config_map('default', configmap('child', ownerReferences=[owner_reference(owner)]))
    core.create_namespaced_config_map('default', configmap('grandchild', ownerReferences=[owner_reference(child)]))
    other = core.create_namespaced_config_map('default', configmap('other'))
    shared = configmap('shared', ownerReferences=[owner_reference(owner), owner_reference(other)])
    core.create_namespaced_config_map('default', shared)
    widgets.create(dict(widget('w1'), metadata={'name': 'w1', 'ownerReferences': [owner_reference(owner)]}))

    core.delete_namespaced_config_map('owner', 'default')

    remaining = {cm.metadata.name: cm for cm in core.list_namespaced_config_map('default').items}
    assert set(remaining) == {'other', 'shared'}
    assert remaining['shared'].metadata.owner_references[0].uid == other.metadata.uid
    assert len(remaining['shared'].metadata.owner_references) == 1
    assert not widgets.exists('w1')


def test_orphan_propagation_keeps_dependents(core):
    owner = core.create_namespaced_config_map('default', configmap('owner'))
    core.create_namespaced_config_map('default', configmap('child', ownerReferences=[owner_reference(owner)]))

    core.delete_namespaced_config_map('owner', 'default', propagation_policy='Orphan')

    child = core.read_namespaced_config_map('child', 'default')
    assert child.metadata.owner_references is None


def test_namespace_deletion_deletes_its_contents(core):
    core.create_namespaced_config_map('doomed', configmap('plain'))
    core.create_namespaced_config_map('doomed', configmap('held', finalizers=['test/hold']))

    core.delete_namespace('doomed')

    namespace = core.read_namespace('doomed')
    assert namespace.status.phase == 'Terminating'
    assert [cm.metadata.name for cm in core.list_namespaced_config_map('doomed').items] == ['held']
    with pytest.raises(ApiException) as raised:
        core.create_namespaced_config_map('doomed', configmap('late'))
    assert raised.value.status == 403

    core.patch_namespaced_config_map('held', 'doomed', {'metadata': {'finalizers': None}})
    with pytest.raises(ApiException) as raised:
        core.read_namespace('doomed')
    assert raised.value.status == 404


def test_delete_collection_with_label_selector(core):
    for name, tier in [('a', 'web'), ('b', 'web'), ('c', 'db')]:
        core.create_namespaced_config_map('default', configmap(name, {'tier': tier}))

    core.delete_collection_namespaced_config_map('default', label_selector='tier=web')

    assert [cm.metadata.name for cm in core.list_namespaced_config_map('default').items] == ['c']


# ---- patches and replace ---------------------------------------------------------------------------

def test_json_patch_with_failing_test_is_422(core):
    created = core.create_namespaced_config_map('default', configmap('c1'))

    with pytest.raises(ApiException) as raised:
        core.patch_namespaced_config_map('c1', 'default', [
            {'op': 'test', 'path': '/metadata/resourceVersion', 'value': 'stale'},
            {'op': 'add', 'path': '/data/x', 'value': 'y'},
        ])
    assert raised.value.status == 422
    assert status_of(raised)['reason'] == 'Invalid'

    patched = core.patch_namespaced_config_map('c1', 'default', [
        {'op': 'test', 'path': '/metadata/resourceVersion', 'value': created.metadata.resource_version},
        {'op': 'add', 'path': '/data/x', 'value': 'y'},
    ])
    assert patched.data == {'key': 'c1', 'x': 'y'}


def test_merge_patch_sets_and_removes_fields(widgets):
    widgets.create(widget('w1', extra={'a': 1, 'b': 2}))

    patched = widgets.patch('w1', {'spec': {'extra': {'a': None, 'c': 3}}})

    assert patched['spec']['extra'] == {'b': 2, 'c': 3}


def test_strategic_merge_patch_merges_keyed_lists(api):
    apps = kubernetes.client.AppsV1Api(api)
    apps.create_namespaced_deployment('default', {  # type: ignore[arg-type]  # a dict body: sent as it is
        'metadata': {'name': 'd1'},
        'spec': {'selector': {'matchLabels': {'app': 'd1'}}, 'template': {
            'metadata': {'labels': {'app': 'd1'}},
            'spec': {'containers': [{'name': 'main', 'image': 'a:1'}, {'name': 'sidecar', 'image': 'b:1'}]}}}})

    patched = apps.patch_namespaced_deployment('d1', 'default', {'spec': {'template': {'spec': {'containers': [
        {'name': 'sidecar', 'image': 'b:2'}, {'name': 'extra', 'image': 'c:1'}]}}}})

    pod_spec = patched.spec.template.spec
    assert pod_spec is not None and patched.metadata is not None
    containers = [(c.name, c.image) for c in pod_spec.containers]
    assert containers == [('main', 'a:1'), ('sidecar', 'b:2'), ('extra', 'c:1')]
    assert patched.metadata.generation == 2


def test_strategic_merge_patch_is_unsupported_for_custom_resources(widgets):
    widgets.create(widget('w1'))
    with pytest.raises(ApiException) as raised:
        widgets.patch('w1', {'spec': {'table': 'x'}}, _content_type='application/strategic-merge-patch+json')
    assert raised.value.status == 415


def test_server_side_apply_creates_then_merges(widgets):
    widgets.patch('w1', widget('w1', mode='snapshot'), field_manager='test',
                  _content_type='application/apply-patch+yaml')  # 201 Created: the client returns None
    assert widgets.get('w1')['spec']['mode'] == 'snapshot'

    reapplied = widgets.patch('w1', {'apiVersion': f'{GROUP}/{VERSION}', 'kind': KIND, 'metadata': {'name': 'w1'},
                                     'spec': {'table': 'items'}},
                              field_manager='test', _content_type='application/apply-patch+yaml')
    assert reapplied['spec']['table'] == 'items' and reapplied['spec']['mode'] == 'snapshot'

    with pytest.raises(ApiException) as raised:
        widgets.patch('w1', {'spec': {}}, _content_type='application/apply-patch+yaml')
    assert raised.value.status == 422, 'apply requires a fieldManager'


def test_replace_with_stale_resource_version_is_409_conflict(core, widgets):
    created = core.create_namespaced_config_map('default', configmap('c1'))
    core.patch_namespaced_config_map('c1', 'default', {'data': {'a': 'b'}})

    with pytest.raises(ApiException) as raised:
        core.replace_namespaced_config_map('c1', 'default', created)
    assert raised.value.status == 409
    assert status_of(raised)['reason'] == 'Conflict'

    fresh = core.read_namespaced_config_map('c1', 'default')
    fresh.data = {'replaced': 'yes'}
    assert core.replace_namespaced_config_map('c1', 'default', fresh).data == {'replaced': 'yes'}

    body = widgets.create(widget('w1'))
    del body['metadata']['resourceVersion']
    with pytest.raises(ApiException) as raised:
        widgets.replace('w1', body)
    assert raised.value.status == 422, 'custom resources need a resourceVersion on update'


# ---- namespaces -------------------------------------------------------------------------------------

def test_namespaces_can_be_listed_created_and_are_auto_created(core):
    core.create_namespace({'metadata': {'name': 'team-a'}})
    core.create_namespaced_config_map('team-b', configmap('c1'))

    names = {ns.metadata.name for ns in core.list_namespace().items}

    assert {'default', 'kube-system', 'team-a', 'team-b'} <= names
    assert core.read_namespace('team-b').status.phase == 'Active'


# ---- selectors ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(('selector', 'expected'), [
    ('tier=web', ['a', 'b']),
    ('tier==web', ['a', 'b']),
    ('tier!=web', ['c', 'd']),
    ('tier in (web, db)', ['a', 'b', 'c']),
    ('tier notin (web)', ['c', 'd']),
    ('canary', ['b']),
    ('!canary', ['a', 'c', 'd']),
    ('tier=web,!canary', ['a']),
])
def test_label_selectors_on_list(core, selector, expected):
    for name, labels in [('a', {'tier': 'web'}), ('b', {'tier': 'web', 'canary': 'yes'}),
                         ('c', {'tier': 'db'}), ('d', {})]:
        core.create_namespaced_config_map('default', configmap(name, labels))

    listed = core.list_namespaced_config_map('default', label_selector=selector)

    assert [cm.metadata.name for cm in listed.items] == expected


def test_field_selectors_on_list(core):
    core.create_namespaced_config_map('ns1', configmap('a'))
    core.create_namespaced_config_map('ns2', configmap('a'))
    core.create_namespaced_config_map('ns2', configmap('b'))

    by_name = core.list_config_map_for_all_namespaces(field_selector='metadata.name=a')
    by_namespace = core.list_config_map_for_all_namespaces(field_selector='metadata.namespace=ns2,metadata.name!=a')

    assert [(cm.metadata.namespace, cm.metadata.name) for cm in by_name.items] == [('ns1', 'a'), ('ns2', 'a')]
    assert [(cm.metadata.namespace, cm.metadata.name) for cm in by_namespace.items] == [('ns2', 'b')]
    with pytest.raises(ApiException) as raised:
        core.list_config_map_for_all_namespaces(field_selector='data.key=a')
    assert raised.value.status == 400


def test_label_selector_on_watch_reports_objects_entering_and_leaving(core):
    created = core.create_namespaced_config_map('default', configmap('c1', {'tier': 'db'}))
    core.patch_namespaced_config_map('c1', 'default', {'metadata': {'labels': {'tier': 'web'}}})
    core.patch_namespaced_config_map('c1', 'default', {'data': {'x': 'y'}})
    core.patch_namespaced_config_map('c1', 'default', {'metadata': {'labels': {'tier': 'db'}}})
    core.create_namespaced_config_map('default', configmap('c2', {'tier': 'db'}))

    events = [event['type'] for event in watch.Watch().stream(
        core.list_namespaced_config_map, 'default', label_selector='tier=web',
        resource_version=created.metadata.resource_version, timeout_seconds=1)]

    assert events == ['ADDED', 'MODIFIED', 'DELETED']


# ---- watch --------------------------------------------------------------------------------------------

def test_watch_streams_added_modified_deleted(core):
    core.create_namespaced_config_map('default', configmap('c0'))
    stream = watch.Watch().stream(core.list_namespaced_config_map, 'default', timeout_seconds=60)
    events = [next(stream)]  # the current state first: the stream is now open

    core.create_namespaced_config_map('default', configmap('c1'))
    core.patch_namespaced_config_map('c1', 'default', {'data': {'a': 'b'}})
    core.delete_namespaced_config_map('c1', 'default')
    events += [next(stream) for _ in range(3)]

    assert [(event['type'], event['object'].metadata.name) for event in events] == [
        ('ADDED', 'c0'), ('ADDED', 'c1'), ('MODIFIED', 'c1'), ('DELETED', 'c1')]


def test_watch_from_resource_version_replays_only_newer_events(core):
    core.create_namespaced_config_map('default', configmap('old'))
    listed = core.list_namespaced_config_map('default')
    core.create_namespaced_config_map('default', configmap('new'))
    core.patch_namespaced_config_map('old', 'default', {'data': {'a': 'b'}})

    events = [(e['type'], e['object'].metadata.name) for e in watch.Watch().stream(
        core.list_namespaced_config_map, 'default', resource_version=listed.metadata.resource_version,
        timeout_seconds=1)]

    assert events == [('ADDED', 'new'), ('MODIFIED', 'old')]


def test_watch_from_too_old_resource_version_is_410_gone(core, monkeypatch):
    monkeypatch.setattr(kube_emulator, 'EVENT_HISTORY_LIMIT', 3)
    first = core.create_namespaced_config_map('default', configmap('c0'))
    for index in range(1, 5):
        core.create_namespaced_config_map('default', configmap(f'c{index}'))

    with pytest.raises(ApiException) as raised:
        list(watch.Watch().stream(core.list_namespaced_config_map, 'default',
                                  resource_version=first.metadata.resource_version, timeout_seconds=1))

    assert raised.value.status == 410


def test_watch_honours_timeout_seconds(core):
    events = list(watch.Watch().stream(core.list_namespaced_config_map, 'default', timeout_seconds=1))
    assert events == []  # the stream ended by itself, with nothing to report


def test_watch_with_send_initial_events_ends_them_with_a_bookmark(core):
    core.create_namespaced_config_map('default', configmap('c1'))

    stream = watch.Watch().stream(core.list_namespaced_config_map, 'default', send_initial_events=True,
                                  resource_version_match='NotOlderThan', allow_watch_bookmarks=True,
                                  timeout_seconds=1)
    events = [(event['type'], event['raw_object']['metadata']) for event in stream]

    assert [event_type for event_type, _ in events] == ['ADDED', 'BOOKMARK']
    assert events[1][1]['annotations'] == {'k8s.io/initial-events-end': 'true'}


def test_list_carries_resource_version_and_pages(core):
    for index in range(5):
        core.create_namespaced_config_map('default', configmap(f'c{index}'))

    first = core.list_namespaced_config_map('default', limit=2)
    second = core.list_namespaced_config_map('default', limit=2, _continue=first.metadata._continue)
    third = core.list_namespaced_config_map('default', limit=2, _continue=second.metadata._continue)

    assert first.metadata.resource_version.isdigit()
    assert [cm.metadata.name for page in (first, second, third) for cm in page.items] == [f'c{i}' for i in range(5)]
    assert not third.metadata._continue


# ---- performance ---------------------------------------------------------------------------------------

def test_thousands_of_requests_all_succeed(core):
    """kmock's router replays its whole request history per request; the emulator must not."""
    names = [f'c{index}' for index in range(1000)]
    for name in names:
        core.create_namespaced_config_map('default', configmap(name))
    assert [core.read_namespaced_config_map(name, 'default').metadata.name for name in names] == names
    for name in names:
        core.delete_namespaced_config_map(name, 'default')
    assert core.list_namespaced_config_map('default').items == []


# ---- built-in kinds -------------------------------------------------------------------------------------

BUILTIN_OBJECTS = [
    ('v1', 'Pod', {'spec': {'containers': [{'name': 'main', 'image': 'busybox'}]}}),
    ('v1', 'Service', {'spec': {'ports': [{'port': 80}]}}),
    ('v1', 'ServiceAccount', {}),
    ('v1', 'ConfigMap', {'data': {'a': 'b'}}),
    ('v1', 'Secret', {'stringData': {'password': 'x'}}),
    ('v1', 'Event', {'involvedObject': {'kind': 'Pod', 'name': 'p'}, 'reason': 'Test', 'message': 'hello'}),
    ('events.k8s.io/v1', 'Event', {'eventTime': '2024-01-01T00:00:00.000000Z', 'reason': 'Test',
                                   'action': 'Testing', 'reportingController': 'test',
                                   'reportingInstance': 'test', 'type': 'Normal'}),
    ('apps/v1', 'Deployment', {'spec': {'selector': {'matchLabels': {'app': 'x'}}, 'template': {
        'metadata': {'labels': {'app': 'x'}}, 'spec': {'containers': [{'name': 'main', 'image': 'busybox'}]}}}}),
    ('rbac.authorization.k8s.io/v1', 'Role', {'rules': []}),
    ('rbac.authorization.k8s.io/v1', 'RoleBinding', {'roleRef': {
        'apiGroup': 'rbac.authorization.k8s.io', 'kind': 'Role', 'name': 'r'}}),
    ('rbac.authorization.k8s.io/v1', 'ClusterRole', {'rules': []}),
    ('coordination.k8s.io/v1', 'Lease', {'spec': {'holderIdentity': 'me'}}),
]


@pytest.mark.parametrize(('api_version', 'kind', 'content'), BUILTIN_OBJECTS,
                         ids=[f'{a}/{k}' for a, k, _ in BUILTIN_OBJECTS])
def test_builtin_kinds_are_served(api, api_version, kind, content):
    resource = DynamicClient(api).resources.get(api_version=api_version, kind=kind)
    namespace = 'default' if resource.namespaced else None

    resource.create(body={'apiVersion': api_version, 'kind': kind, 'metadata': {'name': 'x1'}, **content},
                    namespace=namespace)

    fetched = resource.get(name='x1', namespace=namespace)
    assert fetched.metadata.uid and fetched.kind == kind
    assert [item.metadata.name for item in resource.get(namespace=namespace).items] == ['x1']
    resource.delete(name='x1', namespace=namespace)
    assert resource.get(namespace=namespace).items == []


def test_events_can_be_posted_through_the_typed_clients(api):
    kubernetes.client.CoreV1Api(api).create_namespaced_event('default', {  # type: ignore[arg-type]
        'metadata': {'generateName': 'evt-'}, 'involvedObject': {'kind': 'Pod', 'name': 'p'},
        'reason': 'Test', 'message': 'hello', 'type': 'Normal'})
    kubernetes.client.EventsV1Api(api).create_namespaced_event('default', {  # type: ignore[arg-type]
        'metadata': {'generateName': 'evt-'}, 'eventTime': '2024-01-01T00:00:00.000000Z',
        'reportingController': 'test', 'reportingInstance': 'test', 'action': 'Testing', 'type': 'Normal'})

    events = kubernetes.client.CoreV1Api(api).list_namespaced_event(
        'default', field_selector='involvedObject.name=p').items
    assert [event.reason for event in events] == ['Test']


# ---- custom resource schema validation --------------------------------------------------------------

def test_invalid_custom_resource_is_422_naming_the_field(widgets):
    with pytest.raises(ApiException) as raised:
        widgets.create(widget('w1', source={'host': 'db', 'port': 70000}))

    status = status_of(raised)
    assert raised.value.status == 422
    assert (status['kind'], status['status'], status['reason']) == ('Status', 'Failure', 'Invalid')
    assert status['message'] == ('Widget.example.com "w1" is invalid: spec.source.port: Invalid value: 70000: '
                                 'spec.source.port in body should be less than or equal to 65535')
    assert status['details']['causes'] == [{
        'reason': 'FieldValueInvalid', 'field': 'spec.source.port',
        'message': 'Invalid value: 70000: spec.source.port in body should be less than or equal to 65535'}]


@pytest.mark.parametrize(('spec', 'expected'), [
    ({'source': {}}, 'spec.source.host: Required value'),
    ({'source': {'host': ''}},
     'spec.source.host: Invalid value: "": spec.source.host in body should be at least 1 chars long'),
    ({'source': {'host': 'db', 'port': 0}}, 'spec.source.port in body should be greater than or equal to 1'),
    ({'source': {'host': 'db', 'port': 'x'}},
     'spec.source.port: Invalid value: "string": spec.source.port in body must be of type integer: "string"'),
    ({'mode': 'bulk'}, 'spec.mode: Unsupported value: "bulk": supported values: "snapshot", "cdc"'),
    ({'table': 'Orders'}, "spec.table: Invalid value: \"Orders\": spec.table in body should match '^[a-z_]+$'"),
    ({'tables': ['a', 'b', 'c', 'd']}, 'spec.tables: Too many: 4: must have at most 3 items'),
    ({'interval': 'soon'},
     'spec.interval: Invalid value: "soon": spec.interval in body must be of type duration: "soon"'),
    ({'size': True}, 'spec.size in body must be of type integer,string: "boolean"'),
])
def test_schema_keywords_are_validated(widgets, spec, expected):
    assert expected in invalid_message(widgets, widget('w1', **spec))


def test_int_or_string_and_nullable_values_are_accepted(widgets):
    widgets.create(widget('w1', size=3, note=None))
    widgets.create(widget('w2', size='3Gi', note='text'))
    assert widgets.get('w1')['spec']['note'] is None


def test_schema_defaults_are_applied(widgets):
    created = widgets.create(widget('w1'))
    assert created['spec']['source']['port'] == 5432
    assert created['spec']['mode'] == 'cdc'

    without_mode = widgets.patch('w1', {'spec': {'mode': None}})
    assert without_mode['spec']['mode'] == 'cdc'


def test_unknown_fields_are_pruned_unless_preserved(widgets):
    created = widgets.create(dict(widget('w1', unknown=1, extra={'anything': {'goes': True}}), junk=2))

    assert 'unknown' not in created['spec'] and 'junk' not in created
    assert created['spec']['extra'] == {'anything': {'goes': True}}


def test_validation_applies_to_patch_and_replace(widgets):
    widgets.create(widget('w1'))

    with pytest.raises(ApiException) as raised:
        widgets.patch('w1', {'spec': {'mode': 'bulk'}})
    assert raised.value.status == 422
    with pytest.raises(ApiException) as raised:
        widgets.patch('w1', [{'op': 'remove', 'path': '/spec/source/host'}],
                      _content_type='application/json-patch+json')  # the client's default is a merge patch
    assert raised.value.status == 422
    body = widgets.get('w1')
    body['spec']['source']['port'] = -1
    with pytest.raises(ApiException) as raised:
        widgets.replace('w1', body)
    assert raised.value.status == 422


def test_status_is_validated_on_the_status_subresource(widgets):
    widgets.create(widget('w1'))
    with pytest.raises(ApiException) as raised:
        widgets.patch_status('w1', {'status': {'phase': 'Broken'}})
    assert raised.value.status == 422
    assert 'status.phase: Unsupported value: "Broken"' in status_of(raised)['message']


# ---- CEL rules --------------------------------------------------------------------------------------

def test_cel_transition_rule_makes_a_field_immutable(widgets):
    widgets.create(widget('w1'))
    assert widgets.patch('w1', {'spec': {'source': {'port': 6432}}})['spec']['source']['port'] == 6432

    with pytest.raises(ApiException) as raised:
        widgets.patch('w1', {'spec': {'source': {'host': 'elsewhere'}}})

    assert raised.value.status == 422
    assert status_of(raised)['details']['causes'] == [
        {'reason': 'FieldValueInvalid', 'field': 'spec.source.host',
         'message': 'Invalid value: "string": host is immutable'}]


@pytest.mark.parametrize(('spec', 'field', 'message'), [
    ({'table': None}, 'spec', 'either table or tables is required'),
    ({'minReplicas': 3, 'maxReplicas': 2}, 'spec.minReplicas', 'minReplicas must not exceed maxReplicas'),
    ({'tables': []}, 'spec.tables', 'tables must not be empty'),
])
def test_cel_rules_reject_invalid_objects(widgets, spec, field, message):
    body = widget('w1', **spec)
    body['spec'] = {k: v for k, v in body['spec'].items() if v is not None}

    with pytest.raises(ApiException) as raised:
        widgets.create(body)

    causes = status_of(raised)['details']['causes']
    assert [(cause['field'], cause['message'].rsplit(': ', 1)[-1]) for cause in causes] == [(field, message)]


def test_unsupported_cel_rule_rejects_the_crd(crds):
    schema = {'type': 'object', 'properties': {'spec': {'type': 'object', 'x-kubernetes-validations': [
        {'rule': "quantity(self.memory).isGreaterThan(quantity('1Gi'))"}]}}}

    with pytest.raises(ApiException) as raised:
        crds.create_custom_resource_definition(make_crd(schema=schema))

    assert raised.value.status == 422
    assert "function 'quantity' is not supported" in status_of(raised)['message']


@pytest.mark.parametrize(('expression', 'expected'), [
    ('self.a == oldSelf.a', True),
    ('has(self.a) || has(self.missing)', True),
    ('has(self.missing) && self.missing > 0', False),
    ('self.missing > 0 || true', True),  # errors are absorbed by a deciding operand
    ('self.a <= self.b', True),
    ('size(self.items) > 0 && self.items.size() == 3', True),
    ('self.items.all(x, x > 0) && self.items.exists(x, x == 2) && self.items.exists_one(x, x > 2)', True),
    ('self.items.map(x, x * 2) == [2, 4, 6] && self.items.filter(x, x % 2 == 1) == [1, 3]', True),
    ("self.name.startsWith('pg-') && self.name.matches('^[a-z-]+$') && 'pg' in self.tags", True),
    ("self.name + '!' == 'pg-main!' && self.name.split('-') == ['pg', 'main']", True),
    ('self.a >= 1 ? -7 / 2 : 0', -3),
    ('-7 % 3', -1),
    ("{'k': 1}['k'] + int('2') + size('héllo')", 8),
    ("size(bytes('héllo')) == 6 && string(bytes('x')) == 'x'", True),
    ("'host' in {'host': 1} && !('port' in {'host': 1})", True),
    ("string(self.a) == '1' && double(self.b) == 2.0", True),
    ('r"\\d" == "\\\\d"', True),
])
def test_cel_subset_evaluates(expression, expected):
    env = {'self': {'a': 1, 'b': 2, 'items': [1, 2, 3], 'name': 'pg-main', 'tags': ['pg', 'x']},
           'oldSelf': {'a': 1}}
    assert compile_cel(expression).evaluate(env) == expected


@pytest.mark.parametrize('expression', ['self.missing', '1 / 0', "'a' < 1", 'self.items[5]', '!1'])
def test_cel_runtime_errors_raise(expression):
    with pytest.raises(CelError):
        compile_cel(expression).evaluate({'self': {'items': []}})


@pytest.mark.parametrize('expression', ['self.a ==', 'timestamp(self.t) > now', 'self.x.format([])', 'self.a ?? 1'])
def test_cel_syntax_errors_and_unsupported_features_raise(expression):
    with pytest.raises(CelSyntaxError):
        compile_cel(expression)


# ---- the emulator's own API -----------------------------------------------------------------------------

def test_reset_drops_objects_and_custom_resources(kube, core, widgets):
    core.create_namespaced_config_map('team', configmap('c1'))
    widgets.create(widget('w1'))

    kube.reset()

    assert core.list_config_map_for_all_namespaces().items == []
    assert {ns.metadata.name for ns in core.list_namespace().items} == set(kube_emulator.DEFAULT_NAMESPACES)
    with pytest.raises(ApiException) as raised:
        widgets.get('w1')
    assert raised.value.status == 404
    assert core.create_namespaced_config_map('team', configmap('c1')).metadata.name == 'c1'


def test_kubeconfig_points_at_the_emulator(kube, tmp_path):
    configuration = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=str(kube.write_kubeconfig(tmp_path / 'kubeconfig')),
                                       client_configuration=configuration)
    with kubernetes.client.ApiClient(configuration) as api_client:
        namespaces = kubernetes.client.CoreV1Api(api_client).list_namespace().items
    names = {ns.metadata.name for ns in namespaces if ns.metadata is not None}
    assert 'default' in names


@pytest.mark.timeout(120)  # a stream left open would otherwise run for its hour-long server timeout
def test_watches_end_when_their_resource_is_unregistered(kube, crds, widgets):
    widgets.create(widget('w1'))
    stream = watch.Watch().stream(widgets.api.list_namespaced_custom_object, GROUP, VERSION, 'default', PLURAL,
                                  timeout_seconds=3600)
    assert next(stream)['type'] == 'ADDED'

    crds.delete_custom_resource_definition(f'{PLURAL}.{GROUP}')

    assert [event['type'] for event in stream] == ['DELETED']


def test_secret_string_data_is_folded_into_data(kube):
    import base64

    with kube.api_client() as api_client:
        core = kubernetes.client.CoreV1Api(api_client)
        core.create_namespaced_secret('default', {'metadata': {'name': 's'},  # type: ignore[arg-type]
                                                  'stringData': {'password': 'first'}})
        core.patch_namespaced_secret('s', 'default', {'stringData': {'password': 'second'}})
        secret = core.read_namespaced_secret('s', 'default')
    assert secret.data is not None
    assert base64.b64decode(secret.data['password']).decode() == 'second'
    assert secret.string_data is None
