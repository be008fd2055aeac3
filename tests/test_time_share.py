"""lakeslot.local.time_share: work bounded to a share of the run's time (the live status and the
re-snapshot decisions of `lakeslot run`), on a clock the test moves — no timing of its own."""

from __future__ import annotations

import types

import pytest

from lakeslot.local import time_share
from lakeslot.local.time_share import TimeShare


@pytest.fixture
def clock(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(time_share, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    return now


def test_work_that_took_a_second_at_a_tenth_is_due_again_ten_seconds_after_it_started(clock):
    share = TimeShare(0.1)
    assert share.due()
    with share.spent():
        clock[0] += 1.0  # the work takes a second
    for at, due in ((101.0, False), (109.9, False), (110.0, True)):
        clock[0] = at
        assert share.due() is due, at


def test_work_that_raises_counts_as_a_run(clock):
    share = TimeShare(0.5)

    def failing() -> None:
        with share.spent():
            clock[0] += 2.0
            raise RuntimeError("the catalog is down")

    with pytest.raises(RuntimeError):
        failing()
    clock[0] = 103.9
    assert not share.due()
    clock[0] = 104.0
    assert share.due()
