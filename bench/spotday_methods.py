"""The spot day's methods: the same job, the same trace, four ways, each on a fresh 4-node local cluster.

* :func:`ours` -- ``train --recover 20`` with RECOVER's defaults (RECOVER_WAIT, GRACE), the replacement estimate it
  would have on EC2 (:data:`EC2_ESTIMATE`) and the nodes' metadata endpoint for notices: a noticed node trains on
  while its replacement launches beside it and is let go when it is ready (a noticed head: every rank stops at the
  notice's deadline, the coordinated checkpoint, and the job starts again on the replacement), a lost peer's
  survivors keep their last step, the lost node is replaced (or the job goes on without it and grows back);
* :func:`restart` -- SkyPilot's managed-job strategy (its default, EAGER_NEXT_REGION: "it immediately terminates
  the cluster and relaunches it", sky/jobs/recovery_strategy.py ``EagerFailoverStrategyExecutor``; its docs: "the
  user application code can checkpoint its progress periodically to a mounted cloud bucket. The program can reload
  the latest checkpoint when restarted", docs.skypilot.co/en/latest/examples/managed-jobs.html): when the job fails
  with a node gone, the last periodic snapshot goes to a bucket (a directory here: its transfer costs nothing), the
  cluster is torn down, made again once capacity allows (retrying every 60 s) and its nodes' launch time has
  passed, and the job starts again from the bucket. Notices and rebalance recommendations are not read (SkyPilot's
  spot-notice hooks are an open PR, 9712); the job is started again the moment it fails (SkyPilot polls first);
* :func:`torchrun` -- ``torchrun --max-restarts 20`` on 4 fixed nodes with torch's default rendezvous join timeout,
  600 s (``RendezvousTimeout._DEFAULT_TIMEOUTS["join"]`` in torch/distributed/elastic/rendezvous/
  dynamic_rendezvous.py): a lost node's peers restart their workers and wait for it; the cloud brings a new node
  back by itself (an autoscaling group, :class:`bench.spotday_replay.Cloud`), whose torchrun the orchestrator
  starts again (MAX_RESTARTS' rejoin); every restart resumes from the last periodic snapshot. The head hosts the
  rendezvous: its loss ends the job, which the user starts again once the head is back;
* :func:`uninterrupted` -- the same job with nothing done to it: the reference.

The baselines run the trainer without the surviving ranks' snapshot (``MULTINODE_SURVIVOR=0``): a user's trainer
resumes from its last periodic checkpoint. Every method's ``train`` runs with the orchestrator's defaults (PG_TIMEOUT
30 s: a dead peer's collective fails after it) but ``LINKCHECK=warn``: the pre-flight
link check still measures every link, but a node slowed by the trace (its CPU held to 0.03 of a core) measures as a
broken link, and the default, ``refuse``, ended the first full replay's ``ours`` at its first recovery ("could not
start again: link check: node-3: 272 Mbit/s from node-2 ... its link is throttled or broken", 2026-11-27): a run
that cannot start again after a recovery is a failed run. Each method returns a :class:`MethodRun`: what was watched from outside
(:mod:`bench.spotday_watch`), each ``train``'s summary, the events as they were applied; ``bench.spotday_figures``
reads the figures out of it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.drills.common import watched
from bench.drills.preempt import IMDS_ENV
from bench.nodes import REPO, bring_up
from bench.spotday_replay import Cloud
from bench.spotday_trace import Trace
from bench.spotday_watch import Instances, SampleLog, Watch
from multinode.providers.aws.launches import PUBLISHED

NODES = 4
RECOVERIES = 20  # RECOVER and MAX_RESTARTS: more than any trace's events
BASELINE_ENV = "MULTINODE_SURVIVOR=0"
RELAUNCHES = 12  # a baseline started again more often than this is a failure of the replay, not of the method
# What ours would estimate a replacement takes on EC2 before its cluster's first launch (the AWS provider's published
# lower bound; then the median of its own launches, every one of which the trace makes 40 s or more): the local
# provider says so from MULTINODE_REPLACE_DELAY. Without it, it says "made at once", and a recovery that restarts
# every process (a notice on the head) waited up to RECOVER_WAIT for a replacement that takes the trace's 40-180 s,
# where on EC2 it goes on with the other nodes at once and grows back in their processes (ours, 2026-11-28: 50 s of
# four nodes idle for a 49 s replacement). Each replacement itself still takes its event's own seconds (the replay's
# replace-delay file, which the local provider reads instead of the variable).
EC2_ESTIMATE = {"MULTINODE_REPLACE_DELAY": f"{PUBLISHED.seconds:g}"}


@dataclass(frozen=True)
class Job:
    """``--workload digits EPOCHS SAVE_EVERY``, each step at least ``sample_seconds`` per sample of a rank's share."""

    epochs: int
    save_every: int
    sample_seconds: float

    def args(self) -> str:
        return (f"--workload digits {self.epochs} {self.save_every} --log-samples "
                f"--min-sample-seconds {self.sample_seconds:g}")


@dataclass
class MethodRun:
    """What one method's replay left (module doc); times are monotonic, ``t0`` the first ``train``'s start."""

    method: str
    t0: float
    end: float = 0.0
    invocations: list[dict] = field(default_factory=list)  # {"from", "to", "exit", "summary", "recovery"}
    gaps: list[dict] = field(default_factory=list)  # {"from", "to", "what"}: the method's own downtime
    samples: list[tuple[float, str]] = field(default_factory=list)
    paid: float = 0.0  # node-seconds
    applied: list[dict] = field(default_factory=list)
    load: list[float] = field(default_factory=list)  # the machine's 1-minute load average at t0 and at the end
    reports: dict[str, str] = field(default_factory=dict)  # run report paths, when asked for


class Replay:
    """One method's cluster, watchers and cloud (the replay's clock starts at :meth:`begin`)."""

    def __init__(self, method: str, job: Job, trace: Trace | None, replaces: str, reports: Path | None) -> None:
        self.cluster = bring_up(NODES, f"sd{method[:3]}")
        print(f"spotday: {method}: cluster {self.cluster.name} is up (MULTINODE_HOME={self.cluster.home})", flush=True)
        self.method, self.job, self.trace, self.replaces, self.reports = method, job, trace, replaces, reports
        names = [f"mn-{self.cluster.name}-{i}" for i in range(NODES)]
        files = [self.cluster.workdir(i) / "runs" / method / "samples.jsonl" for i in range(NODES)]
        self.watch = Watch(Instances(names, provider_dir=self.cluster.home / self.cluster.name / "provider"),
                           SampleLog(files))
        self.cloud: Cloud | None = None
        self.run: MethodRun | None = None
        self.bucket: Path | None = None  # the restart method's bucket (a directory), for the replay's whole day

    def begin(self) -> MethodRun:
        self.watch.start()
        self.run = MethodRun(self.method, time.monotonic(), load=[round(os.getloadavg()[0], 1)])
        if self.trace is not None:
            self.cloud = Cloud(self.cluster, self.trace, self.watch, self.run.t0, replaces=self.replaces,
                               run_id=self.method).start()
        return self.run

    def train(self, *extra: str, env: str = "", orchestrator: dict[str, str] | None = None) -> int:
        """One ``train`` of the job under the method's run id, to its end; its exit code (and summary kept).
        ``env``: the job's (``--env``); ``orchestrator``: more of the orchestrator's own environment."""
        start = time.monotonic()
        envs = [f"--env={env}"] if env else []
        proc = subprocess.Popen([sys.executable, "-m", "multinode", "train", "--nodes", str(NODES),
                                 f"--run-id={self.method}", "--linkcheck=warn", *extra, *envs,
                                 f"--args={self.job.args()}"], cwd=REPO, env=self.cluster.env(**(orchestrator or {})),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        with watched(proc) as (out, err):
            code = proc.wait(timeout=7200)
        self.watch.poll()
        run_dir = self.cluster.home / self.cluster.name / "runs" / self.method
        summary, recovery = _json(run_dir / "summary.json"), _json(run_dir / "recovery.json")
        if self.reports is not None and summary is not None:
            self._report(run_dir, len(self.run.invocations))
        if run_dir.exists():  # the next train of the run id starts new logs (the orchestrator appends to them)
            run_dir.rename(run_dir.with_name(f"{self.method}.train-{len(self.run.invocations)}"))
        self.run.invocations.append({"from": start, "to": time.monotonic(), "exit": code, "summary": summary,
                                     "recovery": recovery, "tail": "".join((out.lines + err.lines)[-30:])})
        print(f"spotday: {self.method}: train exited {code} after {time.monotonic() - start:.0f} s", flush=True)
        return code

    def _report(self, run_dir: Path, number: int) -> None:
        from multinode.diagnose.run_report import write

        self.reports.mkdir(parents=True, exist_ok=True)
        target = self.reports / f"spotday-{self.method}-{number}.html"
        shutil.copy(write(run_dir), target)
        self.run.reports[str(number)] = str(target)

    def finish(self) -> MethodRun:
        run = self.run
        run.end = time.monotonic()
        run.load.append(round(os.getloadavg()[0], 1))
        if self.cloud is not None:
            self.cloud.stop()
            run.applied = self.cloud.applied
        self.watch.stop()
        self.watch.instances.close(run.end)
        run.paid = self.watch.instances.paid(run.t0, run.end)
        run.samples = list(self.watch.samples.lines)
        return run

    def keep_logs(self) -> Path | None:
        """A failed replay's run logs (every train's node logs, stacks, summaries), copied out of the cluster's home
        before :meth:`down` removes it; where they are, said."""
        runs = self.cluster.home / self.cluster.name / "runs"
        if not runs.is_dir():
            return None
        kept = Path(tempfile.mkdtemp(prefix=f"mn-spotday-{self.method}-failed-"))
        try:
            shutil.copytree(runs, kept / "runs", symlinks=True, ignore=shutil.ignore_patterns("*.sock"))
        except OSError as err:  # the replay's own failure is the one to raise
            shutil.rmtree(kept, ignore_errors=True)
            print(f"spotday: {self.method}: its runs' logs could not be kept ({err})", flush=True)
            return None
        print(f"spotday: {self.method}: the replay failed; its runs' logs are kept in {kept / 'runs'}", flush=True)
        return kept / "runs"

    def down(self) -> None:
        if self.cloud is not None:
            self.cloud.stop()
        self.watch.stop()
        self.cluster.down()
        if self.bucket is not None:
            shutil.rmtree(self.bucket, ignore_errors=True)


def _json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _replay(method: str, job: Job, trace: Trace | None, replaces: str, reports: Path | None, body) -> MethodRun:
    replay = Replay(method, job, trace, replaces, reports)
    try:
        replay.begin()
        body(replay)
        return replay.finish()
    except BaseException:
        replay.keep_logs()
        raise
    finally:
        replay.down()


def ours(job: Job, trace: Trace, reports: Path | None = None) -> MethodRun:
    def body(replay: Replay) -> None:
        if replay.train(f"--recover={RECOVERIES}", env=IMDS_ENV, orchestrator=EC2_ESTIMATE) != 0:
            raise RuntimeError(f"ours: the run failed:\n{replay.run.invocations[-1]['tail']}")

    return _replay("ours", job, trace, "orchestrator", reports, body)


def uninterrupted(job: Job, trace: Trace | None = None, reports: Path | None = None) -> MethodRun:
    def body(replay: Replay) -> None:
        if replay.train() != 0:
            raise RuntimeError(f"uninterrupted: the run failed:\n{replay.run.invocations[-1]['tail']}")

    return _replay("uninterrupted", job, None, "method", reports, body)


def torchrun(job: Job, trace: Trace, reports: Path | None = None) -> MethodRun:
    def body(replay: Replay) -> None:
        for _ in range(RELAUNCHES):
            if replay.train(f"--max-restarts={RECOVERIES}", "--rdzv-timeout=600", env=BASELINE_ENV) == 0:
                return
            start = time.monotonic()  # the head was lost (or restarts ran out): started again once every node is back
            while any(replay.watch.instances.current(i) is None for i in range(NODES)):
                time.sleep(1.0)
                replay.watch.poll()
            replay.run.gaps.append({"from": start, "to": time.monotonic(), "what": "waiting for the head's new node"})
        raise RuntimeError(f"torchrun: still failing after {RELAUNCHES} starts:\n{replay.run.invocations[-1]['tail']}")

    return _replay("torchrun", job, trace, "cloud", reports, body)


def restart(job: Job, trace: Trace, reports: Path | None = None) -> MethodRun:
    def body(replay: Replay) -> None:
        for _ in range(RELAUNCHES):
            if replay.train(env=BASELINE_ENV) == 0:
                return
            if all(replay.watch.instances.current(i) is not None for i in range(NODES)):
                raise RuntimeError(f"restart: the job failed with every node there:\n"
                                   f"{replay.run.invocations[-1]['tail']}")
            _relaunch(replay)
        raise RuntimeError(f"restart: still failing after {RELAUNCHES} starts")

    return _replay("restart", job, trace, "method", reports, body)


def _relaunch(replay: Replay) -> None:
    """SkyPilot's recovery (module doc): the last periodic snapshot to the bucket, the cluster down, made again
    once capacity allows and its nodes have launched, the snapshot back on the new head. The bucket outlives the
    clusters: where the nodes still there hold no snapshot (a relaunch that failed before its first, on a head then
    taken), the bucket's last one is restored (it started again from step 1 in the full replay of 2026-11-27)."""
    cluster, start = replay.cluster, time.monotonic()
    if replay.bucket is None:
        replay.bucket = Path(tempfile.mkdtemp(prefix="mn-spotday-bucket-"))
    kept = _freshest_snapshot(replay)
    if kept is not None:
        for name in ("snapshot.pt", "snapshot.sha256"):
            if (kept / name).exists():
                shutil.copy(kept / name, replay.bucket / name)
    cluster.cli("down", timeout=300)
    replay.watch.poll()
    replay.cloud.wait_capacity()
    cluster.cli("up", "--nodes", str(NODES), timeout=300)
    cluster._inventory = None
    replay.watch.instances.booting.clear()
    replay.watch.poll()
    time.sleep(replay.cloud.last_replacement or 0.0)  # every new node launches at once: ready after its time
    target = cluster.workdir(0) / "runs" / replay.method / "snapshots"
    target.mkdir(parents=True, exist_ok=True)
    for path in replay.bucket.iterdir():
        shutil.copy(path, target / path.name)
    replay.run.gaps.append({"from": start, "to": time.monotonic(), "what": "whole cluster down and up again"})


def _freshest_snapshot(replay: Replay) -> Path | None:
    """The directory of the newest snapshot copy (primary or replica) on the nodes still there (a taken node's files
    stay on this machine until its cluster goes down: they are not the bucket's)."""
    alive = [i for i in range(NODES) if replay.watch.instances.current(i) is not None]
    found = [p for i in alive
             for p in (replay.cluster.workdir(i) / "runs" / replay.method / "snapshots").glob("**/snapshot.pt")]
    return max(found, key=lambda p: p.stat().st_mtime).parent if found else None


METHODS = {"uninterrupted": uninterrupted, "ours": ours, "torchrun": torchrun, "restart": restart}
