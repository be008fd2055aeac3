"""Java classes, static members and singletons by name, resolved once per JVM.

py4j resolves ``jvm.org.apache.iceberg.MetricsConfig`` one round trip per dotted part it cannot
tell is a package (measured: 4 for that name), and a class's static member one more each time it
is named: a static call written out in full cost five round trips, and the driver's row delta
made about 150 per table and pass, most of them naming classes. :func:`java` resolves a name
once and keeps what it found (a class, a static method, a constant; with a trailing ``()`` the
result of calling it, for singletons such as Iceberg's JSON mapper): a call through it is one
round trip.

Invariants: what is kept belongs to the JVM it was resolved in (a new session's JVM resolves
again); only what can be used again and from any thread is kept — classes, static methods,
constants, thread-safe singletons; never a call's result that is used up (a ``Stream``) or
changed (a builder). Failure modes: a name that does not resolve raises py4j's error, as the written-out
chain would.
"""

from __future__ import annotations

import threading

_FOUND: dict[tuple[int, str], tuple[object, object]] = {}  # (id(jvm), name) → (jvm, what)
_LOCK = threading.Lock()


def java(jvm, name: str):
    """The Java class or static member ``name`` of ``jvm`` ("java.util.ArrayList",
    "org.apache.iceberg.MetricsConfig.forTable"), or the result of calling it once when
    ``name`` ends in ``()``."""
    key = (id(jvm), name)
    with _LOCK:
        found = _FOUND.get(key)
    if found is not None and found[0] is jvm:
        return found[1]
    call = name.endswith("()")
    what = jvm
    for part in name.removesuffix("()").split("."):
        what = getattr(what, part)
    if call:
        what = what()
    with _LOCK:
        _FOUND[key] = (jvm, what)
    return what
