"""``training.preempt.on_peer_loss`` in a user's loop, on a real gloo process group (two processes on this machine,
DDP, one SIGKILLed mid-loop): the survivor's ``save`` is called once, with the last completed step, and the error
still ends its loop. Also what :func:`training.survivor.lost_peer` takes for a lost peer and what it does not."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from bench.drills.common import REPO
from training import survivor

pytestmark = pytest.mark.integration

SCRIPT = textwrap.dedent('''
    import datetime, json, os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp
    from torch.nn.parallel import DistributedDataParallel as DDP
    from training import preempt

    def run(rank, port, out):
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=10))
        torch.manual_seed(0)
        net = DDP(torch.nn.Linear(16, 16))
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        saved = []
        try:
            for step in range(1000):
                if rank == 1 and step == 20:
                    os.kill(os.getpid(), 9)  # the peer is gone, no notice
                with preempt.on_peer_loss(lambda err: saved.append({"step": step, "error": str(err)[:80]})):
                    net(torch.randn(4, 16)).sum().backward()
                    opt.step()
                    opt.zero_grad()
        except RuntimeError:
            pass
        with open(out, "w") as fh:
            json.dump(saved, fh)

    if __name__ == "__main__":
        port, out = int(sys.argv[1]), sys.argv[2]
        ranks = [mp.get_context("spawn").Process(target=run, args=(rank, port, f"{out}.{rank}")) for rank in (0, 1)]
        for proc in ranks:
            proc.start()
        for proc in ranks:
            proc.join()
''')


def test_the_survivor_saves_its_last_completed_step_when_a_peer_is_killed(tmp_path):
    import socket

    with socket.socket() as s:  # a free port on loopback for the process group's store
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "loop.py").write_text(SCRIPT)
    out = tmp_path / "saved.json"  # rank 0's: saved.json.0 (rank 1 is killed before it writes)
    res = subprocess.run([sys.executable, str(tmp_path / "loop.py"), str(port), str(out)], cwd=REPO,
                         capture_output=True, text=True, timeout=300, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    assert not (tmp_path / "saved.json.1").exists(), res.stderr[-2000:]
    saved = json.loads((tmp_path / "saved.json.0").read_text())
    assert len(saved) == 1 and saved[0]["step"] == 20, (saved, res.stderr[-2000:])  # steps 0-19 done: step 20 failed
    assert survivor.lost_peer(RuntimeError(saved[0]["error"])), saved


def test_what_is_a_lost_peer():
    import torch.distributed as dist

    assert survivor.lost_peer(RuntimeError("[../gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:10139: "
                                          "Connection reset by peer"))
    assert survivor.lost_peer(dist.DistBackendError("NCCL communicator was aborted"))
    assert not survivor.lost_peer(RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x16 and 8x16)"))
    assert not survivor.lost_peer(ValueError("Connection reset by peer"))  # not a collective's error type
