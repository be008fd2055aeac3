"""The seals' and passes' shared grid (lakeslot.cadence): pure arithmetic, and the listing
that feeds the lag (a real staging directory, file times set by the test)."""

from __future__ import annotations

import itertools
import os

import pytest

from lakeslot import cadence
from lakeslot.staging.segments import SegmentName
from lakeslot.staging.store import Staging


def test_a_seal_is_due_at_the_next_multiple_of_its_period():
    assert cadence.until_grid(1000.2, 0.5) == pytest.approx(0.3)
    assert cadence.until_grid(1000.0, 0.5) == pytest.approx(0.5)  # after, never now
    assert cadence.until_grid(1000.49, 0.5) == pytest.approx(0.01)
    assert cadence.until_grid(7.0, 2.5) == pytest.approx(0.5)


def test_aligned_passes_keep_the_interval_and_land_a_lag_after_a_seal():
    start = 1000.05  # a grid point (0.5 s) plus a lag of 0.05 s
    starts = [start]
    for _ in range(10):
        starts.append(cadence.next_start(starts[-1], 1, 0.5, 0.05))
    assert [round(b - a, 9) for a, b in itertools.pairwise(starts)] == [1.0] * 10
    assert all(abs(((s - 0.05) / 0.5) - round((s - 0.05) / 0.5)) < 1e-6 for s in starts)


def test_an_unaligned_pass_snaps_to_the_nearest_grid_point():
    # a first pass started off the grid (or a long one, then followed at once)
    assert cadence.next_start(1000.21, 1, 0.5, 0.05) == pytest.approx(1001.05)
    assert cadence.next_start(1000.31, 1, 0.5, 0.05) == pytest.approx(1001.55)
    assert cadence.next_start(1000.01, 60, 10, 0.05) == pytest.approx(1060.05)


def test_an_interval_that_is_no_multiple_of_the_seal_period_is_kept_unaligned():
    assert cadence.aligned(1, 0.5) and cadence.aligned(60, 10) and cadence.aligned(7, 3.5)
    assert not cadence.aligned(1, 0.3) and not cadence.aligned(45, 10)
    assert not cadence.aligned(1, 0)
    assert cadence.next_start(1000.31, 1, 0.3, 0.02) == pytest.approx(1001.31)
    assert cadence.next_start(1000.31, 45, 10, 0.02) == pytest.approx(1045.31)


def test_the_wait_for_the_next_pass_is_bounded_whatever_the_wall_clock_does():
    assert cadence.wait(1000.05, 1, 0.5, 0.05, now=1000.95) == pytest.approx(0.1)
    assert cadence.wait(1000.05, 1, 0.5, 0.05, now=1001.40) == 0.0  # a long pass: at once
    assert cadence.wait(1000.05, 1, 0.5, 0.05, now=1000.05 - 3600) == 1.5  # stepped back an hour
    assert cadence.wait(1000.05, 1, 0.5, 0.05, now=1000.05 + 3600) == 0.0  # stepped forth


def test_the_lag_follows_the_slow_seals_but_not_a_few_off_the_grid():
    lag = cadence.Lag(0.5)
    assert lag.seconds == cadence.LAG_DEFAULT_S  # nothing seen yet
    lag.observe([1000.012, 1000.508, 1001.015])  # sealed 12, 8 and 15 ms after their grid point
    assert lag.seconds == pytest.approx(0.015 + cadence.LAG_MARGIN_S)
    lag.observe([1002.0 + 0.01 * i for i in range(cadence.LAG_SEALS - cadence.LAG_OUTLIERS)])
    lag.observe([1003.31, 1003.42, 1004.27, 1005.44])  # sealed by size, off the grid
    assert lag.seconds == pytest.approx(0.01 * 15 + cadence.LAG_MARGIN_S)


def test_a_file_time_a_clock_tick_before_the_grid_is_a_seal_at_it():
    lag = cadence.Lag(0.5)
    lag.observe([1000.49, 1000.986, 1001.5])  # 10 and 14 ms before, and at the grid point
    assert lag.seconds == pytest.approx(cadence.LAG_MARGIN_S)


def test_a_slow_store_moves_the_passes_up_to_a_period_later():
    lag = cadence.Lag(0.5)
    lag.observe([1000.4] * cadence.LAG_SEALS)  # every seal visible 0.4 s after its grid point
    assert lag.seconds == pytest.approx(0.4 + cadence.LAG_MARGIN_S)


def test_the_listing_says_when_each_segment_was_sealed(tmp_path):
    staging = Staging(tmp_path.as_uri())
    names = [SegmentName(16, 32), SegmentName(0, 16)]
    for i, name in enumerate(names):
        path = tmp_path / name.filename
        path.write_bytes(b"")
        os.utime(path, (1_700_000_000.25 + i, 1_700_000_000.25 + i))
    (tmp_path / "not-a-segment.txt").write_bytes(b"")
    assert staging.listing() == [(SegmentName(0, 16), pytest.approx(1_700_000_001.25)),
                                 (SegmentName(16, 32), pytest.approx(1_700_000_000.25))]
    assert staging.list() == [SegmentName(0, 16), SegmentName(16, 32)]
