"""The EC2 instance metadata service, as much of it as spot notices need, inside a local node.

The watcher that runs on EC2 (``training/imds.py``) runs unchanged on a local node: :func:`start_endpoint`
adds AWS's address ``169.254.169.254/32`` to the node's loopback and serves, from a process inside the node's
network namespace, on port 80:

* ``PUT /latest/api/token`` (needs ``X-aws-ec2-metadata-token-ttl-seconds``; 400 without it) -> a token;
* ``GET /latest/meta-data/spot/instance-action`` and ``GET /latest/meta-data/events/recommendations/rebalance``
  with ``X-aws-ec2-metadata-token`` (401 without a valid one): 404 until a notice is armed, then AWS's
  documented bodies ``{"action": "terminate", "time": "..."}`` and ``{"noticeTime": "..."}``
  (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html,
  https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-data-categories.html,
  https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/configuring-instance-metadata-service.html).

Ranks find it at ``AWS_EC2_METADATA_SERVICE_ENDPOINT=http://169.254.169.254`` (the AWS SDKs' variable; setting
it is what tells the trainer to poll on a machine that is not EC2). :func:`arm_notice` writes the node's notice
file (``provider/<node>/imds/notice.json``), which the server reads on every request: ``make preempt NODE=1
IN=s [NOTICE=rebalance]`` is :func:`preempt`. The server is a process of the node: it ends with
:func:`stop_endpoint`, on its own after ``lifetime`` seconds, and with the node at ``down`` (every process of a
namespace is stopped there).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from multinode.core.errors import UserError
from multinode.core.inventory import node_name
from multinode.core.state import ClusterState
from multinode.providers.local import netns as localnet
from multinode.providers.local.meta import load_meta, net_plan, node_dir, node_index

ADDRESS, PORT = "169.254.169.254", 80
ENDPOINT = f"http://{ADDRESS}"
TOKEN_PATH = "/latest/api/token"
INSTANCE_ACTION = "/latest/meta-data/spot/instance-action"
REBALANCE = "/latest/meta-data/events/recommendations/rebalance"
WARNING_SECONDS = 120  # AWS: the interruption notice comes two minutes before the action
ACTIONS = ("terminate", "stop", "hibernate")


def _utc(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def notice_bodies(notice: dict | None, now: float) -> dict[str, str]:
    """{path: body} the service answers at ``now`` for an armed ``notice`` (pure; absent paths are 404)."""
    if not notice or now < notice["visible_at"]:
        return {}
    bodies = {REBALANCE: json.dumps({"noticeTime": _utc(notice["visible_at"])})}
    if notice["kind"] == "interruption":
        bodies[INSTANCE_ACTION] = json.dumps({"action": notice["action"], "time": _utc(notice["action_at"])})
    return bodies


class _Handler(BaseHTTPRequestHandler):
    notice_file: Path
    tokens: set[str]

    def log_message(self, fmt, *args):  # no access log on stderr
        pass

    def _answer(self, status: int, body: str = "") -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self):
        if self.path != TOKEN_PATH:
            return self._answer(404)
        if not (self.headers.get("X-aws-ec2-metadata-token-ttl-seconds") or "").isdigit():
            return self._answer(400, "Missing or invalid TTL header")
        token = secrets.token_urlsafe(32)
        self.tokens.add(token)
        return self._answer(200, token)

    def do_GET(self):
        if self.headers.get("X-aws-ec2-metadata-token") not in self.tokens:
            return self._answer(401)
        try:
            notice = json.loads(self.notice_file.read_text())
        except (OSError, ValueError):
            notice = None
        body = notice_bodies(notice, time.time()).get(self.path)
        return self._answer(200, body) if body is not None else self._answer(404)


def endpoint_server(notice_file: Path, host: str = ADDRESS, port: int = PORT) -> ThreadingHTTPServer:
    """The service's HTTP server, bound (port 0: any free one), answering from ``notice_file``."""
    handler = type("Handler", (_Handler,), {"notice_file": notice_file, "tokens": set()})
    return ThreadingHTTPServer((host, port), handler)


def serve(notice_file: Path, lifetime: float, host: str = ADDRESS, port: int = PORT) -> None:
    """Serve until ``lifetime`` seconds have passed (runs inside the node: see :func:`start_endpoint`)."""
    server = endpoint_server(notice_file, host, port)
    server.timeout = 0.5
    end = time.monotonic() + lifetime
    while time.monotonic() < end:
        server.handle_request()
    server.server_close()


def _imds_dir(state: ClusterState, node: str) -> Path:
    return node_dir(state, node) / "imds"


def _check_node(state: ClusterState, node: str) -> None:
    meta = load_meta(state)
    if meta is None:
        raise UserError(f"cluster {state.name!r} is not up; run 'make up' first")
    names = [f"node-{i}" for i in range(meta["nodes"])]
    if node not in names:
        raise UserError(f"NODE={node} is not a node of cluster {state.name!r}; its nodes are {', '.join(names)}")
    if not meta.get("isolated", True):
        raise UserError("a metadata endpoint needs network namespaces (root); this cluster runs on loopback")


def start_endpoint(state: ClusterState, node: str, lifetime: float = 900) -> int:
    """The metadata service inside ``node`` (no notice armed); its pid. Idempotent while it runs."""
    _check_node(state, node)
    where = _imds_dir(state, node)
    where.mkdir(parents=True, exist_ok=True)
    pid_file = where / "server.pid"
    if pid_file.exists() and Path(f"/proc/{pid_file.read_text().strip()}").exists():
        return int(pid_file.read_text())
    ns = net_plan(state).netns(node_index(node))
    localnet.run("ip", "-n", ns, "addr", "replace", f"{ADDRESS}/32", "dev", "lo")
    code = ("import sys; from pathlib import Path; from multinode.providers.local.imds import serve; "
            "serve(Path(sys.argv[1]), float(sys.argv[2]))")
    proc = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", code, str(where / "notice.json"),
                             str(lifetime)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=open(where / "server.log", "ab"), start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])})
    pid_file.write_text(str(proc.pid))
    _wait_listening(ns, proc)
    return proc.pid


def _wait_listening(ns: str, proc: subprocess.Popen, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"the metadata endpoint in {ns} exited with code {proc.returncode}")
        out = localnet.run("ip", "netns", "exec", ns, "ss", "-Hltn", f"sport = :{PORT}", check=False).stdout
        if ADDRESS in out:
            return
        time.sleep(0.1)
    raise RuntimeError(f"the metadata endpoint in {ns} did not listen within {timeout:.0f} s")


def endpoint_pid(state: ClusterState, node: str) -> int | None:
    """The pid of ``node``'s running metadata service, or None when none runs."""
    pid_file = _imds_dir(state, node) / "server.pid"
    pid = pid_file.read_text().strip() if pid_file.exists() else ""
    return int(pid) if pid.isdigit() and Path(f"/proc/{pid}").exists() else None


def stop_endpoint(state: ClusterState, node: str) -> None:
    """End ``node``'s metadata service and forget its notice."""
    where = _imds_dir(state, node)
    pid_file = where / "server.pid"
    if pid_file.exists():
        pid = int(pid_file.read_text())
        try:
            os.kill(pid, signal.SIGTERM)
            for _ in range(50):
                os.kill(pid, 0)
                time.sleep(0.1)
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        pid_file.unlink(missing_ok=True)
    (where / "notice.json").unlink(missing_ok=True)


def arm_notice(state: ClusterState, node: str, in_seconds: float = 0.0, action: str = "terminate",
               kind: str = "interruption") -> dict:
    """``node``'s metadata service shows a notice ``in_seconds`` from now: an interruption (``action`` two minutes
    after it appears, and a rebalance recommendation with it) or, with ``kind="rebalance"``, only the latter."""
    if not in_seconds >= 0:
        raise UserError(f"IN={in_seconds} must be 0 or more seconds")
    if action not in ACTIONS or kind not in ("interruption", "rebalance"):
        raise UserError(f"action={action!r} must be one of {', '.join(ACTIONS)}; kind interruption or rebalance")
    start_endpoint(state, node)
    visible = time.time() + in_seconds
    notice = {"kind": kind, "action": action, "visible_at": visible, "action_at": visible + WARNING_SECONDS}
    tmp = _imds_dir(state, node) / "notice.json.tmp"
    tmp.write_text(json.dumps(notice))
    os.replace(tmp, _imds_dir(state, node) / "notice.json")
    return notice


NOTICES = ("interruption", "rebalance")  # make preempt's NOTICE


def check_notice(notice: str) -> None:
    """UserError, in one line with the fix, for a NOTICE the service does not serve."""
    if notice not in NOTICES:
        raise UserError(f"NOTICE={notice} is not a notice the local metadata service serves; use NOTICE=interruption "
                        f"(spot/instance-action, the default) or NOTICE=rebalance (events/recommendations/rebalance)")


def preempt(cluster: str, node: str | int, in_seconds: float = 0.0, home: Path | None = None,
            notice: str = "interruption") -> str:
    """``make preempt NODE=n [IN=s] [NOTICE=rebalance]``: arm a spot interruption notice (or, with
    ``notice="rebalance"``, a rebalance recommendation only) on node ``n``; the line to print."""
    check_notice(notice)
    name = node_name(node)
    state = ClusterState.for_cluster(cluster, root=home)
    armed = arm_notice(state, name, float(in_seconds), kind=notice)
    if notice == "rebalance":
        return f"{name}: rebalance recommendation at {_utc(armed['visible_at'])}, served at {ENDPOINT}{REBALANCE}"
    return (f"{name}: spot interruption notice at {_utc(armed['visible_at'])} "
            f"({armed['action']} at {_utc(armed['action_at'])}), served at {ENDPOINT}{INSTANCE_ACTION}")


__all__ = ["ENDPOINT", "arm_notice", "endpoint_server", "notice_bodies", "preempt", "serve", "start_endpoint",
           "stop_endpoint"]
