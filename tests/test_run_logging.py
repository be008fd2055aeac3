"""``lakeslot run``'s log keeps failures and drops py4j's retried sends
(:func:`lakeslot.local.run.quiet_py4j_retries`): py4j notes a send it retries over a new
connection with ``logging.info`` on the root logger and a traceback, though the retry succeeds.
The records are made as ``logging`` makes them from py4j's own module file."""

from __future__ import annotations

import logging
import sys

import py4j.java_gateway

from lakeslot.local.run import quiet_py4j_retries


def _record(name: str, level: int, pathname: str, message: str) -> logging.LogRecord:
    try:
        raise ConnectionResetError(104, "Connection reset by peer")
    except ConnectionResetError:
        return logging.LogRecord(name, level, pathname, 1056, message, None, sys.exc_info())


def test_a_retried_send_is_dropped_and_failures_and_lakeslots_lines_are_kept():
    py4j_file = py4j.java_gateway.__file__
    assert not quiet_py4j_retries(_record("root", logging.INFO, py4j_file,
                                          "Exception while sending command."))
    # a send that failed for good (py4j's logging.exception), and lakeslot's own lines, stay
    assert quiet_py4j_retries(_record("root", logging.ERROR, py4j_file,
                                      "Exception while sending command."))
    assert quiet_py4j_retries(_record("root", logging.INFO, __file__, "a line of ours"))
    assert quiet_py4j_retries(_record("lakeslot.local", logging.INFO, __file__, "phase=Streaming"))
