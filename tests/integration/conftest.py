"""Integration fixtures: real local clusters (network namespaces + sshd per node), driven through
the real CLI in a subprocess, exactly as `make` does (see localcluster.py).

Every cluster is brought down at teardown, and the teardown fails when a test left a process running on it beyond
its services (read before `down`, which would kill it unreported) or anything of the cluster is left after `down`
(namespaces, links, sshd, python): a leak fails the cluster's teardown, on a module's cluster the module's last test.

Which cluster fixture a test takes:

* ``shared_cluster3``: one 3-node cluster for the whole session, for the modules that only run jobs on it. After
  each test that uses it, the test must have left nothing (no process of its runs on any node or outside them, the
  claim given back) and the cluster as it found it (inventory, host keys, namespaces, sshd): see
  ``localcluster.assert_left_as_found``; the session's end brings it down with the full leak check.
* ``cluster3`` / ``cluster2``: a cluster of the module's own, for modules that reshape it (replace, stop or restart
  a node or its sshd, cut a link, edit its inventory) or depend on what earlier runs left on the nodes.
"""

from __future__ import annotations

import leakcheck
import pytest
from localcluster import ModuleView, assert_left_as_found, bring_up, shape, tear_down


@pytest.fixture(scope="session", autouse=True)
def _namespace_watch():
    """Every cluster namespace made in this test process, by inode, while it existed: a node replaced mid-test (by
    RECOVER, growback, replace) leaves its old namespace's number for the leak check at the cluster's end."""
    with leakcheck.session_watch():
        yield


def shared_cluster(tmp_path_factory, nodes: int):
    cluster = bring_up(tmp_path_factory.mktemp("mnhome"), nodes)
    try:
        yield cluster
    finally:
        tear_down(cluster)


@pytest.fixture(scope="session")
def session_cluster3(tmp_path_factory):
    """The 3-node cluster behind ``shared_cluster3``; brought down (with the full leak check) when the session ends."""
    yield from shared_cluster(tmp_path_factory, 3)


@pytest.fixture(scope="module")
def shared_cluster3(session_cluster3):
    """The session's 3-node cluster, seen by one module: its ``runs()`` are the module's own."""
    return ModuleView(session_cluster3.name, session_cluster3.home,
                      earlier=frozenset(run.name for run in session_cluster3.runs()))


@pytest.fixture(autouse=True)
def _shared_cluster_left_as_found(request):
    """For every test on ``shared_cluster3``: it left nothing and did not reshape the cluster."""
    if "shared_cluster3" not in request.fixturenames:
        yield
        return
    cluster = request.getfixturevalue("shared_cluster3")
    before = shape(cluster)
    yield
    assert_left_as_found(cluster, before)


@pytest.fixture(scope="module")
def cluster3(tmp_path_factory):
    """A 3-node local cluster shared by one test module."""
    yield from shared_cluster(tmp_path_factory, 3)


@pytest.fixture(scope="module")
def cluster2(tmp_path_factory):
    """A 2-node local cluster shared by one test module."""
    yield from shared_cluster(tmp_path_factory, 2)


@pytest.fixture(scope="session")
def bootstrap_renderings(tmp_path_factory) -> dict[str, str]:
    """Every kind's bootstrap as Terraform renders it (test_bootstrap.render_all: one terraform init, one console per
    kind), made once for test_bootstrap.py and test_bootstrap_runtime.py; MULTINODE_IMAGE unset while it renders."""
    from test_bootstrap import render_all

    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("MULTINODE_IMAGE", raising=False)
        return render_all(tmp_path_factory)
