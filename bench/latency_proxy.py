"""The benchmarks' network: an HTTP proxy that adds a fixed delay to every request it forwards —
put one in front of the S3 endpoint and one in front of the Iceberg REST catalog to see what a
pass costs where every request crosses a network — and records each request, so a benchmark
counts the round trips a table's commit makes.

Guarantees:

- Every request is forwarded as it came (method, path, headers — ``Host`` included, which S3's
  SigV4 signature covers —, body) after :attr:`LatencyProxy.delay_s`, and its answer returned as
  it came. The delay is per HTTP request, not per TCP connection: S3 clients keep connections
  alive, and a network's round trip is paid by each request on them.
- Requests on one client connection are forwarded on one upstream connection of their own (kept
  alive), so concurrency between the client's connections is kept and nothing is serialised
  here. A request whose reused upstream connection turns out closed before it was sent is sent
  once more on a new one (what every HTTP client does); a request that reached the catalog is
  never resent.
- ``route`` (optional) sends a request elsewhere: given the method, path (with its query) and
  body, it names another upstream (``http://host:port``) or None for ``upstream``. Each client
  connection keeps one upstream connection per upstream.
- ``rewrite`` replaces strings in the answers (not compressed ones): a REST catalog's
  ``loadTable`` hands out its S3 endpoint in the table's ``config``, which overrides the client's
  own ``s3.endpoint`` — rewritten to the S3 proxy's, the table's files are reached through it too.
- :class:`ProxyProcess` runs one in a process of its own (what the benchmarks use).
- While :attr:`LatencyProxy.recording` is set, each request is appended to
  :attr:`LatencyProxy.requests` as a :class:`Request` (monotonic start and end, method, path,
  status, the position of an apply commit — :func:`apply_commit` — and the client that sent it:
  :func:`client_of`).
- Every apply commit the catalog accepted, recording or not, is appended to
  :attr:`LatencyProxy.commits` when its answer was sent (monotonic time, table, position): from
  then on, any reader loading the table sees it — how the benchmarks observe visibility on a REST
  catalog without loading every table in a loop (:meth:`ProxyProcess.follow`).

Failure modes: the upstream unreachable answers 502 (the client sees a network error of its
own kind and retries as it would); a client that disconnects is dropped silently.

Bodies are read whole before they are forwarded: right for the benchmarks' small files, not a
general-purpose proxy.
"""

from __future__ import annotations

import http.client
import json
import multiprocessing
import re
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from multiprocessing.connection import Connection
from urllib.parse import unquote, urlsplit

from lakeslot.mirror.contract import LSN_PROPERTY

TABLE_PATH = re.compile(r"/v1/(?:.+/)?namespaces/(?P<namespace>[^/]+)/tables/(?P<table>[^/?]+)$")
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
              "proxy-authorization", "proxy-authenticate", "content-length", "expect"}
UPSTREAM_TIMEOUT_S = 300


@dataclass(frozen=True)
class Request:
    start: float  # time.monotonic() when the proxy had read it (before the delay)
    end: float  # ... when its answer was sent back
    method: str
    path: str  # unquoted, without the query
    status: int
    lsn: int | None  # an apply commit's position (a POST to a table adding a snapshot with it)
    client: str = ""  # the first product of its User-Agent (PyIceberg, Apache-HttpClient, ...)

    @property
    def commit(self) -> bool:
        return self.lsn is not None


def client_of(user_agent: str | None) -> str:
    """Who asked, as a request's ``User-Agent`` names itself first: ``PyIceberg/0.9.1 …`` →
    ``PyIceberg`` (the progress readers), ``Apache-HttpClient/5.4 …`` → ``Apache-HttpClient``
    (Iceberg's Java REST client: the apply job); ``"-"`` without one."""
    return (user_agent or "-").split("/", 1)[0].split(" ", 1)[0] or "-"


def apply_commit(method: str, path: str, body: bytes) -> tuple[str, int] | None:
    """The table an apply commit to a REST catalog goes to (``namespace.table``) and the
    position (``lakeslot.lsn``) of the snapshot it adds, else None."""
    match = TABLE_PATH.match(urlsplit(path).path)
    if method != "POST" or match is None or not body:
        return None
    try:
        updates = json.loads(body).get("updates", [])
    except ValueError:
        return None
    for u in updates:
        added = u.get("snapshot", {}) if u.get("action") == "add-snapshot" else {}
        summary = added.get("summary") or {}
        if LSN_PROPERTY in summary:
            return f"{match['namespace']}.{match['table']}", int(summary[LSN_PROPERTY])
    return None


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def handle_error(self, request, client_address) -> None:
        """A client killed mid-request resets its connection: expected here, not reported."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def send_answer(handler: BaseHTTPRequestHandler, status: int, reason: str,
                headers: list[tuple[str, str]], answer: bytes, length: str | None) -> None:
    """Answer the request (``length``: a ``HEAD``'s ``Content-Length``); a client that is gone
    (killed mid-request) closes the connection."""
    try:
        handler.send_response(status, reason)
        for key, value in headers:
            handler.send_header(key, value)
        handler.send_header("Content-Length", length or str(len(answer)))
        handler.end_headers()
        if handler.command != "HEAD":
            handler.wfile.write(answer)
        handler.wfile.flush()
    except OSError:
        handler.close_connection = True


def read_body(handler: BaseHTTPRequestHandler) -> bytes:
    """A request's body, whole: by its ``Content-Length`` or chunked (trailers skipped)."""
    if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
        chunks = []
        while (size := int(handler.rfile.readline().split(b";")[0].strip() or b"0", 16)):
            chunks.append(handler.rfile.read(size))
            handler.rfile.readline()
        while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
            pass  # trailers
        return b"".join(chunks)
    return handler.rfile.read(int(handler.headers.get("Content-Length") or 0))


class LatencyProxy:
    """An HTTP proxy on 127.0.0.1 to ``upstream`` (``http://host:port``) adding ``delay_s`` to
    each request."""

    def __init__(self, upstream: str, delay_s: float, rewrite: dict[str, str] | None = None,
                 route: Callable[[str, str, bytes], str | None] | None = None) -> None:
        self.upstream = _address(upstream)
        self.route = route
        self.delay_s = delay_s
        self.rewrite = [(old.encode(), new.encode()) for old, new in (rewrite or {}).items()]
        self.recording = threading.Event()
        self.requests: list[Request] = []
        self.commits: list[tuple[float, str, int]] = []  # (answered, table, lsn): see above
        self._lock = threading.Lock()
        self._server = Server(("127.0.0.1", 0), self._handler())
        threading.Thread(target=self._server.serve_forever, name="latency-proxy",
                         daemon=True).start()

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> LatencyProxy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _record(self, request: Request, table: str | None) -> None:
        with self._lock:
            if self.recording.is_set():
                self.requests.append(request)
            if table is not None and request.lsn is not None and request.status == 200:
                self.commits.append((request.end, table, request.lsn))

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            upstreams: dict[tuple[str, int], http.client.HTTPConnection]  # this client connection's

            def setup(self) -> None:
                super().setup()
                self.upstreams = {}

            def log_message(self, format: str, *args) -> None:  # noqa: A002 - the base's name
                pass  # (requests carry credentials in headers: nothing is logged)

            def _send_upstream(self, target: tuple[str, int], body: bytes, headers: dict[str, str]):
                for attempt in (0, 1):
                    if target not in self.upstreams:
                        self.upstreams[target] = http.client.HTTPConnection(
                            *target, timeout=UPSTREAM_TIMEOUT_S)
                    connection = self.upstreams[target]
                    try:
                        connection.request(self.command, self.path, body=body, headers=headers)
                    except (BrokenPipeError, ConnectionResetError):
                        self.upstreams.pop(target).close()
                        if attempt:
                            raise
                        continue  # a kept-alive connection the upstream closed: not sent
                    return connection.getresponse()
                raise AssertionError("unreachable")

            def _forward(self) -> None:
                started = time.monotonic()
                body = read_body(self)
                table, lsn = apply_commit(self.command, self.path, body) or (None, None)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                headers["Content-Length"] = str(len(body))
                if proxy.rewrite:  # (answers to rewrite must come uncompressed)
                    headers = {k: v for k, v in headers.items() if k.lower() != "accept-encoding"}
                routed = proxy.route(self.command, self.path, body) if proxy.route else None
                target = proxy.upstream if routed is None else _address(routed)
                time.sleep(proxy.delay_s)
                try:
                    response = self._send_upstream(target, body, headers)
                    status, reason = response.status, response.reason
                    answer = response.read()
                    if not response.getheader("Content-Encoding"):
                        for old, new in proxy.rewrite:
                            answer = answer.replace(old, new)
                    answer_headers = [(k, v) for k, v in response.getheaders()
                                      if k.lower() not in HOP_BY_HOP]
                    length = response.getheader("Content-Length") if self.command == "HEAD" \
                        else None
                    if response.will_close:
                        self.upstreams.pop(target).close()
                except (OSError, http.client.HTTPException):
                    if target in self.upstreams:
                        self.upstreams.pop(target).close()
                    status, reason, answer, answer_headers, length = 502, "Bad Gateway", b"", [], None
                # recorded before the client has the answer: a client that stops recording
                # once answered must find its request recorded (the other order raced it)
                proxy._record(Request(started, time.monotonic(), self.command,
                                      unquote(urlsplit(self.path).path), status, lsn,
                                      client_of(self.headers.get("User-Agent"))), table)
                send_answer(self, status, reason, answer_headers, answer, length)

            def finish(self) -> None:
                super().finish()
                for connection in self.upstreams.values():
                    connection.close()

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _forward

        return Handler


class ProxyProcess:
    """A :class:`LatencyProxy` (no ``route``) in a process of its own, spawned: a benchmark's
    proxies forward thousands of requests a pass, and in the measured process they would take
    its interpreter's lock from the driver they measure — a cost no real network has. The same
    ``uri``, ``delay_s``, ``recording`` (an event shared with the process) and ``requests`` (a
    copy, asked of the process); :meth:`follow` for the commits."""

    def __init__(self, upstream: str, delay_s: float, rewrite: dict[str, str] | None = None
                 ) -> None:
        context = multiprocessing.get_context("spawn")
        self.delay_s = delay_s
        self.recording = context.Event()
        self._conn, theirs = context.Pipe()
        self._asking = threading.Lock()  # one question on the pipe at a time
        self._process = context.Process(target=_serve, name="latency-proxy", daemon=True,
                                         args=(upstream, delay_s, rewrite, self.recording, theirs))
        self._process.start()
        self.uri: str = self._conn.recv()

    @property
    def pid(self) -> int | None:
        return self._process.pid

    @property
    def requests(self) -> list[Request]:
        with self._asking:
            self._conn.send("requests")
            return self._conn.recv()

    def follow(self) -> Callable[[], list[tuple[float, str, int]]]:
        """A reader of :attr:`LatencyProxy.commits`: each call returns those answered since its
        previous call (any thread: calls take turns, so none is returned twice or skipped)."""
        done, turn = 0, threading.Lock()

        def new() -> list[tuple[float, str, int]]:
            nonlocal done
            with turn, self._asking:
                self._conn.send(done)
                answered: list[tuple[float, str, int]] = self._conn.recv()
                done += len(answered)
                return answered

        return new

    def close(self) -> None:
        if self._process.is_alive():
            with self._asking:
                self._conn.send("close")
            self._process.join(10)
        self._process.kill()

    def __enter__(self) -> ProxyProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _serve(upstream: str, delay_s: float, rewrite: dict[str, str] | None, recording,
           conn: Connection) -> None:
    with LatencyProxy(upstream, delay_s, rewrite) as proxy:
        proxy.recording = recording
        conn.send(proxy.uri)
        while (asked := conn.recv()) != "close":
            with proxy._lock:
                conn.send(list(proxy.requests) if asked == "requests" else proxy.commits[asked:])


def _address(uri: str) -> tuple[str, int]:
    parts = urlsplit(uri)
    return parts.hostname or "127.0.0.1", parts.port or 80


def chain(requests: Iterable[Request]) -> int:
    """The longest run of requests one after the other (each starting after the one before it
    ended): the round trips among ``requests`` that no concurrency overlapped — what their
    latency costs at the least is this × the delay."""
    count, free_at = 0, float("-inf")
    for r in sorted(requests, key=lambda r: r.end):
        if r.start >= free_at:
            count, free_at = count + 1, r.end
    return count


# The round trips a table's commit cannot avoid: its data and delete files (written at once),
# then the metadata files that list them (its manifests and manifest list, written at once: the
# list needs the manifests' names and counts, not their upload), then the catalog's commit —
# each needs the one before it, with the table's metadata kept from its previous commit (the
# commit's answer carries it).
MIN_COMMIT_TRIPS = 3

# a table's requests further apart than this belong to different passes (or are not a commit's)
BURST_GAP_S = 1.0


@dataclass(frozen=True)
class CommitTrips:
    """The requests about one table around each of its apply commits (medians over the commits).
    A commit's requests are that table's burst of requests (none further than :data:`BURST_GAP_S`
    apart) up to its commit's answer; what the same burst asks after it is counted apart."""

    commits: int
    s3: float  # S3 requests to the table's files, the commit's own burst up to the commit
    rest: float  # catalog requests for the table, the commit included
    sequential: float  # the chain (:func:`chain`) of both together
    seconds: float  # from the table's first request in the burst to its commit's answer
    s3_after: float  # requests of the burst after the commit's answer (reloads, reports)
    rest_after: float
    other_s3: int  # S3 requests not to a table's files (staging, ...) in the window
    other_rest: int  # catalog requests not about a table (tokens, config, ...)
    example: tuple[str, ...]  # one commit's burst, request by request


def commit_trips(s3: list[Request], rest: list[Request], table_of_s3, table_of_rest
                 ) -> CommitTrips:
    """:class:`CommitTrips` of the apply commits in ``rest`` (``table_of_*``: a request's path →
    its table, or None)."""
    by_table: dict[str, list[tuple[Request, str]]] = {}
    for service, requests, table_of in (("s3", s3, table_of_s3), ("rest", rest, table_of_rest)):
        for r in requests:
            if (table := table_of(r.path)) is not None:
                by_table.setdefault(table, []).append((r, service))
    before: list[tuple[int, int, int, float]] = []
    after: list[tuple[int, int]] = []
    example: tuple[str, ...] = ()
    for table_requests in by_table.values():
        table_requests.sort(key=lambda rs: rs[0].start)
        bursts: list[list[tuple[Request, str]]] = []
        for r, service in table_requests:
            if not bursts or r.start - max(q.end for q, _ in bursts[-1]) > BURST_GAP_S:
                bursts.append([])
            bursts[-1].append((r, service))
        for burst in bursts:
            pending: list[tuple[Request, str]] = []
            for r, service in burst:
                pending.append((r, service))
                if r.commit and r.status == 200:
                    before.append((sum(s == "s3" for _, s in pending),
                                   sum(s == "rest" for _, s in pending),
                                   chain(q for q, _ in pending),
                                   r.end - pending[0][0].start))
                    pending = []
            if pending and len(pending) < len(burst):  # the tail after the burst's last commit
                after.append((sum(s == "s3" for _, s in pending),
                              sum(s == "rest" for _, s in pending)))
                example = tuple(_line(q, s, burst[0][0].start) for q, s in burst)
    if not before:
        return CommitTrips(0, 0, 0, 0, 0, 0, 0, 0, 0, ())
    s3_trips, rest_trips, sequential, seconds = (statistics.median(c[i] for c in before)
                                                 for i in range(4))
    s3_after, rest_after = (statistics.median(c[i] for c in after) if after else 0
                            for i in range(2))
    return CommitTrips(len(before), s3_trips, rest_trips, sequential, seconds, s3_after,
                       rest_after, sum(table_of_s3(r.path) is None for r in s3),
                       sum(table_of_rest(r.path) is None for r in rest), example)


def _line(r: Request, service: str, origin: float) -> str:
    name = r.path.rsplit("/", 1)[-1] if service == "s3" else r.path.split("/tables/")[-1]
    return (f"{r.start - origin:7.3f}–{r.end - origin:7.3f} s  {service:4} {r.method:4} {r.status}"
            f"{'  (the commit)' if r.commit else ''}  {name[:70]}")


@dataclass(frozen=True)
class Reads:
    """Reads (``GET``/``HEAD``) of the objects under one prefix."""

    requests: int
    objects: int  # distinct objects read
    sequential: int  # the chain (:func:`chain`) of them

    def line(self, delay_s: float) -> str:
        return (f"{self.requests} reads (GET, HEAD) of {self.objects} objects, "
                f"{self.requests / max(self.objects, 1):.1f} an object, {self.sequential} of them "
                f"one after the other ({self.sequential * delay_s:.1f} s of added latency)")


def reads(requests: list[Request], prefix: str) -> Reads:
    """:class:`Reads` of the objects whose path starts with ``prefix``."""
    mine = [r for r in requests if r.method in ("GET", "HEAD") and r.path.startswith(prefix)]
    return Reads(len(mine), len({r.path for r in mine}), chain(mine))
