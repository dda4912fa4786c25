"""Pre-flight's look-up of the peers' names on real nodes (multinode.checks.preflight.resolve_probe): the head looks
up every peer with one getent, and only when that fails each peer alone, so that the warning names every peer it
cannot look up and no other."""

from __future__ import annotations

import dataclasses
import io

import pytest

from localcluster import Cluster

pytestmark = pytest.mark.integration


def test_the_head_names_exactly_the_peers_it_cannot_look_up(shared_cluster3: Cluster):
    from multinode.checks.preflight import resolve_probe, resolve_warning
    from multinode.ssh.runner import RemoteRunner

    inv = shared_cluster3.inventory()
    # Two peers no hosts file lists (addresses of the cluster subnet that no node has; nothing is sent to them:
    # the node's resolver reads its hosts file, then its nameserver, 127.0.0.1, which refuses).
    strangers = tuple(dataclasses.replace(inv.nodes[1], name=f"node-{9 + i}", private_ip=inv.nodes[1].private_ip[:-2]
                                          + str(90 + i)) for i in range(2))
    wider = dataclasses.replace(inv, nodes=(*inv.nodes, *strangers))
    with RemoteRunner(inv, out=io.StringIO()) as runner:
        known = runner.run_on("node-0", resolve_probe(inv, "node-0"), timeout=30)
        unknown = runner.run_on("node-0", resolve_probe(wider, "node-0"), timeout=30)
    assert known.ok and known.stdout.strip() == "", known
    assert unknown.ok and sorted(unknown.stdout.split()) == sorted(f"{n.name}={n.private_ip}" for n in strangers), unknown
    line = resolve_warning({"node-0": unknown.stdout}, [n.name for n in wider.nodes])
    assert line is not None and line.startswith(f"warning: node-0 cannot look up the name of {strangers[0].name} (")
    assert "node-1 (" not in line  # the peer it can look up is not named
