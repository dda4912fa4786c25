"""Requests the AWS SDK sent twice: answers that mean the first request did its work and its answer was lost on the
way back, and how ``up`` goes on (one registry, and the apply that heeds it).

The AWS SDK for Go v2 under Terraform's AWS provider sends a request again when its connection was reset, whatever the
call (its standard retryer: aws-sdk-go-v2 ``aws/retry/retryable_error.go``, ``RetryableConnectionError``, "connection
reset"). A call that carries no idempotency token then meets its own first request's work:

* ``AddRoleToInstanceProfile``: an instance profile holds one role, so the resend finds it there and IAM answers 409
  ``LimitExceeded`` ("Cannot exceed quota for InstanceSessionsPerInstanceProfile: 1"; moto answers the same). The AWS
  provider made the profile before adding its role (5.100 ``internal/service/iam/instance_profile.go``: ``d.SetId``,
  then ``instanceProfileAddRole``, which retries only IAM's eventual-consistency errors), so Terraform keeps the profile,
  tainted: a second apply replaces it (removes the role, deletes it, makes it again) and converges. Seen in one cold run
  against moto (2026-11-27) and made on purpose in tests/integration/test_aws_lost_answer.py.

EC2's RunInstances is not here: the provider sends a ClientToken with it (``terraform-<time><n>`` in moto's record of
the tests' requests), and EC2 answers a resend of a token it has seen with the first launch (EC2 API reference,
"Ensure idempotency"). A call here whose second apply would not converge (a create that fails before Terraform records the resource)
has no place in this registry: it fails ``up``, which destroys what it made.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass

from multinode.providers.aws.terraform import TerraformFailed


@dataclass(frozen=True)
class Resent:
    """One service's answer to a request sent twice: the call, the error code the second request gets, what happened
    in words, and why one more apply converges."""

    service: str
    action: str
    code: str
    meaning: str
    cure: str

    def found_in(self, output: str) -> bool:
        """Terraform's error line for it (the SDK's: ``operation error IAM: AddRoleToInstanceProfile, https response
        error StatusCode: 409, RequestID: ..., LimitExceeded: ...``)."""
        return re.search(rf"operation error {self.service}: {self.action}, .*\b{self.code}:", output) is not None

    @property
    def line(self) -> str:
        return (f"{self.service} answered {self.action} with {self.code}: {self.meaning}; "
                f"applying once more ({self.cure})")


RESENT = (
    Resent("IAM", "AddRoleToInstanceProfile", "LimitExceeded",
           "the role was already added by a request whose answer was lost and which the AWS SDK sent again",
           "Terraform replaces the instance profile it marked tainted"),
)


def resent_in(output: str | None) -> Resent | None:
    """The request sent twice that ``output`` (Terraform's stderr) names, else None."""
    return next((entry for entry in RESENT if entry.found_in(output or "")), None)


def once_more_if_resent(apply: Callable[[], object]) -> None:
    """``apply()``; when it fails on a request sent twice (:data:`RESENT`), one line and ``apply()`` once more (a
    second failure is raised as it is)."""
    try:
        apply()
    except TerraformFailed as err:
        entry = resent_in(err.output)
        if entry is None:
            raise
        print(entry.line, file=sys.stderr, flush=True)
        apply()


__all__ = ["RESENT", "Resent", "once_more_if_resent", "resent_in"]
