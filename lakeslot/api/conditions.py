"""Pure helpers for status conditions (metav1.Condition semantics).

Invariants: at most one condition per type; setting a condition keeps the order of the others;
``lastTransitionTime`` changes only when the status flips (a new reason or message alone does not
move it), so it says how long the current state has lasted. Inputs are never mutated.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from lakeslot.api.models import Condition, ConditionStatus


def find_condition(conditions: Sequence[Condition], type_: str) -> Condition | None:
    return next((condition for condition in conditions if condition.type == type_), None)


def set_condition(
    conditions: Sequence[Condition],
    type_: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    *,
    now: datetime,
    observed_generation: int | None = None,
) -> list[Condition]:
    """The conditions with ``type_`` set (replaced in place, or appended when new)."""
    previous = find_condition(conditions, type_)
    updated = Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=(
            previous.last_transition_time if previous is not None and previous.status == status else now
        ),
        observed_generation=observed_generation,
    )
    if previous is None:
        return [*conditions, updated]
    return [updated if condition.type == type_ else condition for condition in conditions]
