"""Fault injection on a local cluster, for tests and drills: a node's processes, its link, a crash, the loss of a
whole node, and a provider that has no capacity for a replacement.

Root only (the nodes are network namespaces). :func:`multinode.providers.local.sshd.stop_sshd` and
``start_sshd`` make a node unreachable over SSH and back.

* :func:`lose_node`: the node is gone without notice, as a reclaimed instance looks from outside: every process in
  its namespace (sshd, ranks, its metadata endpoint) SIGKILLed, its link and namespace deleted. Its files stay
  until :meth:`LocalProvider.replace <multinode.providers.local.provider.LocalProvider.replace>` or `down`.
* :func:`refuse_replacements` / :func:`allow_replacements`: the file ``<provider dir>/refuse-replacements``
  (empty: refuse every replacement; a number N: refuse the next N) makes ``replace`` raise
  :class:`~multinode.core.errors.CapacityRefused`, as EC2 does when it has no capacity; :func:`take_refusal` is
  what ``replace`` asks before it changes anything.
* ``MULTINODE_REPLACE_DELAY=<seconds>`` in the orchestrator's environment (:func:`replace_delay`): every replacement
  takes that much longer, between removing what is left of the old node and making the new one -- an EC2 instance's
  launch and bootstrap, drilled here. ``replace`` sleeps it; :meth:`LocalProvider.replacement_estimate` says it.
  :func:`set_replace_delay` writes ``<provider dir>/replace-delay``, which ``replace`` reads instead while it exists:
  a delay that changes while a run goes on (``bench.spotday`` replays each event's own), which the provider's
  estimate, read once from the environment, does not know -- as EC2's cannot.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from multinode.core.errors import CapacityRefused, UserError
from multinode.core.setting import Refused
from multinode.core.settings import REPLACE_DELAY
from multinode.core.state import ClusterState
from multinode.providers.local import netns as localnet
from multinode.providers.local.meta import load_meta, net_plan, node_change, node_index

REFUSE_FILE = "refuse-replacements"
DELAY_ENV = REPLACE_DELAY.environ  # MULTINODE_REPLACE_DELAY, declared with the other settings
DELAY_FILE = "replace-delay"


def replace_delay(env=None, state: ClusterState | None = None) -> float:
    """``MULTINODE_REPLACE_DELAY`` (or, given ``state``, its ``replace-delay`` file while it exists): the seconds a
    replacement takes on top of making the node (0 unset); UserError in one line for anything but seconds >= 0."""
    path = delay_path(state) if state is not None else None
    text = path.read_text() if path is not None and path.exists() else (os.environ if env is None else env).get(
        DELAY_ENV, "")
    if not text.strip():
        return REPLACE_DELAY.default
    try:
        delay = REPLACE_DELAY.kind.text(text)
    except Refused:
        delay = -1.0
    if not delay >= 0:
        raise UserError(f"{DELAY_ENV}={text!r} must be 0 or more seconds a replacement takes, e.g. {DELAY_ENV}=120")
    return delay


def delay_path(state: ClusterState) -> Path:
    return state.provider_dir / DELAY_FILE


def set_replace_delay(state: ClusterState, seconds: float | None) -> None:
    """Every replacement from now on takes ``seconds`` (None: back to ``MULTINODE_REPLACE_DELAY``)."""
    path = delay_path(state)
    if seconds is None:
        path.unlink(missing_ok=True)
        return
    if not seconds >= 0:
        raise UserError(f"a replacement delay of {seconds} s: give 0 or more seconds")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{seconds}\n")
    os.replace(tmp, path)


LAUNCH_PREFIX = "launched-"  # <provider dir>/launched-<node>: when its replacement's drilled launch began (Unix s)


def note_launch(state: ClusterState, node: str) -> None:
    """A replacement's drilled launch begins now: its instance is paid from here (an EC2 instance from its launch),
    though the node is made only once the launch -- and, beside a noticed node, that node's stay -- is over. The spot
    day reads it (:func:`launched_at`)."""
    (state.provider_dir / f"{LAUNCH_PREFIX}{node}").write_text(f"{time.time():.3f}\n")


def launched_at(provider_dir: Path, node: str) -> float | None:
    """When ``node``'s last replacement launch began (Unix seconds), taken once: the file is removed; None if none."""
    path = provider_dir / f"{LAUNCH_PREFIX}{node}"
    try:
        text = path.read_text()
        path.unlink()
        return float(text)
    except (OSError, ValueError):
        return None


def node_pids(state: ClusterState, node: str) -> list[int]:
    """Every process of a node (its sshd included)."""
    return localnet.netns_pids(net_plan(state).netns(node_index(node)))


def job_pids(state: ClusterState, node: str) -> list[int]:
    """A node's processes other than sshd: empty whenever no job runs on it."""
    pids = []
    for pid in node_pids(state, node):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() != "sshd":
                pids.append(pid)
        except OSError:
            continue
    return pids


def set_link(state: ClusterState, node: str, up: bool) -> None:
    """Cut (or restore) a node's only link to the cluster."""
    localnet.run("ip", "link", "set", net_plan(state).veth(node_index(node)), "up" if up else "down")


def kill_node(state: ClusterState, node: str) -> int:
    """SIGKILL every process of the node except its sshd, as if the machine's workload crashed."""
    pids = job_pids(state, node)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(pids)


def lose_node(state: ClusterState, node: str) -> int:
    """``node`` vanishes with no notice: every process in it SIGKILLed (sshd included), its veth and namespace
    deleted. Returns how many processes it had. The other nodes and the bridge stay."""
    plan = net_plan(state)
    names = [f"node-{i}" for i in range(plan.nodes)]
    if node not in names:
        raise UserError(f"NODE={node} is not a node of cluster {state.name!r}; its nodes are {', '.join(names)}")
    if not (load_meta(state) or {}).get("isolated", True):
        raise UserError("losing a node needs network namespaces (root); this cluster runs on loopback")
    with node_change(state, node):  # whole before the run can replace it (a vanished machine is gone at once)
        return localnet.destroy_node(plan, node_index(node), warn=False)


def refusal_path(state: ClusterState) -> Path:
    return state.provider_dir / REFUSE_FILE


def refuse_replacements(state: ClusterState, n: int | None = None) -> Path:
    """Refuse the next ``n`` replacements (None: every one until :func:`allow_replacements`); the knob's path."""
    if n is not None and n < 1:
        raise UserError(f"n={n}: refuse at least 1 replacement, or pass None to refuse every one")
    path = refusal_path(state)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("" if n is None else f"{n}\n")
    return path


def allow_replacements(state: ClusterState) -> None:
    """Replacements are made again."""
    refusal_path(state).unlink(missing_ok=True)


def refusals_left(text: str) -> int | None:
    """The knob's content: None = refuse every ask, else how many asks are still refused (pure)."""
    text = text.strip()
    if not text:
        return None
    try:
        return max(0, int(text))
    except ValueError:
        return None  # a file someone wrote by hand still refuses: its presence is the knob


def take_refusal(state: ClusterState, node: str) -> None:
    """Raise :class:`CapacityRefused` if the provider was told to refuse this ask (a count goes down by one and the
    file goes at 0); return quietly otherwise."""
    path = refusal_path(state)
    try:
        left = refusals_left(path.read_text())
    except FileNotFoundError:
        return
    if left == 0:
        path.unlink(missing_ok=True)
        return
    if left is not None:
        if left == 1:
            path.unlink(missing_ok=True)
        else:
            path.write_text(f"{left - 1}\n")
    raise CapacityRefused(f"{node}: no capacity for a replacement (the local provider was told to refuse: {path}); "
                          f"go on with fewer nodes, or delete that file (faults.allow_replacements) and ask again")


__all__ = ["allow_replacements", "job_pids", "kill_node", "launched_at", "lose_node", "node_pids", "note_launch",
           "refuse_replacements", "refusals_left", "set_link", "set_replace_delay", "take_refusal"]
