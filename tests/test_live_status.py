"""The live status of ``lakeslot run`` takes at most STATUS_SHARE of the run's time
(lakeslot/local/live_status.py): after a computation that took d seconds, the next one is due
d / STATUS_SHARE seconds after the last one started, whether it succeeded or failed. The clock is
the module's own, replaced here by a counter (no timing), and the computation is replaced by one
that advances it; the supervision loop calls ``due()`` before every refresh (lakeslot/local/run.py)."""

from __future__ import annotations

import io
import threading
from types import SimpleNamespace

import pytest

from lakeslot.api.models import PostgresIngestionStatus
from lakeslot.local import live_status, observe


class Clock:
    now = 100.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clocked(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(live_status.time, "monotonic", clock.monotonic)
    live = live_status.LiveStatus(None, None, out=io.StringIO(), interactive=False)  # type: ignore[arg-type]
    monkeypatch.setattr(live.display, "show", lambda *args, **kwargs: None)
    return clock, live


@pytest.mark.parametrize("fails", [False, True])
def test_a_slow_status_waits_in_proportion_to_what_it_took(clocked, monkeypatch, fails):
    clock, live = clocked

    def observed(local, activity, staged=None, read=None):  # took 3 s of the run's clock
        clock.now += 3.0
        if fails:
            raise RuntimeError("the catalog did not answer")
        return PostgresIngestionStatus()

    monkeypatch.setattr(observe, "observe", observed)
    assert live.due()
    assert (live.refresh(None, None, None) is None) == fails
    # started at 100, took 3: the next one not before 100 + 3 / STATUS_SHARE
    next_at = 100.0 + 3.0 / live_status.STATUS_SHARE
    clock.now = next_at - 0.001
    assert not live.due()
    clock.now = next_at
    assert live.due()


def test_a_quick_status_is_due_every_tick(clocked, monkeypatch):
    clock, live = clocked

    def observed(local, activity, staged=None, read=None):
        clock.now += 0.01
        return PostgresIngestionStatus()

    monkeypatch.setattr(observe, "observe", observed)
    live.refresh(None, None, None)
    clock.now += 2.0  # the run's tick (Options.interval)
    assert live.due()


def test_a_phase_ends_without_computing_a_status(clocked, monkeypatch):
    # The supervision loop (run._Session._supervise) computes the status only when due. When a
    # phase's job ends it returns at once: at 1,000 mirrors on a network catalog a status took
    # 20 s, which the next phase (the apply job's start after the snapshot) waited for.
    from lakeslot.local import run

    clock, live = clocked
    computed = []

    def observed(local, activity, staged=None, read=None):
        computed.append(clock.now)
        clock.now += 3.0  # a slow status: the next one due 3 / STATUS_SHARE s later
        return PostgresIngestionStatus()

    monkeypatch.setattr(observe, "observe", observed)
    ticks = iter([False, False, True])  # the job ends at the third check
    session = SimpleNamespace(
        stop=threading.Event(), live=live, options=SimpleNamespace(interval=1.0),
        processes=SimpleNamespace(check_reader=lambda: None,
                                  pause=lambda s: setattr(clock, "now", clock.now + s)),
        _refresh=lambda: live.refresh(None, None, None))
    run._Session._supervise(session, lambda: next(ticks))  # type: ignore[arg-type]
    assert computed == [100.0]  # the first tick's; the second was not due, the end computes none
