"""The SLURM path's planner: (inventory, launch spec, entry point) -> the sbatch script. Pure.

The script is self-contained: ``make train DRY_RUN=1`` prints it, and ``sbatch job.sbatch`` on the
login node runs the same job a user would get from ``make train``. Inside the allocation:

* MODE=cpu/gpu: one task per node (``srun --ntasks-per-node=1``) runs torchrun with its c10d
  endpoint on the allocation's first host (``scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1``,
  ``is_host`` set on that host only, ``--rdzv-id=$SLURM_JOB_ID``): every node agrees on one master,
  and ranks come from the rendezvous, not from ``--node-rank``.
* MODE=mpi/mpi-gpu: ``srun --mpi=<plugin>`` starts every rank itself (PMIx/PMI2: the trainer sees an
  MPI launch, MPI is the gradient data plane) when the cluster's srun has such a plugin; otherwise
  ``mpirun`` inside the allocation (Open MPI reads the allocation from SLURM).

What runs is the launchers' plan, materialised (torchx's ``SlurmBatchRequest.materialize`` is the model): the
torchrun agent's flags and environment (:func:`multinode.plan.launchers.torchrun.agent_argv`, ``agent_env``), an MPI
rank's env:// contract (:func:`multinode.plan.launchers.mpirun.env_contract`, from srun's ``SLURM_PROCID``,
``SLURM_LOCALID``, ``SLURM_NODEID`` or Open MPI's ``OMPI_COMM_WORLD_*``), the notice guard and the exit-75 rule
(:mod:`multinode.plan.launchers.base`). This module gives them what only the task knows, as shell text
(:class:`~multinode.plan.launchers.words.Sh`), and lays out the script around them; GRACE's place in the task is
:mod:`.grace`.

Every task prefixes its lines ``[node-i]`` (ranks add ``[rankN]``), prints
``multinode: node-i exited with code C`` when it fails, and ``--kill-on-bad-exit=1`` makes SLURM end
the other tasks. All output lands in one file on the shared (here: common) filesystem,
``<head workdir>/runs/<run id>/slurm-<job id>.out``, which the executor streams.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from multinode.core.config import LaunchSpec
from multinode.core.inventory import Inventory
from multinode.core.nodepaths import env_file, run_dir
from multinode.plan.launchers.base import (BASE_ENV, PREEMPT_MARK_ENV, EntryPoint, bucket_env, collective_env, data_env,
                                           entry_dir, grace_env, guard_argv, iface_for_subnet, node_python,
                                           trainer_args)
from multinode.plan.launchers.mpirun import DIRECT_MODEX, OPEN_MPI, RankPlace, as_user, env_contract, tcp_env
from multinode.plan.launchers.torchrun import Agent, agent_argv, agent_env
from multinode.plan.launchers.words import Sh, assignments, fixed, shell_join
from multinode.backends.slurm import grace

# What only the task knows, given to the launchers as shell values: the allocation's first host (and whether the
# task runs on it), the job id, the task's run directory and synced guard (set per node by the task), the
# trainer's arguments (the task's "$@", set from the trainer's arguments with RUNDIR standing for "$rundir").
HEAD = Sh("$MULTINODE_HEAD")
ON_HEAD = Sh('$([ "$SLURMD_NODENAME" = "$MULTINODE_HEAD" ] && echo 1 || echo 0)')
JOB_ID = Sh("$SLURM_JOB_ID")
RUN_DIR = Sh("$rundir")
GUARD = Sh("$guard")
PROGRAM_ARGS = (Sh("$@"),)
RUNDIR = "@RUNDIR@"
# srun --mpi=list names these when MPI ranks can be started by srun itself (best first).
SRUN_MPI_PLUGINS = ("pmix", "pmix_v4", "pmix_v3", "pmi2")
TERMINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                   "DEADLINE", "PREEMPTED"}


def sinfo_command() -> str:
    """The node table `make status` shows (any SLURM login node)."""
    return "sinfo -N -o '%N %P %T %c'"


def pick_mpi_plugin(srun_mpi_list: str) -> str | None:
    """The first PMI plugin ``srun --mpi=list`` offers that MPI ranks can use, or None (then: mpirun)."""
    offered = {line.strip().split()[-1] for line in srun_mpi_list.splitlines()
               if line.strip() and not line.strip().endswith(":") and "are..." not in line}
    for plugin in SRUN_MPI_PLUGINS:
        if plugin in offered:
            return plugin
    return None


@dataclass(frozen=True)
class SlurmJob:
    """What the executor submits and where it reads the job's output."""

    run_id: str
    script: str
    script_path: str  # on the login node
    job_dir: str  # the job's directory on the login node (holds the script and the output)
    nodes: int
    world_size: int
    node_names: dict[str, str]  # SLURM NodeName (hostname) -> our node name
    launch: str = ""  # how the ranks start, in words: "srun + torchrun", "srun --mpi=pmix", "mpirun"

    def output_path(self, job_id: str) -> str:
        return f"{self.job_dir}/slurm-{job_id}.out"


def _task_body(inv: Inventory, spec: LaunchSpec, entry: EntryPoint, launch: _Launch) -> str:
    """What each task runs: go to its node's code, pin the collectives to the cluster network, run, prefix, report.

    Nodes without a shared filesystem (the local provider) each have their own code and run directory,
    chosen by ``$SLURMD_NODENAME``; on a shared filesystem every node runs the one synced copy and
    writes under ``runs/<run id>/node-<SLURM_NODEID>``."""
    args = shlex.join(trainer_args(entry, RUNDIR, spec)).replace(RUNDIR, '"$rundir"')
    if inv.extra.get("shared_fs"):
        where = [
            "node=node-$SLURM_NODEID",
            f"rundir={shlex.quote(inv.workdir_for(inv.head.name) + '/runs/' + spec.run_id)}/$node",
            f"cd {shlex.quote(entry_dir(inv, inv.head.name, entry))}{_node_setup(inv, spec, inv.head.name)}"
            f"{grace.guard_path(inv, spec, inv.head.name)}",
        ]
    else:
        cases = [f"  {node.hostname}) node={node.name}; rundir={shlex.quote(run_dir(inv, node.name, spec.run_id))}; "
                 f"cd {shlex.quote(entry_dir(inv, node.name, entry))}{_node_setup(inv, spec, node.name)}"
                 f"{grace.guard_path(inv, spec, node.name)} ;;"
                 for node in inv.nodes]
        where = [
            'case "$SLURMD_NODENAME" in',
            *cases,
            '  *) echo "multinode: $SLURMD_NODENAME is not a node of cluster ' + inv.cluster + '" >&2; exit 2 ;;',
            "esac",
        ]
    # A user's project (WORKDIR) is the ranks' cwd and on their PYTHONPATH, as under the other launchers.
    project = ['export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"'] if entry.subdir else []
    first, before, after = grace.task_lines(spec, launch.mark)
    body = [
        *first,
        *where,
        *project,
        'mkdir -p "$rundir"',
        f"set -- {args}",
        *(f'export {name}="{expr}"' for name, expr in launch.network.items()),
        *before,
        f"{launch.line} 2>&1 | sed -u \"s/^/[$node] /\"",
        "rc=${PIPESTATUS[0]}",
        *after,
        f'[ "$rc" = 0 ] || echo "[$node] multinode: $node exited with code $rc{launch.who}"',
        'exit "$rc"',
    ]
    return "\n".join(body)


def _node_setup(inv: Inventory, spec: LaunchSpec, node: str) -> str:
    """A node's own part of the environment: the interpreter of its SETUP environment, its ENV file (sourced: the
    values never appear in the script), where DATA lies on it (MULTINODE_DATA_DIR, as the other launchers set)."""
    parts = [f"py={shlex.quote(node_python(inv, spec, node))}"] if spec.setup else []
    parts += [f". {shlex.quote(env_file(inv, node, spec.run_id))}"] if spec.env else []
    parts += [f"export {assignments(data_env(inv, node, spec))}"] if spec.data else []
    return "".join(f"; {part}" for part in parts)


def _python(inv: Inventory, spec: LaunchSpec) -> str:
    """The ranks' interpreter: with SETUP, each node's own environment (``$py``, set per node in the task)."""
    return Sh("$py") if spec.setup else inv.interpreter


@dataclass(frozen=True)
class _Launch:
    """How the allocation starts the job: the line each task runs, the srun/mpirun that starts the tasks."""

    line: str  # what each task runs (its arguments are "$@")
    tasks: str  # the command that starts the tasks, before ``bash -c "$MULTINODE_TASK"``
    per_task: str  # the script's header: what one task is
    env_lines: tuple[str, ...]  # exported in the batch script, before the tasks start
    network: dict[str, str]  # the task's interface pinning: name -> shell expression evaluated on its node
    mark: str | None = None  # where the launcher's guards note a preemption (torchrun with GRACE), in the task
    who: str = ""  # appended to a failed task's "exited with code" line
    launch: str = "srun + torchrun"  # in words, for the run's first line


def srun_place(world: int, nproc: int) -> RankPlace:
    """A rank's place as srun gives it: its task's global and node-local ids (``SLURM_PROCID``, ``SLURM_LOCALID``:
    srun(1), "OUTPUT ENVIRONMENT VARIABLES"); the sizes are the job's shape, one count per node (SLURM asks one
    ``--ntasks-per-node``)."""
    return RankPlace(Sh("$SLURM_PROCID"), Sh("$SLURM_LOCALID"), str(world), str(nproc))


def _mpi_launch(inv: Inventory, spec: LaunchSpec, entry: EntryPoint, mpi_plugin: str | None) -> _Launch:
    """MODE=mpi/mpi-gpu: ``srun --mpi=<plugin>`` starts every rank, or (no plugin) mpirun in the allocation. Each
    rank gets the launchers' env:// contract: from srun's task variables, or from Open MPI's as over SSH; with
    mpirun the node's index is the rank's block (``--map-by ppr:N:node``: Open MPI names no node index)."""
    world = spec.nodes * int(spec.nproc)
    if mpi_plugin:
        launcher = f"srun --mpi={mpi_plugin}"
        steps = f"--nodes={spec.nodes} --ntasks={world} --ntasks-per-node={spec.nproc}"
        place, group = srun_place(world, int(spec.nproc)), Sh("$SLURM_NODEID")
    else:
        launcher = "mpirun"
        steps = f"-np {world} --map-by ppr:{spec.nproc}:node --bind-to none"
        place, group = OPEN_MPI, Sh(f"$(($OMPI_COMM_WORLD_RANK / {spec.nproc}))")
    # Each task is one rank and prefixes its own lines: the launcher gives it its rank before Python starts.
    program = (f"{assignments(env_contract(place, group, HEAD, spec.rdzv_port))} "
               + shell_join((*guard_argv(inv, spec, entry, GUARD), _python(inv, spec), "-u", *entry.program(),
                             *PROGRAM_ARGS)))
    # srun's ranks: no data fence before their handlers are set (DIRECT_MODEX); mpirun, as the SSH path's: allowed to
    # run as root when the job's user is root (the login node's).
    launcher_env = DIRECT_MODEX if mpi_plugin else as_user(inv.head.ssh_user)
    # The line prefix: srun's task id; a rank of mpirun inherits the batch step's SLURM_PROCID (0), so Open MPI's.
    label = "${SLURM_PROCID:-$OMPI_COMM_WORLD_RANK}" if mpi_plugin else "$OMPI_COMM_WORLD_RANK"
    launch_line = f'{grace.catching(spec, program)} 2>&1 | sed -u "s/^/[rank{label}] /"'

    return _Launch(
        line=launch_line,
        tasks=f"{launcher} {steps} --kill-on-bad-exit=1" if mpi_plugin else f"{launcher} {steps}",
        per_task="one task per rank" if mpi_plugin else "mpirun in the allocation",
        env_lines=(f"export {assignments(tcp_env(inv.subnet))}",
                   *(f"export {assignments({k: v})}" for k, v in launcher_env.items())),
        network={"GLOO_SOCKET_IFNAME": iface_for_subnet(inv.subnet)},  # as the SSH path's ranks (RANK_ENV)
        who=" (rank $SLURM_PROCID)" if mpi_plugin else "",
        launch=launcher,
    )


def _torchrun_launch(inv: Inventory, spec: LaunchSpec, entry: EntryPoint) -> _Launch:
    """MODE=cpu/gpu: one task per node runs the torchrun launcher's agent, its c10d endpoint on the allocation's
    first host, the job id as rendezvous id, the task's own directories."""
    agent = Agent(python=_python(inv, spec), nproc=int(spec.nproc), host=HEAD, rdzv_id=JOB_ID, is_host=ON_HEAD,
                  run_directory=RUN_DIR, guard_script=GUARD)
    env = agent_env(spec, agent)
    return _Launch(
        line=grace.catching(spec, shell_join(agent_argv(inv, spec, entry, agent, PROGRAM_ARGS))),
        # --mpi=none: no PMI for torchrun's agents (a cluster's MpiDefault=pmix would give them PMIX_RANK, and the
        # agent would pass for a rank in the stall watchdog and the stack capture).
        tasks=f"srun --nodes={spec.nodes} --ntasks={spec.nodes} --ntasks-per-node=1 --kill-on-bad-exit=1 --mpi=none",
        per_task="one task per node running torchrun",
        # The agent's environment: literal values for every task, the note's path (in the task's run directory)
        # exported by the task itself.
        env_lines=tuple(f"export {assignments({k: v})}" for k, v in fixed(env).items()),
        network=collective_env(inv, spec)[1],  # gloo, and NCCL in MODE=gpu, on the cluster's interface
        mark=env.get(PREEMPT_MARK_ENV),
    )


def _sbatch_script(spec: LaunchSpec, head_dir: str, partition: str | None, launch: _Launch, body: str) -> str:
    """The batch script: #SBATCH header, the job's environment, the head's name, then the tasks running ``body``."""
    gpus = [f"#SBATCH --gpus-per-node={spec.nproc}"] if spec.uses_gpu else []
    part = [f"#SBATCH --partition={partition}"] if partition else []
    lines = [
        "#!/bin/bash",
        f"# multinode run {spec.run_id}: MODE={spec.mode}, {spec.nodes} node(s) x {spec.nproc} process(es), "
        f"{launch.per_task}",
        f"# Submit by hand on the login node: sbatch {head_dir}/job.sbatch",
        f"#SBATCH --job-name=multinode-{spec.run_id}",
        f"#SBATCH --nodes={spec.nodes}",
        f"#SBATCH --ntasks-per-node={spec.nproc if spec.uses_mpi else 1}",
        *part,
        *gpus,
        *grace.signal_header(spec),
        f"#SBATCH --output={head_dir}/slurm-%j.out",
        "set -uo pipefail",
        f"mkdir -p {shlex.quote(head_dir)}",
        # GRACE: SIGTERM (scancel, preemption, --signal) is a notice to the ranks; SLURM sends SIGKILL after the
        # site's KillWait or GraceTime (slurm.conf), which a job cannot lengthen (multinode.backends.slurm.grace).
        *[f"export {k}={shlex.quote(v)}" for k, v in {**BASE_ENV, **grace_env(spec), **bucket_env(spec)}.items()],
        f"export MULTINODE_RUN_ID={shlex.quote(spec.run_id)}",
        *launch.env_lines,
        'MULTINODE_HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "export MULTINODE_HEAD",
        'echo "multinode: batch job $SLURM_JOB_ID on $SLURM_JOB_NODELIST, head $MULTINODE_HEAD"',
        "read -r -d '' MULTINODE_TASK <<'TASK'",
        body,
        "TASK",
        f'{launch.tasks} bash -c "$MULTINODE_TASK"',
    ]
    return "\n".join(lines) + "\n"


def plan_sbatch(inventory: Inventory, spec: LaunchSpec, entry: EntryPoint, mpi_plugin: str | None = None,
                partition: str | None = None) -> SlurmJob:
    """The sbatch script for ``spec`` on the first ``spec.nodes`` nodes of ``inventory`` (on a shared
    filesystem, the inventory holds the login node only and the scheduler picks ``spec.nodes`` nodes)."""
    inv = inventory if inventory.extra.get("shared_fs") else inventory.first(spec.nodes)
    head_dir = f"{inv.workdir_for(inv.head.name)}/runs/{spec.run_id}"
    launch = _mpi_launch(inv, spec, entry, mpi_plugin) if spec.uses_mpi else _torchrun_launch(inv, spec, entry)
    body = _task_body(inv, spec, entry, launch)
    return SlurmJob(run_id=spec.run_id, script=_sbatch_script(spec, head_dir, partition, launch, body),
                    script_path=f"{head_dir}/job.sbatch", job_dir=head_dir, nodes=spec.nodes,
                    world_size=spec.nodes * spec.nproc, node_names={n.hostname: n.name for n in inv.nodes},
                    launch=launch.launch)


def held_reason(scontrol_line: str) -> str | None:
    """Why a pending job will never start by itself (held, e.g. after a failed launch), else None."""
    fields = dict(item.split("=", 1) for item in scontrol_line.split() if "=" in item)
    reason = fields.get("Reason", "")
    if fields.get("JobState") == "PENDING" and ("held" in reason.lower() or "launch_failed" in reason.lower()):
        return reason
    return None


def job_state(scontrol_line: str) -> tuple[str | None, int | None]:
    """(JobState, exit code) from ``scontrol show job -o <id>``; the exit code of a signal is 128+sig."""
    fields = dict(item.split("=", 1) for item in scontrol_line.split() if "=" in item)
    state = fields.get("JobState")
    code = None
    if "ExitCode" in fields and ":" in fields["ExitCode"]:
        status, sig = (int(x) for x in fields["ExitCode"].split(":", 1))
        code = 128 + sig if sig else status
    return state, code
