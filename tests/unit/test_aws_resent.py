"""multinode.providers.aws.resent: Terraform's error for a request the AWS SDK sent twice is found by its registry, and
``up``'s apply goes once more for it only (pure: the apply is a stand-in; the real one is
tests/integration/test_aws_lost_answer.py)."""

from __future__ import annotations

import pytest

from multinode.providers.aws.resent import RESENT, once_more_if_resent, resent_in
from multinode.providers.aws.terraform import TerraformFailed

# Terraform's error as the AWS provider 5.100 wrote it when moto answered the SDK's resend (the integration test's run)
LOST = ("Error: adding IAM Role (multinode-tflost-5c1965) to IAM Instance Profile (multinode-tflost-5c1965): operation "
        "error IAM: AddRoleToInstanceProfile, https response error StatusCode: 409, RequestID: 4qeJGOjGWlPCE46gYxiriY9l8Kl"
        "qHmMIWGIohMdNZJ01xjo4KpbL, LimitExceeded: Cannot exceed quota for InstanceSessionsPerInstanceProfile: 1\n")
OTHER = ("Error: creating IAM Role (multinode-x): operation error IAM: CreateRole, https response error StatusCode: 409, "
         "RequestID: 1, EntityAlreadyExists: Role with name multinode-x already exists.\n")


def test_the_resend_of_add_role_to_instance_profile_is_found_and_nothing_else_is():
    assert resent_in(LOST) is RESENT[0]
    assert resent_in(OTHER) is None and resent_in("") is None and resent_in(None) is None
    # the same code from another call is not it
    assert resent_in(LOST.replace("AddRoleToInstanceProfile", "CreateServiceLinkedRole")) is None


class Applies:
    def __init__(self, *outputs: str | None) -> None:
        self.outputs, self.calls = list(outputs), 0

    def __call__(self) -> str:
        self.calls += 1
        output = self.outputs.pop(0)
        if output is not None:
            raise TerraformFailed("'terraform apply' failed (exit code 1)", output)
        return ""


def test_up_applies_once_more_after_a_resend_with_one_line(capsys):
    apply = Applies(LOST, None)
    once_more_if_resent(apply)
    assert apply.calls == 2
    assert capsys.readouterr().err.splitlines() == [RESENT[0].line]
    assert RESENT[0].line.startswith("IAM answered AddRoleToInstanceProfile with LimitExceeded: ")


def test_any_other_failure_and_a_second_failure_are_raised_as_they_are(capsys):
    other = Applies(OTHER, None)
    with pytest.raises(TerraformFailed) as raised:
        once_more_if_resent(other)
    assert other.calls == 1 and raised.value.output == OTHER and capsys.readouterr().err == ""
    twice = Applies(LOST, LOST)
    with pytest.raises(TerraformFailed):
        once_more_if_resent(twice)
    assert twice.calls == 2  # once more, never a loop
