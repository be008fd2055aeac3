"""Serving a WSGI app (Prometheus' ``/metrics``, a health check) from a daemon thread, quietly.

Shared by the replication reader and the operator. Each request is answered on a thread of its
own (a slow scrape never blocks another), and no access log is written (scrapes every few
seconds would drown the process's own log).

Failure mode: a port already in use raises ``OSError`` from :func:`serve`.
"""

from __future__ import annotations

import threading
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server


def serve(app, port: int, host: str, thread_name: str) -> WSGIServer:
    """Serve ``app`` on ``host:port`` from a daemon thread; returns the server
    (``server_port`` is the bound port when ``port`` is 0)."""
    server = make_server(host, port, app, _ThreadingServer, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, daemon=True, name=thread_name).start()
    return server


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args) -> None:  # noqa: A002 - the base class's signature
        pass
