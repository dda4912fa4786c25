"""Spot notices from the EC2 instance metadata service (IMDSv2), read with the standard library only.

It runs on every node (inside each rank, see :mod:`training.preempt`), so it imports nothing but the stdlib.
The same code reads AWS's real endpoint and the local provider's one (multinode/providers/local/imds.py),
which serves the same paths at the same address inside each simulated node.

What it relies on, as AWS documents it:

* IMDSv2 session: ``PUT /latest/api/token`` with header ``X-aws-ec2-metadata-token-ttl-seconds``; the body is
  the token, sent back on every read as ``X-aws-ec2-metadata-token``
  (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/configuring-instance-metadata-service.html).
* ``GET /latest/meta-data/spot/instance-action``: 404 until the instance is marked for interruption, then
  ``{"action": "terminate", "time": "2017-09-18T08:22:00Z"}`` (action ``hibernate``, ``stop`` or ``terminate``;
  the time in UTC, about two minutes ahead; "we recommend that you check for these interruption notices every
  5 seconds") -- https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html
* ``GET /latest/meta-data/events/recommendations/rebalance``: 404 until emitted, then
  ``{"noticeTime": "2020-11-05T08:22:00Z"}`` (instance metadata categories,
  https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-data-categories.html;
  https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/rebalance-recommendations.html).
* The endpoint: ``http://169.254.169.254`` unless ``AWS_EC2_METADATA_SERVICE_ENDPOINT`` names another, as the
  AWS SDKs do (https://docs.aws.amazon.com/sdkref/latest/guide/feature-imds-credentials.html).

A service that cannot be reached (not on EC2) is "no notice", never an error. The parser and the client are
tested on the answers of AWS's own mock, aws/amazon-ec2-metadata-mock (tests/unit/test_imds_answers.py).
"""

from __future__ import annotations

import calendar
import json
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

DEFAULT_ENDPOINT = "http://169.254.169.254"
ENDPOINT_ENV = "AWS_EC2_METADATA_SERVICE_ENDPOINT"
TOKEN_PATH = "/latest/api/token"
TOKEN_TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
INSTANCE_ACTION = "/latest/meta-data/spot/instance-action"
REBALANCE = "/latest/meta-data/events/recommendations/rebalance"
ACTIONS = ("hibernate", "stop", "terminate")
POLL_SECONDS = 5.0  # AWS: "check for these interruption notices every 5 seconds"
# IMDS is link-local: never through an http_proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class Notice:
    """A reason to checkpoint: ``kind`` is ``interruption``, ``rebalance``, ``signal`` or ``peer``; ``action``/``time``
    as AWS gives them (``time``: when the instance goes, or when a rebalance recommendation was emitted; None when
    unknown). Every kind but ``rebalance`` stops the job (:attr:`stops`)."""

    kind: str
    action: str | None = None
    time: str | None = None
    source: str = "imds"

    def describe(self) -> str:
        if self.kind == "interruption":
            return f"spot interruption notice ({self.action} at {self.time})"
        if self.kind == "rebalance":
            return f"rebalance recommendation (noticed {self.time})"
        return f"{self.action or 'signal'} ({self.source})"

    @property
    def stops(self) -> bool:
        """Whether the job stops for it. A rebalance recommendation does not: AWS's page calls it a signal "that a
        Spot Instance is at elevated risk of interruption", which "can arrive sooner than the two-minute Spot Instance
        interruption notice", and lists saving work to resume later among what to do; the instance is not taken
        until an interruption notice comes (which can arrive with it). So: save state, keep running
        (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/rebalance-recommendations.html, read 2026-11-25)."""
        return self.kind != "rebalance"

    def epoch(self) -> float | None:
        """``time`` as Unix seconds (AWS writes whole seconds, UTC, ``%Y-%m-%dT%H:%M:%SZ``); None if it has none."""
        if not self.time:
            return None
        try:
            return float(calendar.timegm(time.strptime(self.time, "%Y-%m-%dT%H:%M:%SZ")))
        except ValueError:
            return None

    def older_than(self, started: float) -> bool:
        """Whether its time is before ``started`` (Unix seconds): a notice left from before the run, ignored.
        Compared in whole seconds, as AWS writes the time (a notice of the run's own first second is not older)."""
        at = self.epoch()
        return at is not None and at < int(started)


class BadNotice(ValueError):
    """A metadata body that is not what AWS documents."""


def parse_instance_action(body: str) -> Notice:
    """``spot/instance-action``'s 200 body -> Notice (BadNotice on anything else)."""
    try:
        data = json.loads(body)
    except ValueError:
        raise BadNotice(f"spot/instance-action is not JSON: {body[:80]!r}") from None
    if not isinstance(data, dict) or data.get("action") not in ACTIONS or not isinstance(data.get("time"), str):
        raise BadNotice(f"spot/instance-action lacks action ({'|'.join(ACTIONS)}) and time: {body[:80]!r}")
    return Notice("interruption", data["action"], data["time"])


def parse_rebalance(body: str) -> Notice:
    """``events/recommendations/rebalance``'s 200 body -> Notice (BadNotice on anything else)."""
    try:
        data = json.loads(body)
    except ValueError:
        raise BadNotice(f"rebalance recommendation is not JSON: {body[:80]!r}") from None
    if not isinstance(data, dict) or not isinstance(data.get("noticeTime"), str):
        raise BadNotice(f"rebalance recommendation lacks noticeTime: {body[:80]!r}")
    return Notice("rebalance", None, data["noticeTime"])


def endpoint(env=None) -> str:
    env = os.environ if env is None else env
    return (env.get(ENDPOINT_ENV) or DEFAULT_ENDPOINT).rstrip("/")


class MetadataClient:
    """IMDSv2 reads with a cached session token, renewed before it expires (when less than a fifth of its
    ``ttl`` is left, at most 30 s: a read never carries a token about to lapse) and once more on a 401 (a token the
    service no longer takes). AWS's IMDSv2 page (link in the module doc): a token lives the TTL asked for (1 s to
    6 h) and a read with an expired one is answered 401 -- so waiting for the 401 costs a failed read each time."""

    def __init__(self, base: str | None = None, timeout: float = 1.0, ttl: int = 300, clock=time.monotonic):
        self.base, self.timeout, self.ttl, self.clock = base or endpoint(), timeout, ttl, clock
        self._token: str | None = None
        self._renew_at = 0.0

    def _request(self, req: urllib.request.Request) -> tuple[int, str]:
        try:
            with _OPENER.open(req, timeout=self.timeout) as resp:
                return resp.status, resp.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as err:
            return err.code, ""

    def token(self) -> str:
        if self._token is None or self.clock() >= self._renew_at:
            asked = self.clock()
            req = urllib.request.Request(self.base + TOKEN_PATH, method="PUT",
                                         headers={TOKEN_TTL_HEADER: str(self.ttl)})
            status, body = self._request(req)
            if status != 200 or not body:
                raise OSError(f"IMDS token: HTTP {status}")
            self._token, self._renew_at = body.strip(), asked + self.ttl - min(30.0, self.ttl / 5)
        return self._token

    def get(self, path: str) -> str | None:
        """The body of ``path``; None on 404 (no such item: no notice)."""
        for _ in range(2):
            req = urllib.request.Request(self.base + path, headers={TOKEN_HEADER: self.token()})
            status, body = self._request(req)
            if status == 401:  # the token expired: take a new one, once
                self._token = None
                continue
            if status == 404:
                return None
            if status != 200:
                raise OSError(f"IMDS {path}: HTTP {status}")
            return body
        raise OSError(f"IMDS {path}: token refused twice")

    def poll(self) -> Notice | None:
        """The interruption notice if there is one, else the rebalance recommendation, else None.
        Raises OSError when the service cannot be reached (the caller decides how often to retry)."""
        body = self.get(INSTANCE_ACTION)
        if body is not None:
            return parse_instance_action(body)
        body = self.get(REBALANCE)
        return parse_rebalance(body) if body is not None else None


def on_ec2() -> bool:
    """Best effort, without the network: the DMI vendor strings EC2's Nitro and Xen instances show."""
    for path in ("/sys/devices/virtual/dmi/id/sys_vendor", "/sys/devices/virtual/dmi/id/bios_vendor",
                 "/sys/hypervisor/uuid"):
        try:
            text = open(path, encoding="utf-8").read().strip().lower()
        except OSError:
            continue
        if "amazon" in text or text.startswith("ec2"):
            return True
    return False


def main(argv: list[str] | None = None) -> int:
    """``python -m training.imds``: one poll, printed as JSON (``null`` when there is no notice); exit 1 when
    the metadata service cannot be reached."""
    import sys

    try:
        notice = MetadataClient(timeout=2.0).poll()
    except (OSError, BadNotice) as err:
        print(f"imds: {endpoint()}: {err}", file=sys.stderr)
        return 1
    print(json.dumps(None if notice is None else notice.__dict__))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def process_started(pid: int | None = None) -> float:
    """When this process started, in Unix seconds (Linux: ``/proc/<pid>/stat``'s starttime after boot, ``/proc/stat``'s
    btime), so a notice that came while the rank imported torch is this run's; now where /proc cannot say."""
    try:
        stat = open(f"/proc/{pid or os.getpid()}/stat", encoding="ascii").read()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22; the name in () may hold spaces
        boot = next(int(line.split()[1]) for line in open("/proc/stat", encoding="ascii") if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()
