"""A loopback HTTP proxy in front of moto_server that answers chosen EC2 actions with EC2's own error document and
passes everything else through, so the real client (boto3's botocore, Terraform's AWS provider) parses a real
refusal: for the errors moto cannot be asked for (InsufficientInstanceCapacity, a DependencyViolation while network
interfaces detach). A rule may also lose an answer (:data:`LOSE`): the request reaches moto, which acts on it, and the
client's connection is reset before the answer -- what a dropped connection on the way back does to a real client.

The error document is the EC2 query API's (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html:
``<Response><Errors><Error><Code>..</Code><Message>..</Message></Error></Errors><RequestID>..</RequestID></Response>``);
client errors such as DependencyViolation come with HTTP 400, InsufficientInstanceCapacity with 500 (a server error).
"""

from __future__ import annotations

import json
import socket
import struct
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


# A rule's answer that passes the request to moto and resets the client's connection instead of answering (RST: an
# SO_LINGER of 0 before close): the client sees "connection reset by peer" after the server did the work.
LOSE = "lose the answer"
# A rule: (form fields of the request) -> None to pass it to moto, LOSE, or (HTTP status, code, message) to refuse it.
# The fields of a JSON-protocol request (Service Quotas) are its JSON body, with "Action" from its X-Amz-Target;
# every request also carries ":method", ":path" and ":range" (its Range header, or "").
Rule = Callable[[dict[str, str]], "tuple[int, str, str] | str | None"]
# An answer for an action moto does not implement: (form fields) -> None, or (HTTP status, body) -- EC2's XML
# document -- or (HTTP status, body, content type).
Answer = Callable[[dict[str, str]], "tuple[int, bytes] | tuple[int, bytes, str] | None"]


def request_fields(method: str, path: str, headers, body: bytes) -> dict:
    """The fields a rule sees (see Rule)."""
    target = headers.get("X-Amz-Target") or ""
    if target:
        fields = {**json.loads(body or b"{}"), "Action": target.rsplit(".", 1)[-1]}
    else:
        fields = {k: v[0] for k, v in urllib.parse.parse_qs(body.decode(errors="replace")).items()}
    return {**fields, ":method": method, ":path": path, ":range": headers.get("Range") or ""}


class RefusingProxy:
    """Forwards to ``target`` (moto); each request's form fields go through ``rule`` first. ``calls`` counts the
    requests by Action, ``refused`` the refusals."""

    def __init__(self, target: str, rule: Rule, answer: Answer | None = None) -> None:
        self.rule = rule
        self.answer = answer  # an action moto lacks: (form fields) -> EC2's XML answer (HTTP 200), or None
        self.calls: dict[str, int] = {}
        self.refused: list[tuple[str, str]] = []  # (action, code)
        self.requests: list[tuple[str, str, str]] = []  # (method, path, Range header) of every request
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, fmt, *args):
                pass

            def _forward(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                fields = request_fields(self.command, self.path, self.headers, body)
                action = fields.get("Action", "")
                proxy.calls[action] = proxy.calls.get(action, 0) + 1
                proxy.requests.append((self.command, self.path, fields[":range"]))
                refusal = proxy.rule(fields)
                if refusal == LOSE:
                    proxy.refused.append((action, LOSE))
                    return self._lose(body)
                if refusal:
                    status, code, message = refusal
                    proxy.refused.append((action, code))
                    return self._answer(status, error_document(code, message), {"Content-Type": "text/xml"})
                answered = proxy.answer(fields) if proxy.answer else None
                if answered is not None:
                    kind = answered[2] if len(answered) > 2 else "text/xml"
                    return self._answer(answered[0], answered[1], {"Content-Type": kind})
                return self._answer(*self._moto(body))

            def _moto(self, body):
                """moto's answer to this request: (HTTP status, body, headers)."""
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                req = urllib.request.Request(target + self.path, data=body or None, headers=headers, method=self.command)
                try:
                    with urllib.request.urlopen(req, timeout=120) as reply:
                        return reply.status, reply.read(), dict(reply.headers)
                except urllib.error.HTTPError as err:
                    return err.code, err.read(), dict(err.headers)

            def _lose(self, body):
                self._moto(body)  # moto acts on it (or refuses it); either way its answer goes nowhere
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.connection.close()
                self.close_connection = True

            def _answer(self, status, data, headers):
                self.send_response(status)
                length = str(len(data))
                for key, value in headers.items():
                    if key.lower() == "content-length" and self.command == "HEAD":
                        length = value  # a HEAD answer has no body but says the object's size
                    elif key.lower() not in ("content-length", "transfer-encoding", "connection", "server", "date"):
                        self.send_header(key, value)
                self.send_header("Content-Length", length)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _first(counts: dict[str, int], answer: Callable[[dict[str, str]], "tuple[int, str, str] | str"]) -> Rule:
    """A rule that gives the first ``counts[action]`` calls of each action ``answer(fields)`` and passes the rest."""
    left = dict(counts)

    def rule(fields: dict[str, str]):
        action = fields.get("Action", "")
        if left.get(action, 0) > 0:
            left[action] -= 1
            return answer(fields)
        return None

    return rule


def first_n(counts: dict[str, int], code: str, message: str, status: int = 400) -> Rule:
    """Refuse the first ``counts[action]`` calls of each action with ``code``; ``{id}`` in the message becomes the
    request's GroupId/SubnetId/VpcId."""
    def refusal(fields: dict[str, str]) -> tuple[int, str, str]:
        subject = fields.get("GroupId") or fields.get("SubnetId") or fields.get("VpcId") or "?"
        return status, code, message.replace("{id}", subject)

    return _first(counts, refusal)


def lose_first_n(counts: dict[str, int]) -> Rule:
    """Lose the answer (:data:`LOSE`) to the first ``counts[action]`` calls of each action."""
    return _first(counts, lambda fields: LOSE)


EC2_XMLNS = "http://ec2.amazonaws.com/doc/2016-11-15/"


class PlacementGroups:
    """The placement group API moto 5.2.5 lacks (Create/Describe/DeletePlacementGroup), answered from a dict in the
    shapes of AWS's EC2 API reference (CreatePlacementGroup: ``placementGroup``; DescribePlacementGroups:
    ``placementGroupSet`` of ``groupName, strategy, state, groupId, groupArn, tagSet``; an unknown name:
    ``InvalidPlacementGroup.Unknown``). Enough for Terraform's aws_placement_group to create, read and destroy one."""

    def __init__(self) -> None:
        self.groups: dict[str, dict] = {}

    def _item(self, tag: str, group: dict) -> str:
        tags = "".join(f"<item><key>{k}</key><value>{v}</value></item>" for k, v in group["tags"].items())
        return (f"<{tag}><groupName>{group['name']}</groupName><strategy>{group['strategy']}</strategy>"
                f"<state>available</state><groupId>{group['id']}</groupId><groupArn>arn:aws:ec2:us-east-1:123456789012:"
                f"placement-group/{group['name']}</groupArn><tagSet>{tags}</tagSet></{tag}>")

    def __call__(self, fields: dict[str, str]) -> "tuple[int, bytes] | None":
        action = fields.get("Action")
        head = f'<?xml version="1.0" encoding="UTF-8"?>\n<{action}Response xmlns="{EC2_XMLNS}"><requestId>pg-0</requestId>'
        tail = f"</{action}Response>"
        if action == "CreatePlacementGroup":
            name = fields["GroupName"]
            keys = sorted(k for k in fields if k.startswith("TagSpecification.1.Tag.") and k.endswith(".Key"))
            tags = {fields[k]: fields[k[:-4] + ".Value"] for k in keys}
            group = {"name": name, "strategy": fields.get("Strategy", "cluster"), "tags": tags,
                     "id": f"pg-{len(self.groups) + 1:017x}"}
            self.groups[name] = group
            return 200, (head + self._item("placementGroup", group) + tail).encode()
        if action == "DescribePlacementGroups":
            names = [v for k, v in fields.items() if k.startswith("GroupName.")]
            ids = [v for k, v in fields.items() if k.startswith("GroupId.")]
            found = [g for g in self.groups.values()
                     if (not names or g["name"] in names) and (not ids or g["id"] in ids)]
            if (names or ids) and not found:
                return 400, error_document("InvalidPlacementGroup.Unknown",
                                           f"The Placement Group '{(names or ids)[0]}' is unknown.")
            items = "".join(self._item("item", g) for g in found)
            return 200, (head + f"<placementGroupSet>{items}</placementGroupSet>" + tail).encode()
        if action == "DeletePlacementGroup":
            self.groups.pop(fields.get("GroupName", ""), None)
            return 200, (head + "<return>true</return>" + tail).encode()
        return None


def in_placement_group(fields: dict[str, str]) -> bool:
    """A RunInstances into a placement group (Placement.GroupName or Placement.GroupId, EC2 API reference)."""
    return fields.get("Action") == "RunInstances" and bool(fields.get("Placement.GroupName") or fields.get("Placement.GroupId"))
