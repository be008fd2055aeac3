"""Acceptance: the real kopf operator reconciles objects on the Kubernetes emulator.

A test-only operator (its own fresh registry) reconciles a small test CRD created with the
official client: creation sets status, deletion waits on kopf's finalizer until the on.delete
handler has run. The emulator also rejects invalid custom resources like a real API server.
"""

import json
import threading
from typing import Any

import kopf
import kubernetes.client
import pytest
from kubernetes.client import ApiException

from tests.support.fixtures_kube import kopf_peering_crds, running_operator
from tests.support.waiting import wait_for

GROUP, VERSION, PLURAL = 'emulator.test', 'v1', 'gadgets'
DEADLINE = 30.0  # seconds; generous because other test runs share the machine

GADGET_CRD: dict[str, Any] = {
    'apiVersion': 'apiextensions.k8s.io/v1',
    'kind': 'CustomResourceDefinition',
    'metadata': {'name': f'{PLURAL}.{GROUP}'},
    'spec': {
        'group': GROUP,
        'scope': 'Namespaced',
        'names': {'plural': PLURAL, 'singular': 'gadget', 'kind': 'Gadget'},
        'versions': [{
            'name': VERSION, 'served': True, 'storage': True,
            'subresources': {'status': {}},
            'schema': {'openAPIV3Schema': {
                'type': 'object',
                'properties': {
                    'spec': {
                        'type': 'object',
                        'required': ['size'],
                        'properties': {
                            'size': {'type': 'integer', 'minimum': 1, 'maximum': 10},
                            'colour': {'type': 'string', 'enum': ['red', 'blue'], 'default': 'red'},
                        },
                    },
                    'status': {'type': 'object', 'x-kubernetes-preserve-unknown-fields': True},
                },
            }},
        }],
    },
}


@pytest.fixture
def client(kube):
    with kube.api_client() as api_client:
        # The client's types ask for a V1CustomResourceDefinition; it sends a dict body as is.
        kubernetes.client.ApiextensionsV1Api(api_client).create_custom_resource_definition(
            GADGET_CRD)  # type: ignore[arg-type]
        yield kubernetes.client.CustomObjectsApi(api_client)


def gadget(name: str, **spec: Any) -> dict[str, Any]:
    return {'apiVersion': f'{GROUP}/{VERSION}', 'kind': 'Gadget', 'metadata': {'name': name}, 'spec': spec}


def read_gadget(client: kubernetes.client.CustomObjectsApi, name: str) -> dict[str, Any] | None:
    try:
        obj = client.get_namespaced_custom_object(GROUP, VERSION, 'default', PLURAL, name)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    assert isinstance(obj, dict), obj
    return obj


def ready_gadget(client: kubernetes.client.CustomObjectsApi, name: str) -> dict[str, Any] | None:
    obj = read_gadget(client, name)
    return obj if obj is not None and obj.get('status', {}).get('phase') == 'Ready' else None


def test_operator_reconciles_and_finalizes(kube, client):
    registry = kopf.OperatorRegistry()
    deletion_allowed = threading.Event()
    deleting = threading.Event()  # the on.delete handler is running (and holds the finalizer)
    deleted: list[str] = []

    @kopf.on.create(GROUP, VERSION, PLURAL, registry=registry)
    def create_fn(spec, patch, **_):
        patch.status['observedSize'] = spec['size']
        patch.status['phase'] = 'Ready'

    @kopf.on.delete(GROUP, VERSION, PLURAL, registry=registry)
    def delete_fn(name, **_):
        deleting.set()
        if not deletion_allowed.wait(DEADLINE):
            raise kopf.PermanentError('the test never allowed the deletion')
        deleted.append(name)

    with running_operator(kube, registry):
        client.create_namespaced_custom_object(GROUP, VERSION, 'default', PLURAL, gadget('g1', size=3))

        reconciled = wait_for(lambda: ready_gadget(client, 'g1'), 'the on.create handler to set the status')
        assert reconciled is not None  # wait_for returns only a truthy value
        assert reconciled['status']['observedSize'] == 3
        assert reconciled['spec']['colour'] == 'red'  # defaulted by the emulator's schema handling
        assert reconciled['metadata']['finalizers'], 'kopf adds its finalizer for the on.delete handler'

        client.delete_namespaced_custom_object(GROUP, VERSION, 'default', PLURAL, 'g1')
        terminating = read_gadget(client, 'g1')
        assert terminating is not None and terminating['metadata']['deletionTimestamp']
        assert deleting.wait(DEADLINE), 'the on.delete handler never ran'
        # the handler runs and has not returned: its finalizer keeps the object
        assert read_gadget(client, 'g1') is not None and deleted == []

        deletion_allowed.set()
        wait_for(lambda: read_gadget(client, 'g1') is None, 'the object to disappear after on.delete')
        assert deleted == ['g1']


def test_emulator_rejects_invalid_custom_resource_naming_the_field(client):
    with pytest.raises(ApiException) as raised:
        client.create_namespaced_custom_object(GROUP, VERSION, 'default', PLURAL, gadget('g2', size=70))

    error = raised.value
    assert error.status == 422
    assert error.body is not None
    body = json.loads(error.body)
    assert body['kind'] == 'Status' and body['reason'] == 'Invalid'
    assert body['message'] == ('Gadget.emulator.test "g2" is invalid: spec.size: Invalid value: 70: '
                               'spec.size in body should be less than or equal to 10')
    assert body['details']['causes'] == [{
        'reason': 'FieldValueInvalid', 'field': 'spec.size',
        'message': 'Invalid value: 70: spec.size in body should be less than or equal to 10'}]


def test_operator_restricted_to_a_namespace_with_peering(kube, client):
    crds = kubernetes.client.ApiextensionsV1Api(client.api_client)
    for crd in kopf_peering_crds():
        # The client's types ask for a V1CustomResourceDefinition; it sends a dict body as is.
        crds.create_custom_resource_definition(crd)  # type: ignore[arg-type]
    client.create_namespaced_custom_object('kopf.dev', 'v1', 'team', 'kopfpeerings', {
        'apiVersion': 'kopf.dev/v1', 'kind': 'KopfPeering', 'metadata': {'name': 'lakeslot'}})
    registry = kopf.OperatorRegistry()

    @kopf.on.create(GROUP, VERSION, PLURAL, registry=registry)
    def create_fn(patch, **_):
        patch.status['phase'] = 'Ready'

    with running_operator(kube, registry, namespaces=['team'], peering_name='lakeslot'):
        client.create_namespaced_custom_object(GROUP, VERSION, 'team', PLURAL, gadget('inside', size=1))
        client.create_namespaced_custom_object(GROUP, VERSION, 'default', PLURAL, gadget('outside', size=1))

        wait_for(lambda: client.get_namespaced_custom_object(GROUP, VERSION, 'team', PLURAL, 'inside')
                 .get('status', {}).get('phase') == 'Ready', 'the object in the served namespace to reconcile')
        peering = wait_for(lambda: client.get_namespaced_custom_object(
            'kopf.dev', 'v1', 'team', 'kopfpeerings', 'lakeslot').get('status'), 'the operator to announce itself')
        assert len(peering) == 1, 'one operator (this one) is in the peering'

    outside = read_gadget(client, 'outside')
    assert outside is not None
    assert 'status' not in outside and 'finalizers' not in outside['metadata']
