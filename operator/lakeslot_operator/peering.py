"""Which operator replica acts: kopf peering with a distinct priority per process.

kopf lets only the peer with the highest priority act; peers of *equal* priority all pause
("Pausing all operators, including self", kopf's peering code), so replicas started with kopf's
default priority serve nothing. Every lakeslot process therefore announces its own priority
(:func:`priority`), and the chart runs more than one replica only with peering.

Invariants:

- Priorities of two processes differ: the start time in milliseconds, times 1000, plus three
  digits of a hash of the pod's name (two pods would have to start in the same millisecond *and*
  share those digits to tie).
- The newest process has the highest priority, so in a rolling update the new pod takes over as
  soon as it runs and the old one pauses before it is stopped: there is always one active
  replica (for the moment both see each other, the old one is pausing; kopf offers no
  per-object lock).
- A replica that stops cleanly removes itself from the peering object, so the next one resumes
  at once; one that dies is dropped when its keep-alive expires (:data:`LIFETIME_S`), and the
  highest-priority survivor resumes then: failover within about one lifetime.

Failure modes: peering objects missing (the chart creates them) → kopf exits at startup with
``--peering``; the API server unreachable → keep-alives stop, the others take over after the
lifetime.
"""

from __future__ import annotations

import time
import zlib

import kopf

LIFETIME_S = 30  # keep-alive lifetime: how long a dead replica blocks the others at most


def priority(pod: str, started_ns: int | None = None) -> int:
    """This process's peering priority (higher acts): newer processes first, ties broken by pod."""
    started = time.time_ns() if started_ns is None else started_ns
    return (started // 1_000_000) * 1000 + zlib.crc32(pod.encode()) % 1000


def configure(settings: kopf.OperatorSettings, *, pod: str, lifetime: int = LIFETIME_S,
              started_ns: int | None = None) -> None:
    settings.peering.priority = priority(pod, started_ns)
    settings.peering.lifetime = lifetime
