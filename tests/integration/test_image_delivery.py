"""``make image PUSH=1`` delivered to a running container cluster through a real registry (issue 27, item 5).

A real registry -- Debian's ``docker-registry`` (the CNCF distribution registry, 2.8) -- serves plain HTTP on
this machine's address on the cluster's bridge, the one address the nodes can reach. The 2-node cluster runs
the CPU image from that registry (its inventory's image reference). ``make image IMAGE=cpu PUSH=1 CLUSTER=..``
then builds (a layer-cache hit), pushes to exactly that reference and has every node pull it: the registry's
access log shows each node's own address fetching the manifest, and ``make`` prints one line per node.
Podman and buildah reach the plain-HTTP registry through a registries.conf marking it insecure
(``CONTAINERS_REGISTRIES_CONF``, containers-registries.conf(5)).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import shlex
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from localcluster import REPO, bring_up, tear_down
from test_images import CACHE, RUN_ARGS, built_cpu_image

pytestmark = pytest.mark.integration

REGISTRY_CONFIG = """\
version: 0.1
log:
  level: info
  accesslog:
    disabled: false
storage:
  filesystem:
    rootdirectory: {root}
http:
  addr: 0.0.0.0:{port}
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def cpu_image():
    return built_cpu_image()


@pytest.fixture
def registry(tmp_path):
    """A registry on this machine; yields (port, its log file)."""
    assert shutil.which("docker-registry"), "docker-registry is missing: run 'make setup' (apt-get install docker-registry)"
    port, log = free_port(), tmp_path / "registry.log"
    (tmp_path / "config.yml").write_text(REGISTRY_CONFIG.format(root=tmp_path / "data", port=port))
    with open(log, "w") as out:
        proc = subprocess.Popen(["docker-registry", "serve", str(tmp_path / "config.yml")], stdout=out, stderr=subprocess.STDOUT)
    try:
        end = time.monotonic() + 15
        while time.monotonic() < end:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        yield port, log
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_push_goes_to_the_image_the_cluster_runs_and_every_node_pulls_it(cpu_image, registry, tmp_path):
    store, tag = cpu_image
    port, log = registry
    conf = tmp_path / "registries.conf"
    cli = shlex.join(["env", f"CONTAINERS_REGISTRIES_CONF={conf}", *store.podman])
    cluster = bring_up(tmp_path / "mnhome", 2, prefix="img", options={
        "runtime": "docker", "image": tag, "container_cli": cli, "container_args": RUN_ARGS})
    try:
        inv = cluster.inventory()
        host = f"{ipaddress.ip_network(inv.subnet)[1]}:{port}"  # this machine on the cluster's bridge
        conf.write_text(f'[[registry]]\nlocation = "{host}"\ninsecure = true\n')
        ref = f"{host}/multinode-test/cpu:{uuid.uuid4().hex[:8]}"
        dataclasses.replace(inv, image=ref).save(cluster.state.inventory_path)  # what `up IMAGE_REF=..` records
        env = {**os.environ, "MAKEFLAGS": "", "MULTINODE_HOME": str(cluster.home), "CONTAINERS_REGISTRIES_CONF": str(conf)}
        res = subprocess.run(
            ["make", "-s", "--no-print-directory", "-C", str(REPO), "image", "IMAGE=cpu", f"TAG={tag}", "PUSH=1",
             f"CLUSTER={cluster.name}", f"WHEEL_CACHE={CACHE / 'wheels'}", "BUILD_ARGS=--pull=never",
             f"BUILDAH={shlex.join(store.buildah)}"], env=env, capture_output=True, text=True, timeout=1500)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        assert f"push {tag} -> {ref}" in res.stdout, res.stdout[-2000:]
        assert [line for line in res.stdout.splitlines() if ": pulled " in line] == [
            f"node-0: pulled {ref}", f"node-1: pulled {ref}"], res.stdout[-2000:]
        # Each node fetched the manifest from the registry itself, from its own address.
        repo, _, reference = ref.partition("/")[2].partition(":")
        fetched = set(re.findall(rf'(\d+\.\d+\.\d+\.\d+) - - \[[^]]*\] "(?:GET|HEAD) /v2/{repo}/manifests/{reference} ',
                                 log.read_text()))
        assert {node.private_ip for node in inv.nodes} <= fetched, (fetched, log.read_text()[-2000:])
    finally:
        tear_down(cluster)
