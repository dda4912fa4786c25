"""Snapshots copied to a bucket (CHECKPOINT_URL) from the node that wrote them, on a thread of their own.

``MULTINODE_CHECKPOINT_URL`` (the orchestrator sets it from CHECKPOINT_URL) and ``MULTINODE_RUN_ID`` say where, in
:mod:`training.bucket`'s layout. :meth:`Uploader.submit` hands a snapshot (its file, opened at once so a later
atomic replace of the path cannot change what goes up; or its bytes) and checksum to one background thread and
returns at once, so the steps go on while it uploads -- in parts, from disk, above ``bucket.THRESHOLD``; a snapshot
submitted while an older one still waits replaces it (only the freshest matters). Each upload ends in one line on stdout, ``CHECKPOINT_UPLOADED
{json}`` (url, bytes, sha256, order, seconds) or ``CHECKPOINT_UPLOAD_FAILED {json}`` (order, error: boto3's error
code and message, never a credential); :attr:`Uploader.seconds` totals the uploads' time (the trainer's RESULT
carries it as ``checkpoint_upload_seconds``). :meth:`Uploader.drain` waits for what is in flight: at the end of
training, and after the coordinated checkpoint of a notice, within what is left of the grace.
"""

from __future__ import annotations

import io
import logging
import os
import threading
import time
from typing import BinaryIO

from . import bucket, channel

URL_ENV, RUN_ENV = channel.CHECKPOINT_URL_ENV, channel.RUN_ID_ENV

log = logging.getLogger("training")


def where(env=None) -> tuple[str, str] | None:
    """(CHECKPOINT_URL, run id) from the environment; None when no bucket was asked for."""
    env = os.environ if env is None else env
    url = env.get(URL_ENV)
    return (url, env.get(RUN_ENV) or "run") if url else None


def fetch_freshest(env=None) -> tuple[bytes, str] | None:
    """(bytes, s3 URL) of this run's freshest complete copy in the bucket; None without a bucket or a copy."""
    place = where(env)
    return bucket.freshest_copy(*place) if place else None


class Uploader:
    """One background thread uploading the freshest submitted snapshot (module doc)."""

    def __init__(self, url: str, run_id: str):
        self.url, self.run_id = url, run_id
        self.seconds = 0.0
        self.uploaded: list[dict] = []
        self._pending: tuple[BinaryIO, int, str | None] | None = None
        self._busy = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name="checkpoint-upload", daemon=True)
        self._thread.start()

    @classmethod
    def from_env(cls, env=None) -> Uploader | None:
        place = where(env)
        return cls(*place) if place else None

    def submit(self, snapshot: bytes | str | os.PathLike, order: int, digest: str | None = None) -> None:
        """Queue ``snapshot`` (its bytes, or the path of its file: opened now, read in the background) of freshness
        ``order`` for upload; returns at once."""
        source = io.BytesIO(snapshot) if isinstance(snapshot, (bytes, bytearray)) else open(snapshot, "rb")
        with self._cond:
            if self._pending is not None:
                self._pending[0].close()  # replaced by a fresher one before it went up
            self._pending = (source, order, digest)
            self._cond.notify_all()

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until nothing is pending or uploading (True), or ``timeout`` seconds (False)."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._pending is not None or self._busy:
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._pending is None:
                    self._cond.wait()
                (source, order, digest), self._pending = self._pending, None
                self._busy = True
            try:
                with source:
                    self._upload(source, order, digest)
            finally:  # never left busy: drain() would wait for ever
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _upload(self, source: BinaryIO, order: int, digest: str | None) -> None:
        start, size = time.monotonic(), source.seek(0, os.SEEK_END)  # before: a single PUT closes the file it sent
        try:
            url = bucket.put_copy(self.url, self.run_id, source, order, digest)
        except Exception as err:  # noqa: BLE001 -- a failed upload is reported, never fatal to training
            log.warning("checkpoint upload to %s failed: %s", self.url, bucket._code(err))
            channel.send(channel.UPLOAD_FAILED, {"order": order, "error": f"{bucket._code(err)}: {err}"})
            return
        took = time.monotonic() - start
        self.seconds += took
        report = {"url": url, "bytes": size, "sha256": digest, "order": order, "seconds": round(took, 3)}
        self.uploaded.append(report)
        channel.send(channel.UPLOADED, report)


# --- the user script's side (training.preempt.upload_checkpoint, ...) ---

_UPLOADER = None


def upload_checkpoint(path, step: int) -> bool:
    """CHECKPOINT_URL: upload the file at ``path`` as this run's copy ``step`` (later steps are fresher) in the
    background, streamed from disk; False (nothing done) when no CHECKPOINT_URL was given."""
    global _UPLOADER
    _UPLOADER = _UPLOADER or Uploader.from_env()
    if _UPLOADER is None:
        return False
    _UPLOADER.submit(path, int(step))
    return True


def wait_for_uploads(timeout: float | None = None) -> bool:
    """Wait until the checkpoints handed to :func:`upload_checkpoint` are in the bucket (False: ``timeout`` first)."""
    return True if _UPLOADER is None else _UPLOADER.drain(timeout)


def fetch_checkpoint(path) -> str | None:
    """Write this run's freshest complete copy from CHECKPOINT_URL to ``path`` (downloaded in parts, to disk); its
    ``s3://`` URL, or None when there is no bucket or no copy (nothing written)."""
    place = where()
    return bucket.fetch_copy(*place, str(path)) if place else None
