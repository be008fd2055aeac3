"""Waiting for a condition in tests: poll with a generous deadline, never assert on time.

The machine is shared and noisy, so a deadline only bounds a hang; it is never a performance
claim. Failing names what was awaited.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")
DEADLINE_S = 60.0


def wait_for(condition: Callable[[], T], what: str, deadline: float = DEADLINE_S,
             interval: float = 0.1) -> T:
    """Poll ``condition()`` until it is truthy and return that value; fail naming ``what``."""
    until = time.monotonic() + deadline
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > until:
            pytest.fail(f"timed out after {deadline:.0f}s waiting for {what}")
        time.sleep(interval)
