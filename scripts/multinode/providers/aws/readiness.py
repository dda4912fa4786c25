"""Wait, over SSH, until every node of a new cluster has finished its bootstrap; provider-independent.

A node answering SSH is not a node that can run a job: its first-boot script may still be installing
a driver (and rebooting for it, on g4ad), Docker and the image or the host runtime's virtualenv, or may
have failed. The bootstrap (infra/ec2/user_data.sh.tftpl) reports in files, and this module reads them:

* ``ready``: written last, after the driver, the runtime and the GPU smoke test; it holds
  ``image=<reference>`` (empty for the host runtime), ``gpus=<count>``, ``runtime=...``, what the job runtime
  links (``torch=``, ``cuda=``, ``hip=``, ``nccl=``, ``mpi4py=``, ``libmpi=``: MPI.Get_library_version()'s first
  line) and, for the host runtime, ``mpirun=``; :func:`software_summary` makes the line `make status` shows;
* ``failed``: written by the bootstrap's error trap (the failing line) or by its own checks (the reason,
  e.g. the GPU smoke test's arch), so a failure ends the wait at once instead of at the deadline;
* the bootstrap log, whose tail is shown for the node that failed;
* ``cloud-init status``: must say ``done`` (``error`` is a failure).

Contract of :func:`wait_ready`: it returns when every node is ready (its marker names the expected
image and at least the GPUs of its inventory record) and cloud-init is done; otherwise it raises
:class:`~multinode.core.errors.NodeError` naming the node, the reason and the tail of its bootstrap log:
at once for a node that failed, at the deadline for the nodes still waiting (a node that does not
answer SSH yet is waiting, not failed). It takes an :class:`Inventory` and a
:class:`~multinode.ssh.runner.RemoteRunner`, so local nodes stand in for instances in the tests.
"""

from __future__ import annotations

import logging
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass

from multinode.core.errors import NodeError, UserError
from multinode.core.inventory import Inventory, Node
from multinode.core.progress import Progress
from multinode.ssh.runner import RemoteRunner

log = logging.getLogger(__name__)

READY, WAITING, FAILED = "ready", "waiting", "failed"


@dataclass(frozen=True)
class Bootstrap:
    """Where a node's bootstrap reports. ``{node}`` in a path becomes the node's name (local stand-ins
    share one filesystem); ``cloud_init`` is the command that prints ``status: ...``."""

    ready: str = "/var/lib/multinode/ready"
    failed: str = "/var/lib/multinode/failed"
    log: str = "/var/log/multinode-bootstrap.log"
    cloud_init: str = "cloud-init"
    tail_lines: int = 30

    def __post_init__(self) -> None:
        if self.tail_lines < 1:
            raise UserError(f"tail_lines={self.tail_lines} must be at least 1")

    def path(self, template: str, node: Node) -> str:
        return template.replace("{node}", node.name)


@dataclass(frozen=True)
class Probe:
    """One node's answer to :func:`probe_command`."""

    node: str
    state: str  # READY, WAITING or FAILED
    detail: str = ""


def probe_command(bootstrap: Bootstrap, node: Node, image: str | None) -> str:
    """The shell command that prints ``ready``, ``waiting <why>`` or ``failed <why>`` for ``node``;
    it always exits 0, so a non-zero exit or no answer means SSH (or the node) is not there yet."""
    ready, failed = (shlex.quote(bootstrap.path(p, node)) for p in (bootstrap.ready, bootstrap.failed))
    want_image = shlex.quote(image or "")
    gpus = node.accelerator_count
    return "\n".join([
        f"if [ -e {failed} ]; then echo \"failed the bootstrap failed: $(head -c 300 {failed})\"; exit 0; fi",
        # the step the bootstrap has reached: its log's last line, shown while the run waits (Progress)
        f"step=$(tail -n 1 {shlex.quote(bootstrap.path(bootstrap.log, node))} 2>/dev/null | tr -d '\\r' | cut -c1-100)",
        'at=${step:+ (bootstrap: $step)}',
        f"ci=$({bootstrap.cloud_init} status 2>/dev/null | sed -n 's/^status: //p' | head -n 1)",
        'case "$ci" in',
        "  done*) ;;",
        '  error*) echo "failed cloud-init status: $ci"; exit 0 ;;',
        '  *) echo "waiting cloud-init is ${ci:-not reporting yet}$at"; exit 0 ;;',
        "esac",
        f"if [ ! -e {ready} ]; then echo \"waiting no ready marker {bootstrap.path(bootstrap.ready, node)} yet$at\"; exit 0; fi",
        f"image=$(sed -n 's/^image=//p' {ready}); gpus=$(sed -n 's/^gpus=//p' {ready})",
        f"want={want_image}",
        'if [ -n "$want" ] && [ "$image" != "$want" ]; then echo "failed the node pulled image \'$image\', not \'$want\'"; exit 0; fi',
        f'if [ "${{gpus:-0}}" -lt {gpus} ]; then echo "failed the bootstrap saw ${{gpus:-0}} GPUs, the inventory says {gpus}"; exit 0; fi',
        "echo ready",
    ])


def parse_probe(node: str, exit_code: int | None, stdout: str, error: str | None = None) -> Probe:
    """Probe output -> :class:`Probe`; no answer or a broken answer is WAITING (SSH may not be up yet)."""
    if exit_code is None:
        return Probe(node, WAITING, f"no SSH answer yet ({error or 'no connection'})")
    lines = [line for line in stdout.splitlines() if line.strip()]
    if exit_code != 0 or not lines:
        return Probe(node, WAITING, f"probe exited {exit_code}")
    state, _, detail = lines[-1].partition(" ")
    if state not in (READY, WAITING, FAILED):
        return Probe(node, WAITING, f"unexpected probe output {lines[-1]!r}")
    return Probe(node, state, detail)


def software_summary(marker: str) -> str | None:
    """A ready marker's record of the job runtime as one line (``torch 2.13.0 (CUDA 13.0, NCCL 2.29.7); libmpi: Open
    MPI v4.1.6, ...; mpi4py 4.1.2``), None when ``marker`` (any text: lines without ``=`` are skipped) names no
    torch. Values the node wrote as ``None`` (no CUDA in a CPU build) are left out."""
    fields = {}
    for line in marker.splitlines():
        key, sep, value = line.partition("=")
        if sep and value.strip() not in ("", "None"):
            fields[key.strip()] = value.strip()
    if "torch" not in fields:
        return None
    links = ", ".join(f"{label} {fields[key]}" for key, label in (("cuda", "CUDA"), ("hip", "HIP"), ("nccl", "NCCL"))
                      if key in fields)
    parts = [f"torch {fields['torch']}" + (f" ({links})" if links else "")]
    parts += [f"libmpi: {fields['libmpi']}"] if "libmpi" in fields else []
    parts += [f"mpi4py {fields['mpi4py']}"] if "mpi4py" in fields else []
    return "; ".join(parts)


def tail_command(bootstrap: Bootstrap, node: Node) -> str:
    path = shlex.quote(bootstrap.path(bootstrap.log, node))
    return f"tail -n {bootstrap.tail_lines} {path} 2>/dev/null || echo '(no bootstrap log at {bootstrap.path(bootstrap.log, node)})'"


def wait_ready(inventory: Inventory, runner: RemoteRunner, *, image: str | None, timeout: float,
               bootstrap: Bootstrap = Bootstrap(), poll: float = 5.0,
               clock: Callable[[], float] = time.monotonic, say: Callable[[str], None] | None = None,
               progress: Progress | None = None) -> float:
    """Block until every node is ready (see the module docstring); return the seconds it took. ``progress``, if
    given, says after each round how many nodes are ready and the step each other one has reached."""
    start = clock()
    deadline = start + timeout
    pending = {node.name: node for node in inventory.nodes}
    last: dict[str, Probe] = {}
    say = say or (lambda message: log.info("%s", message))
    while True:
        answers = runner.run_each({name: probe_command(bootstrap, node, image) for name, node in pending.items()},
                                  timeout=max(5.0, min(30.0, deadline - clock())))
        for name, result in answers.items():
            probe = parse_probe(name, result.exit_code, result.stdout, result.error)
            last[name] = probe
            if probe.state == FAILED:
                raise _failure(runner, bootstrap, pending[name], f"bootstrap failed: {probe.detail}")
            if probe.state == READY:
                say(f"{name} is ready ({clock() - start:.0f}s)")
                del pending[name]
        if not pending:
            return clock() - start
        if progress is not None:
            waiting = "; ".join(f"{name}: {last[name].detail}" for name in sorted(pending))
            progress.update(f"{len(inventory.nodes) - len(pending)}/{len(inventory.nodes)} node(s) ready; {waiting}")
        if clock() >= deadline:
            first = sorted(pending)[0]
            others = f" (also not ready: {', '.join(sorted(pending)[1:])})" if len(pending) > 1 else ""
            raise _failure(runner, bootstrap, pending[first],
                           f"not ready within {timeout:.0f}s: {last[first].detail}{others}")
        time.sleep(min(poll, max(0.0, deadline - clock())))


def _failure(runner: RemoteRunner, bootstrap: Bootstrap, node: Node, message: str) -> NodeError:
    result = runner.run_on(node.name, tail_command(bootstrap, node), timeout=15)
    tail = result.stdout.splitlines() if result.exit_code == 0 else [f"(bootstrap log unreadable: {result.error or result.stderr.strip()})"]
    return NodeError(node.name, "bootstrap", None, message, tail=tail,
                     log_path=f"{node.name}:{bootstrap.path(bootstrap.log, node)}")


# seconds for every bootstrap to finish after SSH answers: apt behind unattended-upgrades, g4ad's reboot
# for its driver, a pull of a multi-GB GPU image or the host runtime's torch (the ROCm wheel is ~6 GB).
READY_TIMEOUT = 2400.0


def wait_bootstrap(inventory: Inventory, image: str | None) -> None:
    """Every node's bootstrap done (ready marker, image, GPUs, cloud-init) within READY_TIMEOUT."""
    from multinode.core.progress import Progress

    runtime = image or "torch, Open MPI and mpi4py in a virtualenv"
    with RemoteRunner(inventory) as runner:
        runner.say(f"waiting up to {READY_TIMEOUT / 60:.0f} min for the bootstrap of {len(inventory.nodes)} nodes "
                   f"(driver, {runtime}, GPU smoke test)")
        with Progress("[multinode] bootstrap", runner.out) as progress:  # one updating line on a terminal
            took = wait_ready(inventory, runner, image=image, timeout=READY_TIMEOUT, poll=10.0, progress=progress,
                              say=lambda message: progress.note(f"[multinode] {message}"))
            progress.done(f"every node is ready after {took:.0f}s")
