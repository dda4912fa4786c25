"""The SLURM path's pure parts: slurm.conf of the embedded cluster, the sbatch script, what srun
offers for MPI, scontrol's job line. No daemons, no sockets."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from multinode.core.config import LaunchSpec
from multinode.core.errors import UserError
from multinode.plan.launchers import EntryPoint
from multinode.providers.local.slurm import SlurmLayout, slurm_conf
from multinode.backends.slurm.script import held_reason, job_state, pick_mpi_plugin, plan_sbatch

ENTRY = EntryPoint("training/train.py", ("--workload", "digits", "10", "5"))
LAYOUT = SlurmLayout("dev", Path("/st/dev/provider/slurm"))


def conf_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith("#")]


def test_slurm_conf_names_every_node_by_its_hostname_with_the_nodes_cpus():
    text = slurm_conf("dev", ["dev-node-0", "dev-node-1"], ["10.1.1.10", "10.1.1.11"], 4, LAYOUT, "pmix")
    lines = conf_lines(text)
    assert "SlurmctldHost=dev-node-0(10.1.1.10)" in lines and "ClusterName=dev" in lines
    assert "NodeName=dev-node-0 NodeAddr=10.1.1.10 CPUs=4 State=UNKNOWN" in lines
    assert "NodeName=dev-node-1 NodeAddr=10.1.1.11 CPUs=4 State=UNKNOWN" in lines
    assert "PartitionName=batch Nodes=ALL Default=YES MaxTime=INFINITE State=UP" in lines
    # what works inside network namespaces without systemd: no cgroup plugins
    assert {"ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SelectType=select/cons_tres",
            "MpiDefault=pmix", "AuthType=auth/munge"} <= set(lines)
    assert "AuthInfo=socket=/run/mn-slurm-dev/munge.sock" in lines
    # every file of the cluster lives under its state directory (so `down` removes it)
    paths = [line.split("=", 1)[1] for line in lines
             if line.split("=", 1)[0].endswith(("Location", "SpoolDir", "PidFile", "LogFile"))]
    assert len(paths) == 6, paths
    assert all(p.startswith("/st/dev/provider/slurm/") for p in paths if "spool" not in p), paths
    assert "SlurmdSpoolDir=/run/mn-slurm-dev/spool/%n" in lines  # unix sockets: 108-byte paths at most


@pytest.mark.parametrize("hosts, ips, cpus", [([], [], 2), (["a"], ["1.1.1.1", "1.1.1.2"], 2), (["a"], ["1.1.1.1"], 0)])
def test_slurm_conf_refuses_inconsistent_input(hosts, ips, cpus):
    with pytest.raises(ValueError):
        slurm_conf("dev", hosts, ips, cpus, LAYOUT)


def test_cpu_script_runs_one_torchrun_per_node_with_c10d_on_the_first_host(inventory):
    spec = LaunchSpec(mode="cpu", nodes=3, nproc=2, run_id="r1")
    job = plan_sbatch(inventory, spec, ENTRY, partition="batch")
    s = job.script
    assert s.startswith("#!/bin/bash\n") and "#SBATCH --nodes=3" in s and "#SBATCH --ntasks-per-node=1" in s
    assert "#SBATCH --partition=batch" in s
    assert f"#SBATCH --output={job.job_dir}/slurm-%j.out" in s and job.job_dir == "/state/dev/nodes/node-0/runs/r1"
    assert 'MULTINODE_HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)' in s
    assert "srun --nodes=3 --ntasks=3 --ntasks-per-node=1 --kill-on-bad-exit=1" in s
    assert '--rdzv-backend=c10d --rdzv-endpoint="$MULTINODE_HEAD:29500" --rdzv-id="$SLURM_JOB_ID"' in s
    assert 'is_host=$([ "$SLURMD_NODENAME" = "$MULTINODE_HEAD" ]' in s and "--node-rank" not in s
    assert "--nnodes=3 --nproc-per-node=2" in s and "export MULTINODE_RUN_ID=r1" in s
    for i in range(3):  # each node's own code directory (nodes share no filesystem)
        assert f"dev-node-{i}) node=node-{i}; rundir=/state/dev/nodes/node-{i}/runs/r1; cd /state/dev/nodes/node-{i}/code ;;" in s
    assert 'set -- --snapshot-dir "$rundir"/snapshots --metrics-dir "$rundir" --timeout 30 --workload digits 10 5' in s
    assert job.world_size == 6 and job.node_names == {f"dev-node-{i}": f"node-{i}" for i in range(3)}


def test_gpu_script_pins_nccl_to_the_cluster_interface_as_over_ssh(inventory):
    """MODE=gpu: every task pins gloo and NCCL to the interface holding the cluster subnet (the launchers'
    collective_env); MODE=mpi-gpu pins gloo, as the SSH path's mpirun ranks do."""
    iface = "$(ip -o -4 addr show to 10.200.7.0/24 | awk 'NR==1{print $2}')"
    gpu = plan_sbatch(inventory, LaunchSpec(mode="gpu", nodes=2, nproc=1, run_id="r1"), ENTRY).script
    assert f'export GLOO_SOCKET_IFNAME="{iface}"\nexport NCCL_SOCKET_IFNAME="={iface}"\n' in gpu
    mpi = plan_sbatch(inventory, LaunchSpec(mode="mpi-gpu", nodes=2, nproc=1, run_id="r1"), ENTRY, "pmix").script
    assert f'export GLOO_SOCKET_IFNAME="{iface}"\n' in mpi and "NCCL_SOCKET_IFNAME" not in mpi


def test_mpi_script_uses_srun_pmi_when_offered_else_mpirun(inventory):
    spec = LaunchSpec(mode="mpi", nodes=3, nproc=2, run_id="r1")
    srun = plan_sbatch(inventory, spec, ENTRY, "pmix").script
    assert "srun --mpi=pmix --nodes=3 --ntasks=6 --ntasks-per-node=2 --kill-on-bad-exit=1" in srun
    assert "#SBATCH --ntasks-per-node=2" in srun and "torch.distributed.run" not in srun
    assert "OMPI_MCA_btl_tcp_if_include=10.200.7.0/24" in srun and "(rank $SLURM_PROCID)" in srun
    mpirun = plan_sbatch(inventory, spec, ENTRY, None).script
    assert "mpirun -np 6 --map-by ppr:2:node --bind-to none" in mpirun and "srun --mpi" not in mpirun
    # mpirun's ranks are labelled by Open MPI's rank (each also inherits the batch step's SLURM_PROCID=0), and mpirun
    # runs as the job's user root as over SSH; srun's tasks need neither
    assert 'sed -u "s/^/[rank$OMPI_COMM_WORLD_RANK] /"' in mpirun and "SLURM_PROCID" not in mpirun
    assert "export OMPI_ALLOW_RUN_AS_ROOT=1\nexport OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1\n" in mpirun
    assert "OMPI_ALLOW_RUN_AS_ROOT" not in srun
    # srun's ranks skip MPI_Init's data fence (the start-up SIGSEGV's window: multinode.plan.launchers.mpirun)
    assert "export OMPI_MCA_pmix_base_async_modex=1\nexport OMPI_MCA_pmix_base_collect_data=0\n" in srun
    assert "pmix_base" not in mpirun


def test_every_mpi_rank_gets_the_mpirun_launchers_env_contract_from_its_own_launcher(inventory):
    """The launchers' one contract (multinode.plan.launchers.mpirun.env_contract): each value read from what the
    rank's launcher gives it, not computed from the global rank (that assumed srun's block distribution)."""
    spec = LaunchSpec(mode="mpi", nodes=3, nproc=2, run_id="r1")
    srun = plan_sbatch(inventory, spec, ENTRY, "pmix").script
    assert ('RANK="$SLURM_PROCID" LOCAL_RANK="$SLURM_LOCALID" WORLD_SIZE=6 LOCAL_WORLD_SIZE=2 '
            'MASTER_ADDR="$MULTINODE_HEAD" MASTER_PORT=29500 GROUP_RANK="$SLURM_NODEID" ') in srun
    mpirun = plan_sbatch(inventory, spec, ENTRY, None).script
    assert ('RANK="$OMPI_COMM_WORLD_RANK" LOCAL_RANK="$OMPI_COMM_WORLD_LOCAL_RANK" WORLD_SIZE="$OMPI_COMM_WORLD_SIZE" '
            'LOCAL_WORLD_SIZE="$OMPI_COMM_WORLD_LOCAL_SIZE" MASTER_ADDR="$MULTINODE_HEAD" MASTER_PORT=29500 '
            'GROUP_RANK="$(($OMPI_COMM_WORLD_RANK / 2))" ') in mpirun
    assert "% 2" not in srun + mpirun


def test_pick_mpi_plugin_reads_srun_mpi_list():
    listing = "MPI plugin types are...\n\tpmix\n\tnone\n\tcray_shasta\n\tpmi2\nspecific pmix plugin versions available: pmix_v4\n"
    assert pick_mpi_plugin(listing) == "pmix"
    assert pick_mpi_plugin("MPI plugin types are...\n\tnone\n\tpmi2\n") == "pmi2"
    assert pick_mpi_plugin("MPI plugin types are...\n\tnone\n") is None and pick_mpi_plugin("") is None


def test_job_state_from_scontrol():
    line = "JobId=7 JobName=multinode-r1 UserId=root(0) JobState=COMPLETED Reason=None ExitCode=0:0 RunTime=00:00:40"
    assert job_state(line) == ("COMPLETED", 0)
    assert job_state("JobId=7 JobState=FAILED Reason=NonZeroExitCode ExitCode=1:0") == ("FAILED", 1)
    assert job_state("JobId=7 JobState=CANCELLED ExitCode=0:15") == ("CANCELLED", 128 + 15)
    assert job_state("JobId=7 JobState=RUNNING ExitCode=0:0")[0] == "RUNNING" and job_state("") == (None, None)
    held = "JobId=1 JobState=PENDING Reason=launch_failed_requeued_held Dependency=(null) ExitCode=0:0"
    assert held_reason(held) == "launch_failed_requeued_held"
    assert held_reason("JobId=1 JobState=PENDING Reason=Resources ExitCode=0:0") is None


def test_no_restarts_on_slurm(inventory, tmp_path, monkeypatch):
    from multinode.app.run import Run
    from multinode.core.state import ClusterState

    inv = inventory.__class__(**{**inventory.__dict__, "extra": {"scheduler": "slurm"}})
    state = ClusterState.for_cluster("dev", root=tmp_path)
    with pytest.raises(UserError, match="MAX_RESTARTS"):
        Run(state, inv, LaunchSpec(mode="cpu", nodes=2, max_restarts=1, run_id="r"), None).execute()


def test_unknown_scheduler_is_one_line_naming_it():
    from multinode.providers.local.provider import _check_scheduler

    with pytest.raises(UserError, match=r"SCHEDULER='pbs' is not a scheduler; use SCHEDULER=slurm"):
        _check_scheduler("pbs")
    _check_scheduler(None)  # no scheduler: the local cluster as it always was


HPC = {"login": "alice@10.9.0.5:2200", "ssh_key": "/home/alice/.ssh/id_ed25519", "known_hosts": "/k",
       "workdir": "/shared/alice/mn", "subnet": "10.9.0.0/16", "python": "/shared/venv/bin/python", "partition": "gpu"}


def test_an_existing_cluster_is_its_login_node_on_a_shared_filesystem():
    from multinode.providers.hosts import inventory_from_options

    inv = inventory_from_options("hpc", HPC, "ssh-ed25519 AAAA")
    (login,) = inv.nodes
    assert (login.name, login.ssh_user, login.private_ip, login.ssh_port) == ("node-0", "alice", "10.9.0.5", 2200)
    assert inv.extra == {"scheduler": "slurm", "shared_fs": True, "slurm_partition": "gpu"}
    job = plan_sbatch(inv, LaunchSpec(mode="cpu", nodes=4, nproc=2, run_id="r1"), ENTRY, partition="gpu")
    s = job.script
    assert "#SBATCH --nodes=4" in s and "srun --nodes=4 --ntasks=4" in s and "case " not in s
    assert "node=node-$SLURM_NODEID\nrundir=/shared/alice/mn/runs/r1/$node\ncd /shared/alice/mn/code\n" in s
    assert job.job_dir == "/shared/alice/mn/runs/r1" and "/shared/venv/bin/python -m torch.distributed.run" in s


@pytest.mark.parametrize("change, fragment", [
    ({"login": "alice"}, "login='alice' must look like user@host"),
    ({"workdir": ""}, "needs -o workdir="),
    ({"subnet": "10.8.0.0/16"}, "outside subnet=10.8.0.0/16"),
    ({"workdir": "mn"}, "must be an absolute path"),
    ({"colour": "blue"}, "unknown option 'colour'"),
])
def test_an_existing_cluster_description_is_checked(change, fragment):
    from multinode.providers.hosts import inventory_from_options

    with pytest.raises(UserError, match=re.escape(fragment)):
        inventory_from_options("hpc", {**HPC, **change}, "ssh-ed25519 AAAA")


def test_a_killed_rank_whose_task_slurm_ended_before_it_said_so_is_the_root_cause():
    """cold run of 2026-12-07: rank 1 (node-1) SIGKILLed; its peers' collective failed at once (exit 76) and node-0's
    task said so first; --kill-on-bad-exit then ended node-1's task before it printed how it ended -- but its torchrun
    agent had reported the rank's -9. The run named node-0. The node that never said is a failure too, and its rank's
    own exit code (not a peer's 76, though its log reads like a reaction: the store went with node-0) names it."""
    import io
    from types import SimpleNamespace

    from conftest import make_inventory

    from multinode.backends.slurm.follow import SlurmEnded
    from multinode.backends.slurm.job import SlurmJobRun
    from multinode.core.events import Events
    from multinode.core.outcome import Ending
    from multinode.diagnose.rank import pick_root_cause

    nodes = ["node-0", "node-1", "node-2"]
    job = SlurmJobRun(SimpleNamespace(inventory=make_inventory(3)), None, "5", nodes, io.StringIO(),
                      Path("/nonexistent"), Events())
    reaction = ["[rank{}]: RuntimeError: [pair.cc:537] Read error: Connection reset by peer", "  exitcode  : 76"]
    job.follower.lines = [*(f"[node-0] {line.format(0)}" for line in reaction),
                          "[node-1] E1207 api.py:1002] failed (exitcode: -9) local_rank: 0 (pid: 10782) of binary",
                          "[node-1] frame #2: c10::DistNetworkError::DistNetworkError(c10::SourceLocation)",
                          *(f"[node-2] {line.format(2)}" for line in reaction)]
    job.ended = SlurmEnded("5", "FAILED", 1, failed_nodes=[("node-0", 1, 0)])
    outcome = job.outcome(Ending())
    assert [f.node for f in outcome.failures] == nodes and outcome.failure.node == "node-0"
    assert outcome.failures[1].message.startswith("a rank of it ended with code -9, then SLURM ended its task")
    assert pick_root_cause(list(outcome.failures), outcome.failure).node == "node-1"
    job.follower.lines = [line for line in job.follower.lines if not line.startswith("[node-1]")]  # it said nothing
    assert pick_root_cause(list(job.outcome(Ending()).failures), outcome.failure).node == "node-0"  # as before
