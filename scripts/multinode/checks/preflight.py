"""Pre-flight: before a job starts, prove every node can run it, in parallel, within a deadline.

Checks, in order (each failure is one line naming the node and the fix, and nothing is started):

1. every node answers SSH with the pinned host key (retried with back-off until the deadline);
2. every node other than the head reaches the head on the cluster network (where the rendezvous is);
3. every node has the runtime (the inventory's Python, or the container CLI and image); whether that Python has
   torch, and the same one everywhere, is the software probe's (:mod:`multinode.checks.software`); GPUs are checked
   next, inside the runtime, by the smoke test of :mod:`multinode.checks.gpu`;
4. torchrun modes: the rendezvous port is free on the head node;
5. mpi modes: the head can SSH to every other node with the cluster key (mpirun needs it).

In the same round each node looks up the names of the peers its ranks talk to (the head: every node; the others:
the head), by the address as c10d sees it on a dual-stack socket (``::ffff:<ip>``); a node that cannot is named in
one warning line (:func:`resolve_warning`), not refused: the job runs, but every rank prints c10d's "hostname of
the client socket cannot be retrieved" and each lookup may wait on an unreachable DNS.
"""

from __future__ import annotations

import secrets
import shlex
import socket
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from multinode.core.errors import PreflightFailed
from multinode.core.inventory import Inventory
from multinode.ssh.runner import CommandResult, RemoteRunner
from multinode.ssh.connect import refused


def refuse_unreachable(inv: Inventory, failed: dict[str, str]) -> None:
    """One line naming the first node that does not answer SSH (a refused key first: waiting cannot fix it)."""
    if not failed:
        return
    name, why = next(iter(failed.items()))
    node = inv.node(name)
    others = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
    raise PreflightFailed(
        f"{name} ({node.ssh_user}@{node.ssh_host}:{node.ssh_port}) does not answer SSH{others}: {why}; "
        f"check the cluster with 'make status' (or 'make down' and 'make up')"
    )


def _check_script(checks: list[tuple[str, str]]) -> str:
    """A shell script that runs every check and prints 'FAIL <what>: <output>' for each that fails."""
    parts = []
    for desc, command in checks:
        parts.append(
            f"out=$( {{ {command}; }} 2>&1 ) || echo \"FAIL {desc}: $(echo \"$out\" | tail -n 2 | tr '\\n' ' ')\""
        )
    return "\n".join(parts) or "true"


def port_check(port: int) -> tuple[str, str]:
    """Nothing listens on ``port``; when something does, what (``ss -p`` walks every process's descriptors: only
    then)."""
    return (f"rendezvous port {port} is free",
            f"[ -z \"$(ss -Hltn 'sport = :{port}')\" ] || {{ ss -Hltnp 'sport = :{port}'; false; }}")


def head_reach_check(inv: Inventory, port: int | None = None) -> tuple[str, str]:
    """From a non-head node: open a TCP connection to the head on its cluster address -- the route, firewall or
    security group that would keep this node from the rendezvous shows here, in 3 s, instead of as a rendezvous
    timeout once the job has started. With a rendezvous ``port`` that port itself (nothing listens there yet: the
    head's refusal is the answer that proves it reachable, and a security group that drops the port shows as no
    answer; and the head's sshd is not made to start a session for it), else (mpirun: no rendezvous) its sshd."""
    head = inv.head
    if port is None:
        return (f"{head.name} ({head.private_ip}) is reachable on the cluster network",
                f"timeout 3 bash -c '</dev/tcp/{head.private_ip}/{head.ssh_port}'")
    return (f"{head.name} ({head.private_ip}) is reachable on the cluster network at port {port}",
            f"r=$(LC_ALL=C timeout 3 bash -c '</dev/tcp/{head.private_ip}/{port}' 2>&1) || "
            f"case $r in *refused*) ;; *) echo \"${{r:-no answer within 3 s}}\"; false;; esac")


def mpi_mesh_check(inv: Inventory) -> tuple[str, str]:
    """From the head: SSH to every other node exactly the way mpirun will."""
    from multinode.plan.launchers.mpirun import mpi_ssh_args

    args = mpi_ssh_args(inv)
    probes = " && ".join(
        f"{{ ssh {args} {shlex.quote(f'{n.ssh_user}@{n.private_ip}')} true 2>&1 || {{ echo 'to {n.name}'; false; }}; }}"
        for n in inv.nodes[1:]
    )
    return ("the head can SSH to the other nodes", probes or "true")


RESOLVE = "peer names"  # the read label of the reverse lookups


def resolve_probe(inv: Inventory, name: str) -> str:
    """Print each peer address ``name`` cannot look up (2 s at most; nothing where getent is missing). One getent
    looks up every peer (the head has N-1: a process pair each cost the head 2(N-1) process starts per run); only
    when it fails (it stops at the first address it cannot look up) is each peer looked up on its own, in parallel,
    to name them all."""
    peers = [n for n in inv.nodes if n.name != name] if name == inv.head.name else [inv.head]
    if not peers:
        return "true"
    each = " ".join(f"{{ timeout 2 getent hosts ::ffff:{n.private_ip} >/dev/null || echo {n.name}={n.private_ip}; }} &"
                    for n in peers)
    if len(peers) == 1:
        return f"command -v getent >/dev/null && {{ {each} wait; }} || true"
    every = " ".join(f"::ffff:{n.private_ip}" for n in peers)
    return (f"if command -v getent >/dev/null && ! timeout 2 getent hosts {every} >/dev/null; then {each} wait; fi; "
            f"true")


def resolve_warning(unresolved: dict[str, str], order: Sequence[str] = ()) -> str | None:
    """One line naming the first node that cannot look up a peer's name ({node: the probe's output}), or None; the
    peers in ``order`` (the inventory's: the probe's parallel look-ups print in the order they end)."""
    failed = {node: out.split() for node, out in unresolved.items() if out.split()}
    if not failed:
        return None
    node, peers = next(iter(failed.items()))
    rank = {name: i for i, name in enumerate(order)}
    peers = sorted(peers, key=lambda peer: rank.get(peer.split("=")[0], len(rank)))
    others = f" (and {len(failed) - 1} more node(s))" if len(failed) > 1 else ""
    named = ", ".join(f"{peer.split('=')[0]} ({peer.split('=')[-1]})" for peer in peers)
    return (f"warning: {node} cannot look up the name of {named}{others}: every rank will print c10d's 'hostname of "
            f"the client socket cannot be retrieved' and may wait on DNS; give the nodes DNS hostnames (AWS: "
            f"enable_dns_hostnames on the VPC) or list every node in each node's /etc/hosts, also as ::ffff:<address>")


def _node_commands(inv: Inventory, checks: list[tuple[str, str]], need_mpi_ssh: bool, port: int | None,
                   reads: dict[str, dict[str, str]] | None, token: str) -> dict[str, str]:
    """Each node's one pre-flight script: the checks (plus the head's or the other nodes' own), then the reads,
    each read's output after a line ``<token> <label>``."""
    commands = {}
    for node in inv.nodes:
        node_checks = list(checks)
        if node.name != inv.head.name:
            node_checks.append(head_reach_check(inv, port))
        else:
            if port is not None:
                node_checks.append(port_check(port))
            if need_mpi_ssh and len(inv.nodes) > 1:
                node_checks.append(mpi_mesh_check(inv))
        commands[node.name] = _check_script(node_checks) + "".join(
            f"\nprintf '\\n%s\\n' {shlex.quote(f'{token} {label}')}; {{ {by_node[node.name]}; }} 2>&1"
            for label, by_node in (reads or {}).items())
    return commands


def _run_round(runner: RemoteRunner, commands: dict[str, str], end: float) -> dict[str, CommandResult]:
    """Run each node's script as soon as that node is connected; refuse (one line) when a node does not answer SSH."""
    inv = runner.inventory
    # Each node's checks start as soon as it is connected (no barrier after the connections): its login shell
    # and checks run while other nodes still connect.
    unreachable: dict[str, str] = {}
    results: dict[str, CommandResult] = {}

    def check(name: str) -> None:
        why = runner.connect_until([name], end).get(name)
        if why is not None:
            unreachable[name] = why
            return
        results[name] = runner.run_on(name, commands[name], timeout=max(5.0, end - time.monotonic()))

    errors = runner.parallel(check, list(commands), timeout=max(10.0, end - time.monotonic() + 10.0))
    for name, err in errors.items():
        if err is not None and name not in results:
            unreachable.setdefault(name, str(err))
    order = [n.name for n in inv.nodes]
    fatal = {n: unreachable[n] for n in order if n in unreachable and refused(unreachable[n])}
    refuse_unreachable(inv, {**fatal, **{n: unreachable[n] for n in order if n in unreachable}})
    return results


def _answers(inv: Inventory, results: dict[str, CommandResult], token: str, labels: list[str],
             port: int | None) -> dict[str, dict[str, str]]:
    """Refuse (one line) on the first node whose round failed or whose check failed; else the reads' outputs."""
    answers: dict[str, dict[str, str]] = {label: {} for label in labels}
    for node in inv.nodes:
        res = results[node.name]
        if res.exit_code is None:
            raise PreflightFailed(f"{node.name} stopped answering during pre-flight: {res.error}; check it with 'make status'")
        checked, outputs = split_reads(res.stdout, token)
        failures = [line[5:] for line in checked.splitlines() if line.startswith("FAIL ")]
        if failures:
            desc, _, output = failures[0].partition(": ")
            detail = f" ({output.strip()})" if output.strip() else ""
            raise PreflightFailed(f"{node.name}: pre-flight check '{desc}' failed{detail}{_hint(desc, port)}")
        for label in answers:
            answers[label][node.name] = outputs.get(label, "")
    return answers


def preflight(
    runner: RemoteRunner,
    *,
    checks: list[tuple[str, str]],
    need_mpi_ssh: bool = False,
    port: int | None = None,
    timeout: float = 30.0,
    reads: dict[str, dict[str, str]] | None = None,
) -> dict[str, dict[str, str]]:
    """Raise :class:`PreflightFailed` (one line) unless every node can run the job. ``reads``: {label: {node: command}},
    run after the checks in the same round, so they cost no round trip of their own (the software probe of
    :func:`multinode.checks.software.versions_probe`, the project's manifest); returns {label: {node: its output}}."""
    inv = runner.inventory
    end = time.monotonic() + timeout
    token = secrets.token_hex(8)  # separates the reads' outputs in the round's stdout
    reads = {**(reads or {}), RESOLVE: {n.name: resolve_probe(inv, n.name) for n in inv.nodes}}
    commands = _node_commands(inv, checks, need_mpi_ssh, port, reads, token)
    results = _run_round(runner, commands, end)
    answers = _answers(inv, results, token, list(reads), port)
    warning = resolve_warning(answers.pop(RESOLVE), [n.name for n in inv.nodes])
    if warning is not None:
        runner.say(warning)
    return answers


def split_reads(stdout: str, token: str) -> tuple[str, dict[str, str]]:
    """A pre-flight round's stdout: (what the checks printed, {label: what that read printed}). Each read's output
    follows a line ``<token> <label>`` (after a newline of its own: the output before it may not end with one)."""
    parts = stdout.split(f"\n{token} ")
    outputs = {}
    for part in parts[1:]:
        label, _, output = part.partition("\n")
        outputs[label] = output
    return parts[0], outputs


def _hint(failure: str, port: int | None) -> str:
    if failure.startswith("rendezvous port"):
        return f"; stop what listens there or pass RDZV_PORT=<another port> (e.g. {(port or 29500) + 1})"
    if "reachable on the cluster network" in failure:
        return "; the node cannot reach the head (the rendezvous): check routes and security groups within the cluster subnet"
    if failure.startswith("the head can SSH"):
        return "; mpirun starts remote ranks over SSH: check the nodes' authorized_keys and known_hosts"
    if failure.startswith("python"):
        return "; run 'make setup' (or fix the inventory's python)"
    return ""


def probe_ssh(inventory: Inventory, timeout: float = 5.0, command: str = "uptime -p 2>/dev/null || uptime"
              ) -> dict[str, tuple[bool, str]]:
    """For `status`: does each node answer SSH (and run ``command``)? {node: (ok, its output or why not)}."""
    with RemoteRunner(inventory, connect_timeout=timeout) as runner:
        results = runner.run_all(command, timeout=timeout)
    return {
        name: (res.ok, res.stdout.strip() if res.ok else (res.error or res.stderr.strip() or f"exit {res.exit_code}"))
        for name, res in results.items()
    }


def reach_tcp(inventory: Inventory, timeout: float = 1.0) -> dict[str, str]:
    """{node: why} of the nodes whose SSH port takes no TCP connection within ``timeout`` s, asked side by side. The
    node's kernel answers the handshake (from the listening socket's backlog) however busy or stopped its processes
    are: no answer means no route to the machine, not a slow one."""
    def reach(node) -> str | None:
        try:
            socket.create_connection((node.ssh_host, node.ssh_port), timeout=timeout).close()
            return None
        except OSError as err:
            return f"no TCP connection to {node.ssh_host}:{node.ssh_port} within {timeout:g} s ({str(err) or type(err).__name__})"

    nodes = list(inventory.nodes)
    with ThreadPoolExecutor(max(1, len(nodes)), thread_name_prefix="mn-reach") as pool:
        answers = list(pool.map(reach, nodes))
    return {node.name: why for node, why in zip(nodes, answers) if why is not None}


def start_mpi_sshds(runner: RemoteRunner, run_id: str, timeout: float = 30.0) -> None:
    """Docker runtime, MODE=mpi: start the image's sshd on every node but the head, then wait until
    the head reaches each of them exactly as mpirun will (the containers are removed with the run)."""
    from multinode.plan.runtime import mpi_sshd_shell

    inv = runner.inventory
    others = [n.name for n in inv.nodes[1:]]
    if not others:
        return
    results = runner.run_each({name: mpi_sshd_shell(inv, name, run_id) for name in others}, timeout=timeout)
    for name in others:
        res = results[name]
        if not res.ok:
            detail = (res.error or res.stderr.strip() or f"exit {res.exit_code}").splitlines()[-1:]
            raise PreflightFailed(f"{name}: the image's sshd did not start ({' '.join(detail)}); check the image with 'make status'")
    # mpirun runs in the head's container as the node's SSH user (multinode.plan.runtime): probe as that user.
    label, probe = mpi_mesh_check(inv)
    end = time.monotonic() + timeout
    while True:
        res = runner.run_on(inv.head.name, probe, timeout=15)
        if res.ok:
            return
        if time.monotonic() > end:
            output = " ".join((res.stdout + res.stderr).strip().splitlines()[-2:])
            raise PreflightFailed(f"{inv.head.name}: pre-flight check '{label}' failed ({output}){_hint(label, None)}")
        time.sleep(0.5)
