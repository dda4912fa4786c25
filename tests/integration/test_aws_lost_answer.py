"""Issue 48: moto's 409 ``LimitExceeded`` on ``AddRoleToInstanceProfile``, seen once in a cold run, made on purpose.

The call is not idempotent (an instance profile holds one role) and carries no token, so when its answer is lost on
the way back the AWS SDK for Go v2 under Terraform's AWS provider sends it again (its standard retryer retries a
"connection reset": aws-sdk-go-v2 aws/retry/retryable_error.go, RetryableConnectionError), and the second request finds
the role already there: IAM (and moto) answer 409 LimitExceeded "Cannot exceed quota for
InstanceSessionsPerInstanceProfile: 1". The provider had made the profile before adding its role (5.100,
internal/service/iam/instance_profile.go: d.SetId, then instanceProfileAddRole), so Terraform keeps it, tainted.

The real Terraform binary and AWS provider against a real moto_server (test_aws_moto's fixtures), through
ec2_refusals.RefusingProxy: the first AddRoleToInstanceProfile reaches moto (the role is added) and its answer is
lost (the connection reset). Before: `up` failed with Terraform's 409 and destroyed what it made. Now: one line says
what happened and `up` applies once more, which replaces the tainted profile (multinode.providers.aws.resent).
"""

from __future__ import annotations

import boto3
import pytest
from ec2_refusals import LOSE, RefusingProxy, lose_first_n
from test_aws_capacity import _provider
from test_aws_moto import REGION, _instances, _spec, ec2, moto_url, offline_terraform, ssh_listener  # noqa: F401

from multinode.core.state import ClusterState

pytestmark = pytest.mark.integration


def test_a_lost_answer_to_add_role_to_instance_profile_is_applied_again_not_a_failed_up(
        ec2, offline_terraform, moto_url, tmp_path, ssh_listener, monkeypatch, capsys):
    proxy = RefusingProxy(moto_url, lose_first_n({"AddRoleToInstanceProfile": 1}))
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)  # Terraform's AWS provider and boto3 both
    state = ClusterState.for_cluster("tflost", root=tmp_path)
    provider = _provider(ssh_listener)
    try:
        inv = provider.up(_spec("tflost", nodes=1), state)
        err = capsys.readouterr().err
        assert proxy.refused == [("AddRoleToInstanceProfile", LOSE)]
        # the lost one, the SDK's resend (answered 409 by moto: Terraform's error, passed on), the second apply's
        assert proxy.calls["AddRoleToInstanceProfile"] == 3, proxy.calls
        assert "StatusCode: 409" in err and "LimitExceeded: Cannot exceed quota for InstanceSessionsPerInstanceProfile" in err
        lines = [line for line in err.splitlines() if "answered" in line]
        assert lines == [
            "IAM answered AddRoleToInstanceProfile with LimitExceeded: the role was already added by a "
            "request whose answer was lost and which the AWS SDK sent again; applying once more (Terraform replaces "
            "the instance profile it marked tainted)"], err
        iam = boto3.client("iam", region_name=REGION, endpoint_url=moto_url)
        profile = iam.get_instance_profile(InstanceProfileName=inv.extra["instance_role"])["InstanceProfile"]
        assert [role["RoleName"] for role in profile["Roles"]] == [inv.extra["instance_role"]]
        running = {i["InstanceId"] for i in _instances(ec2, "tflost") if i["State"]["Name"] == "running"}
        assert running == {n.instance_id for n in inv.nodes}
        provider.down(state)
    finally:
        proxy.close()
    assert iam.list_instance_profiles()["InstanceProfiles"] == []
