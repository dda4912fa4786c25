"""DATA on 3 real local nodes (sshd per node) against a real moto S3 server (tests/integration/bucket_server.py):
every node mirrors the prefix itself, with the credentials passed by name in ENV; the job's ranks find the files at
MULTINODE_DATA_DIR; a second run fetches nothing (the step's own lines, and moto's log of the requests it served:
listings only, no object read); a changed object is fetched again, a removed one deleted; the credentials are in no
output, log or plan; Ctrl-C while the nodes fetch leaves no sync running and no ENV file. Bad DATA is one line: not a bucket URL (before anything), a bucket that does not exist
(pre-flight, no run directory)."""

from __future__ import annotations

import json
import re
import signal
import time
import urllib.parse
from pathlib import Path

import pytest

from multinode.core.nodepaths import data_dir

from bench.drills.common import watched
from bucket_server import CREDENTIALS, ENV_NAMES, bridge_address, moto_s3, relay, requests, s3_client

pytestmark = pytest.mark.integration

BUCKET, PREFIX = "dset", "train"
DATA = f"s3://{BUCKET}/{PREFIX}"
FILES = {"a.bin": 70_000, "b.bin": 1_000, "sub/c.bin": 5_000, "sub/deeper/d.txt": 12}
LINE = re.compile(r"data on (node-\d+): (\d+) files? \((\d+) bytes, [^)]*\) fetched, (\d+) unchanged, (\d+) deleted, "
                  r"(\d+) in all, s3://\S+ -> (\S+)")

COUNT_SCRIPT = """import hashlib, json, os
root = os.environ["MULTINODE_DATA_DIR"]
found = {}
for base, _dirs, names in os.walk(root):
    for name in names:
        if not name.startswith("."):
            path = os.path.join(base, name)
            found[os.path.relpath(path, root)] = hashlib.sha256(open(path, "rb").read()).hexdigest()
print("DATA_FILES " + json.dumps(found, sort_keys=True), flush=True)
"""


@pytest.fixture(scope="module")
def bucket(shared_cluster3, tmp_path_factory):
    """(moto's loopback URL, its recording, the URL the nodes use)."""
    recording = tmp_path_factory.mktemp("moto") / "requests.jsonl"
    with moto_s3(recording) as url:
        port = int(url.rsplit(":", 1)[1])
        with relay(bridge_address(shared_cluster3.inventory()), port) as node_url:
            yield url, recording, node_url


def _contents() -> dict[str, bytes]:
    return {name: bytes((i * 7 + len(name)) % 251 for i in range(size)) for name, size in FILES.items()}


def _train(cluster, project: Path, node_url: str, run_id: str, data: str = DATA):
    return cluster.cli("train", "--nodes", "3", f"--run-id={run_id}", "--script=count_data.py",
                       f"--workdir={project}", f"--data={data}", f"--env={ENV_NAMES}",
                       AWS_ENDPOINT_URL=node_url, **CREDENTIALS)


def _lines(text: str) -> dict[str, tuple]:
    return {m[1]: (m[7], int(m[2]), int(m[3]), int(m[4]), int(m[5]), int(m[6])) for m in LINE.finditer(text)}


def _object_reads(recording: Path) -> list[str]:
    return [path for method, path in requests(recording)
            if method == "GET" and path.startswith(f"{BUCKET}/") and "list-type" not in path]


def test_data_reaches_every_node_and_a_second_run_fetches_nothing(shared_cluster3, bucket, tmp_path):
    url, recording, node_url = bucket
    s3 = s3_client(url)
    s3.create_bucket(Bucket=BUCKET)
    contents = _contents()
    for name, body in contents.items():
        s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}/{name}", Body=body)
    s3.put_object(Bucket=BUCKET, Key="elsewhere/x.bin", Body=b"not under the prefix")
    project = tmp_path / "project"
    project.mkdir()
    (project / "count_data.py").write_text(COUNT_SCRIPT)
    inv = shared_cluster3.inventory()
    total = sum(FILES.values())

    first = _train(shared_cluster3, project, node_url, "data1")
    text = first.stdout + first.stderr
    assert first.returncode == 0, text[-4000:]
    lines = _lines(text)
    assert sorted(lines) == ["node-0", "node-1", "node-2"], text[-4000:]
    for node, (directory, fetched, size, unchanged, deleted, count) in lines.items():
        assert (fetched, size, unchanged, deleted, count) == (len(FILES), total, 0, 0, len(FILES)), lines
        assert directory == f"{inv.workdir_for(node)}/data"
        for name, body in contents.items():  # the node's own disk: each local node has its own work directory
            assert (Path(directory) / name).read_bytes() == body
    seen = [json.loads(line.split("DATA_FILES ", 1)[1]) for line in text.splitlines() if "DATA_FILES " in line]
    assert len(seen) == 3 and all(set(found) == set(FILES) for found in seen), seen  # the ranks see it too
    assert len(_object_reads(recording)) == 3 * len(FILES)

    recording.write_text("")  # moto appends: from here on, the second run's requests only
    second = _train(shared_cluster3, project, node_url, "data2")
    text = second.stdout + second.stderr
    assert second.returncode == 0, text[-4000:]
    lines = _lines(text)
    assert sorted(lines) == ["node-0", "node-1", "node-2"], text[-4000:]
    assert all(line[1:] == (0, 0, len(FILES), 0, len(FILES)) for line in lines.values()), lines
    served = requests(recording)
    assert _object_reads(recording) == [], served
    assert sum("list-type=2" in path for _m, path in served) >= 3, served  # each node listed the prefix

    s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}/b.bin", Body=b"changed")
    s3.delete_object(Bucket=BUCKET, Key=f"{PREFIX}/sub/deeper/d.txt")
    third = _train(shared_cluster3, project, node_url, "data3")
    text = third.stdout + third.stderr
    assert third.returncode == 0, text[-4000:]
    lines = _lines(text)
    assert all(line[1:] == (1, 7, len(FILES) - 2, 1, len(FILES) - 1) for line in lines.values()), lines
    for node in lines:
        assert (Path(lines[node][0]) / "b.bin").read_bytes() == b"changed"
        assert not (Path(lines[node][0]) / "sub/deeper/d.txt").exists()

    secret = CREDENTIALS["AWS_SECRET_ACCESS_KEY"]
    for run_id in ("data1", "data2", "data3"):
        for path in shared_cluster3.state.run_dir(run_id).rglob("*"):
            if path.is_file():
                assert secret not in path.read_text(errors="replace"), path
    assert secret not in first.stdout + first.stderr + second.stdout + second.stderr + third.stdout + third.stderr


def test_bad_data_is_one_line_before_anything_runs(shared_cluster3, bucket, tmp_path):
    _url, _recording, node_url = bucket
    project = tmp_path / "project"
    project.mkdir()
    (project / "count_data.py").write_text(COUNT_SCRIPT)

    res = _train(shared_cluster3, project, node_url, "databad1", data="gs://dset/train")
    assert res.returncode == 2, res.stdout + res.stderr
    assert "DATA='gs://dset/train' is not a bucket URL; give it as s3://bucket/prefix" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr

    res = _train(shared_cluster3, project, node_url, "databad2", data="s3://no-such-bucket/x")
    assert res.returncode == 2, res.stdout + res.stderr
    error = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(error) == 1 and "DATA=s3://no-such-bucket/x: bucket no-such-bucket does not exist" in error[0], error
    assert "Traceback" not in res.stderr
    assert not shared_cluster3.state.run_dir("databad2").exists()
    assert urllib.parse.urlparse(node_url).hostname == bridge_address(shared_cluster3.inventory())


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_while_the_nodes_fetch_leaves_nothing_running(shared_cluster3, bucket, tmp_path, signum):
    """Ctrl-C (or a SIGTERM: a CI job's timeout, ``kill``) during the data step, outside any job: the nodes' syncs
    stopped, no ENV file left, one line, exit 130 (143), no traceback."""
    url, recording, _node_url = bucket
    s3 = s3_client(url)
    s3.create_bucket(Bucket="slow")
    s3.put_object(Bucket="slow", Key="big/blob.bin", Body=bytes(8 << 20))
    project = tmp_path / "project"
    project.mkdir()
    (project / "count_data.py").write_text(COUNT_SCRIPT)
    recording.write_text("")
    port = int(url.rsplit(":", 1)[1])
    inv = shared_cluster3.inventory()
    parts = [Path(data_dir(inv, node.name)) / "blob.bin.part" for node in inv.nodes]
    for part in parts:  # an interrupted fetch's partial file stays on the node (the next sync writes it anew)
        part.unlink(missing_ok=True)
    with relay(bridge_address(inv), port, pause=0.05) as slow_url:  # 8 MiB: ~25 s a node
        # --linkcheck off: the test is of Ctrl-C in the data step; on a loaded machine a link's measure can fall
        # below the others' and the pre-flight refuse the run before any node fetches (seen once in the suite).
        # Started with SIGINT ignored, as a shell starts a background job (and as this suite may be run): Python
        # then installs no Ctrl-C handler of its own; the command's (multinode.ssh.signals.Interrupts) must act.
        before = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            proc = shared_cluster3.popen("train", "--nodes", "3", f"--run-id=dataint{signum}", "--script=count_data.py",
                                         "--linkcheck=off", f"--workdir={project}", "--data=s3://slow/big",
                                         f"--env={ENV_NAMES}",
                                         AWS_ENDPOINT_URL=slow_url, **CREDENTIALS)
        finally:
            signal.signal(signal.SIGINT, before)
        with watched(proc) as (out, err):
            deadline = time.monotonic() + 120
            while not any(part.exists() for part in parts):  # a node is writing the file: stop the run now
                # (the node's own .part file, not moto's request log: that one may be written when the reply ends)
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("no node started fetching: " + "".join(out.lines + err.lines)[-3000:])
                time.sleep(0.05)
            proc.send_signal(signum)
            code = proc.wait(timeout=120)
        text = "".join(out.lines) + "".join(err.lines)
    assert code == 128 + signum and "DATA_FILES" not in text, text[-3000:]
    assert "multinode: interrupted" in text and "Traceback" not in text, text[-3000:]
    inv = shared_cluster3.inventory()
    for node in inv.nodes:  # no ENV file left (the shared cluster's own check: no process of the run anywhere)
        assert not (Path(inv.workdir_for(node.name)) / "runs" / f"dataint{signum}" / "env").exists()
