"""torchrun on every node at once, with c10d rendezvous on the head's private IP.

Each node runs the same command but for ``--local-addr`` and ``is_host``: the head hosts the
rendezvous store (set explicitly, so nothing depends on the node's hostname resolving), every
node advertises its cluster address, and gloo/NCCL are pinned to the interface that carries the
cluster subnet. ``--rdzv-id`` is the run id, so two runs never join each other.

One node's command is :func:`agent_argv` and :func:`agent_env` over an :class:`Agent`, the node's own values.
Over SSH they are literal; a SLURM batch script materialises the same command in every task with the values
only the task knows, as shell text (:mod:`multinode.backends.slurm.script`: the allocation's first host as
endpoint, the job id as rendezvous id, ``is_host`` computed in the task, no ``--local-addr``).

GRACE (docs/preemption.md), read in torch 2.13's own source (torch/distributed/run.py,
torch/distributed/elastic/agent/server/api.py):

* a SIGTERM to the agent raises ``SignalException`` in ``SimpleElasticAgent.run``, which calls
  ``_shutdown(e.sigval, timeout=self._shutdown_timeout)``: SIGTERM to the workers, then SIGKILL after
  ``--shutdown-timeout`` seconds (default 30, or ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``: torch/distributed/launcher/
  api.py). We set that variable to GRACE -- a variable, not the flag, so a SETUP environment with an older torch
  ignores it instead of refusing an unknown flag -- and the agent waits as long as our stop does, restarting
  nothing on that path;
* a worker that exits non-zero on its own -- 75, preempted, included -- makes ``_invoke_run`` see
  ``WorkerState.FAILED`` and, while restarts are left, ``_restart_workers``: the agent has no notion of an exit
  code that means "do not restart". So with GRACE every worker runs behind ``training.guard``, which, when its
  command ended preempted, notes it in the node's run directory and sends SIGTERM to its agent (the agent then
  takes the shutdown path above instead of a restart);
* torchrun itself then exits 1 (the ``SignalException`` propagates), so the node's command is a small ``sh``
  that runs torchrun in the foreground, outlives a SIGTERM to itself, and exits 75 when the note is there
  (:data:`PREEMPTED_EXIT`; a batch script's task applies the same rule to its own status,
  :func:`multinode.plan.launchers.base.preempted_status`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from multinode.core.config import LaunchSpec
from multinode.core.inventory import Inventory, Node
from multinode.core.nodepaths import run_dir
from multinode.plan.launchers.base import (
    CATCH_TERM,
    PREEMPT_MARK_ENV,
    EntryPoint,
    LaunchPlan,
    guard_argv,
    guard_script,
    node_python,
    nproc_of,
    per_node_plan,
    preempt_mark,
    preempted_status,
    trainer_args,
)
from multinode.plan.launchers.words import cat

# Seconds a store operation -- connecting to the rendezvous endpoint included -- may take. torch's
# default is 60, the same as the join timeout, so a node that cannot reach the endpoint was outlived by
# its peers' join timeout and the job named the wrong node after a minute; with 10 it fails in ~15 s.
RDZV_READ_TIMEOUT = 10

# torchrun's error summary: "  rank      : 1 (local_rank: 0)" under "Root Cause (first observed failure)".
ROOT_CAUSE_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank")


# GRACE: torchrun in the foreground of a shell that catches SIGTERM (a caught signal is the default again in
# torchrun, which installs its own handler), and exits 75 when a guard noted a preemption ($0: the note's path).
PREEMPTED_EXIT = f'{CATCH_TERM}; "$@"; c=$?; {preempted_status("c", "$0")}; exit "$c"'


def root_cause_rank(log_lines: Sequence[str]) -> int | None:
    """The global rank torchrun's error summary names as the first failure, if the lines hold one."""
    for line in log_lines:
        match = ROOT_CAUSE_RANK.match(line)
        if match:
            return int(match[1])
    return None


@dataclass(frozen=True)
class Agent:
    """One node's torchrun agent: what differs from node to node, and from SSH to a batch script. Over SSH every
    value is literal; a batch script gives shell text (:class:`multinode.plan.launchers.words.Sh`) for what only
    its task knows (the allocation's first host, the job id, the task's directories)."""

    python: str  # the interpreter of the agent and its workers
    nproc: int  # workers on this node
    host: str  # the rendezvous endpoint's host: the head's cluster address
    rdzv_id: str  # the run id (two runs never join each other)
    is_host: str  # "1" on the node that hosts the rendezvous store, else "0"
    run_directory: str  # the node's run directory (torchrun's per-rank logs, the guard's note)
    guard_script: str  # the node's synced guard (used with GRACE)
    local_addr: str | None = None  # the address the agent advertises (None: torch asks the hostname)


def grace_options(guard: tuple[str, ...], python: str) -> tuple[str, ...]:
    """With GRACE: every worker behind the guard (``--no-python``: the worker's command is the guard's, which
    starts ``python -u`` itself)."""
    return ("--no-python", *guard, python, "-u") if guard else ()


def agent_argv(inv: Inventory, spec: LaunchSpec, entry: EntryPoint, agent: Agent,
               program_args: Sequence[str]) -> tuple[str, ...]:
    """torchrun's command line on one node: c10d rendezvous, the agent's options, the workers' program."""
    rdzv_conf = cat(f"join_timeout={spec.rdzv_timeout},read_timeout={min(spec.rdzv_timeout, RDZV_READ_TIMEOUT)},"
                    "is_host=", agent.is_host)
    guard = guard_argv(inv, spec, entry, agent.guard_script, every=True)
    return (
        agent.python, "-m", "torch.distributed.run",
        f"--nnodes={spec.elastic or str(spec.nodes)}",
        f"--nproc-per-node={agent.nproc}",
        "--rdzv-backend=c10d",
        cat("--rdzv-endpoint=", agent.host, f":{spec.rdzv_port}"),
        cat("--rdzv-id=", agent.rdzv_id),
        cat("--rdzv-conf=", rdzv_conf),
        f"--max-restarts={spec.max_restarts}",
        *((f"--local-addr={agent.local_addr}",) if agent.local_addr else ()),
        "--monitor-interval=0.5",
        # Tee worker output through the agent so each line carries its rank prefix;
        # per-rank copies stay in the node's run directory.
        "--tee=3",
        cat("--log-dir=", agent.run_directory, "/torchrun"),
        *grace_options(guard, agent.python),
        *entry.program(),  # torchrun's -m runs a module as python -m does
        *program_args,
    )


def agent_env(spec: LaunchSpec, agent: Agent) -> dict[str, str]:
    """The agent's environment: every worker line starts with its global rank (``[node-1] [rank1]: ...``); with
    GRACE the agent waits as long as our stop does and the guards know where to note a preemption."""
    env = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[rank${rank}]: "}
    if spec.max_restarts:
        # Restarted workers otherwise reconnect to stale store addresses (pytorch#135712).
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    if spec.grace is not None:
        # The agent's SIGTERM-to-SIGKILL wait for its workers: whole seconds, at least GRACE.
        env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = str(math.ceil(spec.grace))
        env[PREEMPT_MARK_ENV] = preempt_mark(agent.run_directory)
    return env


class TorchrunLauncher:
    name = "torchrun"

    def plan(self, inventory: Inventory, spec: LaunchSpec, entry: EntryPoint) -> LaunchPlan:
        inv = inventory.first(spec.nodes)

        def node_command(node_rank: int, node: Node) -> tuple[tuple[str, ...], dict[str, str]]:
            directory = run_dir(inv, node.name, spec.run_id)
            agent = Agent(python=node_python(inv, spec, node.name), nproc=nproc_of(spec, node),
                          host=inv.head.private_ip, rdzv_id=spec.run_id, is_host=str(int(node.name == inv.head.name)),
                          run_directory=directory, guard_script=guard_script(inv, node.name),
                          local_addr=node.private_ip)
            argv = agent_argv(inv, spec, entry, agent, trainer_args(entry, directory, spec))
            env = agent_env(spec, agent)
            if spec.grace is not None:
                argv = ("sh", "-c", PREEMPTED_EXIT, env[PREEMPT_MARK_ENV], *argv)
            return argv, env

        return per_node_plan(self.name, inv, spec, node_command, entry)

    def relabel(self, plan: LaunchPlan):
        return None  # every node streams its own ranks' lines

    def failed_rank(self, log_lines: Sequence[str]) -> int | None:
        return root_cause_rank(log_lines)
