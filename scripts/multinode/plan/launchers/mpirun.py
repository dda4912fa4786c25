"""One ``mpirun`` on the head node; Open MPI starts the other ranks over SSH.

The job is written as one MPMD app context per node (``-np P --host IP:P --wdir DIR``), so each
node runs the code from its own node-local directory: nothing assumes a shared filesystem. A
hostfile listing the nodes is also written on the head for anyone re-running by hand.

Open MPI's TCP traffic (both the out-of-band channel and the byte transfer layer) is pinned to
the cluster subnet by CIDR, which Open MPI accepts directly: no interface name is hard-coded.

Every rank starts with torch's env:// contract, as under torchrun, so ``init_process_group()`` and
accelerate's ``PartialState`` work unchanged: ``MASTER_ADDR`` (the head's cluster address), ``MASTER_PORT``
(the run's rendezvous port, checked free on the head at pre-flight), ``GROUP_RANK`` (the node's index),
literal per app context; ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE`` copied from the
``OMPI_COMM_WORLD_*`` variables Open MPI defines on every MPI process (docs.open-mpi.org, "Environment
variables set for MPI applications"; the integration test checks all four under Debian 12's 4.1.4)
by a one-line ``sh -c`` (:data:`RANK_ENV`) that then execs the program -- mpirun's ``-x`` carries fixed
values only. The contract is written once (:func:`env_contract` over a :class:`RankPlace`, where a rank learns
its place from its launcher): a batch script gives each rank the same one from srun's task variables
(:mod:`multinode.backends.slurm.script`). DeepSpeed maps the same variables the same way (deepspeedai/DeepSpeed@edaa722,
``deepspeed/comm/comm.py`` ``patch_aws_sm_env_for_torch_nccl_backend``: ``RANK=OMPI_COMM_WORLD_RANK``,
``LOCAL_RANK=OMPI_COMM_WORLD_LOCAL_RANK``, ``WORLD_SIZE=OMPI_COMM_WORLD_SIZE``; its ``mpi_discovery`` sets
``MASTER_ADDR`` to rank 0's address and ``MASTER_PORT`` to a fixed port, 29500 by default). MPI stays the
truth: our trainer still asks mpi4py (``training/dist_env.py``).

Lines: ``--tag-output`` tags every chunk a rank's pipe gives, not every line (measured with Open MPI 4.1.4:
``[1,0]<stderr>:    [1,0]<stderr>:outer()[1,0]<stderr>:``), so :func:`relabel_by_rank` re-assembles each
rank's stream into whole lines (:class:`multinode.ssh.lines.TaggedLines`) before it is shown or logged.

GRACE: every rank starts with ``MULTINODE_GRACE`` (SIGTERM is a notice), a user script behind the notice guard.
"When orterun receives a SIGTERM and SIGINT, it will attempt to kill the entire job by sending all processes in the
job a SIGTERM, waiting a small number of seconds, then sending all processes in the job a SIGKILL"
(mpirun.openmpi(1), "Signal Propagation", Open MPI 4.1.4); the small number is the MCA parameter
``odls_base_sigkill_timeout`` ("Time to wait for a process to die after issuing a kill signal to it", default 1:
``ompi_info --param odls all --level 9``). A user script gets GRACE there: when its first rank exits 75 the job is
aborted, and the others may still be saving. Its cost: ORTE 4.1's kill of the local procs sends SIGCONT, sleeps
that long, sends SIGTERM, sleeps again, then SIGKILL, whether or not they already exited
(orte/mca/odls/base/odls_base_default_fns.c, ``orte_odls_base_default_kill_local_procs``): by that source up to
4 x GRACE after the ranks (no run here has recorded it). Our trainer does not need it: a rank exits 75 only after the whole coordinated checkpoint
(written, replicated, its places gathered by every rank), so it keeps Open MPI's 1 s.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from multinode.core.config import LaunchSpec
from multinode.core.inventory import Inventory, Node
from multinode.core.nodepaths import env_file, run_dir
from multinode.ssh.lines import TaggedLines
from multinode.plan.launchers.base import (
    BASE_ENV,
    EntryPoint,
    LaunchPlan,
    NodeCommand,
    entry_dir,
    bucket_env,
    data_env,
    grace_env,
    guard_argv,
    guard_script,
    iface_for_subnet,
    node_python,
    nproc_of,
    project_env,
    trainer_args,
)
from multinode.plan.launchers.words import Sh, assignments, fixed

# Environment forwarded to every rank (mpirun does not forward the environment by itself).
FORWARDED = ("MULTINODE_RUN_ID", "OMP_NUM_THREADS", "PYTHONUNBUFFERED", "GLOO_SOCKET_IFNAME")

# mpirun's own reports of the first failed rank:
#   "  Process name: [[12345,1],1]"  (non-zero exit, under "The first process to do so was:")
#   "mpirun noticed that process rank 1 with PID 4242 on node 10.0.0.11 exited on signal 9 (Killed)."
MPIRUN_FAILED_RANK = (
    re.compile(r"Process name: \[\[\d+,\d+\],(\d+)\]"),
    re.compile(r"process rank (\d+) with PID \d+ on node \S+ exited"),
)


# --tag-output: "Tag each line of output to stdout, stderr, and stddiag with [jobid, MCW_rank]<stdxxx>"
# (mpirun.openmpi(1), Debian 12's Open MPI 4.1.4). What 4.1.4 does (tests/unit/fixtures/mpirun): the tag
# "[jobid,rank]<stdout>:" starts every chunk read from the rank's pipe and every line inside one, with no
# space and no newline added -- so a chunk ending mid-line is continued after a tag, often after other
# ranks' lines. orte_iof_base_write_output (orte/mca/iof/base/iof_base_output.c) writes the tags.
TAG = re.compile(r"\[\d+,(\d+)\]<(std(?:out|err|diag))>:")

# The env:// variables each rank derives from Open MPI's own (OMPI_COMM_WORLD_SIZE, _RANK, _LOCAL_RANK,
# _LOCAL_SIZE: "defined on every MPI process", docs.open-mpi.org "Environment variables set for MPI applications"),
# and gloo pinned to the interface holding the cluster subnet ($1), found on the rank's node where it has
# `ip` (the images in docker/ have none: there the rank gets it from mpirun's -x, at MPI_Init).
# $0 is the project directory to put first on PYTHONPATH, or "-" for none; the program follows $1.
@dataclass(frozen=True)
class RankPlace:
    """A rank's place in the job as its MPI launcher gives it: shell text read in the rank's environment
    (:class:`~multinode.plan.launchers.words.Sh`), or a literal where the launcher names no variable."""

    rank: str
    local_rank: str
    world_size: str
    local_world_size: str

    def env(self) -> dict[str, str]:
        return {"RANK": self.rank, "LOCAL_RANK": self.local_rank, "WORLD_SIZE": self.world_size,
                "LOCAL_WORLD_SIZE": self.local_world_size}


# Open MPI's own variables, "defined on every MPI process" that mpirun starts (the module doc).
OPEN_MPI = RankPlace(Sh("$OMPI_COMM_WORLD_RANK"), Sh("$OMPI_COMM_WORLD_LOCAL_RANK"), Sh("$OMPI_COMM_WORLD_SIZE"),
                     Sh("$OMPI_COMM_WORLD_LOCAL_SIZE"))


# Ranks that srun starts (--mpi=pmix): Open MPI 4.1.4's MPI_Init waits in its data exchange (a PMIx fence with data)
# before its PML registers its handlers, making progress on the TCP BTL meanwhile -- a peer's first message landing then
# goes to a NULL handler (a rank's SIGSEGV at start-up: docs/verification.md). With the modex asynchronous and no data
# collected a rank skips that fence ("we don't want to do the modex, so fall thru", ompi/runtime/ompi_mpi_init.c), asks
# a peer's endpoint when it needs it, and makes no progress before its handlers are in place; the final barrier stays.
# async_modex is Open MPI's own start-up option (its v4.x large-clusters FAQ, docs.open-mpi.org "Reducing startup
# time"); 4.1.4 skips the fence only with collect_data off as well (on, it runs in the background). `ompi_info --level 9`
# lists both parameters.
DIRECT_MODEX = {"OMPI_MCA_pmix_base_async_modex": "1", "OMPI_MCA_pmix_base_collect_data": "0"}


def tcp_env(subnet: str) -> dict[str, str]:
    """Open MPI's transports for ranks it does not start with mpirun's ``--mca`` (srun's): ob1 over shared memory and
    TCP, TCP and the out-of-band channel on the cluster's subnet."""
    return {"OMPI_MCA_btl": "self,vader,tcp", "OMPI_MCA_pml": "ob1", "OMPI_MCA_btl_tcp_if_include": subnet,
            "OMPI_MCA_oob_tcp_if_include": subnet}


def env_contract(place: RankPlace, group_rank: str, master_addr: str, master_port: int) -> dict[str, str]:
    """torch's env:// variables for one MPI rank: its place, its node's index, the rendezvous address."""
    return {**place.env(), "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port), "GROUP_RANK": group_rank}


RANK_ENV = (f"export {assignments(OPEN_MPI.env())}; "
            'if command -v ip >/dev/null; then '
            'export GLOO_SOCKET_IFNAME="$(ip -o -4 addr show to "$1" | awk "NR==1{print \\$2}")"; fi; shift; '
            '[ "$0" = - ] || export PYTHONPATH="$0${PYTHONPATH:+:$PYTHONPATH}"; exec "$@"')


def relabel_by_rank(rank_nodes: Sequence[str]) -> TaggedLines:
    """Lines of every rank arrive through the head's mpirun, tagged by global rank: each rank's whole lines,
    shown under the rank's own node as ``[rankN]: <line>`` (torchrun's prefix)."""

    def label(match: re.Match, text: str) -> tuple[str, str] | None:
        rank = int(match[1])
        return (rank_nodes[rank], f"[rank{rank}]: {text}") if rank < len(rank_nodes) else None

    return TaggedLines(TAG, label)


def mpi_ssh_args(inventory: Inventory) -> str:
    """How mpirun on the head SSHes to the other nodes: the cluster key and pinned host keys only."""
    port = inventory.extra.get("mpi_ssh_port", inventory.head.ssh_port)
    opts = [
        f"-p {port}",
        f"-i {inventory.extra.get('mpi_ssh_key', inventory.ssh_key)}",
        f"-o UserKnownHostsFile={inventory.extra.get('mpi_known_hosts', inventory.known_hosts)}",
        "-o StrictHostKeyChecking=yes",
        "-o BatchMode=yes",
        "-o ConnectTimeout=10",
    ]
    return " ".join(opts)


def mpirun_options(inv: Inventory, spec: LaunchSpec, ours: bool = True) -> list[str]:
    """mpirun's own options, before the app contexts: the hostfile, transports pinned to the cluster subnet,
    SSH to the other nodes, abort on the first failed rank, tagged output, the forwarded environment (``ours``:
    the job is our trainer, see the module doc for GRACE)."""
    hostfile = f"{inv.workdir_for(inv.head.name)}/runs/{spec.run_id}/hostfile"
    argv: list[str] = [
        "mpirun",
        "--hostfile", hostfile,
        # Several simulated nodes share cores; pinning would put every node's rank on core 0.
        "--bind-to", "none",
        "--mca", "pml", "ob1",
        "--mca", "btl", "self,vader,tcp",
        "--mca", "btl_tcp_if_include", inv.subnet,
        "--mca", "oob_tcp_if_include", inv.subnet,
        "--mca", "plm_rsh_args", mpi_ssh_args(inv),
        # The daemons Open MPI starts over SSH on the other nodes carry the run id too (their sshd gives them a
        # fresh environment): the gang-stop and the leak checks find them like the ranks, instead of waiting for
        # each orted to notice that mpirun is gone.
        "--mca", "orte_launch_agent", f"env MULTINODE_RUN_ID={spec.run_id} orted",
        # Fail the whole job as soon as one rank exits non-zero.
        "--mca", "orte_abort_on_non_zero_status", "1",
        "--tag-output",
    ]
    if spec.grace is not None and not ours:  # a user script's ranks get GRACE before SIGKILL (the module doc)
        argv += ["--mca", "odls_base_sigkill_timeout", str(math.ceil(spec.grace))]
    for name in FORWARDED:
        argv += ["-x", name]
    return argv


def app_context(inv: Inventory, spec: LaunchSpec, entry: EntryPoint, node: Node, group_rank: int) -> list[str]:
    """One node's MPMD app context: its ranks, in its own node-local directory, with its own PYTHONPATH and
    the env:// contract (see the module doc)."""
    count = nproc_of(spec, node)
    # A project's directory differs per node (local nodes share a disk): PYTHONPATH per app context, put
    # before the node's own (a site's module setup) by the rank's shell; `env` alone would replace it.
    project = project_env(inv, node.name, entry).get("PYTHONPATH", "-")
    return [
        "-np", str(count),
        "--host", f"{node.private_ip}:{count}",
        "--wdir", entry_dir(inv, node.name, entry),
        # ENV: the head sources the values from its env file; mpirun carries them by name. In every app
        # context: a -x before the first one reaches only that context's ranks (measured here: the
        # other nodes' ranks see none of FORWARDED either).
        *(arg for var in spec.env for arg in ("-x", var.name)),
        # -x sets variables only once MPI starts inside the rank (measured: a remote rank's Python starts without
        # OMP_NUM_THREADS, PYTHONUNBUFFERED or GLOO_SOCKET_IFNAME, and a script that never calls MPI never gets
        # them): the run id goes into the environment the rank starts with, where the gang-stop and the stack
        # capture find ranks by it (/proc/<pid>/environ); so do BASE_ENV and the env:// variables, which torch and
        # accelerate read before any MPI call.
        "env", f"MULTINODE_RUN_ID={spec.run_id}",
        *(f"{k}={v}" for k, v in {**BASE_ENV, **grace_env(spec), **bucket_env(spec),
                                  **data_env(inv, node.name, spec)}.items()),
        # The env:// contract: the values known here as words, the ones Open MPI gives read by RANK_ENV's shell.
        *(f"{k}={v}" for k, v in fixed(env_contract(OPEN_MPI, str(group_rank), inv.head.private_ip,
                                                     spec.rdzv_port)).items()),
        "sh", "-c", RANK_ENV, project, inv.subnet,
        *guard_argv(inv, spec, entry, guard_script(inv, node.name)),
        node_python(inv, spec, node.name), *entry.program(),
        *trainer_args(entry, run_dir(inv, node.name, spec.run_id), spec),
    ]


def as_user(user: str) -> dict[str, str]:
    """What mpirun needs to run as ``user``: without these Open MPI refuses to run as root -- and still exits 0."""
    return {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"} if user == "root" else {}


def head_command(inv: Inventory, spec: LaunchSpec, entry: EntryPoint, argv: list[str],
                 counts: tuple[int, ...]) -> NodeCommand:
    """The one command, on the head: mpirun with the hostfile it reads, as root when the head logs in as root."""
    head = inv.head
    hostfile = f"{inv.workdir_for(head.name)}/runs/{spec.run_id}/hostfile"
    env = {**BASE_ENV, **as_user(head.ssh_user)}
    content = "".join(f"{n.private_ip} slots={c}\n" for n, c in zip(inv.nodes, counts))
    return NodeCommand(
        node=head.name,
        argv=tuple(argv),
        cwd=entry_dir(inv, head.name, entry),
        env=env,
        node_env={"GLOO_SOCKET_IFNAME": iface_for_subnet(inv.subnet)},
        files={hostfile: content},
        env_file=env_file(inv, head.name, spec.run_id) if spec.env else None,
        secret_env=tuple(var.name for var in spec.env),
        nproc=counts[0],
    )


class MpirunLauncher:
    name = "mpirun"

    def plan(self, inventory: Inventory, spec: LaunchSpec, entry: EntryPoint) -> LaunchPlan:
        inv = inventory.first(spec.nodes)
        argv = mpirun_options(inv, spec, entry.ours)
        for i, node in enumerate(inv.nodes):
            if i:
                argv.append(":")
            argv += app_context(inv, spec, entry, node, i)
        counts = tuple(nproc_of(spec, node) for node in inv.nodes)
        return LaunchPlan(
            run_id=spec.run_id,
            launcher=self.name,
            commands=(head_command(inv, spec, entry, argv, counts),),
            participants=tuple(n.name for n in inv.nodes),
            world_size=sum(counts),
            procs=counts,
        )

    def relabel(self, plan: LaunchPlan):
        """mpirun's lines arrive on the head, tagged by global rank: show each under its rank's node."""
        return relabel_by_rank([node for node, count in zip(plan.participants, plan.procs) for _ in range(count)])

    def failed_rank(self, log_lines: Sequence[str]) -> int | None:
        for line in log_lines:
            for pattern in MPIRUN_FAILED_RANK:
                match = pattern.search(line)
                if match:
                    return int(match[1])
        return None
