"""A reader whose parent died ends even when its graceful stop hangs (lakeslot.reader.orphan).

The hang itself (a main thread blocked in libpq past its SIGTERM) could not be reproduced on
purpose; the watcher is tested with the process's parent and ending injected, and end to end
with a real process whose main thread ignores SIGTERM and sleeps, as a hung stop would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

from lakeslot.reader import orphan
from tests.support.waiting import wait_for


def test_the_watcher_ends_the_process_a_grace_after_its_parent_is_gone():
    parents = iter([100, 100, 100, 1])
    ended: list[int] = []
    dumped: list[bool] = []
    thread = orphan.watch(0.05, interval_s=0.01, getppid=lambda: next(parents, 1),
                          dump=lambda: dumped.append(True), end=ended.append)
    assert thread is not None
    wait_for(lambda: ended, "the watcher to end the process")
    assert ended == [1] and dumped == [True]


def test_the_watcher_is_not_armed_without_a_parent_to_outlive():
    assert orphan.watch(getppid=lambda: 1) is None
    assert orphan.watch(getppid=lambda: 0) is None


def test_a_process_whose_stop_hangs_ends_after_its_parent_is_killed(tmp_path):
    child_code = textwrap.dedent("""
        import signal, time
        from lakeslot.reader import orphan
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as a main thread that never sees it
        orphan.watch(0.5, interval_s=0.05)
        print("armed", flush=True)
        while True:
            time.sleep(1)
    """)
    parent_code = textwrap.dedent(f"""
        import subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", {child_code!r}], stdout=sys.stdout,
                                 stderr=open({str(tmp_path / "child.log")!r}, "w"))
        print(child.pid, flush=True)
        child.wait()
    """)
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert parent.stdout.readline().strip() == "armed"
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()

    def gone() -> bool:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return True
        return _zombie(child)

    wait_for(gone, "the orphaned child to end", deadline=30)
    log = (tmp_path / "child.log").read_text()
    assert "did not stop within" in log
    assert "most recent call first" in log  # every thread's stack: where the stop hung


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True
