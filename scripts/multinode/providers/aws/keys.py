"""Keys made locally for an AWS cluster: the client key and one host key per node, ed25519.

The host keys are made here so they are pinned before the first connection (no trust-on-first-use;
the trade-off: the private host key travels in user data, readable via IMDS by anyone on the node).
"""

from __future__ import annotations

import os
from pathlib import Path


def new_ed25519(comment: str) -> tuple[str, str]:
    """(private key in OpenSSH format, public key line) made locally with ``cryptography``."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    return private, f"{public} {comment}"


def write_secret(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, readable by its owner only (0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
