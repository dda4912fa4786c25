"""Static launch, no torchrun agents: the orchestrator starts every rank itself (``LAUNCHER=static``).

For fixed-size jobs (no ``ELASTIC``, no ``MAX_RESTARTS``) the torchrun agent on every node buys
nothing but its cost: each agent imports torch before it even starts its workers (1-4 s per node on
a small machine, in series with the worker's own import), and polls for the workers' exit. Here each
node runs a small POSIX-sh starter instead, which gives every local process the env:// contract
torchrun would give it -- ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``,
``GROUP_RANK``, ``MASTER_ADDR`` (the head's cluster IP), ``MASTER_PORT`` (the rendezvous port) -- so
``init_process_group()`` rendezvouses on a TCPStore hosted by rank 0 on the head.

What torchrun gave and the starter keeps: every line prefixed ``[rankN]: `` (stdout and stderr
merged per rank, whole lines), the node's exit code is the first failed rank's, and a failure is
reported in torchrun's own "rank : N (local_rank: L)" form so the orchestrator names the rank.
Gang-stop, run-id tagging and logs are the runner's, unchanged. What it does not do: restarts,
elastic membership, or a rendezvous timeout of its own (``init_process_group``'s timeout applies).

With GRACE the starter outlives a SIGTERM (:func:`starter`): the orchestrator's stop sends SIGTERM to every
process of the run, and the starter and each rank's ``sed`` must go on, so that the ranks' last lines (the
checkpoint, ``PREEMPTED {...}``) still arrive and the node's exit code is the ranks' (75), not a signal's.
A user script runs behind ``training.guard`` then (:func:`multinode.plan.launchers.base.guard_argv`).
"""

from __future__ import annotations

from collections.abc import Sequence

from multinode.core.config import LaunchSpec
from multinode.core.inventory import Inventory, Node
from multinode.core.nodepaths import run_dir
from multinode.plan.launchers.base import (
    CATCH_TERM,
    IGNORE_TERM,
    EntryPoint,
    LaunchPlan,
    guard_argv,
    guard_script,
    node_python,
    nproc_of,
    per_node_plan,
    trainer_args,
)
from multinode.plan.launchers.torchrun import root_cause_rank
from multinode.trainer import channel

# $1 = this node's first global rank, $2 = processes on this node, $3 = directory for per-rank exit files;
# the rest is the program. Exit files of an earlier run of the same run id go first (a resumed or recovered
# run may place other ranks on this node: their old files would read as this run's failures). Each rank: its own
# RANK/LOCAL_RANK, output through sed for the prefix, exit code and, for a failure, its time into a file (a
# pipeline's status is sed's in POSIX sh). Then every rank's file is read, in rank order, and the earliest failure
# is reported the way torchrun does, and is the node's exit code. A rank without a file had its subshell killed
# before it could write one (SIGKILL: a vanishing machine's processes die in no set order, and a starter that
# outlived its subshells read "no file" as exit 1 -- a failure of the job's own, which restarted every process
# instead of the survivors going on): 137, killed, timed as read (a failure seen earlier stays the root cause).
# A rank that exited 75 (preempted: training/preempt.py) is no failure: without one, the node exits 75 and
# reports no root cause. One line (statements joined with spaces), so the plan prints as one shell line.
STARTER = " ".join(part.strip() for part in [
    'base=$1; nproc=$2; status_dir=$3; shift 3; mkdir -p "$status_dir"; rm -f "$status_dir"/rank*; i=0;',
    'while [ "$i" -lt "$nproc" ]; do',
    '  rank=$((base + i));',
    '  { RANK=$rank LOCAL_RANK=$i "$@" 2>&1; c=$?; t=0; [ "$c" = 0 ] || t=$(date +%s%N); echo "$c $t" > "$status_dir/rank$rank"; }',
    '    | sed -u "s/^/[rank$rank]: /" &',
    '  i=$((i + 1));',
    'done; wait; first=; first_t=; code=0; preempted=; i=0;',
    'while [ "$i" -lt "$nproc" ]; do',
    '  rank=$((base + i)); i=$((i + 1)); f="$status_dir/rank$rank";',
    '  if [ -s "$f" ] && read -r c t < "$f"; then :; else c=137; t=$(date +%s%N); fi;',
    '  if [ "$c" = 75 ]; then preempted=75; continue; fi;',
    '  if [ "$c" != 0 ] && { [ -z "$first_t" ] || [ "$t" -lt "$first_t" ]; }; then first=$rank; first_t=$t; code=$c; fi;',
    'done;',
    'if [ -n "$first" ]; then',
    '  echo "Root Cause (first observed failure):" >&2;',
    '  echo "  rank      : $first (local_rank: $((first - base)))" >&2;',
    '  echo "  exitcode  : $code" >&2;',
    'fi; if [ -z "$first" ] && [ -n "$preempted" ]; then code=75; fi; exit "$code"',
])
# GRACE: the starter and every sed ignore SIGTERM (ignored dispositions are inherited, so the pipeline's sed does
# too); each rank's subshell catches it instead (a caught signal is reset to the default in the programs it
# starts), so the rank itself gets SIGTERM's default or installs its own handler (training/preempt.py), and the
# subshell, which waits for the rank in the foreground, still writes its exit code. SIGKILL ends them all.
def starter(grace: bool) -> str:
    """The node's starter: :data:`STARTER`, or with GRACE the one that outlives a SIGTERM."""
    if not grace:
        return STARTER
    return f"{IGNORE_TERM}; " + STARTER.replace("{ RANK=$rank", f"{{ {CATCH_TERM}; RANK=$rank", 1)


def membership_env(spec: LaunchSpec, counts: list[int], directory: str) -> dict[str, str]:
    """RECOVER with the same number of ranks on every node: where the run writes the job's membership
    (training/membership.py: the survivors of a lost or noticed node go on in their processes). Not under MPI (an
    MPI rank's loss ends every rank), nor with uneven nodes (a membership gives every node ``nproc`` ranks)."""
    if not spec.recover or spec.recover_restart or spec.uses_mpi or len(set(counts)) > 1:
        return {}
    return {channel.MEMBERSHIP_ENV: f"{directory}/{channel.MEMBERSHIP_FILE}"}


class StaticLauncher:
    name = "static"

    def plan(self, inventory: Inventory, spec: LaunchSpec, entry: EntryPoint) -> LaunchPlan:
        inv = inventory.first(spec.nodes)
        counts = [nproc_of(spec, node) for node in inv.nodes]

        def node_command(node_rank: int, node: Node) -> tuple[tuple[str, ...], dict[str, str]]:
            directory = run_dir(inv, node.name, spec.run_id)
            argv = (
                "sh", "-c", starter(spec.grace is not None), "multinode-static", str(sum(counts[:node_rank])),
                str(counts[node_rank]), f"{directory}/ranks",
                *guard_argv(inv, spec, entry, guard_script(inv, node.name)),
                node_python(inv, spec, node.name), *entry.program(),
                *trainer_args(entry, directory, spec),
            )
            return argv, {
                "WORLD_SIZE": str(sum(counts)),
                "LOCAL_WORLD_SIZE": str(counts[node_rank]),
                "GROUP_RANK": str(node_rank),
                "MASTER_ADDR": inv.head.private_ip,
                "MASTER_PORT": str(spec.rdzv_port),
                **membership_env(spec, counts, directory),
            }

        return per_node_plan(self.name, inv, spec, node_command, entry)

    def relabel(self, plan: LaunchPlan):
        return None  # every node streams its own ranks' lines

    def failed_rank(self, log_lines: Sequence[str]) -> int | None:
        return root_cause_rank(log_lines)  # the starter reports failures in torchrun's form
