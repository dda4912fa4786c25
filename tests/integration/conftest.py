"""Integration fixtures: real local clusters (network namespaces + sshd per node), driven through
the real CLI in a subprocess, exactly as `make` does (see localcluster.py).

Every cluster is brought down at teardown and the teardown asserts that nothing of it is left
(namespaces, links, sshd, python), so a leak fails the test that caused it.
"""

from __future__ import annotations

import pytest
from localcluster import bring_up, tear_down


def shared_cluster(tmp_path_factory, nodes: int):
    cluster = bring_up(tmp_path_factory.mktemp("mnhome"), nodes)
    try:
        yield cluster
    finally:
        tear_down(cluster)


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
