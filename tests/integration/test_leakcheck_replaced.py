"""The harness's own leak check: a process a test left running on a cluster fails the cluster's teardown, naming it --
read before `down`, which would kill it without a word (issue 48: the fixture ran `down` first, and a leak on a
cluster shared by a module's tests was killed, not reported); and it follows replaced nodes: a process left in the
namespace a replaced node had (a new namespace now carries the node's name) fails the teardown too.

A replacement inside a run (RECOVER, growback) happens in the orchestrator's subprocess, where no test can read the
old namespace's inode in time; the session's namespace watch (conftest.py, leakcheck.session_watch) records it when
the namespace appears, and ``leakcheck.marks`` joins it. Without the watch this teardown passes with the process alive.
"""

from __future__ import annotations

import os
import subprocess

import leakcheck
import pytest
from localcluster import bring_up, tear_down

from multinode.providers.local.provider import LocalProvider

pytestmark = pytest.mark.integration


def test_a_process_left_in_a_replaced_nodes_old_namespace_fails_the_teardown(tmp_path):
    cluster = bring_up(tmp_path / "mnhome", 2, prefix="lk")
    ns = f"mn-{cluster.name}-1"
    held = os.open(leakcheck.NETNS_RUN / ns, os.O_RDONLY)  # keeps the old namespace, and its number, alive
    try:
        old = os.fstat(held).st_ino
        LocalProvider().replace(cluster.state, cluster.inventory(), "node-1")
        assert leakcheck.namespace_inodes(cluster.name)[ns] != old, "the replacement must be a new namespace"
        # A process in the old namespace, with nothing else of the cluster on it: a clean environment, cwd /.
        stray = subprocess.Popen(["nsenter", f"--net=/proc/self/fd/{held}", "sleep", "600"], pass_fds=(held,),
                                 env={"PATH": os.environ["PATH"]}, cwd="/", start_new_session=True)
        leakcheck.wait_inside(stray.pid, old, "sleep")  # nsenter has entered the namespace and exec'd sleep
    finally:
        os.close(held)
    marks = leakcheck.marks(cluster.name, cluster.home)
    try:
        with pytest.raises(AssertionError) as failed:
            tear_down(cluster)
        assert f"process {stray.pid} (sleep 600): in one of the cluster's network namespaces" in str(failed.value)
    finally:
        stray.kill()
        stray.wait()
    leakcheck.assert_nothing_left(marks)  # the stray was the only thing left: down did the rest


def test_a_process_left_running_on_a_node_fails_the_teardown_though_down_would_kill_it(tmp_path):
    cluster = bring_up(tmp_path / "mnhome", 2, prefix="lk")
    ns = cluster.inventory().extra["namespaces"][1]
    # What a test's job could leave on a shared cluster: a process in node-1 that is not one of its services.
    stray = subprocess.Popen(["ip", "netns", "exec", ns, "sleep", "600"], env={"PATH": os.environ["PATH"]}, cwd="/",
                             start_new_session=True)
    marks = leakcheck.marks(cluster.name, cluster.home)
    try:
        leakcheck.wait_inside(stray.pid, leakcheck.namespace_inodes(cluster.name)[ns], "sleep")  # not yet in at Popen
        with pytest.raises(AssertionError) as failed:
            tear_down(cluster)
        assert "the tests left running (down killed them)" in str(failed.value), failed.value
        assert f"process {stray.pid} (sleep 600)" in str(failed.value), failed.value
    finally:
        if stray.poll() is None:
            stray.kill()
        stray.wait()
    leakcheck.assert_nothing_left(marks)  # down still ran: the cluster is gone, the stray with it
