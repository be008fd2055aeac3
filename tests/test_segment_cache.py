"""The apply driver's segment cache (lakeslot.apply.segment_cache) on a real S3 endpoint (the tests'
SeaweedFS), every request counted by the benchmarks' proxy in front of it: a batch's segments are
fetched whole once, read from memory after, within their bounds — a segment too big, or beyond
the budget, read from staging as before —, dropped once below the batch, replaced or deleted; and
what is read from memory equals what staging serves."""

from __future__ import annotations

import uuid

import pyarrow.parquet as pq
import pytest

from bench.latency_proxy import LatencyProxy
from lakeslot.apply.segment_cache import SegmentCache, TaskSegments
from lakeslot.local.objectstore import STAGING_BUCKET
from lakeslot.reader.writer import SegmentWriter
from lakeslot.staging.segments import SegmentName, SourceIdentity
from lakeslot.staging.store import Staging

SOURCE = SourceIdentity("7", 1)


@pytest.fixture
def proxied(object_store, monkeypatch):
    """(staging URI, the proxy in front of S3, recording): a fresh prefix of the object store."""
    with LatencyProxy(object_store.s3_endpoint, 0.0) as proxy:
        for name, value in {**object_store.environment(), "AWS_ENDPOINT_URL": proxy.uri}.items():
            monkeypatch.setenv(name, value)
        yield f"s3://{STAGING_BUCKET}/{uuid.uuid4().hex[:12]}", proxy


def _requests(proxy: LatencyProxy) -> list[tuple[str, str]]:
    """(method, segment file) of the reads recorded since the last call."""
    found = [(r.method, r.path.rsplit("/", 1)[-1]) for r in proxy.requests
             if r.method in ("GET", "HEAD") and r.path.endswith(".parquet")]
    proxy.requests.clear()
    return found


def _read_all(staging: Staging, name: SegmentName) -> tuple:
    metadata, groups = staging.row_groups(name)
    return metadata, [staging.read_row_group(name, g, ["commit_lsn", "op"]) for g in range(groups)]


def test_a_batch_is_fetched_whole_once_and_read_from_memory_within_its_bounds(proxied):
    uri, proxy = proxied
    plain = Staging(uri)
    a, b, c, d = (SegmentWriter(plain, start, SOURCE).seal(start + 0x100)
                  for start in (0x100, 0x200, 0x300, 0x400))
    size = {s.name: s.size for s in plain.sealed()}
    assert len(set(size.values())) == 1, size  # (equal sizes: the bounds below count segments)
    one = size[a]
    assert one is not None
    expected = {n: _read_all(plain, n) for n in (a, b, c, d)}

    cache = SegmentCache(uri, largest=one, budget=2 * one)
    assert [s.name for s in cache.sealed()] == [a, b, c, d]
    proxy.recording.set()
    cache.read_ahead([a, b, c])  # the budget holds two: a and b, fetched at once; c is not
    assert sorted(_requests(proxy)) == sorted([("HEAD", a.filename), ("GET", a.filename),
                                               ("HEAD", b.filename), ("GET", b.filename)])
    assert cache.held == {a: one, b: one}
    for name in (a, b):  # from memory: the same as staging serves, no request
        assert _read_all(cache, name) == expected[name]
        assert cache.metadata(name) == expected[name][0]
    assert _requests(proxy) == []
    assert _read_all(cache, c) == expected[c]  # beyond the budget: read from staging as before
    assert {f for _, f in _requests(proxy)} == {c.filename}

    # the next batch: a is below it (dropped), b kept, c fetched in its room, d beyond the budget
    cache.read_ahead([b, c, d])
    assert _requests(proxy) == [("HEAD", c.filename), ("GET", c.filename)]
    assert cache.held == {b: one, c: one}
    assert [_read_all(cache, n) for n in (b, c)] == [expected[b], expected[c]]
    assert _requests(proxy) == []

    # a copy of c with other bytes (another writer's footer; the same rows) replaces it: the
    # next listing shows another size, and the copy held is dropped, never served for it
    copy = f"{plain.path}/{c.filename}"
    table = pq.read_table(copy, filesystem=plain.fs)
    with plain.fs.open_output_stream(copy) as out:
        pq.write_table(table, out, compression="none")
    assert {s.name: s.size for s in cache.sealed()}[c] != one
    assert cache.held == {b: one}
    _requests(proxy)
    cache.delete(b)  # retention through the cache drops what it holds
    assert cache.held == {}
    assert [s.name for s in cache.sealed()] == [a, c, d]

    # a segment larger than the largest held is read from staging, each time
    small = SegmentCache(uri, largest=one - 1)
    small.sealed()
    _requests(proxy)
    small.read_ahead([a, d])
    assert small.held == {} and _requests(proxy) == []
    assert _read_all(small, d) == expected[d]
    assert {f for _, f in _requests(proxy)} == {d.filename}


def test_an_executor_task_fetches_its_segments_whole_once_within_its_budget(proxied):
    """An executor task's staging (TaskSegments): the segments of its units fetched whole when
    made (a HEAD and a GET each), at most its budget; every later read of them — the compact
    rows', the winners', the folded changes' — from memory, equal to what staging serves; a
    segment beyond the budget, or larger than the largest held, read from staging as before."""
    uri, proxy = proxied
    plain = Staging(uri)
    a, b, c = (SegmentWriter(plain, start, SOURCE).seal(start + 0x100)
               for start in (0x100, 0x200, 0x300))
    one = {s.name: s.size for s in plain.sealed()}[a]
    assert one is not None
    expected = {n: _read_all(plain, n) for n in (a, b, c)}
    proxy.recording.set()
    task = TaskSegments(uri, [a, b, a, c], budget=2 * one + one // 2)  # (a once; room for two)
    fetched = _requests(proxy)
    assert sorted(m for m, _ in fetched) == ["GET", "GET", "HEAD", "HEAD", "HEAD"], fetched
    held = {f for m, f in fetched if m == "GET"}
    assert len(held) == 2 and held <= {a.filename, b.filename, c.filename}
    for _ in range(2):  # read twice: from memory both times, the same as staging serves
        for name in (a, b, c):
            assert _read_all(task, name) == expected[name]
        assert {f for _, f in _requests(proxy)} == {a.filename, b.filename, c.filename} - held
    small = TaskSegments(uri, [a], largest=one - 1)
    assert [m for m, _ in _requests(proxy)] == ["HEAD"]
    assert _read_all(small, a) == expected[a]
    assert {f for _, f in _requests(proxy)} == {a.filename}
