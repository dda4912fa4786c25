"""A peer lost without warning costs at most the step in progress: the surviving ranks keep what they hold.

In data parallelism every rank holds the whole model and optimizer state. When a collective fails because a peer
is gone (its process killed, its node lost, its link cut: gloo's "Connection reset by peer" or the process-group
timeout, NCCL's watchdog error), the model on every surviving rank is still exactly as the last completed step
left it: DDP averages the gradients inside ``backward()``, before ``optimizer.step()``, so the step that failed
changed no weight and no optimizer state. :func:`keep` wraps each step; on such a failure the first rank of each
surviving node writes a snapshot of the last completed step -- model, optimizer, scheduler, scaler, the RNG states
as they were when the failed step began, the epoch and the samples of it trained -- into its node's snapshot
directory, atomically and with its checksum (:mod:`training.snapshot`), then the error goes on as before (the job
fails; the orchestrator sees which node was lost). The next start (``RECOVER``, or the same run again) resumes from
the freshest complete copy any rank holds (:func:`training.snapshot.load_freshest`): this one, unless a fresher
coordinated checkpoint exists.

A failure after the step's optimizer update (the notice agreement's all-reduce, the sample log's gather) keeps that
step: the update was made on every rank from the same averaged gradients. A failure between two epochs (the
validation's sums, the periodic snapshot's copy, the early-stopping vote) keeps the whole epoch: :func:`keep_between`.

NCCL: by default (``TORCH_NCCL_ASYNC_ERROR_HANDLING`` unset, torch's 3 = tear down without cleanup) the
watchdog ends the process when a collective times out, before Python can see an error; our trainer sets it to 2
("CleanUpOnly": the communicators are aborted and the error is raised in the training loop) on GPU nodes, see
docs/recovery.md. Only gloo runs on this machine.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import traceback

from . import channel, reform, snapshot, waiting

log = logging.getLogger("training")

# What a collective's failure says (gloo, NCCL, the c10d store): anything else is not a lost peer.
PEER_GONE = re.compile(r"gloo|NCCL|ProcessGroup|c10d|Connection (reset|closed|refused)|[Tt]imed out|Broken pipe|"
                       r"[Ss]ocket")


def lost_peer(err: BaseException) -> bool:
    """Whether ``err`` is a collective that failed because a peer is gone (torch's DistError, or gloo's and NCCL's
    RuntimeError: "Connection reset by peer", a timeout)."""
    import torch.distributed as dist

    return isinstance(err, dist.DistError) or (isinstance(err, RuntimeError) and bool(PEER_GONE.search(str(err))))


def peer_failed(err: BaseException) -> bool:
    """Whether ``err`` comes of a collective that failed (:func:`lost_peer`), itself or anywhere in what caused it --
    the survivors' fallback raises its own error from the failed collective's -- so the rank exits
    ``channel.EXIT_PEER_FAILED``, not as a failure of its own."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        if lost_peer(err):
            return True
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return False


def said_peer_failed(timeout: float) -> int:
    """The error being handled, as an uncaught one prints it (the run's culprit line reads it), one line, and
    ``channel.EXIT_PEER_FAILED``: the rank's exit code when :func:`peer_failed` -- RECOVER may start every process
    again (``multinode.app.decide``)."""
    traceback.print_exc()
    log.error("a collective failed with nothing of this rank's own wrong (a peer gone, or slower than the "
              "process-group timeout, %g s): exit %d", timeout, channel.EXIT_PEER_FAILED)
    return channel.EXIT_PEER_FAILED


@contextlib.contextmanager
def on_peer_loss(save):
    """Around one step of a user's loop (``training.preempt.on_peer_loss``): ``save(err)`` on a lost peer, then the
    error raised again."""
    try:
        yield
    except Exception as err:
        if lost_peer(err):
            save(err)
        raise


@contextlib.contextmanager
def keep(trainer, epoch: int, step, state_of):
    """Around one optimizer step of ``epoch`` (a :class:`training.sampler.Step`): on a lost peer, the last
    completed step written on this node (module doc), then the error raised again. ``state_of(trainer, epoch,
    consumed)``: what a snapshot holds (:func:`training.checkpoint.state_of`)."""
    if not _keeps(trainer):
        yield
        return
    rng, steps_before = snapshot.rng_state(), trainer.step
    watch = waiting.of(trainer.world.rank).step(steps_before) if trainer.world.member is not None else \
        contextlib.nullcontext()
    try:
        with watch:  # a step far past its typical time is said: the run looks for a peer gone without a word
            yield
    except reform.Change:
        raise  # not a failure: the agreed change of the membership
    except Exception as err:
        completed = trainer.step > steps_before  # failed after the update: that step is kept
        consumed = step.consumed if completed else step.consumed - step.size
        if trainer.world.member is not None and lost_peer(err):  # the survivors go on in their processes
            raise reform.lost(err, (epoch, consumed), None if completed else rng) from err
        _kept(trainer, err, lambda: state_of(trainer, epoch, consumed), None if completed else rng)
        raise


@contextlib.contextmanager
def keep_between(trainer, next_epoch: int, state_of):
    """Around what runs between an epoch's last step and the next epoch's first (the validation, the epoch's sums,
    the periodic snapshot, the early-stopping vote): on a lost peer, the state at the start of ``next_epoch``
    written on this node -- every step of the epoch, the scheduler stepped, the RNG as it is (the trainer draws
    from it before the first collective of that stretch) -- then the error raised again."""
    if not _keeps(trainer):
        yield
        return
    watch = waiting.of(trainer.world.rank, "epoch end", warmup=1).step(trainer.step) \
        if trainer.world.member is not None else contextlib.nullcontext()
    try:
        with watch:
            yield
    except reform.Change:
        raise
    except Exception as err:
        if trainer.world.member is not None and lost_peer(err):
            raise reform.lost(err, (next_epoch, 0), None) from err
        _kept(trainer, err, lambda: state_of(trainer, next_epoch, 0), None)
        raise


def _keeps(trainer) -> bool:
    """A distributed job with a snapshot directory, or whose membership can change: the kinds with peers to lose
    and somewhere to keep the last step (a file, or the memory the survivors go on with). ``MULTINODE_SURVIVOR=0``
    asks for a trainer without the snapshot (the baselines of ``bench.spotday``: a user's trainer that resumes from
    its last periodic checkpoint, on the restart path)."""
    if trainer.world.backend is None:
        return False
    wanted = os.environ.get(channel.SURVIVOR_ENV, "1").strip() != "0"
    return (wanted and bool(trainer.t.snapshot_dir)) or trainer.world.member is not None


def _kept(trainer, err: BaseException, state, rng: dict | None) -> None:
    """On a lost peer (``err``), the first rank of this node writes ``state()``; the others on it hold the same."""
    if lost_peer(err) and trainer.world.local_rank == 0:
        save(trainer, state(), rng, err)


def save(trainer, state: dict, rng: dict | None, err: BaseException) -> None:
    """Write ``state`` (the last completed step) into this node's snapshot directory."""
    if rng is not None:
        state["rng"] = rng
    state["survivor"] = {"rank": trainer.world.rank, "host": socket.gethostname(), "error": str(err)[:300]}
    path = snapshot.save(trainer.t.snapshot_dir, state)
    trainer.runlog.heartbeat(trainer.step, force=True)
    log.warning("a peer is gone (%s): the last completed step kept: snapshot %s (epoch %d, %d samples of it "
                "trained, step %d)", str(err).splitlines()[0][:160], path, state["next_epoch"], state["consumed"],
                trainer.step)
