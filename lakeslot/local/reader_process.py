"""The replication reader as a child process of a local run.

The command line is the operator's (:func:`lakeslot.workloads.reader_command`), adapted to one
machine: no metrics port (two local runs would fight over it; the run reads progress from the
slot and staging instead), the CA file from ``LAKESLOT_SOURCE_CA_FILE`` instead of the pod's
mount path, a status file and a pod identity in the state directory. The password travels only
in the child's environment (``LAKESLOT_SOURCE_PASSWORD``).

Invariants:

- No orphan: the child is started through :mod:`.deathsig` (``python -m
  lakeslot.local.deathsig PARENT_PID -- ARGV``), which asks Linux to send it SIGTERM when
  its parent dies (``PR_SET_PDEATHSIG``), checks the parent is still the one that started it
  (else it exits at once), then ``exec``s the reader. So even ``kill -9`` of the local run stops
  the reader cleanly (SIGTERM: it seals nothing half-written and releases the slot). The death
  signal follows the *thread* that forked: always spawn from the main thread.
- An earlier run's reader never outlives into a new run: ``PR_SET_PDEATHSIG`` is the first line,
  but it depends on the reader honouring SIGTERM promptly, so a new run (holding the run lock:
  the earlier one is gone) first stops the reader the state directory names, if that process still
  runs a reader with the recorded pod identity (:func:`stop_orphan`) — before starting its own,
  which would otherwise evict it from the slot while it evicts the new one back.
- The child runs in its own process group: a Ctrl-C on the terminal reaches only the run, which
  then stops the reader with SIGTERM itself, in order.
- A unique pod identity per run (``local-<host>-<pid>``) makes the reader's application_name
  unique, so a new run's reader evicts a zombie of an earlier one (stale-holder eviction).

Failure modes: the exit code says what happened (:mod:`lakeslot.exits`): 0 stopped or reached
``--stop-at-lsn``; 3 a definite error (the status file says why); 1 transient errors persisted
or a crash (restarting resumes from staging).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from lakeslot import lsn_text, workloads
from lakeslot.local import deathsig, tree
from lakeslot.local.config import Local
from lakeslot.observability import reader_status
from lakeslot.source import connection

STOP_TIMEOUT_S = 60.0


def pod_identity() -> str:
    return f"local-{socket.gethostname()}-{os.getpid()}"


def reader_argv(local: Local, *, pod: str, status_file: Path,
                stop_at: int | None) -> list[str]:
    """The reader command's arguments for this machine (see the module docstring)."""
    base = workloads.reader_command(local.ingestion)
    argv, args = [], iter(base[2:])  # drop the program and subcommand
    for arg in args:
        if arg == "--metrics-port":
            next(args)
        elif arg == "--sslrootcert":
            next(args)
            argv += [arg, local.environ[workloads.CA_FILE_ENV]]
        else:
            argv.append(arg)
    argv += ["--pod", pod, "--status-file", str(status_file)]
    if stop_at is not None:
        argv += ["--stop-at-lsn", lsn_text.format(stop_at)]
    return argv


@dataclass
class ReaderProcess:
    process: subprocess.Popen
    pod: str
    status_file: Path
    log_file: Path
    app_name: str

    @property
    def pid(self) -> int:
        return self.process.pid

    def poll(self) -> int | None:
        return self.process.poll()

    def outcome(self) -> dict:
        """The reader's status file (its state while it runs, its outcome once it exited), or {}
        when it left none."""
        try:
            return json.loads(self.status_file.read_text())
        except (OSError, ValueError):
            return {}

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM, wait; SIGKILL only if it does not stop within ``timeout``."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait()


def describe_exit(code: int, outcome: Mapping) -> str:
    """What a reader's end says: its status file's outcome, else how it ended (a signal, or an
    exit before it could write its outcome; a running state it left says what it was doing)."""
    if reader_status.is_final(outcome):
        return f"exit {code}, {outcome['reason']}: {outcome.get('message')}"
    problem = reader_status.problem(outcome)
    doing = f"; it was retrying: {problem[0]}: {problem[1]}" if problem else ""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}{doing}"
        except ValueError:
            return f"killed by signal {-code}{doing}"
    return f"exit {code} without a status file (see its log){doing}"


def runs_reader(pid: int, pod: str) -> bool:
    """True when process ``pid`` runs ``lakeslot reader`` with pod identity ``pod`` (Linux
    ``/proc``; a pid reused by anything else is not it)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    pairs = set(itertools.pairwise(argv))
    return b"reader" in argv and (b"--pod", pod.encode()) in pairs


def stop_orphan(pid: int, pod: str, timeout: float = STOP_TIMEOUT_S) -> bool:
    """Stop an earlier run's reader that outlived it (see the module docstring): SIGTERM (it
    seals what is complete and lets go of the slot), SIGKILL if it has not exited within
    ``timeout``. False when ``pid`` is not such a reader (nothing done)."""
    if not runs_reader(pid, pod):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while tree.alive({pid}) and time.monotonic() < deadline:
        time.sleep(0.1)
    if tree.alive({pid}):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return True


def spawn(local: Local, *, pod: str,
          stop_at: int | None = None) -> ReaderProcess:
    local.state_dir.mkdir(parents=True, exist_ok=True)
    status_file = local.path("reader-status.json")
    status_file.unlink(missing_ok=True)
    log_file = local.path("reader.log")
    argv = reader_argv(local, pod=pod, status_file=status_file, stop_at=stop_at)
    command = [sys.executable, "-m", deathsig.__name__, str(os.getpid()), "--",
               sys.executable, "-m", "lakeslot.cli", "reader", *argv]
    with open(log_file, "ab") as log:
        process = subprocess.Popen(command, env=local.environ, stdin=subprocess.DEVNULL,
                                   stdout=log, stderr=log, process_group=0)
    app_name = connection.application_name("reader", local.job.names.owner, pod)
    return ReaderProcess(process, pod, status_file, log_file, app_name)
