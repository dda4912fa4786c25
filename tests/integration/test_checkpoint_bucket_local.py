"""CHECKPOINT_URL, the whole cluster lost: 3 real local nodes, a real moto S3 server (tests/integration/bucket_server.py).
A run with CHECKPOINT_URL and GRACE uploads each snapshot from node-0 while it trains, is interrupted (Ctrl-C: the
coordinated checkpoint, uploaded before the ranks exit 75), the cluster is taken down (nothing left), a new one made
from another MULTINODE_HOME (another machine: no record of the run), and ``train --resume --run-id <id>
CHECKPOINT_URL=...`` continues from the bucket's copy -- RESUMED names it --
and finishes at >= 95 % test accuracy; nothing left after. On the shared cluster: a user script's checkpoint goes up
and comes back through ``training.preempt``'s helpers, and a missing bucket is one line at pre-flight. Times are
never asserted."""

from __future__ import annotations

import json
import re
import shutil
import signal

import pytest

from bench.drills.common import PG_TIMEOUT, RUN_BOUND, watched
from bucket_server import CREDENTIALS, ENV_NAMES, bridge_address, moto_s3, relay, s3_client
from localcluster import REPO, Cluster, bring_up, tear_down

pytestmark = pytest.mark.integration

BUCKET = "ckpt"
URL = f"s3://{BUCKET}/jobs/digits"
UPLOADED = re.compile(r"CHECKPOINT_UPLOADED (\{.*\})")
RUN_ID = "bucketloss"


def _train(cluster: Cluster, node_url: str, *extra: str):
    return cluster.popen("train", "--nodes", "3", f"--pg-timeout={PG_TIMEOUT}", "--grace=30",
                         f"--checkpoint-url={URL}", f"--env={ENV_NAMES}", "--args=--workload digits 12 2", *extra,
                         AWS_ENDPOINT_URL=node_url, **CREDENTIALS)


def _json_lines(pattern: re.Pattern, text: str) -> list[dict]:
    return [json.loads(m[1]) for m in pattern.finditer(text)]


USER_SCRIPT = """import os, sys, tempfile
from training import preempt
here = tempfile.mkdtemp()
path = os.path.join(here, "ckpt.txt")
url = preempt.fetch_checkpoint(path)
start = int(open(path).read()) if url else 0
print("FETCHED", url, start, flush=True)
with open(path, "w") as fh:
    fh.write(str(start + 5))
assert preempt.upload_checkpoint(path, start + 5)
assert preempt.wait_for_uploads(60)
os.unlink(path)
os.rmdir(here)
print("UPLOADED_STEP", start + 5, flush=True)
"""


@pytest.fixture(scope="module")
def moto(tmp_path_factory):
    """(moto's loopback URL and port), its bucket made."""
    with moto_s3(tmp_path_factory.mktemp("moto") / "requests.jsonl") as url:
        s3_client(url).create_bucket(Bucket=BUCKET)
        yield url, int(url.rsplit(":", 1)[1])


def test_a_user_script_uploads_and_fetches_its_checkpoint_with_the_helper(shared_cluster3, moto, tmp_path):
    _url, port = moto
    project = tmp_path / "project"
    (project / "training").mkdir(parents=True)
    (project / "user_bucket.py").write_text(USER_SCRIPT)
    for path in (REPO / "training").glob("*.py"):  # our helpers, as a project without multinode installed carries them
        shutil.copy(path, project / "training" / path.name)
    with relay(bridge_address(shared_cluster3.inventory()), port) as node_url:
        runs = []
        for _ in range(2):  # the same run id: RESUME's way of naming the run whose copies to read
            res = shared_cluster3.cli("train", "--nodes", "1", "--run-id=userbucket", "--script=user_bucket.py",
                                      f"--workdir={project}", f"--checkpoint-url={URL}", f"--env={ENV_NAMES}",
                                      AWS_ENDPOINT_URL=node_url, **CREDENTIALS)
            assert res.returncode == 0, res.stdout + res.stderr
            runs.append(res.stdout)
    assert "FETCHED None 0" in runs[0] and "UPLOADED_STEP 5" in runs[0], runs[0]
    fetched = re.search(r"FETCHED (\S+) 5", runs[1])
    assert fetched and fetched[1] == f"{URL}/userbucket/ckpt-{5:020d}/snapshot.pt", runs[1]
    assert "UPLOADED_STEP 10" in runs[1], runs[1]


def test_the_freshest_complete_copy_is_the_one_whose_bytes_match(moto, monkeypatch):
    """training/bucket.py against moto from this process: a copy without its checksum object, or whose bytes do not
    match it, is passed over for the next freshest; only the two newest complete copies are kept."""
    from training import bucket

    url, _port = moto
    monkeypatch.setenv("AWS_ENDPOINT_URL", url)
    for key, value in CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    s3 = s3_client(url)
    where = f"s3://{BUCKET}/layout"
    for order in (1, 2, 3):
        bucket.put_copy(where, "r", f"copy {order}".encode(), order)
    listed = {o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="layout/")["Contents"]}
    assert listed == {f"layout/r/ckpt-{o:020d}/{name}" for o in (2, 3) for name in ("snapshot.pt", "snapshot.sha256")}
    s3.put_object(Bucket=BUCKET, Key=f"layout/r/ckpt-{4:020d}/snapshot.pt", Body=b"copy 4, no checksum yet")
    s3.put_object(Bucket=BUCKET, Key=f"layout/r/ckpt-{3:020d}/snapshot.pt", Body=b"copy 3, torn")
    assert bucket.freshest_copy(where, "r") == (b"copy 2", f"{where}/r/ckpt-{2:020d}/snapshot.pt")
    assert bucket.freshest_copy(where, "another-run") is None


def test_a_missing_checkpoint_bucket_is_one_line_at_preflight(shared_cluster3, moto):
    _url, port = moto
    with relay(bridge_address(shared_cluster3.inventory()), port) as node_url:
        res = shared_cluster3.cli("train", "--nodes", "3", "--run-id=nobucket", "--checkpoint-url=s3://gone-bucket/x",
                                  f"--env={ENV_NAMES}", AWS_ENDPOINT_URL=node_url, **CREDENTIALS)
    error = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 2 and len(error) == 1, res.stdout + res.stderr
    assert "node-0: CHECKPOINT_URL=s3://gone-bucket/x: bucket gone-bucket does not exist" in error[0], error
    assert not shared_cluster3.state.run_dir("nobucket").exists()


def test_resume_on_a_new_cluster_from_the_bucket(moto, tmp_path):
    url, port = moto
    cluster = bring_up(tmp_path / "home", 3, prefix="ck")
    try:
        with relay(bridge_address(cluster.inventory()), port) as node_url:
            proc = _train(cluster, node_url, f"--run-id={RUN_ID}")
            with watched(proc) as (out, err):
                out.wait_for(r"CHECKPOINT_UPLOADED .*ckpt-0*17179869184/", timeout=RUN_BOUND)  # epoch 4's snapshot
                proc.send_signal(signal.SIGINT)
                code = proc.wait(timeout=RUN_BOUND)
            text = "".join(out.lines) + "".join(err.lines)
        assert code == 75, text[-4000:]
        uploads = _json_lines(UPLOADED, text)
        assert len(uploads) >= 3 and all(u["url"].startswith(f"{URL}/{RUN_ID}/ckpt-") for u in uploads), uploads
        preempted = json.loads((cluster.state.run_dir(RUN_ID) / "summary.json").read_text())["preempted"]
        last = uploads[-1]["url"]
        assert preempted["uploaded"] == last, (preempted, uploads)  # the coordinated checkpoint is in the bucket
        listed = s3_client(url).list_objects_v2(Bucket=BUCKET, Prefix=f"jobs/digits/{RUN_ID}/")
        objects = [o["Key"] for o in listed["Contents"]]
        assert last.removeprefix(f"s3://{BUCKET}/") in objects and len(objects) == 4, objects  # 2 copies kept
    finally:
        tear_down(cluster)  # the whole cluster is gone: every node, its disk, its snapshots

    # Another machine: a new cluster in another MULTINODE_HOME, with no record of the run; RUN_ID names it.
    cluster = bring_up(tmp_path / "elsewhere", 3, prefix="ck")
    assert not cluster.state.runs_dir.exists()
    try:
        with relay(bridge_address(cluster.inventory()), port) as node_url:
            proc = _train(cluster, node_url, "--resume", f"--run-id={RUN_ID}")
            with watched(proc) as (out, err):
                code = proc.wait(timeout=600)
            text = "".join(out.lines) + "".join(err.lines)
        assert code == 0, text[-4000:]
        assert f"RESUME=1: continuing run {RUN_ID} from its freshest snapshot (on the nodes, else in CHECKPOINT_URL)" \
            in text, text[:2000]
        resumed = _json_lines(re.compile(r"RESUMED (\{.*\})"), text)
        assert len(resumed) == 1 and resumed[0]["snapshot_from"] == last, (resumed, last)
        assert resumed[0]["step"] == preempted["stopped_at"]["step"], (resumed, preempted)
        summary = json.loads((cluster.state.run_dir(RUN_ID) / "summary.json").read_text())
        assert summary["outcome"] == "succeeded" and summary["result"]["test_accuracy"] >= 0.95, summary
        assert summary["result"]["checkpoint_uploads"] >= 1, summary["result"]
        assert "checkpoint_upload_seconds" in summary["result"], summary["result"]
        assert CREDENTIALS["AWS_SECRET_ACCESS_KEY"] not in text
    finally:
        tear_down(cluster)
