"""boto3 clients for the AWS provider, safe to make from any thread.

Recovery asks EC2 from two threads at once: the job watcher's gone-poll (every 2 s) and a replacement's own thread.
``boto3.client(...)`` makes each client from boto3's one default session, and a session is not thread safe: "Session
objects are not thread safe and should not be shared across threads and processes. It's recommended to create a new
Session object for each thread" (boto3's guide, "Session", multithreading; boto3 issue 1592 and botocore issue 2991
show the failures when clients are made concurrently from the default session). A client, once made, is thread safe.

So each thread gets a session of its own (:func:`client`), kept for the thread's later clients -- a new session
re-reads its service models, ~0.17 s here against ~0.03 s for a client of a kept one. A session caches the
credentials it found, so it is made anew when the environment that names them changes (the tests switch endpoints
and keys; ``AWS_ENDPOINT_URL`` itself is read again at each client).
"""

from __future__ import annotations

import os
import threading
from typing import Any

# The environment a session reads once and keeps (credentials, profile, config files).
SESSION_ENV = ("AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE",
               "AWS_SHARED_CREDENTIALS_FILE")

_local = threading.local()


def session() -> Any:
    """This thread's boto3 session (made on first use, and again when SESSION_ENV changed)."""
    import boto3  # pinned in pyproject.toml

    key = tuple(os.environ.get(name) for name in SESSION_ENV)
    if getattr(_local, "key", None) != key:
        _local.session, _local.key = boto3.session.Session(), key
    return _local.session


def client(service: str, region: str) -> Any:
    """A client of ``service`` in ``region`` from this thread's session (AWS_ENDPOINT_URL honoured, as boto3 does)."""
    return session().client(service, region_name=region)
