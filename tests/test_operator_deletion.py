"""Deleting an ingestion (lakeslot_operator.deletion) without kopf or a cluster: when the source is
cleaned, what a blocked cleanup writes, and the retry delays. tests/test_operator_kopf.py runs the
same through the real kopf operator against real PostgreSQL.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any, cast

import psycopg
import pytest

from lakeslot.source import cleanup
from lakeslot_operator import deletion
from lakeslot_operator.handlers import SKIP_CLEANUP_ANNOTATION
from lakeslot_operator.kube import Kube
from lakeslot_operator.reconcile import Context
from tests.api_cases import base_document

NOW = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def body(policy: str | None = "Delete", annotations: dict | None = None, valid: bool = True,
         status: dict | None = None) -> dict:
    document = copy.deepcopy(base_document())
    document["metadata"].update(namespace="shop", uid="u-1")
    if policy is not None:
        document["spec"]["policies"] = {"deletionPolicy": policy}
    if annotations is not None:
        document["metadata"]["annotations"] = annotations
    if not valid:
        document["spec"]["source"]["sslMode"] = "sometimes"
    if status is not None:
        document["status"] = status
    return document


class FakeKube:
    def __init__(self, secrets: dict[str, str] | None = None):
        self.secrets = secrets or {}
        self.deleted: list[tuple[str, dict]] = []

    def delete_children(self, namespace, labels):
        self.deleted.append((namespace, dict(labels)))

    def secret_value(self, namespace, ref):
        if ref.name not in self.secrets:
            raise LookupError(f"Secret {namespace}/{ref.name} does not exist")
        return self.secrets[ref.name]


class Connection:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def context(kube: FakeKube, connect: Any = None) -> Context:
    """A Context on the fakes (typed as the real ones: only the methods used are faked)."""
    ctx = Context(kube=cast(Kube, kube), now=lambda: NOW)
    if connect is not None:
        ctx.connect = connect
    return ctx


@pytest.mark.parametrize(("document", "cleans"), [
    (body("Delete"), True),
    (body(None), False),  # the default deletionPolicy is Retain
    (body("Retain"), False),
    (body("Delete", {SKIP_CLEANUP_ANNOTATION: "true"}), False),
    (body("Delete", {SKIP_CLEANUP_ANNOTATION: "false"}), True),
    (body("Delete", {"other": "true"}), True),
    (body("Delete", valid=False), False),
    (body("Delete", status={"phase": "Streaming"}), True),  # status never decides
], ids=["delete", "default-policy", "retain", "skip-annotation", "skip-false", "other-annotation",
        "never-valid", "with-status"])
def test_whether_the_source_is_cleaned(document, cleans):
    ingestion = deletion.source_to_clean(document)
    assert (ingestion is not None) == cleans
    if ingestion is not None:
        assert ingestion.metadata.name == "orders"


@pytest.mark.parametrize(("retry", "delay"), [(0, 10), (1, 20), (4, 160), (5, 300), (40, 300)])
def test_retry_delay(retry, delay):
    assert deletion.retry_delay(retry) == delay


def test_blocked_status_keeps_the_rest_and_says_how_out():
    old = {"phase": "Streaming", "publicationName": "p",
           "conditions": [{"type": "SlotReady", "status": "True", "reason": "SlotHealthy",
                           "message": "", "lastTransitionTime": "2024-01-01T00:00:00Z"}]}
    message = deletion.blocked_message(psycopg.OperationalError("connection refused"))
    status = deletion.blocked_status(body(status=old), message, NOW)
    assert status["phase"] == "Deleting" and status["publicationName"] == "p"
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "CleanupBlocked")
    assert "connection refused" in ready["message"]
    assert f'{SKIP_CLEANUP_ANNOTATION}="true"' in ready["message"]
    assert [c["type"] for c in status["conditions"]] == ["SlotReady", "Ready"]


@pytest.mark.parametrize("document", [body("Retain"), body(annotations={SKIP_CLEANUP_ANNOTATION: "true"}),
                                      body(valid=False)], ids=["retain", "skip", "never-valid"])
def test_children_go_and_postgres_is_not_touched(document):
    kube = FakeKube()

    def connect(*_, **__):
        raise AssertionError("PostgreSQL must not be touched")

    result = deletion.delete(document, context(kube, connect))
    assert result.done and result.cleaned is None and result.blocked is None
    assert kube.deleted == [("shop", {"lakeslot.io/ingestion": "orders"})]


def test_a_missing_secret_blocks_the_deletion():
    kube = FakeKube()
    blocked = deletion.delete(body(), context(kube)).blocked
    assert blocked is not None
    assert "Secret shop/shop-postgres does not exist" in blocked.message
    assert blocked.status["phase"] == "Deleting"
    ready = next(c for c in blocked.status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "CleanupBlocked" and ready["message"] == blocked.message
    assert ready["lastTransitionTime"] == "2024-05-01T12:00:00Z"
    assert kube.deleted  # the children go anyway


def test_an_unreachable_source_blocks_the_deletion_without_leaking_the_password():
    def connect(settings, application_name, **_):
        assert application_name.startswith("lakeslot-operator") and "shop/orders" in application_name
        raise psycopg.OperationalError("connection to server failed: Connection refused")

    result = deletion.delete(body(), context(FakeKube({"shop-postgres": "s3cret"}), connect))
    assert result.blocked is not None and "Connection refused" in result.blocked.message
    assert "s3cret" not in str(result)


def test_a_reachable_source_is_cleaned_with_the_derived_names(monkeypatch):
    calls = []

    def fake_cleanup(conn, **kwargs):
        calls.append(kwargs)
        return {"slot": "dropped", "publication": "dropped"}

    monkeypatch.setattr(cleanup, "cleanup", fake_cleanup)
    result = deletion.delete(body(), context(FakeKube({"shop-postgres": "pw"}),
                                             lambda *_, **__: Connection()))
    assert result.done and result.cleaned == {"slot": "dropped", "publication": "dropped"}
    assert calls == [{"slot_name": "lakeslot_shop_orders", "publication_name": "lakeslot_shop_orders",
                      "owner": "shop/orders", "deletion_policy": "Delete",
                      "publication_management": "Auto"}]
