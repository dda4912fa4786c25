"""EC2's answers that refuse a launch, what each means and what may help: one registry (pure).

The codes and their meaning are AWS's list of EC2 API error codes
(https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html; the capacity ones as quoted in
aws/aws-parallelcluster-node PR 673, which classifies the same codes for fast fail-over):

* ``InsufficientInstanceCapacity``: not enough on-demand or spot capacity of the type in the zone now (RunInstances;
  also an instance's StateReason ``Server.InsufficientInstanceCapacity``). Capacity is per zone, and a later launch
  into a cluster placement group is more likely to get it (AWS's placement group guide): first outside the group,
  then in another zone.
* ``InsufficientCapacity``: "not enough capacity to fulfill your import instance request"; ``UnfulfillableCapacity``:
  "not enough spare capacity to fulfill your request for Spot Instances" -- AWS suggests "additional Availability
  Zones": the same moves.
* ``SpotMaxPriceTooLow``: the request's maximum spot price is below what EC2 asks now. A spot price is per type and
  zone (the maximum is the on-demand price unless one is set): another zone may be cheaper; the placement group has
  nothing to do with it.
* ``MaxSpotInstanceCountExceeded``: the account's spot limit is reached -- a quota ("All G and VT Spot Instance
  Requests" and the like, :mod:`multinode.providers.aws.quotas`); no zone or group helps.
* ``VcpuLimitExceeded``: "You've reached the limit on the number of vCPUs ... assigned to the running On-Demand
  instances in your account" -- a quota again ("Running On-Demand G and VT instances"); raise it.

Note: the AWS provider counts InsufficientInstanceCapacity on RunInstances as retryable (terraform-provider-aws,
internal/service/ec2 service_package.go) and retries it up to its max_retries (default 25) with back-off: infra/ec2
sets max_retries = var.max_retries (3), so a refusal surfaces in seconds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

OUTSIDE_GROUP, OTHER_ZONE = "outside the placement group", "another zone"


@dataclass(frozen=True)
class Refusal:
    """One EC2 error code that refuses a launch: ``kind`` (capacity, spot-price, spot-quota, vcpu-quota), what it
    means in words, and the moves that may help (in order)."""

    code: str
    kind: str
    meaning: str
    moves: tuple[str, ...]

    @property
    def quota(self) -> bool:
        """A quota of the account: no move helps, the user raises it (or the cluster asks for fewer vCPUs)."""
        return self.kind in ("spot-quota", "vcpu-quota")


REFUSALS = {r.code: r for r in (
    Refusal("InsufficientInstanceCapacity", "capacity", "no capacity of the type in the zone now",
            (OUTSIDE_GROUP, OTHER_ZONE)),
    Refusal("InsufficientCapacity", "capacity", "not enough capacity for the request now", (OUTSIDE_GROUP, OTHER_ZONE)),
    Refusal("UnfulfillableCapacity", "capacity", "not enough spare spot capacity for the request now",
            (OUTSIDE_GROUP, OTHER_ZONE)),
    Refusal("SpotMaxPriceTooLow", "spot-price", "the spot price of the type in the zone is above the request's "
            "maximum price (the on-demand price unless one is set)", (OTHER_ZONE,)),
    Refusal("MaxSpotInstanceCountExceeded", "spot-quota", "the account's spot instance quota is used up", ()),
    Refusal("VcpuLimitExceeded", "vcpu-quota", "the account's on-demand vCPU quota is used up", ()),
)}
_CODE = re.compile(r"\b(" + "|".join(REFUSALS) + r")\b")


def refusal_in(text: str | None) -> Refusal | None:
    """The first launch refusal named in ``text`` (Terraform's stderr, a StateReason message), else None."""
    found = _CODE.search(text or "")
    return REFUSALS[found.group(1)] if found else None


__all__ = ["OTHER_ZONE", "OUTSIDE_GROUP", "REFUSALS", "Refusal", "refusal_in"]
