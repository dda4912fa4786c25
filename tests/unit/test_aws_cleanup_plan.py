"""Pure parts of the AWS clean-up: which resources a sweep matches, reap's expiry rule. (Where `make image
PUSH=1` pushes: tests/unit/test_image_delivery_plan.py.)"""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from multinode.providers.aws.reap import expired
from multinode.providers.aws.sweep import Target


def test_a_target_with_an_id_matches_only_that_cluster():
    ours = {"managed-by": "multinode", "cluster": "dev", "cluster-id": "1a2b3c"}
    twin = {**ours, "cluster-id": "ffffff"}
    assert Target("dev", "1a2b3c").matches(ours) and not Target("dev", "1a2b3c").matches(twin)
    assert Target("dev").matches(ours) and Target("dev").matches(twin)  # no local state: every cluster of the name
    assert not Target("dev").matches({"cluster": "dev"})  # not made by multinode
    assert {"Name": "tag:cluster-id", "Values": ["1a2b3c"]} in Target("dev", "1a2b3c").filters()
    assert [f["Name"] for f in Target("dev").filters()] == ["tag:managed-by", "tag:cluster"]


@pytest.mark.parametrize("expiry, gone", [("2026-11-22T18:00:00Z", True), ("2026-11-23T12:00:01Z", False),
                                          ("?", True), ("2026-11-23T12:00:00+00:00", True)])
def test_reap_takes_only_instances_past_their_expiry(expiry, gone):
    assert expired(expiry, datetime(2026, 11, 23, 12, 0, tzinfo=timezone.utc)) is gone
