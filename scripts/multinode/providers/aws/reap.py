"""What an AWS cluster leaves behind: the leak check of ``down`` (:func:`verify_gone`) and ``make reap``
(:func:`reap`): expired instances and the resources of clusters whose instances are gone, listed or deleted.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from multinode.core.errors import UserError
from multinode.providers.aws import ec2 as aws_ec2
from multinode.providers.aws import sweep as aws_sweep


def verify_gone(ec2, cluster: str, region: str, cluster_id: str | None = None) -> list[str]:
    """Lines saying nothing of ``cluster`` (of that id, when given) bills; UserError naming the leaked instances otherwise."""
    leaks = [i for i in aws_ec2.tagged_instances(ec2, cluster) if cluster_id in (None, i.cluster_id)]
    scope = f"cluster={cluster}" + (f", cluster-id={cluster_id}" if cluster_id else "")
    if leaks:
        raise UserError(
            f"cluster {cluster!r} still has instances in a billing state: "
            f"{', '.join(f'{i.instance_id} ({i.state})' for i in leaks)}; "
            f"run 'make reap REGION={region} CLUSTER={cluster} YES=1'")
    return [f"verified: no instance tagged {scope}, managed-by=multinode is pending, running, stopping or stopped in {region}"]


def expired(expiry: str, now: datetime) -> bool:
    """Whether an ``expiry`` tag lies in the past; an unreadable one counts as expired (nobody's cluster)."""
    try:
        return datetime.fromisoformat(expiry.replace("Z", "+00:00")) <= now
    except ValueError:
        return True


def reap(region: str, cluster: str | None = None, yes: bool = False, ec2: Any = None,
         clients: aws_sweep.Clients | None = None, now: datetime | None = None) -> list[str]:
    """What multinode left behind in ``region`` (optionally of one cluster): instances still billing after
    their expiry tag (their TTL timer did not end them), and the tagged resources of clusters with no
    instance left (ended by their TTL). With ``yes`` they are terminated and deleted; an ECR repository
    that holds images is kept, as by ``down``. Clusters within their TTL are left alone."""
    ec2 = ec2 or aws_ec2.client(region)
    clients = clients or aws_sweep.Clients.for_region(region)
    now = now or datetime.now(timezone.utc)
    every = aws_ec2.tagged_instances(ec2, cluster)
    found = [i for i in every if expired(i.expiry, now)]
    scope = f"cluster={cluster}, managed-by=multinode" if cluster else "managed-by=multinode"
    lines = [i.describe() for i in found]
    if yes and found:
        aws_ec2.terminate(ec2, [i.instance_id for i in found])
        lines.append(f"terminated {len(found)} instances in {region}")
    billing = {(i.cluster, i.cluster_id) for i in aws_ec2.tagged_instances(ec2, cluster)}
    orphans = [t for t in aws_sweep.leftover_targets(clients, cluster) if (t.cluster, t.cluster_id) not in billing]
    for target in orphans:
        if yes:
            lines.extend(f"{target.describe()}: {line}" for line in aws_sweep.sweep(clients, target))
        else:
            lines.append(f"{target.describe()}: network, key pair, IAM role and ECR repository left behind (no instance)")
    alive = len(every) - len(found)
    if not found and not orphans:
        return [f"no expired instance or other leftover tagged {scope} in {region}"
                + (f" ({alive} instances within their TTL left alone)" if alive else "")]
    if not yes:
        lines.append(f"{len(found)} instances would be terminated and {len(orphans)} clusters' resources deleted; "
                     f"run 'make reap REGION={region} YES=1' to do it")
    return lines
