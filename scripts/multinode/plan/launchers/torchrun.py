"""torchrun on every node at once, with c10d rendezvous on the head's private IP.

Each node runs the same command but for ``--local-addr`` and ``is_host``: the head hosts the
rendezvous store (set explicitly, so nothing depends on the node's hostname resolving), every
node advertises its cluster address, and gloo/NCCL are pinned to the interface that carries the
cluster subnet. ``--rdzv-id`` is the run id, so two runs never join each other.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from multinode.core.config import LaunchSpec
from multinode.core.inventory import Inventory, Node
from multinode.core.nodepaths import run_dir
from multinode.plan.launchers.base import EntryPoint, LaunchPlan, node_python, nproc_of, per_node_plan, trainer_args

# Seconds a store operation -- connecting to the rendezvous endpoint included -- may take. torch's
# default is 60, the same as the join timeout, so a node that cannot reach the endpoint was outlived by
# its peers' join timeout and the job named the wrong node after a minute; with 10 it fails in ~15 s.
RDZV_READ_TIMEOUT = 10

# torchrun's error summary: "  rank      : 1 (local_rank: 0)" under "Root Cause (first observed failure)".
ROOT_CAUSE_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank")


def root_cause_rank(log_lines: Sequence[str]) -> int | None:
    """The global rank torchrun's error summary names as the first failure, if the lines hold one."""
    for line in log_lines:
        match = ROOT_CAUSE_RANK.match(line)
        if match:
            return int(match[1])
    return None


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
                *entry.program(),  # torchrun's -m runs a module as python -m does
                *trainer_args(entry, directory, spec),
            )
            # Every worker line starts with its global rank: "[node-1] [rank1]: ...".
            env = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[rank${rank}]: "}
            if spec.max_restarts:
                # Restarted workers otherwise reconnect to stale store addresses (pytorch#135712).
                env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
            return argv, env

        return per_node_plan(self.name, inv, spec, node_command, entry)

    def relabel(self, plan: LaunchPlan):
        return None  # every node streams its own ranks' lines

    def failed_rank(self, log_lines: Sequence[str]) -> int | None:
        return root_cause_rank(log_lines)
