"""The preemption and recovery settings of a job (GRACE, RESUME, RECOVER, RECOVER_WAIT): checked once, and GRACE's
default under RECOVER derived once, when the :class:`~multinode.core.config.LaunchSpec` is made.

RECOVER without GRACE: the ranks must take a notice for a coordinated checkpoint, and outlive a dead peer's
process-group timeout to keep their last step (training/survivor.py), so GRACE becomes the larger of
:data:`DEFAULT_GRACE` and the process-group timeout plus :data:`SURVIVOR_WRITE`.
"""

from __future__ import annotations

from multinode.core.errors import UserError

DEFAULT_RECOVER_WAIT = 120.0
DEFAULT_GRACE = 30.0  # seconds a rank gets for its checkpoint when recovery signals it and GRACE was not given
SURVIVOR_WRITE = 15.0  # seconds for the surviving ranks to write their snapshot once the timeout ended the collective


def recovery_grace(spec) -> float:
    """GRACE under RECOVER when none was given (module doc)."""
    return max(DEFAULT_GRACE, spec.pg_timeout + SURVIVOR_WRITE)


def check(spec) -> None:
    """GRACE, RESUME, RECOVER, RECOVER_WAIT: one line naming the value and the fix."""
    if spec.grace is not None and not spec.grace > 0:
        raise UserError(f"GRACE={spec.grace:g} must be a positive number of seconds, e.g. GRACE=60 (the time ranks "
                        f"get between SIGTERM and SIGKILL); leave GRACE unset for none")
    if not isinstance(spec.resume, bool):
        raise UserError(f"RESUME={spec.resume!r} must be 1 (continue the latest preempted run) or 0")
    if spec.recover < 0:
        raise UserError(f"RECOVER={spec.recover} must be 0 (off) or the number of recoveries allowed, e.g. RECOVER=2")
    if spec.recover_wait < 0:
        raise UserError(f"RECOVER_WAIT={spec.recover_wait:g} must be 0 or more seconds to wait for a replacement "
                        f"node, e.g. RECOVER_WAIT={DEFAULT_RECOVER_WAIT:g}")
