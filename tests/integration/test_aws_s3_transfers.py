"""Checkpoints to and from S3 as boto3's managed transfers, against a real moto_server (issue 47 items 3 and 6):

* a snapshot file above the multipart threshold goes up in parts, read from the file opened when it was handed over
  (the trainer then replaces the path atomically: what goes up is still the file it handed over), and comes back
  down in ranged parts to a file; the threshold is lowered to S3's smallest part (5 MiB) so a 12 MiB file shows it.
  S3 marks an object uploaded in parts by its ETag: the MD5 of the parts' MD5s and "-<parts>" ("Checking object
  integrity", S3 user guide); moto does the same. Before: one put_object of the whole file read into memory, one GET.
* a bucket whose objects are encrypted with a KMS key this node may not use: S3's own AccessDenied naming
  kms:Decrypt (answered by ec2_refusals.RefusingProxy in S3's error document) is said as a KMS problem at pre-flight,
  not as a missing BUCKETS entry.
"""

from __future__ import annotations

import os

import boto3
import pytest
from ec2_refusals import RefusingProxy
from motoserver import moto_server

from training import bucket, upload

pytestmark = pytest.mark.integration

MIB = 2**20
CKB = "ckb"


@pytest.fixture
def s3(monkeypatch):
    with moto_server() as url:
        for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                           "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": url}.items():
            monkeypatch.setenv(key, value)
        client = boto3.client("s3", region_name="us-east-1", endpoint_url=url)
        client.create_bucket(Bucket=CKB)
        yield url, client


def test_a_checkpoint_above_the_threshold_goes_up_and_comes_down_in_parts(s3, tmp_path, monkeypatch):
    url, client = s3
    monkeypatch.setattr(bucket, "THRESHOLD", 5 * MIB)
    monkeypatch.setattr(bucket, "PART", 5 * MIB)  # S3's (and moto's) smallest part
    data = os.urandom(12 * MIB)  # 3 parts: 5 + 5 + 2 MiB
    path = tmp_path / "snapshot.pt"
    path.write_bytes(data)
    uploader = upload.Uploader(f"s3://{CKB}/job", "r1")
    uploader.submit(path, 7)
    newer = tmp_path / "newer.pt"
    newer.write_bytes(b"the next snapshot")
    os.replace(newer, path)  # as the trainer writes its next one, while the first may still go up
    uploader.drain(600)  # a guard against a hang, not a bound: what went up is asserted below
    key = f"job/r1/ckpt-{7:020d}/snapshot.pt"
    head = client.head_object(Bucket=CKB, Key=key)
    assert head["ContentLength"] == len(data) and head["ETag"].strip('"').endswith("-3"), head["ETag"]
    assert uploader.uploaded[0]["bytes"] == len(data)
    assert client.get_object(Bucket=CKB, Key=f"job/r1/ckpt-{7:020d}/snapshot.sha256")["Body"].read().split()[1] == (
        str(len(data)).encode())

    counted = RefusingProxy(url, lambda fields: None)
    monkeypatch.setenv("AWS_ENDPOINT_URL", counted.url)
    monkeypatch.setenv(upload.URL_ENV, f"s3://{CKB}/job")
    monkeypatch.setenv(upload.RUN_ENV, "r1")
    try:
        fetched = upload.fetch_checkpoint(tmp_path / "back.pt")
    finally:
        counted.close()
    assert fetched == f"s3://{CKB}/{key}" and (tmp_path / "back.pt").read_bytes() == data
    ranged = [r for method, p, r in counted.requests if method == "GET" and p.split("?")[0].endswith("/snapshot.pt") and r]
    assert len(ranged) == 3, counted.requests  # three ranged GETs of the blob, not one stream
    assert not (tmp_path / "back.pt.got").exists() and not (tmp_path / "back.pt.got.part").exists()


def test_a_checkpoint_below_the_threshold_goes_up_in_one_put_from_its_file(s3, tmp_path):
    """boto3 closes a file object it sent in one PUT: the uploader reads the size first (a regression seen on local
    nodes: the report's size was read from the closed file and the upload thread died)."""
    _url, client = s3
    path = tmp_path / "small.pt"
    path.write_bytes(b"s" * 1000)
    uploader = upload.Uploader(f"s3://{CKB}/job", "r2")
    uploader.submit(path, 1)
    uploader.submit(path, 2)  # the first may still wait: replaced, its file closed
    uploader.drain(600)  # a guard against a hang, not a bound: what went up is asserted below
    assert [u["bytes"] for u in uploader.uploaded][-1] == 1000 and uploader.uploaded[-1]["order"] == 2
    head = client.head_object(Bucket=CKB, Key=f"job/r2/ckpt-{2:020d}/snapshot.pt")
    assert head["ContentLength"] == 1000 and "-" not in head["ETag"]  # one PUT: a plain MD5 ETag


KMS_DENIED = ("User: arn:aws:sts::123456789012:assumed-role/multinode-dev-1a2b3c/i-0123456789abcdef0 is not authorized "
              "to perform: kms:Decrypt on resource: arn:aws:kms:us-east-1:123456789012:key/0f1e2d3c-aaaa-bbbb-cccc-"
              "0123456789ab because no identity-based policy allows the kms:Decrypt action")


def s3_error(code: str, message: str) -> bytes:
    """S3's REST error document (S3 API reference, "Error responses": ``<Error><Code>..</Code><Message>..``)."""
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
            "<RequestId>4442587FB7D0A2F9</RequestId><HostId>aGVsbG8=</HostId></Error>").encode()


@pytest.mark.parametrize("message, said", [
    (KMS_DENIED, "bucket ckb: kms:Decrypt is denied: with SSE-KMS a node needs kms:Decrypt and kms:GenerateDataKey on "
                 "the bucket's key (an EC2 cluster's nodes get them with make up BUCKETS=ckb"),
    ("Access Denied", "bucket ckb: reading data/a.bin is denied although listing works: with SSE-KMS a node needs "
                      "kms:Decrypt"),
])
def test_a_bucket_whose_kms_key_refuses_is_said_as_such_at_preflight(s3, monkeypatch, message, said):
    url, client = s3
    client.put_object(Bucket=CKB, Key="data/a.bin", Body=b"x" * 100)

    def answer(fields):  # listing works; reading an object is refused as S3 refuses it for a KMS key
        if fields[":method"] == "GET" and fields[":path"].split("?")[0].endswith("/data/a.bin"):
            return 403, s3_error("AccessDenied", message), "application/xml"
        return None

    denying = RefusingProxy(url, lambda fields: None, answer=answer)
    monkeypatch.setenv("AWS_ENDPOINT_URL", denying.url)
    try:
        found = bucket.missing(f"s3://{CKB}/data", need_objects=True)
    finally:
        denying.close()
    assert found.startswith(said) and "BUCKETS" in found
    assert not found.startswith("access to bucket")  # before: "add it to BUCKETS", the wrong fix
