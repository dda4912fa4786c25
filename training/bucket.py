"""A bucket as a node uses it: DATA mirrored down, snapshots copied up, the freshest complete copy read back.

Runs on the node, with the standard library and boto3 only, and imports nothing of ours: the orchestrator runs
this file's text with the node's Python (``python -c <this file> sync|check ...``: :func:`main`) for DATA and
for the pre-flight check, and the trainer imports it (:mod:`training.upload`).

Credentials and endpoint are boto3's own chain, read on the node: the environment (``AWS_ACCESS_KEY_ID``... passed
by name with ENV), else the instance profile through the metadata service (EC2). ``AWS_ENDPOINT_URL`` points every
client at another S3 (the tests' moto server): botocore 1.44's ``configprovider.py`` reads it (``name=
'AWS_ENDPOINT_URL'``), as the AWS SDKs reference guide's "Service-specific endpoints" page documents. Nothing here
prints a credential: messages name the bucket, the prefix and boto3's error code only.

The mirror (:func:`sync`): every object under the prefix lands at ``<dir>/<key less the prefix>``; a file is fetched
only when its ETag or size differ from what ``<dir>/.multinode-data.json`` recorded at its last fetch (or the file
is gone), so a second run with nothing changed fetches nothing; a file this mirror fetched whose object is gone is
deleted; files of your own in the directory are left alone. Each file is written to ``.part`` and renamed.

Checkpoint copies (:func:`put_copy`, :func:`fetch_copy`, :func:`freshest_copy`): ``<prefix><run id>/ckpt-<order>/
snapshot.pt`` and then ``snapshot.sha256`` (``<sha256> <size>``, the snapshot's own checksum line) -- a copy is
complete once its checksum object exists and the bytes match it. ``order`` is the snapshot's freshness (later is
larger). The two newest complete copies of a run are kept; older ones are deleted after a newer one is complete.

Large objects move as boto3's managed transfers (:func:`transfer_config`), in parts from and to disk: one PUT holds
at most 5 GB, and AWS advises multipart above 100 MB (S3 user guide, "Uploading and copying objects using multipart
upload"). A snapshot goes up from a file object opened once (``upload_fileobj``): ``upload_file`` opens the path
again for every part (s3transfer's ``UploadFilenameInputManager``), and the trainer replaces that file atomically.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

STATE = ".multinode-data.json"
BLOB, SUM = "snapshot.pt", "snapshot.sha256"
KEEP = 2  # complete copies of a run kept in the bucket
PROGRESS_SECONDS = 0.5
THRESHOLD = 64 * 2**20  # bytes above which an object moves in parts (module doc)
PART = 16 * 2**20  # bytes per part (S3: 5 MiB to 5 GiB, at most 10,000 parts; s3transfer widens parts past that)


def split(url: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` -> ("bucket", "some/prefix/"); ("bucket", "") for the whole bucket."""
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    prefix = prefix.strip("/")
    return bucket, f"{prefix}/" if prefix else ""


def client():
    """An S3 client of a session of its own: boto3's default session is not safe to share between threads (the
    uploader's and the trainer's), and a new session reads the environment again."""
    import boto3  # pinned in pyproject.toml (boto3==1.44.5)

    return boto3.session.Session().client("s3")


def transfer_config():  # boto3's managed transfer settings for every large object here (module doc)
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(multipart_threshold=THRESHOLD, multipart_chunksize=PART, max_concurrency=8)


def _objects(s3, bucket: str, prefix: str):
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        yield from page.get("Contents", [])


# --- DATA: the mirror --------------------------------------------------------------------------------------


def _safe(rel: str) -> bool:
    parts = rel.split("/")
    return bool(rel) and not rel.startswith("/") and ".." not in parts and STATE not in parts


def _fetch(s3, bucket: str, key: str, path: str, counted=None) -> None:  # via <path>.part, its parts at their offsets
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(f"{path}.part", "wb") as fh:
        s3.download_fileobj(bucket, key, fh, Callback=counted, Config=transfer_config())
    os.replace(f"{path}.part", path)


def _write_state(directory: str, state: dict) -> None:
    tmp = os.path.join(directory, f".{STATE}.tmp")
    with open(tmp, "w") as fh:
        json.dump(state, fh)
    os.replace(tmp, os.path.join(directory, STATE))


def sync(url: str, directory: str, say=print) -> dict:
    """Mirror ``url`` into ``directory`` (module doc); ``say`` gets ``PROGRESS {json}`` lines (at most two a
    second) and the last line, ``SYNCED {json}``: files, bytes, fetched, fetched_bytes, unchanged, deleted,
    seconds. The report is returned too."""
    start = time.monotonic()
    bucket, prefix = split(url)
    s3 = client()
    os.makedirs(directory, exist_ok=True)
    try:
        with open(os.path.join(directory, STATE)) as fh:
            state = json.load(fh)
    except (OSError, ValueError):
        state = {}
    listed = {o["Key"][len(prefix):]: o for o in _objects(s3, bucket, prefix) if not o["Key"].endswith("/")}
    listed = {rel: o for rel, o in listed.items() if _safe(rel)}
    wanted = {rel: [o["ETag"], o["Size"]] for rel, o in listed.items()}
    todo = [rel for rel, tag in wanted.items()
            if state.get(rel) != tag or not os.path.isfile(os.path.join(directory, rel))]
    total = sum(wanted[rel][1] for rel in todo)
    done, lock = {"bytes": 0, "files": 0, "said": 0.0}, threading.Lock()

    def counted(n: int) -> None:
        with lock:
            done["bytes"] += n
            now = time.monotonic()
            if now - done["said"] < PROGRESS_SECONDS:
                return
            done["said"] = now
            say("PROGRESS " + json.dumps({"files_done": done["files"], "files": len(todo),
                                          "bytes_done": done["bytes"], "bytes": total}))

    def one(rel: str) -> None:
        state.pop(rel, None)  # not vouched for until fetched whole
        _fetch(s3, bucket, prefix + rel, os.path.join(directory, rel), counted)
        with lock:
            state[rel] = wanted[rel]
            done["files"] += 1

    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(one, todo))
    finally:
        _write_state(directory, state)
    gone = [rel for rel in state if rel not in wanted]
    for rel in gone:
        try:
            os.unlink(os.path.join(directory, rel))
        except FileNotFoundError:
            pass
        del state[rel]
    _write_state(directory, state)
    report = {"files": len(wanted), "bytes": sum(size for _tag, size in wanted.values()), "fetched": len(todo),
              "fetched_bytes": done["bytes"], "unchanged": len(wanted) - len(todo), "deleted": len(gone),
              "seconds": round(time.monotonic() - start, 3)}
    say("SYNCED " + json.dumps(report))
    return report


# --- checkpoint copies --------------------------------------------------------------------------------------


def _copies(s3, bucket: str, base: str) -> dict[int, set[str]]:
    """{order: the names present} of a run's copies under ``base`` (``<prefix><run id>/``)."""
    found: dict[int, set[str]] = {}
    for obj in _objects(s3, bucket, f"{base}ckpt-"):
        folder, _, name = obj["Key"][len(base):].partition("/")
        if folder[5:].isdigit():
            found.setdefault(int(folder[5:]), set()).add(name)
    return found


def _key(base: str, order: int, name: str) -> str:
    return f"{base}ckpt-{order:020d}/{name}"


def checksum(fh) -> tuple[str, int]:
    """(sha256, size) of an open binary file, read from its start in parts."""
    sha, size, _ = hashlib.sha256(), 0, fh.seek(0)
    for chunk in iter(lambda: fh.read(PART), b""):
        sha.update(chunk)
        size += len(chunk)
    return sha.hexdigest(), size


def put_copy(url: str, run_id: str, source, order: int, digest: str | None = None) -> str:
    """Upload ``source`` (the snapshot's bytes, or a binary file open on it) as the run's copy ``order`` -- in parts,
    from the file, above :data:`THRESHOLD` -- then its checksum (which makes it complete), then delete the copies
    older than the :data:`KEEP` newest complete ones; the snapshot's ``s3://`` URL."""
    bucket, prefix = split(url)
    base, s3 = f"{prefix}{run_id}/", client()
    fh = io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else source
    digest, size = (digest, fh.seek(0, os.SEEK_END)) if digest else checksum(fh)
    fh.seek(0)
    s3.upload_fileobj(fh, bucket, _key(base, order, BLOB), Config=transfer_config())
    s3.put_object(Bucket=bucket, Key=_key(base, order, SUM), Body=f"{digest} {size}\n".encode())
    complete = sorted((o for o, names in _copies(s3, bucket, base).items() if {BLOB, SUM} <= names), reverse=True)
    for old in complete[KEEP:]:
        for name in (SUM, BLOB):  # the checksum first: a half-deleted copy is never taken for complete
            s3.delete_object(Bucket=bucket, Key=_key(base, old, name))
    return f"s3://{bucket}/{_key(base, order, BLOB)}"


def fetch_copy(url: str, run_id: str, path: str) -> str | None:
    """The run's freshest complete copy whose bytes match their checksum, to ``path`` (via ``<path>.got``); its URL."""
    bucket, prefix = split(url)
    base, s3 = f"{prefix}{run_id}/", client()
    for order in sorted(_copies(s3, bucket, base), reverse=True):
        try:
            line = s3.get_object(Bucket=bucket, Key=_key(base, order, SUM))["Body"].read().decode().split()
            _fetch(s3, bucket, _key(base, order, BLOB), f"{path}.got")
        except Exception as err:  # noqa: BLE001 -- an object gone between the listing and the read
            if _code(err) in ("NoSuchKey", "404"):
                continue
            raise
        with open(f"{path}.got", "rb") as fh:
            sha, size = checksum(fh)
        if line[:2] == [sha, str(size)]:
            os.replace(f"{path}.got", path)
            return f"s3://{bucket}/{_key(base, order, BLOB)}"
        os.unlink(f"{path}.got")
    return None


def freshest_copy(url: str, run_id: str) -> tuple[bytes, str] | None:
    """(bytes, s3 URL) of the run's freshest complete copy (:func:`fetch_copy`, via a temporary file), or None."""
    with tempfile.TemporaryDirectory(prefix="multinode-copy-") as tmp:
        found = fetch_copy(url, run_id, os.path.join(tmp, BLOB))
        if found is None:
            return None
        with open(os.path.join(tmp, BLOB), "rb") as fh:
            return fh.read(), found


# --- pre-flight -------------------------------------------------------------------------------------------


def _code(err: BaseException) -> str:
    return str(getattr(err, "response", {}).get("Error", {}).get("Code", "")) or type(err).__name__


def missing(url: str, need_objects: bool) -> str | None:
    """What keeps this node from using ``url``, in a few words (None: nothing): boto3, credentials, the endpoint,
    the bucket, listing the prefix, or (``need_objects``) an object under it and its first byte (SSE-KMS: kms:Decrypt)."""
    bucket, prefix = split(url)
    try:
        s3 = client()
    except ImportError:
        return "boto3 is not installed in this node's Python (pip install boto3==1.44.5, e.g. in SETUP or the image)"
    reading = None
    try:
        s3.head_bucket(Bucket=bucket)
        listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1)  # both read the prefix by listing it
        if need_objects and not listed.get("KeyCount"):
            return f"no object under {prefix or '/'} in bucket {bucket}"
        if need_objects:
            reading = listed["Contents"][0]["Key"]
            s3.get_object(Bucket=bucket, Key=reading, Range="bytes=0-0")["Body"].close()
    except Exception as err:  # noqa: BLE001 -- one line for any of boto3's errors, by its code only
        return _why(err, bucket, prefix, reading)
    return None


def _why(err: BaseException, bucket: str, prefix: str, reading: str | None) -> str | None:
    code = _code(err)
    if code == "InvalidRange":  # an empty object has no first byte: it was read
        return None
    if code in ("404", "NoSuchBucket"):
        return f"bucket {bucket} does not exist"
    # S3 answers AccessDenied naming the KMS action when the key refuses ("... is not authorized to perform:
    # kms:Decrypt on resource: arn:aws:kms:..."); older answers say only "Access Denied".
    kms, denied = re.search(r"\bkms:(\w+)", str(err)), code in ("403", "AccessDenied")
    if denied and (kms or reading):
        what = f"kms:{kms[1]} is denied" if kms else f"reading {reading} is denied although listing works"
        return (f"bucket {bucket}: {what}: with SSE-KMS a node needs kms:Decrypt and kms:GenerateDataKey on the "
                f"bucket's key (an EC2 cluster's nodes get them with make up BUCKETS={bucket}, a cluster made before "
                f"that with 'make up' again) and the key's policy must allow them" +
                ("" if kms else "; else a bucket policy denies s3:GetObject"))
    if denied:
        return (f"access to bucket {bucket} (prefix {prefix or '/'}) is denied with this node's credentials (an EC2 "
                f"cluster's nodes get it with make up BUCKETS={bucket})")
    if code == "NoCredentialsError":
        return "no AWS credentials on this node (pass them by name with ENV, or give the instance a profile)"
    if code == "EndpointConnectionError":
        return f"S3 is not reachable from this node ({os.environ.get('AWS_ENDPOINT_URL') or 'AWS'})"
    return f"bucket {bucket}: {code}"


def main(argv: list[str]) -> int:
    """``sync URL DIR`` (the mirror) or ``check URL data|checkpoint`` (prints ``MISSING <what>``, exit 3)."""
    if len(argv) == 3 and argv[0] == "sync":
        sync(argv[1], argv[2], say=lambda line: print(line, flush=True))
        return 0
    if len(argv) == 3 and argv[0] == "check":
        what = missing(argv[1], need_objects=argv[2] == "data")
        print(f"MISSING {what}" if what else "OK", flush=True)
        return 3 if what else 0
    print("usage: bucket.py sync URL DIR | check URL data|checkpoint", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
