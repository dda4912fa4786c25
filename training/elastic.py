"""A user's own training loop that keeps running through a membership change (``preempt.Elastic``): the same path
our trainer takes (:mod:`training.reform`), offered to a script that says what its state is and how it takes it.

Under ``RECOVER`` the run gives the ranks ``MULTINODE_MEMBERSHIP`` (the static launcher; docs/recovery.md): a lost
or noticed node costs the other ranks a pause, and a replacement joins them, without a new process. A script that
does not use this keeps today's behaviour (the run restarts every process, and says so in one line). The script
tells what a rank that joins must receive and how it takes it, and re-shards its data when the world changes::

    from training import preempt

    job = preempt.Elastic(state=lambda: {"weights": weights}, load=lambda s: weights.copy_(s["weights"]))
    job.start("gloo")                          # instead of dist.init_process_group (the same without RECOVER)
    step = job.position or 0                   # a rank that joined a running job starts where its peers are
    while step < steps:
        try:
            with job.guard(step):              # a peer lost in here: the survivors re-form, Changed is raised
                train_one_step(step, job.rank, job.world_size)
            step += 1
            if job.done(step):                 # the notice agreement, every rank the same answer: True -- stop
                save(step); sys.exit(preempt.EXIT_PREEMPTED)
        except preempt.Changed as change:      # a new world: go on from where every rank of it agreed
            step = change.position             # (a DDP model is wrapped again here, on the new group)

``position`` is the script's own word for where it is (a step, an (epoch, sample) pair: anything picklable); the
rank that holds the freshest one sends ``state()`` to the ranks that lack it (a new rank, or one whose step was cut
short). The ledger gets the steps (``done`` marks them) and the pauses. tests/integration/jobs/user_elastic.py is a
runnable example, drilled by tests/integration/test_user_elastic_local.py.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable

from . import channel, dist_env, marks, membership, notice, reform
from .survivor import lost_peer


class Changed(Exception):
    """The job's world changed: every rank of the new one goes on from ``position``."""

    def __init__(self, position, rank: int, world_size: int) -> None:
        super().__init__(f"the job's world changed: rank {rank} of {world_size}, from {position!r}")
        self.position, self.rank, self.world_size = position, rank, world_size


class Elastic:
    """A user's loop as the host of membership changes (:class:`training.reform.Host`; module doc)."""

    def __init__(self, state: Callable[[], dict], load: Callable[[dict], None], timeout: float = 30.0) -> None:
        self._state, self._load, self.timeout = state, load, timeout
        self.world: dist_env.World | None = None
        self.step = 0  # steps done (done() counts them): the freshest rank is the one with the most
        self.position = None  # where a rank that joined a running job starts (its peers' position)
        self.agreement: notice.Agreement | None = None
        self.marks = marks.current()

    @property
    def rank(self) -> int:
        return self.world.rank

    @property
    def world_size(self) -> int:
        return self.world.world_size

    def start(self, backend: str = "gloo") -> "Elastic":
        """The process group: plain ``init_process_group`` without the run's membership; else this generation's
        group on the job's store -- and, for a rank the run started to join a running job, its peers' state."""
        import torch.distributed as dist

        launch = dist_env.detect(os.environ)
        if launch.launcher == "env" and membership.path_from_env() is not None:
            self.world = dist_env.init(launch, backend, self.timeout)
        else:
            dist.init_process_group(backend)
            self.world = dist_env.World(dist_env.Launch(launch.launcher, dist.get_rank(), dist.get_world_size(),
                                                        launch.local_rank), backend)
        if self.world.joining is not None:  # a new node's rank: the script's state is built (``state``), it joins now
            self.position = membership.join(self, self.timeout)
        member = self.world.member
        self.agreement = notice.Agreement(notice.watch(), notice.torch_all_reduce_max(), reform.members(self.world))
        if member is not None and member.generation == 0 and self.world.rank == 0:
            channel.send(channel.WORLD, {"generation": 0, "step": 0, "world_size": self.world.world_size,
                                         "before": self.world.world_size, "seconds": 0.0})  # the job takes changes
        return self

    @contextlib.contextmanager
    def guard(self, position):
        """Around one step that starts at ``position``: a peer lost inside it is a change (Changed), where the run
        can change the job's membership; elsewhere the error goes on as it is."""
        try:
            yield
        except Exception as err:
            if self.world.member is None or not lost_peer(err):
                raise
            self._change(reform.lost(err, position, None))

    def done(self, position) -> bool:
        """A step done, now at ``position``: the ledger's mark and the notice agreement -- True when every rank
        agreed to stop (a notice; the script saves and exits 75); a change of the world raises Changed."""
        self.step += 1
        self.marks.step(self.step)
        with self.guard(position):  # the agreement is a collective too: a peer lost in it is a change
            decision = self.agreement.check()
        if decision in ("leave", "reform"):
            self._change(reform.Change(decision, position, time.time()))
        return decision == "stop"

    def _change(self, what: reform.Change) -> None:
        reform.change(self, what)  # Left (this node leaves: exit 75) and NoNewMembership go to the script
        raise Changed(self.position, self.world.rank, self.world.world_size)

    # --- training.reform.Host -------------------------------------------------------------------------------------

    def paused(self, what: reform.Change) -> None:
        pass  # the script's step was cut short: it runs it again from the agreed position

    def state_of(self, position) -> dict:
        return {"position": position, "step": self.step, "state": self._state()}

    def apply(self, state: dict) -> None:
        self._load(state["state"])
        self.step = int(state["step"])

    def rejoined(self, position, adopted: bool) -> None:
        self.position = position
