"""The drills' and tests' way of following a CLI process (bench.drills.common.watched) says why a wait failed: a wait
for a line that the process can no longer print (it exited: a refusal at pre-flight) fails at once with both streams'
last lines, instead of waiting out its bound; a ``proc.wait(timeout=...)`` that expires fails with the process's
last lines. Issue 48: two cold-run failures were a refused run waited on for 120 and 240 s, and a silent run that
ended its test without a line of output. Real processes (``sh``), no cluster."""

from __future__ import annotations

import subprocess

import pytest

from bench.drills.common import watched

pytestmark = pytest.mark.integration


def sh(script: str) -> subprocess.Popen:
    return subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_wait_for_a_line_fails_at_once_with_both_streams_when_the_process_has_exited():
    proc = sh("echo 'run 1: MODE=cpu'; echo 'link check: node-1 is slow; LINKCHECK=warn runs anyway' >&2; exit 2")
    with pytest.raises(TimeoutError) as failed:
        with watched(proc) as (out, _err):
            out.wait_for(r"epoch 2/", timeout=3600)  # a bound that would hang the test, were it waited out
    assert "the output ended without it" in str(failed.value), failed.value
    assert "run 1: MODE=cpu" in str(failed.value) and "LINKCHECK=warn runs anyway" in str(failed.value)
    assert proc.returncode == 2


def test_a_process_wait_that_expires_fails_with_the_process_last_lines():
    proc = sh("echo 'queued (QUEUE=1)'; echo 'waiting for the claim' >&2; exec sleep 600")
    with pytest.raises(TimeoutError) as failed:
        with watched(proc) as (out, _err):
            out.wait_for(r"queued", timeout=60)
            proc.wait(timeout=1)
    assert "did not exit within 1 s" in str(failed.value) and "queued (QUEUE=1)" in str(failed.value), failed.value
    assert "waiting for the claim" in str(failed.value), failed.value
    assert proc.poll() is not None  # killed on the way out: nothing left
