"""Stand-ins for one attempt's loop (multinode.app.watch) without a cluster: a runner whose node sessions end as a
test says, and the SSH backend's start on it -- the real JobRun and the real loop, no process, no socket."""

from __future__ import annotations

import io
import threading
from types import SimpleNamespace

from conftest import make_inventory

from multinode.app.watch import AttemptLoop
from multinode.core.config import LaunchSpec
from multinode.diagnose.slowranks import SlowRanks
from multinode.ssh.job import JobRun
from multinode.ssh.runner import StopPolicy


class Answer:
    def __init__(self, stdout: str = "stopped 1", answered: bool = True):
        self.exit_code, self.ok, self.stdout = (0, True, stdout) if answered else (None, False, "")


class Sessions:
    """A runner whose node sessions end as ``ends[node]`` says: an exit code, or ``"lost"`` (the SSH session
    raises), once ``release`` is set (or at once); every stop ends the sessions still open with ``stopped_code``; the
    ``silent`` nodes do not answer the stop (their machine went)."""

    def __init__(self, ends: dict[str, object], release: threading.Event | None = None, grace: float | None = None,
                 stopped_code: object = 143, silent: tuple[str, ...] = ()):
        self.ends, self.release, self.stopped_code = ends, release or threading.Event(), stopped_code
        self.silent = silent
        self.stop, self.stops, self.said = StopPolicy(grace), [], []
        self.print_lock, self.out = threading.Lock(), io.StringIO()
        self.stopped = threading.Event()
        self.cut, self.dropped = None, []
        if release is None:
            self.release.set()

    def say(self, message):
        self.said.append(message)

    def execute(self, name, command, timeout=None, out=None, err=None):
        while not (self.release.is_set() or self.stopped.is_set()):
            self.release.wait(0.05)
        end = self.ends[name] if self.release.is_set() else self.stopped_code
        if end == "lost":
            raise EOFError("the session closed")
        return end, b"", b""

    def stop_all(self, run_id, extra_stop=None, names=None):
        self.stops.append(run_id)
        self.stopped.set()
        return {name: Answer(answered=name not in self.silent) for name in (names or self.ends)}

    def drop(self, name):
        self.dropped.append(name)

    def cut_off(self, lost, names, spare_port=None, peers=()):
        self.cut = (list(lost), list(names))


class SshStart:
    """The SSH backend's start, on the stand-in runner."""

    def start(self, ctx, plan, events, observe):
        job = JobRun(ctx.runner, {name: "true" for name in ctx.runner.ends}, run_id=ctx.spec.run_id,
                     log_dir=ctx.run_dir, events=events, observe=observe)
        job.start()
        return job


def loop(tmp_path, runner: Sessions, *, spec: LaunchSpec | None = None, gone=lambda names: {}, **options):
    """An attempt loop over ``runner``'s nodes."""
    spec = spec or LaunchSpec(nodes=len(runner.ends), run_id="r1")
    ctx = SimpleNamespace(spec=spec, inv=make_inventory(len(runner.ends)), runner=runner, run_dir=tmp_path)
    options.setdefault("capture", lambda failure, lost: None)
    return AttemptLoop(ctx, SshStart(), None, gone=gone, slow=SlowRanks(runner.say), **options)
