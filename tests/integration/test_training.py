"""The trainer for real: torchrun (gloo DDP) and mpirun (mpi4py data plane) with 2 ranks on this
machine, SLURM-style and plain runs of a copy of training/ alone, exact resume after a peer's SIGKILL, a
kill during a snapshot write, the snapshot broadcast from a rank other than 0 over gloo, a dead peer
under mpirun, and one-line bad input.

Every process carries MULTINODE_RUN_ID=<this module's id>; a test after which any is left fails naming them,
and they are killed once that is recorded (torchrun starts its workers in their own session, so killing the
launcher would not be enough)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch
from training.channel import EXIT_PEER_FAILED

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TRAIN = str(REPO / "training" / "train.py")
RUN_ID = f"pytest-training-{uuid.uuid4().hex[:8]}"
ENV = {**{k: v for k, v in os.environ.items() if not k.startswith(("MULTINODE_", "OMPI_", "PMI", "SLURM_"))},
       "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "MULTINODE_RUN_ID": RUN_ID}
MPI_ENV = {**ENV, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def torchrun(*args: str, nproc: int = 2) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", TRAIN, *args]
    return subprocess.run(argv, env=ENV, capture_output=True, text=True, timeout=300)


def mpirun(*args: str, np: int = 2) -> subprocess.CompletedProcess:
    argv = ["mpirun", "-np", str(np), "--oversubscribe", "--bind-to", "none", "-x", "OMP_NUM_THREADS",
            "--mca", "btl", "self,vader,tcp", sys.executable, TRAIN, *args]
    return subprocess.run(argv, env=MPI_ENV, capture_output=True, text=True, timeout=300)


def our_pids() -> list[int]:
    mark = f"MULTINODE_RUN_ID={RUN_ID}".encode()
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and mark in (proc / "environ").read_bytes().split(b"\0"):
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def _described(pid: int) -> str:
    """'<pid> (<its command line>)'."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return f"{pid} (gone)"
    return f"{pid} ({b' '.join(argv).decode(errors='replace').strip()[:160]})"


@pytest.fixture(autouse=True)
def nothing_left():
    """After each test, nothing of this module's runs may be left: what is left fails the test, named; it is
    killed after that is recorded, so the next test starts clean. A process that is exiting (e.g. the
    multiprocessing resource tracker of a --spawn run, which ends on its parent's exit) gets a moment to go."""
    yield
    settle = time.monotonic() + 5
    while our_pids() and time.monotonic() < settle:
        time.sleep(0.05)
    left = [_described(pid) for pid in our_pids()]
    if left:
        _stop_ours()
        pytest.fail(f"processes of {RUN_ID} left after the test (killed now): {left}", pytrace=False)


def _stop_ours() -> None:
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 10.0)):
        for pid in our_pids():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while our_pids() and time.monotonic() < deadline:  # until they are gone (reaped), with a deadline
            time.sleep(0.05)
    assert not our_pids(), f"processes of {RUN_ID} survived SIGKILL: {our_pids()}"


def result_of(res: subprocess.CompletedProcess) -> dict:
    lines = [line for line in res.stdout.splitlines() if line.startswith("RESULT ")]
    assert res.returncode == 0 and len(lines) == 1, res.stdout[-3000:] + res.stderr[-3000:]
    return json.loads(lines[0][len("RESULT "):])


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "final_model.pt")


@pytest.fixture(scope="module")
def digits_runs(tmp_path_factory):
    """The same seeded digits run, 2 ranks, under torchrun and under mpirun."""
    base = tmp_path_factory.mktemp("digits")
    ddp = result_of(torchrun("--workload", "digits", "10", "5", "--metrics-dir", str(base / "ddp"),
                             "--snapshot-dir", str(base / "ddp" / "snap")))
    mpi = result_of(mpirun("--workload", "digits", "10", "5", "--metrics-dir", str(base / "mpi")))
    return base, ddp, mpi


def test_digits_reaches_95_under_torchrun_and_mpirun(digits_runs):
    base, ddp, mpi = digits_runs
    assert ddp["launcher"] == "torchrun" and ddp["data_plane"] == "gloo-ddp"
    assert mpi["launcher"] == "mpirun" and mpi["data_plane"] == "mpi4py-allreduce(host)"
    assert ddp["world_size"] == mpi["world_size"] == 2
    assert ddp["test_accuracy"] >= 0.95 and mpi["test_accuracy"] >= 0.95
    rows = [json.loads(line) for line in (base / "ddp" / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows[:-1]] == list(range(10)) and rows[-1]["event"] == "test"
    assert all(r["samples_per_s"] > 0 and r["step_time_s"] > 0 and r["comm_time_s"] > 0 for r in rows[:-1])
    assert rows[-1]["test_accuracy"] == ddp["test_accuracy"] and rows[0]["loss"] > rows[-2]["loss"]


def test_mpi_data_plane_matches_ddp_weights(digits_runs):
    """Same seed, same data order: the MPI allreduce and gloo DDP average the same gradients, and the
    final weights are bitwise equal (torch.equal, no tolerance). With 2 ranks DDP sums a+b and halves it,
    the MPI plane halves the loss before backward (so a and b come out halved) and sums; halving is exact
    in float32 and a sum of two is commutative. Other world sizes divide by non-powers of two and may add
    in a different order: this test says nothing about them.
    """
    base, _, _ = digits_runs
    assert_same_weights(weights(base / "mpi"), weights(base / "ddp"))


def assert_same_weights(mpi: dict, ddp: dict) -> None:
    assert ddp.keys() == mpi.keys()
    different = [name for name in ddp if not torch.equal(mpi[name], ddp[name])]
    assert not different, {name: (mpi[name] - ddp[name]).abs().max().item() for name in different}


def test_mpi_gradient_accumulation_matches_ddp(tmp_path):
    """--grad-accum 2: DDP skips the allreduce on the first micro-batch (no_sync); the MPI plane's
    second micro-batch accumulates into the bucket the first one was copied to. Same weights."""
    args = ("--workload", "digits", "2", "5", "--grad-accum", "2")
    result_of(torchrun(*args, "--metrics-dir", str(tmp_path / "ddp")))
    result_of(mpirun(*args, "--metrics-dir", str(tmp_path / "mpi")))
    assert_same_weights(weights(tmp_path / "mpi"), weights(tmp_path / "ddp"))


def plain_ranks(*args: str, n: int = 2) -> list[subprocess.CompletedProcess]:
    """``n`` ranks of the trainer started as plain processes (RANK, WORLD_SIZE, MASTER_ADDR/PORT on loopback): no
    launcher that stops the survivors when one dies, so what they do on a lost peer can be seen."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, TRAIN, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**ENV, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(n),
                                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": "lo"})
             for r in range(n)]
    outs = [p.communicate(timeout=600) for p in procs]  # a hang guard
    return [subprocess.CompletedProcess(p.args, p.returncode, *out) for p, out in zip(procs, outs)]


@pytest.mark.parametrize("crash_after", [4, 3], ids=["at-a-periodic-snapshot", "between-snapshots"])
def test_killed_and_resumed_run_ends_bitwise_equal(digits_runs, tmp_path, crash_after):
    """The last rank is SIGKILLed right after epoch ``crash_after + 1``'s end (the periodic snapshot is every 5th
    epoch): rank 0 loses its peer in the early-stopping vote and keeps the whole epoch (training/survivor.py's
    keep_between), over the periodic snapshot or where there is none. Resumed under torchrun, the run ends with
    the uninterrupted run's weights, bitwise: the kept state (RNG, scheduler, early stopping) is the epoch's end."""
    base, _, _ = digits_runs
    ranks = plain_ranks("--workload", "digits", "10", "5", "--metrics-dir", str(tmp_path),
                        "--snapshot-dir", str(tmp_path / "snap"), "--crash-after-epoch", str(crash_after))
    # rank 0's collective failed with nothing of its own wrong: it exits 76 (channel.EXIT_PEER_FAILED), so a run
    # with RECOVER starts every process again rather than ending on it
    assert [r.returncode for r in ranks] == [EXIT_PEER_FAILED, -signal.SIGKILL], [r.stderr[-2000:] for r in ranks]
    kept = torch.load(tmp_path / "snap" / "snapshot.pt", weights_only=False)
    assert (kept["next_epoch"], kept["consumed"], kept["survivor"]["rank"]) == (crash_after + 1, 0, 0), kept.keys()
    assert "a peer is gone" in ranks[0].stderr + ranks[0].stdout, ranks[0].stderr[-2000:]
    resumed = result_of(torchrun("--workload", "digits", "10", "5", "--metrics-dir", str(tmp_path),
                                 "--snapshot-dir", str(tmp_path / "snap")))
    assert resumed["epochs_run"] == 10 - crash_after - 1  # the finished epochs are not repeated
    full, again = weights(base / "ddp"), weights(tmp_path)
    for name in full:
        assert torch.equal(full[name], again[name]), name


def test_kill_during_snapshot_write_keeps_the_previous_snapshot(tmp_path):
    from training import snapshot

    snapshot.save(tmp_path, {"next_epoch": 3, "blob": torch.ones(10)})
    # A writer that dies (SIGKILL) after writing its temporary file but before the rename.
    child = (
        "import os, signal, torch\n"
        "from training import snapshot\n"
        "os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)\n"
        f"snapshot.save({str(tmp_path)!r}, {{'next_epoch': 4, 'blob': torch.zeros(1_000_000)}})\n"
    )
    res = subprocess.run([sys.executable, "-c", child], cwd=REPO, env=ENV)
    assert res.returncode == -signal.SIGKILL
    assert list(tmp_path.glob(".snapshot.pt.*.tmp"))  # the torn write is there...
    state = snapshot.decode(snapshot.read(tmp_path))  # ...and the previous snapshot is intact
    assert state["next_epoch"] == 3 and torch.equal(state["blob"], torch.ones(10))
    snapshot.save(tmp_path, {"next_epoch": 5})
    assert not list(tmp_path.glob(".snapshot.pt.*.tmp"))  # the next save sweeps it


@pytest.mark.parametrize("launch", [torchrun, mpirun])
def test_hello_collective_is_correct(launch):
    res = launch("--workload", "hello", **({"nproc": 3} if launch is torchrun else {"np": 3}))
    result = result_of(res)
    assert result["collective_ok"] is True and result["rank_sum"] == 3.0 and result["world_size"] == 3
    assert result.get("mpi_rank_sum", 3) == 3 and ("mpi_rank_sum" in result) == (launch is mpirun)
    # Ranks share one pipe here (no torchrun --tee), so a line may land in the middle of another's.
    assert sorted(re.findall(r"hello from rank (\d/3)", res.stdout)) == ["0/3", "1/3", "2/3"]


@pytest.fixture
def training_copy(tmp_path) -> Path:
    """A directory holding a copy of training/ and nothing else, as the orchestrator ships it."""
    shutil.copytree(REPO / "training", tmp_path / "code" / "training",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path / "code"


def test_regression_learns_in_one_process_from_a_copy(training_copy):
    res = subprocess.run([sys.executable, "training/train.py", "--workload", "regression", "5", "5"], env=ENV,
                         cwd=training_copy, capture_output=True, text=True, timeout=120)
    result = result_of(res)
    assert result["launcher"] == "single" and result["loss_reduction"] >= 10


def test_slurm_environment_two_tasks(training_copy):
    """What srun gives each task (SLURM_PROCID/NTASKS/LOCALID); the rendezvous is MASTER_ADDR:PORT.
    With --grad-accum 2, so DDP's no_sync micro-steps run too."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, "training/train.py", "--workload", "regression", "3", "3",
                               "--grad-accum", "2"], cwd=training_copy, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**ENV, "SLURM_PROCID": str(r), "SLURM_NTASKS": "2", "SLURM_LOCALID": str(r),
                                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
             for r in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    result = result_of(subprocess.CompletedProcess([], 0, outs[0], ""))
    assert (result["launcher"], result["world_size"], result["data_plane"]) == ("slurm", 2, "gloo-ddp")
    assert result["loss_reduction"] >= 10 and "RESULT" not in outs[1]


SNAPSHOT_RANK = """
import json, os, sys
from datetime import timedelta
import torch
import torch.distributed as dist
from training import snapshot
from training.dist_env import Launch, World

dist.init_process_group("gloo", timeout=timedelta(seconds=60))
world = World(Launch("torchrun", dist.get_rank(), dist.get_world_size(), 0), "gloo")  # the trainer's gather/broadcast
state = snapshot.load_everywhere(sys.argv[1], world.rank, world.gather, world.broadcast)
print("SNAP " + json.dumps({"rank": world.rank, "next_epoch": state["next_epoch"],
                            "blob": state["blob"].tolist(), "pid": os.getpid()}), flush=True)
dist.destroy_process_group()
"""


def test_freshest_snapshot_is_broadcast_from_rank_1_through_gloo(tmp_path):
    """Three ranks, each with its own snapshot directory (nodes share no disk): rank 1 holds the freshest
    snapshot, rank 0 an older one, rank 2 none. Every rank ends with rank 1's, carried by the trainer's
    all_gather_object and broadcast_object_list (training.dist_env.World's) on a real gloo process group; no directory
    is written."""
    from training import snapshot

    dirs = [tmp_path / f"rank{r}" for r in range(3)]
    snapshot.save(dirs[0], {"next_epoch": 4, "blob": torch.full((3,), 4.0)})
    snapshot.save(dirs[1], {"next_epoch": 6, "blob": torch.arange(3.0) + 0.5})
    before = {d: (d / "snapshot.pt").read_bytes() for d in dirs[:2]}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, "-c", SNAPSHOT_RANK, str(dirs[r])], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**ENV, "RANK": str(r), "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1",
                                   "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": "lo"})
             for r in range(3)]
    outs = [p.communicate(timeout=180)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    got = [json.loads(line[len("SNAP "):]) for out in outs for line in out.splitlines() if line.startswith("SNAP ")]
    assert [g["rank"] for g in got] == [0, 1, 2]
    assert [(g["next_epoch"], g["blob"]) for g in got] == [(6, [0.5, 1.5, 2.5])] * 3
    assert len({g["pid"] for g in got}) == 3  # three processes, not one
    assert {d: (d / "snapshot.pt").read_bytes() for d in dirs[:2]} == before and not dirs[2].exists()


def test_dead_peer_under_mpirun_fails_the_job(tmp_path):
    """Rank 1 is SIGKILLed after epoch 1 while rank 0 heads into the next MPI allreduce: mpirun must end
    the job with a non-zero code (the timeout here only turns a hang into a failure)."""
    res = mpirun("--workload", "digits", "3", "1", "--snapshot-dir", str(tmp_path), "--crash-after-epoch", "0")
    assert res.returncode != 0 and "RESULT" not in res.stdout
    assert torch.load(tmp_path / "snapshot.pt", weights_only=False)["next_epoch"] == 1


@pytest.mark.parametrize("args, fragment", [
    (["--batch-size", "0"], "batch-size=0 must be at least 1"),
    (["--device", "gpu"], "--device gpu but this node has no usable GPU"),
])
def test_bad_input_is_one_line_and_exit_2(args, fragment):
    """The real process (the other bad values are checked in-process by the unit tests)."""
    res = subprocess.run([sys.executable, TRAIN, *args], env=ENV, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and fragment in res.stderr, res.stderr


def test_bad_input_under_mpirun_is_not_a_success():
    """mpirun exits 0 when it refuses to start; a rank that exits 2 before MPI init must fail the job."""
    res = mpirun("--batch-size", "0")
    assert res.returncode != 0 and "RESULT" not in res.stdout
    assert "batch-size=0 must be at least 1" in res.stderr


def test_spawn_reaches_95_and_matches_torchrun_standalone_bitwise(digits_runs, tmp_path):
    """`train.py --spawn 2`: no launcher, the parent hosts the store; the seeded run ends with exactly
    the weights of `torchrun --standalone --nproc-per-node=2` (torch.equal, no tolerance): both run
    the same code on the same data order with the same gloo allreduce of two ranks, only the way the
    processes were started differs. Bad input is refused once, in the parent, before any rank starts."""
    base, ddp, _ = digits_runs
    res = subprocess.run([sys.executable, TRAIN, "--spawn", "2", "--workload", "digits", "10", "5",
                          "--metrics-dir", str(tmp_path)], env=ENV, capture_output=True, text=True, timeout=300)
    spawned = result_of(res)
    assert spawned["launcher"] == "spawn" and spawned["world_size"] == 2 and spawned["data_plane"] == "gloo-ddp"
    assert spawned["test_accuracy"] >= 0.95 and spawned["test_accuracy"] == ddp["test_accuracy"]
    full, again = weights(base / "ddp"), weights(tmp_path)
    assert full.keys() == again.keys()
    for name in full:
        assert torch.equal(full[name], again[name]), name
    bad = subprocess.run([sys.executable, TRAIN, "--spawn", "2", "--strategy", "single", "--workload", "hello"],
                         env=ENV, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("error:") == 1 and "strategy=single" in bad.stderr, bad.stderr
