"""The link check (``LINKCHECK=refuse|warn|off``, default refuse): before the job starts, every node's link to
its peers, measured in about a second for the whole cluster, so a throttled or broken link is named at
pre-flight instead of surfacing as a gloo ``Connection reset`` minutes into the job.

Who talks to whom: each node sends to its two ring neighbours (node i to i+1 and i-1; with two nodes, to the
other) and receives from them, all at once (:mod:`multinode.checks.linkprobe`). Every node then has two measured
links out and two in, so a bad node is the one common to the slow links -- whether its sending or its receiving
side is slow -- with 2N transfers in one round, where all pairs would take N(N-1).

A link is **slow** when it is below both ``ratio`` x the cluster's reference and the absolute ``floor`` (a
uniformly slow cluster is not refused: it is the cluster). The reference is the median of the faster half of the
links: a throttled node drags down every link it touches -- its sends, and the ACKs of what it receives -- which
on three nodes is four links of six, so the plain median would be its own figure. The verdict names the node(s)
at the most slow links (at least two; with two nodes, the slow direction), with its figures against the others'.

A node named slow is measured once more before anything is refused: alone with its two neighbours, the rest of
the cluster quiet (:func:`confirm`). On a real cluster that changes nothing (every node has its own CPU and NIC);
where many nodes share a few cores -- 64 local nodes on this 2-core machine -- one round of 128 transfers at once
measures the scheduler, and a healthy node can come out slow (it did, in the control-plane benchmark at N=64).
Only a node slow again on its own is named.

A slow link is the network's only if its probe had the CPU: a busy machine (a loaded head node; here, the test
suite on 2 cores) starves the probe, and a starved probe moves few bytes over a fast link (the suite's cold run saw
59 Mbit/s against 837 on one cluster). Each probe thread reads the scheduler's own account of itself
(:mod:`multinode.checks.linkprobe`): the share of its measuring time it was runnable but waiting for a CPU. A link
is judged by its **capacity**, what it carried per second that its probe was not kept waiting -- its figure over
(1 - the larger share of its two ends) -- against the same figure of the other links. Over a link the network holds
back, both ends sleep (the sender blocked on a full socket buffer, the receiver waiting for data): their share is
small and the capacity is the figure. A starved end waits: its link's capacity is what it could carry. Recorded on
3 local nodes (2 cores; tests/unit/test_links.py): a link throttled to 20 Mbit/s by tc tbf, ends waiting 0-57 % of
their time, idle or beside 6 CPU-bound processes at load 7.6: still 100 times below the others; a node whose probe
had 3 % of a CPU (a cgroup quota), its links 167-1081 Mbit/s against 11 Gbit/s with its end waiting 98-99 %: a
capacity like the others'. Such a link is **starved**, said in a warning naming the node whose CPU was busy, never
refused. A kernel that keeps no such account (no ``/proc/thread-self/schedstat``) leaves every link its figure.
"""

from __future__ import annotations

import re
import shlex
import statistics
from dataclasses import asdict, dataclass, field, replace

from multinode.checks.linkprobe import PROBE, parse_lines
from multinode.core.errors import PreflightFailed
from multinode.core.inventory import Inventory
from multinode.ssh.runner import RemoteRunner

# How a broken or throttled link shows in a rank's log: gloo's TCP transport (gloo/transport/tcp/pair.cc raises
# "Read error", "Write error", "writev", "Connection reset/closed/timed out"; unbound_buffer.cc "Timed out
# waiting ... for recv operation" -- seen on the throttled node itself), NCCL's socket transport
# (src/transport/net_socket.cc: "NET/Socket : socket progress error", "Connection closed by remote peer"),
# Open MPI's TCP BTL (btl_tcp_frag.c: "mca_btl_tcp_frag_recv: readv failed: Connection reset by peer").
# A rank that hangs makes its peers' gloo time out too: then the check after the failure finds the links fine.
CONNECTION_ERROR = re.compile(r"gloo/transport/tcp/(?:pair|unbound_buffer)\.cc.*(?:Read error|Write error|writev|"
                              r"Connection|Timed out)|"
                              r"NET/Socket.*(?:error|closed)|Connection closed by remote peer|"
                              r"btl_tcp.*(?:readv|writev|Connection)|Connection reset by peer")

WINDOW_S = 0.3  # each transfer's measuring window
FLOOR_MBIT = 1000.0  # a link is slow only below this...
RATIO = 0.2  # ... and below this fraction of the reference (the median of the faster half of the links)
# A node whose probe waited at least this share of its time for a CPU on some link: every link of it says its CPU.
# Recorded: a node held to 3 % of a core waits 99 %; a whole machine at load 7.6 left ends waiting up to 57 % (the
# throttled round of tests/unit/fixtures/linkcheck/rounds.json, whose throttled link must stay named).
BUSY_WAIT = 0.9
MOST_WAIT = 0.99  # a link's capacity is at most 100 times its figure (an end that waited 100 %: a bound, not 1/0)


@dataclass(frozen=True)
class Link:
    src: str
    dst: str
    mbit_s: float | None  # None: nothing arrived
    rtt_ms: float | None
    cpu_wait: float | None = None  # the larger share of its measuring time an end waited for a CPU (None: unknown)
    waited: str | None = None  # the node of that end

    @property
    def capacity(self) -> float | None:
        """Mbit/s per second its probe was not waiting for a CPU: the figure over (1 - ``cpu_wait``)."""
        if self.mbit_s is None or self.cpu_wait is None:
            return self.mbit_s
        return self.mbit_s / (1 - min(self.cpu_wait, MOST_WAIT))


@dataclass(frozen=True)
class LinkReport:
    links: list[Link]
    median_mbit_s: float | None
    slow: list[Link]
    culprits: list[str]
    errors: dict[str, list[str]]
    unmeasured: dict[str, str]  # nodes whose probe could not run (no python3, its port busy): not judged
    verdict: str  # "ok", or the one line naming the slow node(s)
    rechecked: dict[str, str] | None = None  # {node: the verdict when measured alone} for each node first named
    starved: list[Link] = field(default_factory=list)  # slow by their figure, not by their capacity: a busy CPU

    def to_json(self) -> dict:
        return asdict(self)


def connection_error(lines: list[str]) -> str | None:
    """The first line of a rank's log that reads like a broken connection (see CONNECTION_ERROR), else None."""
    return next((line.strip() for line in lines if CONNECTION_ERROR.search(line)), None)


def neighbours(names: list[str]) -> dict[str, list[str]]:
    """Each node's ring neighbours (both directions; the other node alone with two; none with one)."""
    n = len(names)
    return {name: sorted({names[(i + 1) % n], names[(i - 1) % n]} - {name}, key=names.index)
            for i, name in enumerate(names)}


def plan_probe(inv: Inventory, port: int, window: float = WINDOW_S) -> dict[str, str]:
    """Each node's command: the probe listening on ``port`` and sending to its ring neighbours, run by the
    inventory's interpreter (the host's: the one pre-flight checked, not whatever ``python3`` PATH finds first)
    without ``site`` (see :mod:`multinode.checks.linkprobe`)."""
    names = [n.name for n in inv.nodes]
    ring = neighbours(names)
    commands = {}
    for node in inv.nodes:
        peers = ",".join(f"{p}={inv.node(p).private_ip}" for p in ring[node.name])
        commands[node.name] = (f"{shlex.quote(inv.python)} -S -I -c {shlex.quote(PROBE)} {shlex.quote(node.name)} "
                               f"{port} {window} {len(ring[node.name])} {shlex.quote(peers)}")
    return commands


def parse(answers: dict[str, str]) -> tuple[list[Link], dict[str, list[str]]]:
    """The links (receiver's bandwidth, sender's round trip) and each node's errors from the probes' lines."""
    reports, errors = {}, {}
    for name, text in answers.items():
        reports[name] = parse_lines(text)
        if reports[name] is None:
            errors[name] = [f"the probe printed no result: {text.strip()[-200:] or 'nothing'}"]
        elif reports[name]["errors"]:
            errors[name] = reports[name]["errors"]
    ring = neighbours(list(answers))
    links = []
    for src, dsts in ring.items():
        for dst in dsts:
            got = ((reports.get(dst) or {}).get("in") or {}).get(src)
            out = ((reports.get(src) or {}).get("out") or {}).get(dst)
            sent = ((reports.get(src) or {}).get("sent") or {}).get(dst)
            mbit = got["bytes"] * 8 / got["seconds"] / 1e6 if got and got["seconds"] > 0 else None
            waits = [(share, node) for node, end in ((dst, got), (src, sent)) if (share := _wait_share(end)) is not None]
            share, node = max(waits) if waits else (None, None)
            links.append(Link(src, dst, mbit, out["rtt_ms"] if out else None, share, node))
    return links, errors


def _wait_share(end: dict | None) -> float | None:
    """The share of one end's measuring time its thread was runnable but waiting for a CPU (None: not known)."""
    if not end or end.get("wait") is None or end["wait"] < 0 or end["seconds"] <= 0:
        return None
    return round(min(end["wait"] / end["seconds"], 1.0), 3)


def rate(mbit: float | None) -> str:
    if mbit is None:
        return "nothing"
    return f"{mbit / 1000:.1f} Gbit/s" if mbit >= 1000 else f"{mbit:.0f} Mbit/s"


def span(low: float, high: float) -> str:
    """'9.1-9.8 Gbit/s', '120-480 Mbit/s', or '236 Mbit/s-8.0 Gbit/s'."""
    (a, unit_a), (b, unit_b) = rate(low).split(" "), rate(high).split(" ")
    return f"{a}-{b} {unit_b}" if unit_a == unit_b else f"{rate(low)}-{rate(high)}"


def judge(links: list[Link], errors: dict[str, list[str]], floor: float = FLOOR_MBIT, ratio: float = RATIO) -> LinkReport:
    """Slow links and the nodes they have in common; a node whose probe did not run is left out, not blamed."""
    unmeasured = {n: e[0] for n, e in errors.items() if e and (e[0].startswith("the probe printed no result")
                                                                 or " is busy" in e[0])}
    links = [x for x in links if x.src not in unmeasured and x.dst not in unmeasured]
    measured = sorted(x.mbit_s for x in links if x.mbit_s is not None)
    median = statistics.median(measured) if measured else None
    busy = _busy(links)
    # A link with a starved end is judged by that CPU, whichever end's wait its own figures caught: a receiver held
    # to 3 % of a core slows its neighbour's sending too (a full-suite run refused node-2 for its link to node-1).
    slow = [x for x in _below([x.capacity for x in links], links, floor, ratio) if not {x.src, x.dst} & busy.keys()]
    starved = [_charged(x, busy) for x in _below([x.mbit_s for x in links], links, floor, ratio) if x not in slow]
    culprits = culprits_of(links, slow)
    return LinkReport(links, median, slow, culprits, errors, unmeasured, verdict(links, slow, culprits), starved=starved)


def _busy(links: list[Link]) -> dict[str, float]:
    """{node: the largest share of time its probe waited for a CPU} for the nodes that waited at least
    :data:`BUSY_WAIT` on some link."""
    busy: dict[str, float] = {}
    for x in links:
        if x.waited is not None and (x.cpu_wait or 0.0) >= BUSY_WAIT:
            busy[x.waited] = max(busy.get(x.waited, 0.0), x.cpu_wait or 0.0)
    return busy


def _charged(link: Link, busy: dict[str, float]) -> Link:
    """``link`` charged to its busy end (the one that waited most over all its links), when it has one."""
    ends = [n for n in (link.src, link.dst) if n in busy]
    if not ends or link.waited in ends:
        return link
    node = max(ends, key=busy.__getitem__)
    return replace(link, waited=node, cpu_wait=busy[node])


def _below(figures: list[float | None], links: list[Link], floor: float, ratio: float) -> list[Link]:
    """The links whose figure (None: nothing arrived) is below both ``floor`` and ``ratio`` x the reference, the
    median of the faster half of the figures."""
    known = sorted(f for f in figures if f is not None)
    reference = statistics.median(known[len(known) // 2:]) if known else None
    return [x for x, f in zip(links, figures) if f is None or (reference is not None and f < min(floor, ratio * reference))]


def culprits_of(links: list[Link], slow: list[Link]) -> list[str]:
    """The node(s) at the most slow links, when that is at least two and not every node alike; else the slow
    links' senders (two nodes: the slow direction)."""
    nodes = list(dict.fromkeys(x.src for x in links))
    count = {n: sum(n in (x.src, x.dst) for x in slow) for n in nodes}
    most = max(count.values(), default=0)
    named = [n for n in nodes if count[n] == most]
    if most >= 2 and len(named) < len(nodes):
        return named
    return sorted({x.src for x in slow}, key=nodes.index)


def verdict(links: list[Link], slow: list[Link], culprits: list[str]) -> str:
    """'ok', or one line per the issue's shape: 'node-2: 18 Mbit/s to node-0 (others 9.1-9.8 Gbit/s): ...'."""
    if not slow:
        return "ok"
    fine = [x.mbit_s for x in links if x not in slow and x.mbit_s is not None]
    others = f"others {span(min(fine), max(fine))}" if fine else "no link was fast"
    parts = []
    for node in culprits or sorted({x.src for x in slow}):
        mine = sorted((x for x in slow if node in (x.src, x.dst)), key=lambda x: x.mbit_s or 0.0)  # worst first
        figures = ", ".join(f"{rate(x.mbit_s)} {'to ' + x.dst if x.src == node else 'from ' + x.src}" for x in mine)
        parts.append(f"{node}: {figures}")
    return f"{'; '.join(parts)} ({others}): its link is throttled or broken"


def busy_cpu(starved: list[Link]) -> str:
    """'node-1's CPU was busy (its probe waited 99 % of its time for one): 167 Mbit/s from node-0, ...', one clause
    per node whose probe was starved."""
    parts = []
    for node in dict.fromkeys(x.waited for x in starved):
        mine = [x for x in starved if x.waited == node]
        figures = ", ".join(f"{rate(x.mbit_s)} {'to ' + x.dst if x.src == node else 'from ' + x.src}" for x in mine)
        parts.append(f"{node}'s CPU was busy (its probe waited {max(x.cpu_wait or 0.0 for x in mine):.0%} of its "
                     f"time for one): {figures}")
    return "; ".join(parts)


def measure(runner: RemoteRunner, inv: Inventory, port: int) -> LinkReport:
    """One round: every node of ``inv`` probes its ring neighbours at once; judged."""
    results = runner.run_each(plan_probe(inv, port), timeout=WINDOW_S + 10)
    answers = {name: (res.stdout if res.exit_code == 0 else f"{res.stdout}{res.stderr}{res.error or ''}")
               for name, res in results.items()}
    return judge(*parse(answers))


def confirm(runner: RemoteRunner, inv: Inventory, port: int, report: LinkReport) -> LinkReport:
    """Each named node measured again alone with its ring neighbours, one after the other; the report keeps
    the nodes slow again (with the whole round's figures) and says what each second look found."""
    if not report.culprits or len(inv.nodes) <= 3:  # three nodes or fewer: the round was that measurement
        return report
    ring = neighbours([n.name for n in inv.nodes])
    again = {name: measure(runner, inv.only([name, *ring[name]]), port) for name in report.culprits}
    still = [name for name in report.culprits if name in again[name].culprits]
    slow = [x for x in report.slow if x.src in still or x.dst in still]
    return replace(report, slow=slow, culprits=still, verdict=verdict(report.links, slow, still),
                   rechecked={name: again[name].verdict for name in report.culprits})


def link_check(runner: RemoteRunner, inv: Inventory, mode: str, port: int) -> LinkReport:
    """Measure (one round on every node, a second look at any node named), judge, and refuse (``refuse``) or say
    (``warn``) a slow link; ``report`` only measures and judges (after a failure: the summary shows it)."""
    report = confirm(runner, inv, port, measure(runner, inv, port))
    if mode == "report":
        return report
    for node, why in report.unmeasured.items():
        runner.say(f"warning: link check: {node} not measured: {why}")
    if report.starved:
        runner.say(f"warning: link check: {busy_cpu(report.starved)}: slow for the CPU its probe had, not for the "
                   "link (not refused)")
    if report.verdict != "ok":
        if mode == "refuse":
            raise PreflightFailed(f"link check: {report.verdict}; LINKCHECK=warn runs anyway")
        runner.say(f"warning: link check: {report.verdict} (LINKCHECK=warn: running anyway)")
    elif report.median_mbit_s is not None:
        rtts = [x.rtt_ms for x in report.links if x.rtt_ms is not None]
        runner.say(f"link check: {len(report.links)} links, median {rate(report.median_mbit_s)}"
                   + (f", round trip {statistics.median(rtts):.2f} ms" if rtts else ""))
    return report
