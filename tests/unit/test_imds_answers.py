"""The spot-notice watcher on AWS's own answers, not ours: the bodies aws/amazon-ec2-metadata-mock serves for
``spot/instance-action``, ``events/recommendations/rebalance`` and a path with no notice yet, recorded in
tests/unit/fixtures/ec2_metadata_mock (file, commit and line in its README). The local provider's endpoint is
checked against the same answers, so a misreading of AWS's format cannot hide by being on both sides."""

from __future__ import annotations

import json
import re
from pathlib import Path

from multinode.providers.local import imds as local_imds
from training import imds

FIXTURES = Path(__file__).parent / "fixtures" / "ec2_metadata_mock"
RFC3339_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


def answer(name: str) -> str:
    return (FIXTURES / name).read_text()


class RecordedService(imds.MetadataClient):
    """The client's HTTP replaced by the mock's recorded answers: {path: (status, body)}."""

    def __init__(self, answers: dict[str, tuple[int, str]]):
        super().__init__("http://169.254.169.254")
        self.answers = answers

    def _request(self, req):
        if req.get_method() == "PUT":
            return 200, "token"
        return self.answers.get(req.full_url.removeprefix(self.base), (404, answer("404.html")))


def test_the_mocks_interruption_notice_is_parsed():
    notice = imds.parse_instance_action(answer("instance-action.json"))
    assert (notice.kind, notice.action, notice.time) == ("interruption", "terminate", "2020-04-24T17:11:44Z")


def test_the_mocks_rebalance_recommendation_is_parsed():
    notice = imds.parse_rebalance(answer("rebalance.json"))
    assert (notice.kind, notice.time) == ("rebalance", "2020-10-16T19:18:24Z")


def test_the_client_reads_the_mocks_answers_and_its_404_is_no_notice():
    assert RecordedService({}).poll() is None
    rebalance = RecordedService({imds.REBALANCE: (200, answer("rebalance.json"))}).poll()
    assert (rebalance.kind, rebalance.time) == ("rebalance", "2020-10-16T19:18:24Z")
    both = RecordedService({imds.INSTANCE_ACTION: (200, answer("instance-action.json")),
                            imds.REBALANCE: (200, answer("rebalance.json"))}).poll()
    assert (both.kind, both.action) == ("interruption", "terminate")


def test_the_local_endpoint_answers_with_the_mocks_keys_and_time_format():
    armed = {"kind": "interruption", "action": "terminate", "visible_at": 1_600_000_000.0,
             "action_at": 1_600_000_120.0}
    ours = {path: json.loads(body) for path, body in local_imds.notice_bodies(armed, 1_600_000_001.0).items()}
    aws = {local_imds.INSTANCE_ACTION: json.loads(answer("instance-action.json")),
           local_imds.REBALANCE: json.loads(answer("rebalance.json"))}
    assert set(ours) == set(aws)
    for path, body in aws.items():
        assert set(ours[path]) == set(body), path
        for key, value in body.items():
            if RFC3339_UTC.match(value):
                assert RFC3339_UTC.match(ours[path][key]), (path, key, ours[path][key])
    assert local_imds.INSTANCE_ACTION == imds.INSTANCE_ACTION and local_imds.REBALANCE == imds.REBALANCE
