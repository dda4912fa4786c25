"""An embedded SLURM cluster on the local provider's nodes (``make up SCHEDULER=slurm``).

The real daemons from Debian's packages (slurmctld/slurmd 22.05, munge 0.5), on the same
network-namespace nodes the local provider makes:

* **munge**: one key per cluster (``provider/slurm/munge.key``, 0400) and one ``munged`` in node-0's
  namespace. Its socket is a file, and nodes share this machine's filesystem, so every node's
  daemons and clients reach it (``AuthInfo=socket=...``). munged insists that every directory above
  its socket be world-searchable, which a pytest temporary directory is not, so the socket lives in
  ``/run/mn-slurm-<cluster>/``.
* **slurmctld** in node-0's namespace and **slurmd** in every node's, each under ``unshare --uts``
  with the node's hostname, which is its ``NodeName``; state, pid and log files under
  ``provider/slurm/``, spool directories (slurmd makes unix sockets there, whose paths may not
  exceed 108 bytes) under ``/run/mn-slurm-<cluster>/spool/``.
* **slurm.conf** comes from :func:`slurm_conf` (pure), from the nodes' names, addresses and CPUs.
  It is also copied to ``/etc/netns/<ns>/slurm/``: ``ip netns exec`` bind-mounts that directory over
  ``/etc/slurm`` for everything started in the node, sshd's sessions included, so ``sbatch``,
  ``srun``, ``sinfo`` typed over SSH find the cluster without ``SLURM_CONF``. That is why
  :func:`prepare` runs before the nodes' sshd start, and :func:`start` after.

Teardown: every daemon runs inside a node's namespace and carries the cluster's state path on its
command line, so the local provider's namespace sweep stops it and its leftover check sees it;
:func:`remove` deletes the socket directory, and :func:`leftovers` reports it if it is still there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from multinode.core.state import ClusterState
from multinode.providers.local.cgroups import cgroup_mount_commands
from multinode.providers.local.netns import NETNS_ETC, NetPlan

PLUGIN_DIR = Path("/usr/lib/x86_64-linux-gnu/slurm-wlm")
DAEMONS = {"munged": "/usr/sbin/munged", "slurmctld": "/usr/sbin/slurmctld", "slurmd": "/usr/sbin/slurmd"}
READY_TIMEOUT = 90.0
PARTITION = "batch"
RUN_ROOT = Path("/run")


@dataclass(frozen=True)
class SlurmLayout:
    """Where one embedded SLURM cluster keeps its files (pure)."""

    cluster: str
    state_dir: Path  # provider/slurm

    @property
    def conf(self) -> Path:
        return self.state_dir / "slurm.conf"

    @property
    def munge_key(self) -> Path:
        return self.state_dir / "munge" / "munge.key"

    @property
    def run_dir(self) -> Path:
        return RUN_ROOT / f"mn-slurm-{self.cluster}"

    @property
    def munge_socket(self) -> Path:
        return self.run_dir / "munge.sock"

    def node_conf(self, host: str) -> Path:
        """slurm.conf as node ``host``'s slurmd reads it (its own mpi.conf beside it)."""
        return self.state_dir / "etc" / host / "slurm.conf"

    @property
    def spool_dir(self) -> Path:
        return self.run_dir / "spool"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "log"

    @classmethod
    def of(cls, state: ClusterState) -> "SlurmLayout":
        return cls(state.name, state.provider_dir / "slurm")


def slurm_conf(cluster: str, hostnames: list[str], ips: list[str], cpus: int, layout: SlurmLayout,
               mpi_default: str = "none") -> str:
    """The cluster's slurm.conf: controller on the first node, one NodeName per node, one partition.

    Choices that work inside network namespaces without systemd or cgroup delegation:
    ``proctrack/linuxproc`` (process tree via /proc) and ``task/none``; ``select/cons_tres`` with
    ``CR_CPU`` so several one-task-per-node jobs can share the nodes' CPUs; no accounting daemon
    (exit codes come from ``scontrol show job``, kept ``MinJobAge`` seconds after a job ends).
    """
    if not hostnames or len(hostnames) != len(ips):
        raise ValueError("slurm_conf needs one address per hostname")
    if cpus < 1:
        raise ValueError(f"cpus={cpus} must be at least 1")
    d = layout.state_dir
    lines = [
        f"# slurm.conf of the embedded multinode cluster {cluster!r} (generated; `make down` removes it)",
        f"ClusterName={cluster}",
        f"SlurmctldHost={hostnames[0]}({ips[0]})",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={layout.munge_socket}",
        "SlurmctldPort=6817",
        "SlurmdPort=6818",
        f"StateSaveLocation={d}/ctld",
        # slurmd makes unix sockets in its spool directory (108-byte limit): a short path under /run.
        f"SlurmdSpoolDir={layout.spool_dir}/%n",
        f"SlurmctldPidFile={d}/slurmctld.pid",
        f"SlurmdPidFile={d}/slurmd-%n.pid",
        f"SlurmctldLogFile={layout.log_dir}/slurmctld.log",
        f"SlurmdLogFile={layout.log_dir}/slurmd-%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SchedulerType=sched/backfill",
        f"MpiDefault={mpi_default}",
        "ReturnToService=2",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/none",
        "MinJobAge=600",
        # SLURM's default (slurm.conf(5)), and >= the GRACE a job's checkpoint may take, as a site must set it
        # (multinode.backends.slurm.grace). At 5 s a loaded host lost a preempted task's last line: scancel's SIGTERM,
        # the ranks' save, the guard, torchrun's shutdown and its traceback, then the task's "exited with code 75
        # (preempted)" -- srun stops forwarding output KillWait + 2 s after the cancel ("srun: Job step aborted:
        # Waiting up to 7 seconds for job step to finish.", in every such job's output) and SIGKILL follows.
        "KillWait=30",
        "SlurmctldTimeout=30",
        "SlurmdTimeout=30",
        "InactiveLimit=0",
        "PlugStackConfig=/dev/null",
    ]
    lines += [f"NodeName={h} NodeAddr={ip} CPUs={cpus} State=UNKNOWN" for h, ip in zip(hostnames, ips)]
    lines.append(f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


# slurmd 22.05 initialises its cgroup plugin even with proctrack/linuxproc and task/none; v1 is what
# the hybrid hierarchy of this kind of host offers, and with those plugins it creates no cgroup.
CGROUP_CONF = "# embedded multinode cluster (generated)\nCgroupPlugin=cgroup/v1\n"


def missing_daemons() -> list[str]:
    return [path for path in DAEMONS.values() if not os.access(path, os.X_OK)]


def mpi_default() -> str:
    """pmix when this SLURM build has the plugin (Debian's has mpi_pmix_v4), else none."""
    return "pmix" if (PLUGIN_DIR / "mpi_pmix.so").exists() else "none"


def prepare(state: ClusterState, plan: NetPlan) -> SlurmLayout:
    """Key, directories and slurm.conf (also into each node's /etc/netns/<ns>/slurm/); before sshd starts."""
    layout = SlurmLayout.of(state)
    for sub in ("ctld", "log", "munge"):
        (layout.state_dir / sub).mkdir(parents=True, exist_ok=True)
    (layout.state_dir / "munge").chmod(0o700)
    if not layout.munge_key.exists():
        layout.munge_key.write_bytes(os.urandom(1024))
        layout.munge_key.chmod(0o400)
    layout.run_dir.mkdir(mode=0o755, exist_ok=True)
    layout.run_dir.chmod(0o755)
    text = slurm_conf(state.name, [plan.hostname(i) for i in range(plan.nodes)],
                      [plan.ip(i) for i in range(plan.nodes)], os.cpu_count() or 1, layout, mpi_default())
    layout.conf.write_text(text)
    (layout.state_dir / "cgroup.conf").write_text(CGROUP_CONF)
    for i in range(plan.nodes):
        host = plan.hostname(i)
        (layout.spool_dir / host / "pmix").mkdir(parents=True, exist_ok=True)
        # Nodes share /tmp here, where PMIx puts per-step directories named alike on every node: each
        # node's slurmd reads its own mpi.conf, next to its own copy of slurm.conf.
        files = {"slurm.conf": text, "cgroup.conf": CGROUP_CONF,
                 "mpi.conf": f"PMIxCliTmpDirBase={layout.spool_dir}/{host}/pmix\n"}
        for etc in (layout.node_conf(host).parent, NETNS_ETC / plan.netns(i) / "slurm"):
            etc.mkdir(parents=True, exist_ok=True)
            for name, content in files.items():
                (etc / name).write_text(content)
    return layout


def _in_node(plan: NetPlan, i: int, argv: list[str], cgroups: bool = False) -> list[str]:
    """Run argv in node i's network namespace with its own hostname (UTS namespace); ``cgroups``:
    mount the host's cgroup filesystems again (``ip netns exec`` hides them under a fresh /sys)."""
    steps = cgroup_mount_commands(Path("/proc/self/mounts").read_text()) if cgroups else []
    inner = " && ".join([*steps, f"hostname {plan.hostname(i)}", f"exec {' '.join(argv)}"])
    return ["ip", "netns", "exec", plan.netns(i), "unshare", "--uts", "sh", "-c", inner]


def _spawn(argv: list[str], log: Path) -> None:
    with open(log, "ab") as out:
        subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _node_states(plan: NetPlan, layout: SlurmLayout) -> dict[str, str]:
    res = subprocess.run(["ip", "netns", "exec", plan.netns(0), "sinfo", "-h", "-N", "-o", "%N %T"],
                         capture_output=True, text=True, env={**os.environ, "SLURM_CONF": str(layout.conf)})
    states = {}
    for line in res.stdout.splitlines():
        name, _, st = line.partition(" ")
        states[name] = st.strip()
    return states


def _tail(path: Path, n: int = 3) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-n:])
    except OSError:
        return "no log"


def start(state: ClusterState, plan: NetPlan, layout: SlurmLayout) -> dict:
    """munged, slurmctld on node-0, slurmd on every node; wait until every node is idle.

    Returns the inventory's scheduler fields. Raises RuntimeError naming the daemon and its log."""
    log = layout.log_dir
    _spawn(["ip", "netns", "exec", plan.netns(0), DAEMONS["munged"], "-F", f"--key-file={layout.munge_key}",
            f"--socket={layout.munge_socket}", f"--origin={plan.ip(0)}", f"--pid-file={layout.run_dir}/munged.pid",
            f"--log-file={log}/munged.log", f"--seed-file={layout.state_dir}/munge/munged.seed"], log / "munged.out")
    end = time.monotonic() + 15
    while not layout.munge_socket.exists() and time.monotonic() < end:
        time.sleep(0.05)
    if not layout.munge_socket.exists():
        raise RuntimeError(f"munged of cluster {state.name!r} did not start: {_tail(log / 'munged.log')}")
    conf = str(layout.conf)
    _spawn(_in_node(plan, 0, [DAEMONS["slurmctld"], "-D", "-f", conf]), log / "slurmctld.out")
    for i in range(plan.nodes):
        node_conf = str(layout.node_conf(plan.hostname(i)))
        _spawn(_in_node(plan, i, [DAEMONS["slurmd"], "-D", "-N", plan.hostname(i), "-f", node_conf], cgroups=True),
               log / f"slurmd-{plan.hostname(i)}.out")
    end = time.monotonic() + READY_TIMEOUT
    want = {plan.hostname(i) for i in range(plan.nodes)}
    states: dict[str, str] = {}
    while time.monotonic() < end:
        states = _node_states(plan, layout)
        if want <= {n for n, st in states.items() if st == "idle"}:
            return {"scheduler": "slurm", "slurm_partition": PARTITION, "slurm_conf": conf,
                    "slurm_mpi": mpi_default()}
        time.sleep(0.5)
    pending = sorted(n for n in want if states.get(n) != "idle")
    raise RuntimeError(f"SLURM nodes not idle after {READY_TIMEOUT:.0f} s: "
                       + ", ".join(f"{n} {states.get(n, 'unknown')}" for n in pending)
                       + f"; slurmctld log: {_tail(log / 'slurmctld.log')}")


def remove(cluster: str) -> None:
    """After the namespaces' processes are gone: the socket directory in /run."""
    shutil.rmtree(SlurmLayout(cluster, Path()).run_dir, ignore_errors=True)


def leftovers(cluster: str) -> list[str]:
    run_dir = SlurmLayout(cluster, Path()).run_dir
    return [f"dir {run_dir}"] if run_dir.exists() else []
