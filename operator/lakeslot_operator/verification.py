"""Verifications on request: the ``lakeslot.io/verify`` annotation in, a Job, the ``Verified``
condition and ``status.verification`` out.

A user asks with a token (``kubectl annotate pgi orders lakeslot.io/verify=$(date -u +%Y%m%dT%H%M%SZ)``,
optionally ``lakeslot.io/verify-tables``); the operator runs ``lakeslot verify`` for it as a Job
(:func:`lakeslot_operator.children.verify_job`), the Job leaves its result document in staging
(``verify/<token>.json``: :func:`lakeslot.verify.report.result_document`), and a later reconcile
reads it into the status. The decisions are pure (:func:`start`, :func:`follow`,
:func:`verdict`: plain values in, a :class:`Step` out); :func:`serve` executes them (reads the
Job and the result, creates or deletes Jobs, writes the condition and events).

Invariants:

- One request per token: a token that differs from ``status.verification.token`` is a new
  request, answered once (a Job is created, or the request is refused as ``InvalidRequest``);
  the same token is never run twice by choice. Without the annotation, the recorded request is
  still followed to its end.
- A newer token cancels the running Job of the older one (its temporary slot would hold WAL for
  nothing); a result document answers only the token it names, so a late writer cannot answer
  a newer request.
- While a request is ``Verifying`` its Job exists: an absent Job without a result is created
  (again) — level-based, like every other child. A Job that failed or completed without a
  result ends the request as ``Failed``, with where to look.
- ``Verified`` is Unknown while the Job runs, True only when every table checked is equal, and
  False with the reason otherwise: ``Diverged`` (rows or columns differ — the message names the
  tables, counts and the first keys), ``NotCompared`` (a table could not be settled, e.g. the
  mirror stayed behind because the pipeline is not streaming), ``Failed`` (the check or its Job
  failed), ``InvalidRequest`` (a malformed token or table list, or a table the ingestion does
  not select). It is not part of ``Ready``: a divergence found says something about the data,
  not about whether the pipeline runs.
- Values of rows never reach the status or events, only keys and column names; the result
  document in staging and the Job's log hold the values.

Failure modes: staging unreadable by the operator keeps the request ``Verifying`` with
``Verified: Unknown/ResultUnreadable`` saying so (retried every reconcile); a Job the API server
refuses (:func:`lakeslot_operator.child_health.is_rejection`) is ``Verified: False/ChildRejected``
with the server's message (``NameTaken`` when a Job or ConfigMap of its name is not lakeslot's:
:class:`lakeslot_operator.kube.NameTaken`), the request stays ``Verifying`` and its Job is tried
again on the next reconcile; other Kubernetes API errors propagate (kopf retries the reconcile).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from kubernetes.client.exceptions import ApiException

from lakeslot import workloads
from lakeslot.api.annotations import VERIFY, VERIFY_TABLES
from lakeslot.api.models import PostgresIngestion, TableVerification, VerificationStatus
from lakeslot.api.naming import TableName, namespace_of
from lakeslot.observability import status_report
from lakeslot.staging.store import VERIFY_RESULTS, Staging
from lakeslot.verify.report import key_text
from lakeslot.verify.request import check_token, parse_table, parse_tables
from lakeslot_operator import child_health, children
from lakeslot_operator.kube import Kube, NameTaken

LISTED_KEYS = 3  # keys per kind of difference in a table's status row
MESSAGE_TABLES = 5  # tables named in the condition's message
TOKEN_SHOWN = 253  # an invalid token is recorded up to this length


@dataclass(frozen=True)
class Request:
    """What the annotations ask for."""

    token: str
    tables: str | None = None  # lakeslot.io/verify-tables as written (None: every table)

    @classmethod
    def of(cls, annotations: Mapping[str, str]) -> Request | None:
        token = annotations.get(VERIFY)
        return None if token is None else cls(token, annotations.get(VERIFY_TABLES))


@dataclass(frozen=True)
class Job:
    """The verification Job as Kubernetes reports it."""

    complete: bool = False
    failed: bool = False
    why: str = ""  # the Failed condition's reason and message

    @classmethod
    def of(cls, job: Mapping) -> Job:
        conditions = {c.get("type"): c for c in (job.get("status") or {}).get("conditions") or []
                      if c.get("status") == "True"}
        failed = conditions.get("Failed")
        why = ": ".join(p for p in (failed.get("reason"), failed.get("message")) if p) if failed else ""
        return cls(complete="Complete" in conditions, failed=failed is not None, why=why)


@dataclass(frozen=True)
class Verdict:
    """The ``Verified`` condition."""

    ok: bool | None
    reason: str
    message: str


@dataclass(frozen=True)
class Step:
    """What to write and what to do with Jobs."""

    verification: VerificationStatus | None  # the new status.verification
    verdict: Verdict | None = None  # the new Verified condition; None: unchanged
    create: tuple[TableName, ...] | None = None  # create the Job of the request for these tables
    cancel: str | None = None  # delete this Job (a superseded request's)
    events: list[status_report.Event] = field(default_factory=list)


def start(request: Request, previous: VerificationStatus | None, job_name: str,
          now: datetime) -> Step:
    """A new request (its token differs from ``previous.token``): refused, or a Job to create."""
    cancel = previous.job if previous is not None and previous.state == "Verifying" else None
    try:
        token = check_token(request.token)
    except ValueError as e:
        return _refused(request, VERIFY, e, cancel)
    try:
        tables = parse_tables(request.tables or "")
    except ValueError as e:
        return _refused(request, VERIFY_TABLES, e, cancel)
    what = ", ".join(map(str, tables)) if tables else "every selected table"
    message = (f"Job {job_name} compares {what} with the source at one LSN (token {token}); the "
               "pipeline must be streaming")
    return Step(VerificationStatus(token=token, state="Verifying", tables=[str(t) for t in tables],
                                   job=job_name, started_at=now, message=message),
                Verdict(None, "Verifying", message), create=tuple(tables), cancel=cancel,
                events=[status_report.Event("Normal", "VerificationStarted", message)])


def _refused(request: Request, annotation: str, error: ValueError, cancel: str | None) -> Step:
    message = (f"{annotation}: {error}; nothing was checked. Fix it and set {VERIFY} to a new "
               "token to ask again")
    return Step(VerificationStatus(token=request.token[:TOKEN_SHOWN], state="InvalidRequest",
                                   message=message),
                Verdict(False, "InvalidRequest", message), cancel=cancel)


def follow(previous: VerificationStatus, job: Job | None, document: dict | None,
           unreadable: str | None, where: str) -> Step:
    """A request being verified: its result (``document``, read from ``where``), or what its Job
    (None: absent) says; ``unreadable``: why staging could not be read."""
    if document is not None and document.get("token") == previous.token:
        return finished(previous, document)
    if unreadable is not None:
        return Step(previous, Verdict(None, "ResultUnreadable", (
            f"cannot read the result of Job {previous.job} from {where}: {unreadable}; set keys "
            "that can read staging in the ingestion's spec.secretEnv, or give the operator's service "
            "account that access (workload identity)")))
    tables = tuple(parse_table(t) for t in previous.tables)
    if job is None:
        # A Job of a request being verified always exists: (re)created, it is verifying again.
        return Step(previous, Verdict(None, "Verifying", previous.message), create=tables)
    if not (job.failed or job.complete):
        return Step(previous)
    why = (f"failed ({job.why})" if job.failed else "completed") + f" without leaving its result in {where}"
    return _done(previous, "Failed", (
        f"the verification Job {previous.job} {why}: see kubectl logs job/{previous.job}; set "
        f"{VERIFY} to a new token to try again"))


def _done(previous: VerificationStatus, state: str, message: str, **fields: object) -> Step:
    verification = VerificationStatus.model_validate({
        **previous.model_dump(by_alias=True), "state": state, "message": message, **fields})
    return Step(verification, Verdict(state == "Equal", state, message))


def finished(previous: VerificationStatus, document: dict) -> Step:
    """The request's result document, as status and condition (see :func:`verdict`)."""
    state, message, results, lsn = verdict(document)
    return _done(previous, state, message, finishedAt=document.get("finishedAt"), lsn=lsn,
                 results=[r.model_dump(by_alias=True) for r in results])


def verdict(document: dict) -> tuple[str, str, list[TableVerification], str | None]:
    """State (the condition's reason), message, per-table results and the LSN of a result
    document (:func:`lakeslot.verify.report.result_document`)."""
    result = document.get("result")
    if result is None:
        error = document.get("error") or f"exit code {document.get('exitCode')}"
        if document.get("exitCode") == 2:
            return "InvalidRequest", (f"the check refused the request: {error}; fix "
                                      f"{VERIFY_TABLES} (or the Secrets it names) and set "
                                      f"{VERIFY} to a new token"), [], None
        return "Failed", f"{error}; set {VERIFY} to a new token to try again", [], None
    tables = result["tables"]
    rows = [_row(t) for t in tables]
    lsn = next((t["rounds"][0]["sourceLsn"] for t in tables if t["rounds"]), None)
    different = [t for t in tables if t["result"] == "different"]
    incomplete = [t for t in tables if t["result"] == "incomplete"]
    if different:
        text = "; ".join(_difference(t) for t in different[:MESSAGE_TABLES])
        more = f" and {len(different) - MESSAGE_TABLES} more table(s)" if len(different) > MESSAGE_TABLES else ""
        unsettled = f"; not settled: {_problems(incomplete)}" if incomplete else ""
        return "Diverged", (
            f"the mirror differs from the source at {lsn}: {text}{more}{unsettled}. Copy each such "
            "table again (raise its spec.source.tables[].resnapshotGeneration), then set "
            f"{VERIFY} to a new token to check again; every key and value is in "
            f"{VERIFY_RESULTS}/{document.get('token')}.json in staging and in the Job's log"), rows, lsn
    if incomplete:
        return "NotCompared", (
            f"not settled: {_problems(incomplete)}. The check needs a streaming pipeline whose "
            f"mirror reaches the source snapshot (Streaming: True): fix the cause, then set "
            f"{VERIFY} to a new token"), rows, lsn
    compared = sum(t["rowsCompared"] for t in tables)
    changing = sum(t["notCompared"]["count"] for t in tables)
    note = f"; {changing:,} key(s) changed in every round and were not compared" if changing else ""
    return "Equal", (f"every table equals its source at {lsn}: {len(tables)} table(s), "
                     f"{compared:,} rows compared{note}"), rows, lsn


def _row(table: dict) -> TableVerification:
    keys = [f"{kind} {key_text(k)}" for kind in ("missing", "extra")
            for k in table[kind]["keys"][:LISTED_KEYS]]
    keys += [f"differing {key_text(e['key'])} ({', '.join(e['columns'])})"
             for e in table["differing"]["keys"][:LISTED_KEYS]]
    lacking = table["lackingColumns"]
    return TableVerification.model_validate({
        "schema": table["schema"], "name": table["name"], "result": table["result"],
        "rowsCompared": table["rowsCompared"], "missing": table["missing"]["count"],
        "extra": table["extra"]["count"], "differing": table["differing"]["count"],
        "notCompared": table["notCompared"]["count"], "keys": keys,
        "message": table["problem"] or (f"the mirror lacks the source columns {lacking}" if lacking else "")})


def _difference(table: dict) -> str:
    counts = ", ".join(f"{table[kind]['count']:,} {kind}" for kind in ("missing", "extra", "differing")
                       if table[kind]["count"])
    if table["lackingColumns"]:
        counts = ", ".join(p for p in (counts, f"lacks the source columns {table['lackingColumns']}") if p)
    first = _row(table).keys
    return f"{table['table']}: {counts}" + (f" (first: {'; '.join(first)})" if first else "")


def _problems(tables: list[dict]) -> str:
    text = "; ".join(f"{t['table']}: {t['problem']}" for t in tables[:MESSAGE_TABLES])
    return text + (f" and {len(tables) - MESSAGE_TABLES} more" if len(tables) > MESSAGE_TABLES else "")


# executing the decisions ----------------------------------------------------------------------

def serve(ingestion: PostgresIngestion, uid: str, kube: Kube, config: children.OperatorConfig,
          report: status_report.Report, environ: Mapping[str, str]) -> None:
    """Take the step the annotations and the recorded request call for (see the module
    docstring); everything it decides goes into ``report``; ``environ``: the ingestion's
    ``secretEnv``, resolved, which staging is read with."""
    previous = report.old.verification
    request = Request.of((ingestion.metadata.model_extra or {}).get("annotations") or {})
    namespace = namespace_of(ingestion.metadata.namespace)
    if request is not None and (previous is None or request.token != previous.token):
        step = start(request, previous, children.verify_name(ingestion, request.token), report.now)
    elif previous is not None and previous.state == "Verifying":
        assert previous.job is not None  # a request being verified has its Job
        live = kube.get_job(namespace, previous.job)
        document, unreadable = _result(ingestion, previous.token, environ)
        step = follow(previous, None if live is None else Job.of(live), document, unreadable,
                      ingestion.spec.staging.uri)
    else:
        return
    if step.cancel is not None:
        kube.delete_job(namespace, step.cancel, ingestion=ingestion.metadata.name)
    refused = None
    if step.create is not None and step.verification is not None:
        token = step.verification.token
        invocation = workloads.verify_invocation(ingestion, step.create, token)
        job = children.verify_job(ingestion, uid, config, workloads.verify_command(invocation),
                                  token=token)
        try:
            kube.create_job(job)
            kube.ensure_job_input(job, invocation.document)
        except ApiException as e:
            if not child_health.is_rejection(e):
                raise
            refused = child_health.rejection("Job", job["metadata"]["name"], e)
        except NameTaken as e:
            refused = child_health.name_taken(e)
    report.status.verification = step.verification
    if refused is not None:  # still Verifying: the next reconcile creates the Job again
        report.condition("Verified", False, refused.reason, refused.message)
    elif step.verdict is not None:
        report.condition("Verified", step.verdict.ok, step.verdict.reason, step.verdict.message)
    for event in step.events:
        report.tell(event.type, event.reason, event.message)


def _result(ingestion: PostgresIngestion, token: str,
            environ: Mapping[str, str]) -> tuple[dict | None, str | None]:
    """The request's result document (None: not yet), or why staging could not be read."""
    try:
        return Staging(ingestion.spec.staging.uri, create=False, environ=environ).read_verify_result(token), None
    except (OSError, ValueError) as e:
        return None, status_report.first_line(e)
