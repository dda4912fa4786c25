"""A loopback HTTP proxy in front of moto_server that answers chosen EC2 actions with EC2's own error document and
passes everything else through, so the real client (boto3's botocore, Terraform's AWS provider) parses a real
refusal: for the errors moto cannot be asked for (InsufficientInstanceCapacity, a DependencyViolation while network
interfaces detach).

The error document is the EC2 query API's (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html:
``<Response><Errors><Error><Code>..</Code><Message>..</Message></Error></Errors><RequestID>..</RequestID></Response>``);
client errors such as DependencyViolation come with HTTP 400, InsufficientInstanceCapacity with 500 (a server error).
"""

from __future__ import annotations

import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def error_document(code: str, message: str) -> bytes:
    return ("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>" + code + "</Code><Message>"
            + message + "</Message></Error></Errors><RequestID>5f1c7c7e-0000-4000-8000-000000000001</RequestID>"
            "</Response>").encode()


# A rule: (form fields of the request) -> None to pass it to moto, or (HTTP status, code, message) to refuse it.
Rule = Callable[[dict[str, str]], "tuple[int, str, str] | None"]


class RefusingProxy:
    """Forwards to ``target`` (moto); each request's form fields go through ``rule`` first. ``calls`` counts the
    requests by Action, ``refused`` the refusals."""

    def __init__(self, target: str, rule: Rule) -> None:
        self.rule = rule
        self.calls: dict[str, int] = {}
        self.refused: list[tuple[str, str]] = []  # (action, code)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, fmt, *args):
                pass

            def _forward(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                fields = {k: v[0] for k, v in urllib.parse.parse_qs(body.decode(errors="replace")).items()}
                action = fields.get("Action", "")
                proxy.calls[action] = proxy.calls.get(action, 0) + 1
                refusal = proxy.rule(fields) if action else None
                if refusal:
                    status, code, message = refusal
                    proxy.refused.append((action, code))
                    return self._answer(status, error_document(code, message), {"Content-Type": "text/xml"})
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                req = urllib.request.Request(target + self.path, data=body or None, headers=headers, method=self.command)
                try:
                    with urllib.request.urlopen(req, timeout=120) as reply:
                        return self._answer(reply.status, reply.read(), dict(reply.headers))
                except urllib.error.HTTPError as err:
                    return self._answer(err.code, err.read(), dict(err.headers))

            def _answer(self, status, data, headers):
                self.send_response(status)
                for key, value in headers.items():
                    if key.lower() not in ("content-length", "transfer-encoding", "connection", "server", "date"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def first_n(counts: dict[str, int], code: str, message: str, status: int = 400) -> Rule:
    """Refuse the first ``counts[action]`` calls of each action with ``code``; ``{id}`` in the message becomes the
    request's GroupId/SubnetId/VpcId."""
    left = dict(counts)

    def rule(fields: dict[str, str]):
        action = fields.get("Action", "")
        if left.get(action, 0) > 0:
            left[action] -= 1
            subject = fields.get("GroupId") or fields.get("SubnetId") or fields.get("VpcId") or "?"
            return status, code, message.replace("{id}", subject)
        return None

    return rule
