"""The run's look at the members that went silent while the others paused (:mod:`multinode.app.changes` decides on
what it finds). Each part runs on a thread of its own and answers as an event on the attempt's queue, so the loop
is never held by a node that does not answer:

* :func:`reach` -- with the first ``KEPT`` after a loss: which silent members' SSH port takes no TCP connection
  within :data:`REACH_SECONDS` (``Unreachable``): a cut link or a machine gone -- the kernel of a live machine
  completes a handshake however loaded;
* :func:`look` -- after the survivors' window, at the members still silent: their ranks' stacks and an SSH probe
  (:data:`PROBE_SECONDS`) side by side (``Looked``): a frozen node, one that does not answer, or a survivor still
  blocked in the failed collective (it answers with live ranks).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from multinode.app.watchers import frozen
from multinode.backends.base import RunContext
from multinode.checks.preflight import probe_ssh, reach_tcp
from multinode.core.errors import NodeError
from multinode.core.events import Events, Looked, Unreachable

PROBE_SECONDS = 3.0  # a silent member's SSH probe
# A silent member's TCP connection to its SSH port: its kernel answers at once however loaded the machine (a local
# node at load 14 still completes a handshake in milliseconds; an EC2 peer in one zone, well under one): 1 s of no
# answer is a cut link or a machine gone.
REACH_SECONDS = 1.0


def reach(ctx: RunContext, number: int, silent: tuple[str, ...], events: Events) -> None:
    """Part ``number``: which of ``silent`` no TCP connection reaches, answered on ``events`` (on a thread)."""
    threading.Thread(target=_reaching, args=(ctx, number, silent, events), name=f"mn-reach-{number}",
                     daemon=True).start()


def look(ctx: RunContext, capture, head: str, number: int, silent: tuple[str, ...], events: Events) -> None:
    """Part ``number``: ``silent``'s ranks' stacks (``capture``: the backend's look at the live ranks; None: none)
    and an SSH probe, side by side, answered on ``events`` (on a thread)."""
    threading.Thread(target=_looking_at, args=(ctx, capture, head, number, silent, events), name=f"mn-look-{number}",
                     daemon=True).start()


def _reaching(ctx: RunContext, number: int, silent: tuple[str, ...], events: Events) -> None:
    try:
        cut = reach_tcp(ctx.inv.only(list(silent)), timeout=REACH_SECONDS)
    except Exception:  # noqa: BLE001 -- no answer from this part: the look after the window decides
        cut = {}
    events.put(Unreachable(number, cut))


def _looking_at(ctx: RunContext, capture, head: str, number: int, silent: tuple[str, ...], events: Events) -> None:
    with ThreadPoolExecutor(2, thread_name_prefix="mn-look") as pool:
        stacks = pool.submit(_named, capture, head, list(silent))
        probe = pool.submit(probe_ssh, ctx.inv.only(list(silent)), timeout=PROBE_SECONDS)
        try:
            named = stacks.result()
        except Exception:  # noqa: BLE001 -- no stacks: the SSH probe alone decides
            named = {}
        try:
            answers = probe.result()
        except Exception as err:  # noqa: BLE001 -- the probe itself failed: none of them answered
            answers = {name: (False, f"the probe failed: {err}") for name in silent}
    events.put(Looked(number, silent, named, answers))


def _named(capture, head: str, silent: list[str]) -> dict[str, str]:
    """Why a silent node that has not ended is silent, when the live ranks' stacks say (a rank stopped or stuck in
    the kernel): {node: why}."""
    if capture is None:
        return {}
    found = frozen(capture(NodeError(head, "job", None, "the survivors paused"), ()), head)
    return {found[0]: found[1]} if found is not None and found[0] in silent else {}
