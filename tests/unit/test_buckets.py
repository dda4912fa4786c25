"""DATA, DATA_DIR, CHECKPOINT_URL without a bucket: the settings' one-line refusals, the data step's plan (what each node
runs, where its credentials come from), its lines (a terminal's board, plain lines otherwise), the pre-flight verdict
of a node's answers, the trainer's uploader (one background thread, the freshest snapshot wins) and the fall-back of
a start that finds no snapshot on any rank. The real thing against moto: tests/integration/test_data_local.py and
test_checkpoint_bucket_local.py."""

from __future__ import annotations

import io
import threading

import pytest

from multinode.code.bucketcheck import verdict, wanted
from multinode.code import data
from multinode.code.data import Board, describe, plan_data
from multinode.core.config import LaunchSpec, split_bucket_url
from multinode.core.envvars import parse_env
from multinode.core.errors import UserError
from multinode.plan.launchers import get_launcher, launcher_for_mode
from multinode.plan.launchers.base import EntryPoint
from training import bucket, snapshot, upload

from conftest import make_inventory  # tests/unit/conftest.py

W = "/state/dev/nodes"
PY = "/repo/.venv/bin/python"


@pytest.mark.parametrize("settings, message", [
    ({"data": "gs://b/p"}, "DATA='gs://b/p' is not a bucket URL; give it as s3://bucket/prefix"),
    ({"data": "s3://B_ad/p"}, "DATA='s3://B_ad/p': 'B_ad' is not a bucket name"),
    ({"checkpoint_url": "/mnt/ckpt"}, "CHECKPOINT_URL='/mnt/ckpt' is not a bucket URL"),
    ({"data_dir": "/data"}, "DATA_DIR=/data says where DATA lands on the nodes, but DATA is not set"),
    ({"data": "s3://bkt/p", "data_dir": "data"}, "DATA_DIR='data' must be an absolute path on the nodes"),
])
def test_bad_bucket_settings_are_one_line(settings, message):
    with pytest.raises(UserError) as err:
        LaunchSpec(**settings)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_bucket_url_splits_into_bucket_and_prefix_alike_on_both_sides():
    for url, parts in {"s3://bkt/a/b/": ("bkt", "a/b/"), "s3://bkt": ("bkt", ""), "s3://bkt/a": ("bkt", "a/")}.items():
        assert split_bucket_url(url) == parts == bucket.split(url)


def test_each_node_mirrors_data_itself_with_the_env_file_sourced_and_no_value_in_argv():
    inv = make_inventory(2)
    spec = LaunchSpec(data="s3://bkt/train", env=parse_env("AWS_SECRET_ACCESS_KEY", {"AWS_SECRET_ACCESS_KEY": "s3kr1t"}),
                      run_id="r1")
    plans = plan_data(inv, spec, ["node-0", "node-1"])
    for name, cmd in plans.items():
        assert cmd.argv[:2] == ("sh", "-c") and cmd.argv[4] == f"{W}/{name}/runs/r1/env"  # sourced, then exec
        assert cmd.argv[5:7] == (PY, "-c") and "def sync(" in cmd.argv[7]
        assert cmd.argv[8:] == ("sync", "s3://bkt/train", f"{W}/{name}/data")
        assert "s3kr1t" not in cmd.shell()
    chosen = plan_data(inv, LaunchSpec(data="s3://bkt/train", data_dir="/scratch/d", run_id="r1"), ["node-0"])
    assert chosen["node-0"].argv[4] == "" and chosen["node-0"].argv[-1] == "/scratch/d"


def test_the_ranks_are_told_where_the_data_and_the_bucket_are():
    inv = make_inventory(2)
    spec = LaunchSpec(data="s3://bkt/train", checkpoint_url="s3://ckb/job", run_id="r1")
    for launcher in (get_launcher("static"), get_launcher("torchrun")):
        for cmd in launcher.plan(inv, spec, EntryPoint("")).commands:
            assert cmd.env["MULTINODE_CHECKPOINT_URL"] == "s3://ckb/job"
            assert cmd.node_env["MULTINODE_DATA_DIR"] == f"{W}/{cmd.node}/data"
    mpi = launcher_for_mode("mpi").plan(inv, LaunchSpec(mode="mpi", data="s3://bkt/t", checkpoint_url="s3://ckb/job"),
                                        EntryPoint(""))
    argv = " ".join(a for cmd in mpi.commands for a in cmd.argv)
    assert "MULTINODE_CHECKPOINT_URL=s3://ckb/job" in argv and f"MULTINODE_DATA_DIR={W}/node-1/data" in argv
    plain = get_launcher("static").plan(inv, LaunchSpec(), EntryPoint("")).commands[0]
    assert "MULTINODE_CHECKPOINT_URL" not in plain.env and "MULTINODE_DATA_DIR" not in plain.node_env
    from multinode.backends.slurm.script import plan_sbatch

    script = plan_sbatch(inv, LaunchSpec(nodes=2, data="s3://bkt/train", run_id="r1"), EntryPoint("")).script
    for node in inv.nodes:  # a SLURM task: in its node's case, as the other launchers' per-node environment
        case = next(line for line in script.splitlines() if line.strip().startswith(f"{node.hostname})"))
        assert f"export MULTINODE_DATA_DIR={W}/{node.name}/data" in case, case
    assert "MULTINODE_DATA_DIR" not in plan_sbatch(inv, LaunchSpec(nodes=2, run_id="r1"), EntryPoint("")).script


def test_a_node_line_says_what_was_fetched():
    report = {"files": 4, "bytes": 9, "fetched": 1, "fetched_bytes": 2048, "unchanged": 3, "deleted": 0}
    assert describe("s3://b/p", "/d", "node-0", report) == (
        "data on node-0: 1 file (2048 bytes, 2.0 KiB) fetched, 3 unchanged, 0 deleted, 4 in all, s3://b/p -> /d")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_one_line_per_node_rewritten_and_a_pipe_plain_lines(monkeypatch):
    monkeypatch.setenv("COLUMNS", "50")  # shutil.get_terminal_size reads it first
    tty = _Terminal()
    board = Board(tty, ["node-0", "node-1"])
    board.progress("node-1", {"files_done": 1, "files": 4, "bytes_done": 10, "bytes": 40})
    board.show("node-0", "done 0", final=True)
    board.show("node-0", "x" * 60, final=True)
    text = tty.getvalue()
    assert text.startswith("data on node-0: listing\ndata on node-1: listing\n")
    assert "\x1b[1A\r\x1b[2Kdata on node-1: 1/4 files, 10 B of 40 B\x1b[1B\r" in text
    assert "\x1b[2A\r\x1b[2Kdone 0\x1b[2B\r" in text
    assert f"\x1b[2A\r\x1b[2K{'x' * 49}\x1b[2B\r" in text  # cut to the terminal's width: no wrapped line
    pipe = io.StringIO()
    board = Board(pipe, ["node-0", "node-1"])
    board.progress("node-1", {"files_done": 1, "files": 4, "bytes_done": 10, "bytes": 40})
    board.show("node-0", "done 0", final=True)
    assert pipe.getvalue() == "done 0\n"  # within PLAIN_EVERY of the start: the progress was not printed
    monkeypatch.setattr(data, "PLAIN_EVERY", 0.0)
    board.progress("node-1", {"files_done": 2, "files": 4, "bytes_done": 20, "bytes": 40})
    assert pipe.getvalue() == "done 0\ndata on node-1: 2/4 files, 20 B of 40 B\n"


def test_preflight_reads_each_urls_answer_in_order():
    spec = LaunchSpec(data="s3://bkt/train", checkpoint_url="s3://ckb/job")
    assert [name for name, _url, _need in wanted(spec)] == ["DATA", "CHECKPOINT_URL"]
    assert verdict("OK\nMISSING bucket ckb does not exist\n", "", 3) == [None, "bucket ckb does not exist"]
    assert verdict("", "Traceback...\nModuleNotFoundError: x\n", 1) == [
        "the check did not run (ModuleNotFoundError: x)"]
    assert verdict("", "", None)[0].startswith("the check did not run")


def test_the_mirror_refuses_keys_that_leave_its_directory():
    assert bucket._safe("a/b.bin") and not bucket._safe("../x") and not bucket._safe("a/../../x")
    assert not bucket._safe("/abs") and not bucket._safe(bucket.STATE)


def test_the_uploader_returns_at_once_and_uploads_the_freshest(monkeypatch):
    gate, calls = threading.Event(), []

    def put_copy(url, run_id, blob, order, digest=None):
        gate.wait(10)
        calls.append((url, run_id, blob, order, digest))
        return f"{url}/{run_id}/ckpt-{order}"

    monkeypatch.setattr(bucket, "put_copy", put_copy)
    uploader = upload.Uploader.from_env({upload.URL_ENV: "s3://ckb/job", upload.RUN_ENV: "r1"})
    uploader.submit(b"one", 1, "d1")
    assert not uploader.drain(0.05)  # the first is held at the gate: submit did not wait for it
    uploader.submit(b"two", 2, "d2")
    uploader.submit(b"three", 3, "d3")  # replaces "two", still waiting
    gate.set()
    assert uploader.drain(10)
    assert [c[3] for c in calls] == [1, 3] and calls[1][4] == "d3"
    assert [u["url"] for u in uploader.uploaded] == ["s3://ckb/job/r1/ckpt-1", "s3://ckb/job/r1/ckpt-3"]
    assert upload.Uploader.from_env({}) is None


def test_no_snapshot_on_any_rank_takes_the_remote_copy(tmp_path):
    blob = snapshot.encode({"next_epoch": 3, "consumed": 0})
    loaded = snapshot.load_freshest(tmp_path, 0, lambda x: [x], lambda x, src: x, remote=lambda: (blob, "s3://b/c"))
    assert loaded.state["next_epoch"] == 3 and (loaded.host, loaded.path) == ("", "s3://b/c")
    assert snapshot.load_freshest(tmp_path, 0, lambda x: [x], lambda x, src: x, remote=lambda: None) is None
    snapshot.save(tmp_path, {"next_epoch": 1, "consumed": 0})  # a copy on a node wins: the bucket is not asked
    asked = []
    local = snapshot.load_freshest(tmp_path, 0, lambda x: [x], lambda x, src: x, remote=lambda: asked.append(1))
    assert local.state["next_epoch"] == 1 and not asked


@pytest.mark.parametrize("error, said", [
    ({"Error": {"Code": "404"}}, "bucket bkt does not exist"),
    ({"Error": {"Code": "403"}}, "access to bucket bkt (prefix p/) is denied with this node's credentials (an EC2 cluster's nodes "
                                     "get it with make up BUCKETS=bkt)"),
    ({"Error": {"Code": "SlowDown"}}, "bucket bkt: SlowDown"),
])
def test_preflight_names_what_keeps_a_node_from_its_bucket(monkeypatch, error, said):
    from botocore.exceptions import ClientError

    class Refusing:
        def head_bucket(self, Bucket):
            raise ClientError(error, "HeadBucket")

    monkeypatch.setattr(bucket, "client", Refusing)
    assert bucket.missing("s3://bkt/p", need_objects=False) == said


def test_preflight_without_credentials_says_how_to_give_them(monkeypatch):
    from botocore.exceptions import NoCredentialsError

    class Anonymous:
        def head_bucket(self, Bucket):
            raise NoCredentialsError()

    monkeypatch.setattr(bucket, "client", Anonymous)
    assert bucket.missing("s3://bkt/p", need_objects=True).startswith(
        "no AWS credentials on this node (pass them by name with ENV")
