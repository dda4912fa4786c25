"""Item 4: the pre-flight GPU smoke test (``multinode.checks.gpu``) run for real on this machine, and ``NPROC=auto``.

This machine as a one-node inventory: a GPU node with as many GPUs as the node bootstrap counts
(``nvidia-smi -L``, infra/ec2/user_data.sh.tftpl). ``NPROC=auto`` gives the processes per node
(``nproc_of``); the smoke test runs as the pre-flight plans it (``smoke_commands``: the same argv, cwd and
timeout) for that many processes -- it must pass -- and for one more, which it must refuse with the line the user
would see. The answer's arch must be the GPU's own (``sm_<compute capability>`` as nvidia-smi reports it).
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path

from bench.gpu import plan
from bench.gpu.runs import Context, process


def _inventory(gpus: int):
    from multinode.core.inventory import Inventory, Node

    node = Node("node-0", socket.gethostname(), "127.0.0.1", "root", 22, "ssh-ed25519 unused-here",
                accelerator="nvidia" if gpus else "none", accelerator_count=gpus)
    return Inventory("gpucheck", "local", (node,), "127.0.0.0/8", "/dev/null", "/dev/null", "/tmp",
                     python=sys.executable)


def run(ctx: Context, bootstrap_gpus: int, timeout: float) -> dict:
    """The smoke test for NPROC=auto's count and for one more; what each answered and the line it gives."""
    if str(ctx.repo / "scripts") not in sys.path:  # the multinode package (scripts/multinode) in this process too
        sys.path.insert(0, str(ctx.repo / "scripts"))
    from multinode.checks.gpu import failure_line, smoke_commands
    from multinode.core.config import LaunchSpec
    from multinode.plan.launchers.base import nproc_of

    inventory = _inventory(bootstrap_gpus)
    auto = LaunchSpec(nproc="auto", mode="gpu")
    nproc = nproc_of(auto, inventory.nodes[0])
    record: dict = {"bootstrap_gpus": bootstrap_gpus, "nproc_auto": nproc, "answers": []}
    for spec in (auto, LaunchSpec(nproc=nproc + 1, mode="gpu")):
        command = smoke_commands(inventory, spec).get("node-0")
        if command is None:  # a node without a GPU has no smoke test
            record["answers"].append({"want": nproc_of(spec, inventory.nodes[0]), "planned": False})
            continue
        done = process(f"gpucheck_{command.argv[-1]}", list(command.argv), ctx, timeout, cwd=Path(command.cwd))
        answer = plan.marker(done.output, "GPUCHECK")  # not GPUCHECK-DEVICE: what it found before the test
        record["answers"].append({"want": int(command.argv[-1]), "planned": True, "exit": done.exit,
                                  "answer": answer, "line": failure_line("node-0", None, done.exit, done.output, "")})
    return record
