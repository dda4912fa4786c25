"""torchrun on every node at once, with c10d rendezvous on the head's private IP.

Each node runs the same command but for ``--local-addr`` and ``is_host``: the head hosts the
rendezvous store (set explicitly, so nothing depends on the node's hostname resolving), every
node advertises its cluster address, and gloo/NCCL are pinned to the interface that carries the
cluster subnet. ``--rdzv-id`` is the run id, so two runs never join each other.

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
  that runs torchrun in the foreground, outlives a SIGTERM to itself, and exits 75 when the note is there.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from multinode.core.config import LaunchSpec
from multinode.core.inventory import Inventory, Node
from multinode.core.nodepaths import run_dir
from multinode.plan.launchers.base import (
    EXIT_PREEMPTED,
    PREEMPT_MARK_ENV,
    EntryPoint,
    LaunchPlan,
    guard_argv,
    node_python,
    nproc_of,
    per_node_plan,
    preempt_mark,
    trainer_args,
)

# Seconds a store operation -- connecting to the rendezvous endpoint included -- may take. torch's
# default is 60, the same as the join timeout, so a node that cannot reach the endpoint was outlived by
# its peers' join timeout and the job named the wrong node after a minute; with 10 it fails in ~15 s.
RDZV_READ_TIMEOUT = 10

# torchrun's error summary: "  rank      : 1 (local_rank: 0)" under "Root Cause (first observed failure)".
ROOT_CAUSE_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank")


# GRACE: torchrun in the foreground of a shell that catches SIGTERM (a caught signal is the default again in
# torchrun, which installs its own handler), and exits 75 when a guard noted a preemption ($0: the note's path).
PREEMPTED_EXIT = (f'trap : TERM; "$@"; c=$?; if [ "$c" != 0 ] && [ -e "$0" ]; then c={EXIT_PREEMPTED}; fi; '
                  'exit "$c"')


def root_cause_rank(log_lines: Sequence[str]) -> int | None:
    """The global rank torchrun's error summary names as the first failure, if the lines hold one."""
    for line in log_lines:
        match = ROOT_CAUSE_RANK.match(line)
        if match:
            return int(match[1])
    return None


def grace_options(guard: tuple[str, ...], python: str) -> tuple[str, ...]:
    """With GRACE: every worker behind the guard (``--no-python``: the worker's command is the guard's, which
    starts ``python -u`` itself)."""
    return ("--no-python", *guard, python, "-u") if guard else ()


class TorchrunLauncher:
    name = "torchrun"

    def plan(self, inventory: Inventory, spec: LaunchSpec, entry: EntryPoint) -> LaunchPlan:
        inv = inventory.first(spec.nodes)
        head = inv.head
        nnodes = spec.elastic or str(spec.nodes)
        read_timeout = min(spec.rdzv_timeout, RDZV_READ_TIMEOUT)

        def node_command(node_rank: int, node: Node) -> tuple[tuple[str, ...], dict[str, str]]:
            is_host = node.name == head.name
            rdzv_conf = f"join_timeout={spec.rdzv_timeout},read_timeout={read_timeout},is_host={int(is_host)}"
            directory = run_dir(inv, node.name, spec.run_id)
            guard = guard_argv(inv, spec, entry, node.name, every=True)
            argv = (
                node_python(inv, spec, node.name), "-m", "torch.distributed.run",
                f"--nnodes={nnodes}",
                f"--nproc-per-node={nproc_of(spec, node)}",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint={head.private_ip}:{spec.rdzv_port}",
                f"--rdzv-id={spec.run_id}",
                f"--rdzv-conf={rdzv_conf}",
                f"--max-restarts={spec.max_restarts}",
                f"--local-addr={node.private_ip}",
                "--monitor-interval=0.5",
                # Tee worker output through the agent so each line carries its rank prefix;
                # per-rank copies stay in the node's run directory.
                "--tee=3",
                f"--log-dir={directory}/torchrun",
                *grace_options(guard, node_python(inv, spec, node.name)),
                *entry.program(),  # torchrun's -m runs a module as python -m does
                *trainer_args(entry, directory, spec),
            )
            # Every worker line starts with its global rank: "[node-1] [rank1]: ...".
            env = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[rank${rank}]: "}
            if spec.max_restarts:
                # Restarted workers otherwise reconnect to stale store addresses (pytorch#135712).
                env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
            if guard:
                # The agent's SIGTERM-to-SIGKILL wait for its workers: whole seconds, at least GRACE.
                env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = str(math.ceil(spec.grace))
                env[PREEMPT_MARK_ENV] = preempt_mark(inv, node.name, spec.run_id)
                argv = ("sh", "-c", PREEMPTED_EXIT, env[PREEMPT_MARK_ENV], *argv)
            return argv, env

        return per_node_plan(self.name, inv, spec, node_command, entry)

    def relabel(self, plan: LaunchPlan):
        return None  # every node streams its own ranks' lines

    def failed_rank(self, log_lines: Sequence[str]) -> int | None:
        return root_cause_rank(log_lines)
