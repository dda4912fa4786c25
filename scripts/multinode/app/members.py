"""The job's membership while an attempt runs: the run's side of a membership change without a restart.

The ranks' side is ``training/membership.py``; the contract between the two is the job channel's
(``training/channel.py``): the run writes ``membership.json`` into the run directory of the nodes a change concerns
(one SSH command per node per change, never per step), the ranks send ``WORLD`` (generation 0: the job takes such
changes; later: the new world is training), ``KEPT`` (a survivor paused with the last completed step in memory) and
``JOINING`` (a new node's ranks are ready and wait in the rendezvous).

:class:`Members` is the run's account of it -- which generation the job is in, which nodes' hosts are in it --
and its writes:

* :meth:`Members.leave`: a node lost or noticed leaves; generation + 1, without its host, to the others (the
  survivors, paused, wait for exactly this) -- and to a noticed node let go while its ranks train
  (:mod:`multinode.app.stays`), whose ranks then leave at their next agreement;
* :meth:`Members.again`: every member paused and none left (a peer slower than the process-group timeout):
  generation + 1, the same hosts, to every node;
* :meth:`Members.join`: a replacement joins; generation + 1, with its host, to it alone first (its ranks start
  with it and say ``JOINING`` when ready), then (:meth:`Members.open`) to the others, which change at their next
  agreement -- so the running ranks pause only once the new ones are ready.

Whether the job can take a change is the loop's to ask (:meth:`Members.usable`): the run set
``MULTINODE_MEMBERSHIP`` for it (RECOVER, the static launcher, the same ranks on every node, no MPI), the job
said it takes changes (its ``WORLD`` of generation 0), the node is not the head (its rank 0 holds the job's store),
and some node is left.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from multinode.backends.base import RunContext
from multinode.core.nodepaths import run_dir as node_run_dir
from multinode.trainer import channel


class Members:
    """The job's membership as the run changes it (see the module doc)."""

    def __init__(self, ctx: RunContext, nproc: int, enabled: bool, say: Callable[[str], None],
                 reason: str = "") -> None:
        self.ctx, self.nproc, self.enabled, self.say = ctx, nproc, enabled, say
        self.reason = reason  # why not enabled, in words
        self.supported = False  # the job said it takes changes (its WORLD of generation 0)
        self.generation = 0
        self.formed = 0  # the newest generation the ranks said (WORLD) they formed
        self.names = [n.name for n in ctx.inv.nodes]  # the nodes in the job now, head first
        self.pending: dict[str, channel.Membership] = {}  # a joining node -> its generation, until it is ready
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="mn-members")  # the leaves' cuts and writes, in turn

    @classmethod
    def of(cls, ctx: RunContext, plan, say: Callable[[str], None]) -> "Members":
        """The attempt's members: enabled where the plan gives the ranks the membership file (static launcher)."""
        commands = getattr(plan, "commands", ())
        enabled = bool(commands) and all(channel.MEMBERSHIP_ENV in cmd.env for cmd in commands)
        nproc = commands[0].nproc if commands else 1
        return cls(ctx, nproc, enabled, say, "" if enabled else restart_reason(ctx.spec, plan))

    def path(self, name: str) -> str:
        return f"{node_run_dir(self.ctx.inv, name, self.ctx.spec.run_id)}/{channel.MEMBERSHIP_FILE}"

    def clear(self) -> None:
        """Before the job starts: no node holds an earlier attempt's membership (a rank would take it for its own)."""
        if self.enabled:
            self.ctx.runner.run_each({n: f"rm -f {self.path(n)}" for n in self.names}, timeout=15)

    def usable(self, name: str) -> str | None:
        """None when ``name`` can leave without a restart; else why not, in words."""
        if not self.enabled:
            return self.reason
        if not self.supported:
            return "the job did not say it takes membership changes (no WORLD record: a script without the helper)"
        if name == self.names[0]:
            return f"{name} is the head: its rank 0 holds the job's store"
        if name not in self.names or len(self.names) < 2:
            return f"no node would be left without {name}"
        return None

    def _hosts(self, names: list[str]) -> list[str]:
        by_name = {n.name: n.hostname for n in self.ctx.inv.nodes}
        return [by_name[name] for name in names]

    def _write(self, names: list[str], membership: channel.Membership) -> dict[str, BaseException | None]:
        text = membership.to_json().encode()
        return self.ctx.runner.parallel(lambda name: self.ctx.runner.put_bytes(name, self.path(name), text), names,
                                        timeout=15)

    def leave(self, name: str, first: Callable[[], object] = lambda: None, told: bool = False) -> channel.Membership:
        """``name`` leaves: the next generation, without it, written to every other node (:meth:`again`), and to
        ``name`` too when its ranks still train and are ``told`` (a noticed node let go: they read it and leave)."""
        self.names.remove(name)
        return self.again(first, (name,) if told else ())

    def again(self, first: Callable[[], object] = lambda: None, also: tuple[str, ...] = ()) -> channel.Membership:
        """The next generation of the members now -- the same hosts when every member paused and none left (a
        collective failed, every node answering) -- written to every one of them (and ``also`` to the nodes
        named) on the writer thread (in order, one change after the other), once ``first`` (a leave's cut-off of
        the survivors) has run; the account changes now."""
        self.generation += 1
        membership = channel.Membership(self.generation, self._hosts(self.names), self.nproc)
        names = list(self.names) + list(also)
        self._writer.submit(lambda: (first(), self._write(names, membership)))
        return membership

    def settle(self) -> None:
        """Wait for the leaves' cuts and writes still under way (each bounded by its commands' timeouts)."""
        self._writer.shutdown(wait=True)

    def join(self, name: str) -> channel.Membership:
        """``name`` (a replacement, prepared) joins: the next generation, with it, written to it alone."""
        self.generation += 1
        names = self.names + [name]
        membership = channel.Membership(self.generation, self._hosts(names), self.nproc, self._hosts([name]))
        self._write([name], membership)
        self.pending[name] = membership
        return membership

    def abandon(self, name: str) -> None:
        """``name``'s join given up before it was opened (its ranks ended first): its generation, written to it alone,
        is withdrawn -- the next change writes that number again, so the running ranks never wait for a generation
        nobody forms -- unless a later one was written since (then the ranks skip it as they skip any)."""
        membership = self.pending.pop(name, None)
        if membership is not None and membership.generation == self.generation:
            self.generation -= 1

    def pending_after(self, name: str) -> int:
        """The generation before ``name``'s pending one: it must have formed before ``name``'s is opened."""
        pending = self.pending.get(name)
        return pending.generation - 1 if pending else 0

    def open(self, name: str) -> bool:
        """``name``'s ranks are ready (``JOINING``): its generation written to the running nodes, which change to
        it at their next agreement. False when nothing was pending for it."""
        membership = self.pending.pop(name, None)
        if membership is None:
            return False
        self._write(list(self.names), membership)
        self.names.append(name)
        return True


def restart_reason(spec, plan) -> str:
    """Why a run's membership changes restart every process, in words (the plan gives the ranks no membership)."""
    if spec.recover_restart:
        return "RECOVER_RESTART=1"
    if spec.uses_mpi:
        return "MODE=mpi: an MPI rank's loss ends every rank (its runtime aborts the job)"
    launcher = getattr(plan, "launcher", None)
    if launcher == "torchrun":
        return "LAUNCHER=torchrun: its agent restarts every worker of the node"
    if launcher is None:
        return "the scheduler (SCHEDULER=slurm) owns the job's processes"
    if len(set(getattr(plan, "procs", ()) or (1,))) > 1:
        return "the nodes run different numbers of ranks (NPROC): a membership gives every node the same"
    return "the job was not planned to take membership changes"

