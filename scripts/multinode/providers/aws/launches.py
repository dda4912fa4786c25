"""How long this cluster's own nodes took from launch to ready, and what recovery expects of a replacement from it.

Every node ``up`` makes and every replacement is one sample in ``<provider dir>/launches.json``: its instance type,
the seconds from its ``LaunchTime`` (EC2's own record of the launch, DescribeInstances) to the moment the bootstrap
wait saw it ready (every status check, SSH, the ready marker: what a replacement waits for too), how it was made
(``up`` or ``replacement``) and when. :func:`estimate` is the median of the samples of the cluster's instance type:
recovery waits for a replacement only when that is shorter than a restart of the job
(:mod:`multinode.app.replacements`), and the timeline prints the basis.

Before there is a sample (a cluster made before this record existed), the estimate is a published figure, a lower
bound: about 29 s from RunInstances to an open SSH port on a c5.xlarge (1.5 s API call + 4.9 s pending to running +
17.2 s to a closed port + 5.6 s to an open one: ec2-boot-bench's sample output, daemonology.net, "EC2 boot time
benchmarking", 2021) -- before any of our bootstrap (drivers, torch, the image), so a replacement takes longer.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path

from multinode.core.inventory import Node
from multinode.providers.base import Estimate

RECORD = "launches.json"
PUBLISHED = Estimate(29.0, "published: at least 29 s from RunInstances to SSH on a c5.xlarge (ec2-boot-bench, "
                           "daemonology.net 2021), before the bootstrap")


def read(provider_dir: Path) -> list[dict]:
    try:
        found = json.loads((provider_dir / RECORD).read_text())
    except (OSError, ValueError):
        return []
    return found if isinstance(found, list) else []


def record(provider_dir: Path, ec2, nodes: Iterable[Node], how: str, ready_at: datetime) -> list[dict]:
    """Append one sample per node of ``nodes`` (ready at ``ready_at``, UTC) to the record; the samples added."""
    nodes = [n for n in nodes if n.instance_id]
    if not nodes:
        return []
    reply = ec2.describe_instances(InstanceIds=[n.instance_id for n in nodes])
    found = {i["InstanceId"]: i for r in reply["Reservations"] for i in r["Instances"]}
    added = [{"node": n.name, "instance_type": found[n.instance_id]["InstanceType"], "how": how,
              "seconds": round(max(0.0, (ready_at - found[n.instance_id]["LaunchTime"]).total_seconds()), 1),
              "at": ready_at.strftime("%Y-%m-%dT%H:%M:%SZ")}
             for n in nodes if n.instance_id in found and found[n.instance_id].get("LaunchTime")]
    (provider_dir / RECORD).write_text(json.dumps(read(provider_dir) + added, indent=1))
    return added


def estimate(provider_dir: Path, instance_types: Iterable[str]) -> Estimate:
    """The median launch-to-ready seconds of the cluster's own launches of ``instance_types`` (module doc); the
    published lower bound before there is one."""
    kinds = sorted(set(instance_types))
    samples = [s for s in read(provider_dir) if s.get("instance_type") in kinds and isinstance(s.get("seconds"), (int, float))]
    if not samples:
        return PUBLISHED
    median = statistics.median(s["seconds"] for s in samples)
    return Estimate(float(median), f"measured: median of {len(samples)} launch{'es' if len(samples) > 1 else ''} of "
                                   f"{', '.join(kinds)} in this cluster")


def now() -> datetime:
    return datetime.now(timezone.utc)


__all__ = ["PUBLISHED", "RECORD", "estimate", "now", "read", "record"]
