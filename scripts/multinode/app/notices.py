"""A batch of spot notices becomes one recovery: before :mod:`multinode.app.recover` acts on an attempt that a notice
ended, it collects the notices the other nodes got meanwhile.

When EC2 takes back capacity it often takes several instances of a pool at once, and each gets its own two-minute
notice. The ranks stop at the first notice they agree on (one coordinated checkpoint); a second node's notice that
arrives a moment later, during the checkpoint or the stop, would otherwise start a second recovery as soon as the
first one's job starts on that node (seen: two recoveries 8.7 s apart, the job restarted twice). So recovery
(:meth:`Recovery.after`) first runs this step:

1. **read every node's metadata service**, over the run's own connections, with the node's interpreter and the
   guard's copy of ``training/imds.py`` (synced to ``<code dir>/guard/`` whenever GRACE is set, which RECOVER
   implies): the same IMDSv2 reads the ranks make, ``python imds.py`` printing the notice as JSON;
2. **the window**: :data:`COALESCE_SECONDS` from the batch's first notice -- the earliest of the time a rank saw it
   and the time EC2 issued one (an interruption notice's ``time`` minus its two minutes of warning). Only what is
   left of it is waited, then the nodes are read once more; usually the ranks' own polling, the checkpoint, the stop
   and the sweep have used it up, and nothing is waited;
3. every node showing a **spot interruption notice** of this run (its time not before the run started; a
   rebalance recommendation is no stop, :attr:`training.imds.Notice.stops`) is replaced in the same recovery.

The window is 5 s, AWS's advised interval between two reads of ``spot/instance-action`` ("check for these
interruption notices every 5 seconds"): a notice issued in the same moment as the first is visible by then on
every node, and waiting longer would only delay a recovery the other nodes' notices do not concern. A notice later
than the window is a recovery of its own. A node whose service cannot be read (no endpoint, not EC2, gone) adds
nothing.
"""

from __future__ import annotations

import calendar
import json
import shlex
import time
from collections.abc import Mapping

from multinode.backends.base import RunContext
from multinode.core.inventory import Inventory
from multinode.core.nodepaths import code_dir
from multinode.plan.launchers.base import GUARD_SUBDIR

COALESCE_SECONDS = 5.0  # AWS: "check for these interruption notices every 5 seconds" (training/imds.py cites it)
WARNING_SECONDS = 120.0  # AWS: the interruption notice comes two minutes before the action (training/imds.py)
ENDPOINT_ENV = "AWS_EC2_METADATA_SERVICE_ENDPOINT"  # as training/imds.py reads it


def poll_command(inv: Inventory, name: str, env: Mapping[str, str]) -> str:
    """The command that prints ``name``'s notice as JSON (``null`` for none): the guard's copy of imds.py, run by
    path with the node's interpreter (``-I``: nothing of the project on its path), the ranks' endpoint variable if
    the job was given one."""
    endpoint = env.get(ENDPOINT_ENV)
    prefix = f"env {ENDPOINT_ENV}={shlex.quote(endpoint)} " if endpoint else ""
    script = f"{code_dir(inv, name)}/{GUARD_SUBDIR}/imds.py"
    return f"{prefix}{shlex.quote(inv.interpreter)} -I {shlex.quote(script)} 2>/dev/null"


def _epoch(text: object) -> float | None:
    try:
        return float(calendar.timegm(time.strptime(str(text), "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return None


def _interruptions(answers: Mapping[str, str]) -> dict[str, float | None]:
    """{node: its interruption's action time} for the answers (``python imds.py``'s JSON) that are one."""
    found: dict[str, float | None] = {}
    for name, text in answers.items():
        try:
            notice = json.loads(text.strip() or "null")
        except ValueError:
            continue
        if isinstance(notice, dict) and notice.get("kind") == "interruption":
            found[name] = _epoch(notice.get("time"))
    return found


def interrupted(answers: Mapping[str, str], since: float) -> list[str]:
    """The nodes whose answer is a spot interruption notice not older than ``since`` (Unix seconds; whole seconds, as
    AWS writes its times), in the answers' order. Pure."""
    return [name for name, at in _interruptions(answers).items() if at is None or at >= int(since)]


def first_notice(noticed_at: float | None, answers: Mapping[str, str]) -> float | None:
    """When the batch's first notice came: the earliest of a rank's ``noticed_at`` and the issue time of each
    interruption in ``answers`` (its action time less the two minutes' warning); None when neither is known. Pure."""
    times = [at - WARNING_SECONDS for at in _interruptions(answers).values() if at is not None]
    times += [noticed_at] if noticed_at is not None else []
    return min(times) if times else None


def window_left(first_notice_at: float | None, now: float) -> float:
    """Seconds still to wait before reading the nodes: what is left of the window after the first notice."""
    if first_notice_at is None:
        return 0.0
    return max(0.0, min(COALESCE_SECONDS, first_notice_at + COALESCE_SECONDS - now))


def _read(ctx: RunContext) -> dict[str, str]:
    """Every node's notice as ``python imds.py`` prints it (the nodes whose service cannot be read left out)."""
    env = {var.name: var.value for var in ctx.spec.env}
    commands = {n.name: poll_command(ctx.inv, n.name, env) for n in ctx.inv.nodes}
    answers = ctx.runner.run_each(commands, timeout=10)
    return {name: res.stdout for name, res in answers.items() if res.ok}


def collect(ctx: RunContext, noticed_at: float | None, since: float) -> list[str]:
    """Every node of the ended attempt read, the rest of the window waited (and the nodes read again) if any is
    left: the nodes with a spot interruption notice of this run (``since``: the run's start)."""
    answers = _read(ctx)
    wait = window_left(first_notice(noticed_at, answers), time.time())
    if wait > 0:
        time.sleep(wait)
        answers = _read(ctx)
    return interrupted(answers, since)
