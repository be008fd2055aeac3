"""Where the machine's CPU goes while a benchmark measures: every process's CPU time read from
``/proc`` every :data:`SAMPLE_S`, grouped by the benchmark's own labels, and how often every core
was busy.

Why: a benchmark of the production configuration runs the catalog, the object store and the
latency proxies on the machine lakeslot runs on, where in production they have machines of their
own. When the cores are all busy, a request to the catalog waits for a core, not for the network:
the figures then say how much of the machine each part took, instead of leaving the reader to
guess whether a pass waited on round trips or on CPU.

Invariants: a process's time is its own and its finished threads' (``utime + stime`` of
``/proc/PID/stat``); the time its threads waited for a core is the run-queue delay of those alive
(``/proc/PID/task/*/schedstat``: a thread that ended takes its share with it); a process first
seen after the first sample counts from its start if it started since the sample before (else
from its next sample: a read that missed it is not its whole life); one that ends between two
samples loses its last interval. The sampler's own time is in no group.

Failure modes: none raised — without ``/proc`` (not Linux) nothing is sampled and
:meth:`CpuUse.summary` is None.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

SAMPLE_S = 0.5
BUSY = 0.9  # a sample counts as "every core busy" from this share of the machine's cores on
OTHER = "other processes"

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class Sample:
    start: float  # time.monotonic() of the interval's start
    end: float
    cores: dict[str, float]  # cores used on average in the interval, per group
    waiting: dict[str, float]  # its threads waiting for a core, on average in the interval


@dataclass(frozen=True)
class Summary:
    samples: int
    cores: float  # the machine's cores
    busy: float  # cores used on average, every group
    saturated: float  # the share of the samples with at least BUSY × cores used
    groups: dict[str, float]  # cores used on average, per group, most first
    waiting: dict[str, float]  # threads waiting for a core on average, per group

    def text(self) -> str:
        parts = ", ".join(f"{name} {used:.2f} ({self.waiting.get(name, 0.0):.2f} waiting)"
                          for name, used in self.groups.items() if used >= 0.005)
        return (f"{self.busy:.2f} of {self.cores:.0f} cores busy on average, all of them "
                f"(≥ {BUSY:.0%}) in {self.saturated:.0%} of {self.samples} samples of "
                f"{SAMPLE_S} s — {parts}")


class CpuUse:
    """Samples in a process of its own while inside (in a thread of the measured process, its
    hundreds of reads a sample each took the interpreter's lock back from the threads under
    measure; with busy threads it went whole seconds without a sample). Each sample: cores used
    and threads waiting for a core, per group, on average over its interval. ``label(pid, comm,
    ancestors)`` — picklable — names a process's group (``ancestors``: its parents' pids,
    nearest first), None for :data:`OTHER`."""

    def __init__(self, label: Callable[[int, str, list[int]], str | None]) -> None:
        self.samples: list[Sample] = []
        self._available = Path("/proc/self/stat").exists()
        context = multiprocessing.get_context("spawn")
        self._stop = context.Event()
        self._mine, theirs = context.Pipe()
        self._process = context.Process(target=_sample, args=(label, self._stop, theirs),
                                        name="cpu-use", daemon=True)

    def __enter__(self) -> CpuUse:
        if self._available:
            self._process.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._process.is_alive():
            self._stop.set()
            if self._mine.poll(10):  # (a sampler that failed said so on its stderr)
                self.samples = self._mine.recv()
            self._process.join(10)
            self._process.kill()

    def summary(self, within: Iterable[tuple[float, float]] | None = None) -> Summary | None:
        """Over every sample, or (``within``: monotonic intervals) over those overlapping one of
        them; None without samples."""
        spans = sorted(within) if within is not None else None
        chosen = [s for s in self.samples
                  if spans is None or any(a < s.end and b > s.start for a, b in spans)]
        if not chosen:
            return None
        cores = float(os.cpu_count() or 1)
        totals: dict[str, float] = {}
        waits: dict[str, float] = {}
        for s in chosen:
            for name, used in s.cores.items():
                totals[name] = totals.get(name, 0.0) + used / len(chosen)
            for name, waited in s.waiting.items():
                waits[name] = waits.get(name, 0.0) + waited / len(chosen)
        busy = [sum(s.cores.values()) for s in chosen]
        return Summary(len(chosen), cores, sum(busy) / len(chosen),
                       sum(b >= BUSY * cores for b in busy) / len(chosen),
                       dict(sorted(totals.items(), key=lambda item: -item[1])), waits)


def _sample(label: Callable[[int, str, list[int]], str | None], stop, answer) -> None:
    """The sampling process: every :data:`SAMPLE_S` until ``stop``, then the samples on
    ``answer``."""
    me, samples = os.getpid(), []
    before, at, labels = _read(), time.monotonic(), dict[int, str]()
    since = _uptime()
    while not stop.wait(SAMPLE_S):
        now, processes, uptime = time.monotonic(), _read(), _uptime()
        parents = {pid: p.parent for pid, p in processes.items()}
        cores: dict[str, float] = {}
        waiting: dict[str, float] = {}
        for pid, p in processes.items():
            old = before.get(pid)
            if old is None and p.started < since:  # (missed by the last read: no interval)
                continue
            used, waited = (p.used - old.used, p.waited - old.waited) if old else (p.used, p.waited)
            if pid == me or (used <= 0 and waited <= 0):
                continue
            if pid not in labels:
                labels[pid] = label(pid, p.comm, _ancestors(pid, parents)) or OTHER
            group = labels[pid]
            cores[group] = cores.get(group, 0.0) + max(0.0, used) / (now - at)
            waiting[group] = waiting.get(group, 0.0) + max(0.0, waited) / (now - at)
        samples.append(Sample(at, now, cores, waiting))
        before, at, since = processes, now, uptime
    answer.send(samples)


@dataclass(frozen=True)
class _Process:
    used: float  # CPU seconds, its finished threads' included
    waited: float  # seconds its live threads waited for a core
    parent: int
    comm: str
    started: float  # seconds after boot


def _uptime() -> float:
    return float(Path("/proc/uptime").read_text().split()[0])


def _read() -> dict[int, _Process]:
    out: dict[int, _Process] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            text = Path(entry.path, "stat").read_text()
            tasks = list(os.scandir(Path(entry.path, "task")))
        except OSError:  # (ended since the listing)
            continue
        waited = 0
        for task in tasks:
            with contextlib.suppress(OSError):  # (a thread that ended since)
                waited += int(Path(task.path, "schedstat").read_text().split()[1])
        comm = text[text.index("(") + 1:text.rindex(")")]
        fields = text[text.rindex(")") + 2:].split()
        out[int(entry.name)] = _Process((int(fields[11]) + int(fields[12])) / _TICKS, waited / 1e9,
                                        int(fields[1]), comm, int(fields[19]) / _TICKS)
    return out

def _ancestors(pid: int, parents: dict[int, int]) -> list[int]:
    chain, at = [], parents.get(pid)
    while at and at not in chain:
        chain.append(at)
        at = parents.get(at)
    return chain
