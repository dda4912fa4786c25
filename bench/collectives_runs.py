"""The collectives section's measurements (:mod:`bench.collectives` runs, judges and reports them): the job
``training/allreduce_perf.py`` on 2 nodes through the orchestrator (*ours*), without it (*raw*: gloo with
env:// variables, or the orchestrator's own mpirun line typed by hand), both ranks in one namespace, iperf3
between the nodes, and the gloo MTU sweep on fresh clusters. Each returns the job's ``ALLREDUCE`` rows.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

from bench.nodes import REPO, LocalCluster, bring_up, median
from multinode.app.netcheck import allreduce_rows as parse_rows  # the one parser of the job's rows
from multinode.core.config import DEFAULT_MTU

JOB = REPO / "training" / "allreduce_perf.py"
MIB64 = 64 << 20
MTUS = (1500, 9001, DEFAULT_MTU)  # Ethernet's default; EC2's jumbo frames inside a VPC; the local default


def _job_args(backend: str, sizes: list[int], budget_mb: float) -> list[str]:
    return [str(JOB), "--backend", backend, "--sizes", ",".join(map(str, sizes)), "--budget-mb", str(budget_mb)]


def ours(cluster: LocalCluster, backend: str, sizes: list[int], budget_mb: float) -> list[dict]:
    job, *args = _job_args(backend, sizes, budget_mb)
    mode = "mpi" if backend == "mpi" else "cpu"
    res = cluster.cli("train", "--nodes", "2", "--mode", mode, "--script", job, f"--args={' '.join(args)}")
    return parse_rows(res.stdout)


def _python_env(extra: dict[str, str]) -> list[str]:
    return ["env", "OMP_NUM_THREADS=1", "PYTHONUNBUFFERED=1", *(f"{k}={v}" for k, v in extra.items())]


def _run_all(argvs: list[list[str]], timeout: float = 900) -> list[str]:
    procs = [subprocess.Popen(a, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for a in argvs]
    outs = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        if proc.returncode != 0:
            for p in procs:
                p.kill()
            raise RuntimeError(f"{' '.join(proc.args)} failed ({proc.returncode}):\n{out[-3000:]}")
        outs.append(out)
    return outs


def raw_gloo(cluster: LocalCluster, sizes: list[int], budget_mb: float, one_namespace: bool = False,
             port: int = 29611) -> list[dict]:
    """gloo with no launcher: one process per rank started in a namespace with env:// variables."""
    argvs = []
    for rank in range(2):
        node = 0 if one_namespace else rank
        env = {"RANK": rank, "WORLD_SIZE": 2, "LOCAL_RANK": 0, "MASTER_PORT": port,
               "MASTER_ADDR": "127.0.0.1" if one_namespace else cluster.ip(0),
               "GLOO_SOCKET_IFNAME": "lo" if one_namespace else "eth0"}
        argvs.append(["ip", "netns", "exec", cluster.netns(node), *_python_env({k: str(v) for k, v in env.items()}),
                      sys.executable, *_job_args("gloo", sizes, budget_mb)])
    return parse_rows(_run_all(argvs)[0])


def raw_mpi(cluster: LocalCluster, sizes: list[int], budget_mb: float) -> list[dict]:
    """The orchestrator's mpirun line, typed by hand over ssh on the head (after writing its hostfile)."""
    job, *args = _job_args("mpi", sizes, budget_mb)
    run_id, shells = cluster.shells("--nodes", "2", "--mode", "mpi", "--script", job, f"--args={' '.join(args)}")
    hostfile = cluster.workdir(0) / "runs" / run_id / "hostfile"
    prep = f"mkdir -p {hostfile.parent} && printf '%s slots=1\\n' {cluster.ip(0)} {cluster.ip(1)} > {hostfile}"
    subprocess.run(cluster.ssh(0, prep), check=True, timeout=30)
    run = cluster.run_by_hand(shells, run_id)
    if not run.ok:
        raise RuntimeError(f"hand-typed mpirun failed:\n{run.failure()}")
    return parse_rows(run.text())


def one_namespace_mpi(cluster: LocalCluster, sizes: list[int], budget_mb: float) -> list[dict]:
    """Two MPI ranks in node-0's namespace over Open MPI's TCP transport on loopback."""
    argv = ["ip", "netns", "exec", cluster.netns(0), *_python_env({"OMPI_ALLOW_RUN_AS_ROOT": "1",
            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}),
            "mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none", "-x", "OMP_NUM_THREADS",
            "--mca", "pml", "ob1", "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo",
            sys.executable, *_job_args("mpi", sizes, budget_mb)]
    return parse_rows(_run_all([argv])[0])


def iperf3(cluster: LocalCluster, seconds: float, flows: int = 1, port: int = 5211) -> float:
    """node-0 -> node-1 TCP throughput in GB/s (what the receiver got)."""
    server = subprocess.Popen(["ip", "netns", "exec", cluster.netns(1), "iperf3", "-s", "-1", "-B", cluster.ip(1),
                               "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:  # until the server listens, with a deadline
            probe = subprocess.run(["ip", "netns", "exec", cluster.netns(1), "ss", "-Hltn", f"sport = :{port}"],
                                   capture_output=True, text=True)
            if probe.stdout.strip():
                break
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"iperf3 -s on node-1 is not listening on port {port} (exit {server.poll()})")
            time.sleep(0.1)
        res = subprocess.run(["ip", "netns", "exec", cluster.netns(0), "iperf3", "-c", cluster.ip(1), "-B", cluster.ip(0),
                              "-p", str(port), "-t", str(seconds), "-P", str(flows), "-J"],
                             capture_output=True, text=True, timeout=seconds + 30)
        if res.returncode != 0:
            raise RuntimeError(f"iperf3 failed: {res.stdout[-1000:]} {res.stderr[-1000:]}")
        return json.loads(res.stdout)["end"]["sum_received"]["bits_per_second"] / 8e9
    finally:
        server.kill()
        server.wait()


def row_at(rows: list[dict], nbytes: int) -> dict | None:
    """The row of ``nbytes`` in ``rows`` (None where that size is not there)."""
    return next((r for r in rows if r["bytes"] == nbytes), None)


def mtu_sweep(mtus=MTUS, repeats: int = 3, budget_mb: float = 1024) -> list[dict]:
    """gloo 64 MiB busbw across two namespaces vs in one namespace, on a fresh cluster per MTU."""
    out = []
    for mtu in mtus:
        cluster = bring_up(2, "bmtu", mtu=mtu)
        try:
            pairs = []
            for _ in range(repeats):  # interleaved, so drift hits both sides alike
                two = row_at(raw_gloo(cluster, [MIB64], budget_mb), MIB64)["busbw_gbs"]
                one = row_at(raw_gloo(cluster, [MIB64], budget_mb, one_namespace=True), MIB64)["busbw_gbs"]
                pairs.append((two, one))
            two, one = median(p[0] for p in pairs), median(p[1] for p in pairs)
            out.append({"mtu": mtu, "busbw_gbs": two, "one_namespace_busbw_gbs": one,
                        "ratio": median(t / o for t, o in pairs), "pairs": pairs, "link_gbs": iperf3(cluster, 2)})
        finally:
            cluster.down()
    return out
