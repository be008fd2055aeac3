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
- The child runs in its own process group: a Ctrl-C on the terminal reaches only the run, which
  then stops the reader with SIGTERM itself, in order.
- A unique pod identity per run (``local-<host>-<pid>``) makes the reader's application_name
  unique, so a new run's reader evicts a zombie of an earlier one (stale-holder eviction).

Failure modes: the exit code says what happened (:mod:`lakeslot.exits`): 0 stopped or reached
``--stop-at-lsn``; 3 a definite error (the status file says why); 1 transient errors persisted
or a crash (restarting resumes from staging).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from lakeslot import lsn as lsnlib
from lakeslot import workloads
from lakeslot.local import deathsig
from lakeslot.local.config import Local
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
        argv += ["--stop-at-lsn", lsnlib.format(stop_at)]
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
        """The reader's status file (written when it exits), or {} when it left none."""
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
