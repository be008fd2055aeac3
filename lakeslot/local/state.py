"""Which local run is active for an ingestion, and what it started.

Invariants:

- At most one ``lakeslot run`` per state directory: the run holds an exclusive ``flock`` on
  ``run.lock`` for its whole life. The kernel releases it when the process dies, however it dies
  (``kill -9`` included), so a stale lock can never block a restart, and "is a run active?" is
  answered by trying the lock, never by trusting a pid that may have been reused.
- ``run.json`` (written atomically) says what the active run started: its pid, the reader's pid
  and pod identity, the ``--once`` target. It is only meaningful while the lock is held.
- ``resnapshot-below`` keeps, across runs, the creation LSN of a slot that was recreated after it
  was lost (the operator keeps it in ``status.resnapshotBelowLsn``): a run that dies before the
  re-snapshot leaves it for the next one. It only grows, and never needs clearing: the snapshot
  job skips tables already snapshotted at or above it.

- ``tables.json`` keeps the selection as the last run resolved it (``status.tables`` rows): a
  run compares it with the selection it finds, so a table dropped or taken out of the spec
  between two runs, or while one streams, is reported ``Removed``; and a table that joined the
  publication keeps its ``resnapshotBelowLsn`` until its copy reaches it, across runs; so does a
  table the user asked to copy again (``observedResnapshotGeneration`` recorded at once, as the
  operator records it in its status: :func:`lakeslot.control.resnapshot.serve_requests`).
  ``lakeslot status`` reads it the same way. Deleting it loses only those notes.

- Asking "is a run active?" takes the lock *shared* for an instant. A run that starts in that
  instant must not take the asker for another run (``lakeslot status`` in a loop would make
  ``lakeslot run`` fail to start), so taking the lock retries for :data:`CHECK_GRACE_S`, far
  longer than any check holds it and far shorter than any run.

Failure mode: a second run of the same ingestion gets :class:`AlreadyRunning` naming the pid of
the first.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path

from lakeslot.api.models import TableStatus

CHECK_GRACE_S = 2.0  # how long a start waits out run_active() checks (each holds it for µs)
CHECK_RETRY_S = 0.02


class AlreadyRunning(Exception):
    pass


class RunLock:
    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "run.lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        if not _lock_exclusively(fd, CHECK_GRACE_S):
            os.close(fd)
            info = read_run(self.path.parent)
            raise AlreadyRunning(
                f"another lakeslot run (pid {info.get('pid', '?')}) is active for this ingestion "
                f"(state directory {self.path.parent}); stop it first (Ctrl-C or kill "
                f"{info.get('pid', '<pid>')})")
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _lock_exclusively(fd: int, grace_s: float) -> bool:
    """Takes the lock, waiting out holders that let go within ``grace_s`` (run_active checks)."""
    deadline = time.monotonic() + grace_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(CHECK_RETRY_S)


def run_active(state_dir: Path) -> bool:
    """True while some process holds the run lock of ``state_dir``."""
    path = state_dir / "run.lock"
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _write_atomically(path: Path, text: str) -> None:
    temp = path.with_suffix(f".tmp-{os.getpid()}")
    temp.write_text(text)
    os.replace(temp, path)


def write_run(state_dir: Path, **info: object) -> None:
    _write_atomically(state_dir / "run.json", json.dumps({"pid": os.getpid(), **info}, indent=1) + "\n")


def resnapshot_below(state_dir: Path, recorded: int = 0) -> int:
    """The LSN below which snapshots are void: the larger of ``recorded`` (this run's finding)
    and what an earlier run left, kept for the next run."""
    path = state_dir / "resnapshot-below"
    try:
        kept = int(path.read_text())
    except (OSError, ValueError):
        kept = 0
    if recorded > kept:
        _write_atomically(path, f"{recorded}\n")
    return max(recorded, kept)


def read_run(state_dir: Path) -> dict:
    try:
        return json.loads((state_dir / "run.json").read_text())
    except (OSError, ValueError):
        return {}


def read_tables(state_dir: Path) -> list[TableStatus]:
    """The ``status.tables`` rows the last run recorded (none: an empty list)."""
    try:
        documents = json.loads((state_dir / "tables.json").read_text())
        return [TableStatus.model_validate(d) for d in documents]
    except (OSError, ValueError, TypeError):
        return []


def write_tables(state_dir: Path, rows: list[TableStatus]) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    _write_atomically(state_dir / "tables.json", json.dumps(
        [r.model_dump(mode="json", by_alias=True, exclude_none=True) for r in rows], indent=1) + "\n")
