"""A proxy in front of the tests' Iceberg REST catalog that makes a fault happen exactly while a
table commit is in flight: the catalog, its 409s and the commits that land are the real ones.

- Every request is forwarded unchanged to the catalog (method, path, headers, body) and its answer
  returned unchanged; the proxy keeps no state of the catalog's.
- :meth:`CommitProxy.arm` hands it one action for the next *apply commit*: a ``POST`` to a table
  (``…/namespaces/{ns}/tables/{table}``) whose body adds a snapshot carrying ``lakeslot.lsn``
  (the apply job's commits; the snapshot job creates tables, maintenance commits ``replace``
  snapshots). The action runs in the request's thread *before* the request is forwarded, with the
  table's name; then the request goes on to the catalog — so an action that kills the client
  makes the commit land after the client died, and one that commits to the table first makes the
  catalog answer the client's commit with a real 409.
- :meth:`CommitProxy.drop_answer` arms it to lose the catalog's answer to the next apply commit:
  the commit is forwarded and lands (or not) as the catalog decides, then the client's connection
  is closed without an answer — a commit that timed out on the client but landed on the server.
- :attr:`CommitProxy.commits` records every apply commit forwarded: (table, the catalog's status).

Failure modes: the upstream unreachable answers 502 (the client sees a catalog error); an action
that raises is recorded in :attr:`CommitProxy.errors` and the request is forwarded anyway.
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from urllib.parse import urlsplit

from bench.latency_proxy import Server, apply_commit, read_body, send_answer

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
              "proxy-authorization", "proxy-authenticate", "host", "content-length"}
UPSTREAM_TIMEOUT_S = 120

Action = Callable[[str], None]


class CommitProxy:
    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.upstream_host, self.upstream_port = parts.hostname or "127.0.0.1", parts.port or 80
        self.commits: list[tuple[str, int]] = []
        self.errors: list[BaseException] = []
        self._armed: Action | None = None
        self._drop = False
        self.dropped: list[tuple[str, int]] = []  # the commits whose answer was lost: (table, status)
        self._lock = threading.Lock()
        self.fired = threading.Event()  # the armed action ran
        self._server = Server(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, name="rest-proxy",
                                        daemon=True)
        self._thread.start()

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def arm(self, action: Action) -> None:
        """Run ``action(table)`` before forwarding the next apply commit (once)."""
        with self._lock:
            self.fired.clear()
            self._armed = action

    def drop_answer(self) -> None:
        """Lose the catalog's answer to the next apply commit (once)."""
        with self._lock:
            self.fired.clear()
            self._drop = True

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _take(self) -> Action | None:
        with self._lock:
            action, self._armed = self._armed, None
            return action

    def _take_drop(self) -> bool:
        with self._lock:
            drop, self._drop = self._drop, False
            return drop

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args) -> None:  # noqa: A002 - the base's name
                pass  # (requests carry bearer tokens in headers: nothing is logged)

            def _forward(self) -> None:
                body = read_body(self)
                table, _ = apply_commit(self.command, self.path, body) or (None, None)
                if table is not None and (action := proxy._take()) is not None:
                    try:
                        action(table)
                    except BaseException as e:  # noqa: BLE001 - recorded for the test
                        proxy.errors.append(e)
                    finally:
                        proxy.fired.set()
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                upstream = http.client.HTTPConnection(proxy.upstream_host, proxy.upstream_port,
                                                      timeout=UPSTREAM_TIMEOUT_S)
                try:
                    upstream.request(self.command, self.path, body=body or None, headers=headers)
                    response = upstream.getresponse()
                    status, reason, answer = response.status, response.reason, response.read()
                    length = response.getheader("Content-Length") if self.command == "HEAD" else None
                    answer_headers = [(k, v) for k, v in response.getheaders()
                                      if k.lower() not in HOP_BY_HOP]
                except OSError:
                    status, reason, answer, answer_headers, length = 502, "Bad Gateway", b"", [], None
                finally:
                    upstream.close()
                if table is not None:
                    proxy.commits.append((table, status))
                    if proxy._take_drop():
                        proxy.dropped.append((table, status))
                        proxy.fired.set()
                        self.close_connection = True  # no answer: the client's read fails
                        return
                send_answer(self, status, reason, answer_headers, answer, length)

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _forward

        return Handler
