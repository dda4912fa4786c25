"""Pre-flight of the run's buckets: every node can use DATA and CHECKPOINT_URL before anything is synced or started.
A step of the run's pre-flight phase, after the round of checks (it needs the run's ENV file on each node).

Each node runs our bucket module's ``check`` (``training/bucket.py``, with the node's own credentials: the run's ENV
file sourced when ENV is set, else the instance profile) for each URL: boto3 importable, credentials found, S3
reachable, the bucket there and readable, and for DATA at least one object under the prefix and its first byte
(SSE-KMS: the node's kms:Decrypt). The first node that
cannot is one line naming the node, the setting, its value and what is missing (:class:`PreflightFailed`);
nothing else has run. (Whether a node may also write under CHECKPOINT_URL shows at its first upload, in a
``CHECKPOINT_UPLOAD_FAILED`` line: checking it here would leave an object behind.)
"""

from __future__ import annotations

from multinode.code.data import check_command
from multinode.code.prepare import remove_env_files, write_env_files
from multinode.core.config import LaunchSpec
from multinode.core.errors import PreflightFailed
from multinode.ssh.runner import RemoteRunner

FIX = {"DATA": "fix DATA or the nodes' access to it", "CHECKPOINT_URL": "fix CHECKPOINT_URL or the nodes' access to it"}


def wanted(spec: LaunchSpec) -> list[tuple[str, str, str]]:
    """Pure: (setting, URL, what to check) for each bucket the run uses."""
    found = [("DATA", spec.data, "data"), ("CHECKPOINT_URL", spec.checkpoint_url, "checkpoint")]
    return [(name, url, need) for name, url, need in found if url]


def verdict(stdout: str, stderr: str, exit_code: int | None) -> list[str | None]:
    """Pure: a node's answers, one per URL checked in order -- None (fine) or what is missing."""
    answers: list[str | None] = []
    for line in stdout.splitlines():
        if line == "OK":
            answers.append(None)
        elif line.startswith("MISSING "):
            answers.append(line[8:])
    if exit_code is None or (exit_code not in (0, 3) and not answers):
        last = [t for t in stderr.splitlines() if t.strip()][-1:] or [f"exit {exit_code}"]
        answers.append(f"the check did not run ({last[0].strip()})")
    return answers


def check_buckets(runner: RemoteRunner, spec: LaunchSpec, timeout: float = 60.0) -> None:
    """Every node can use every bucket of the run (module doc); PreflightFailed otherwise."""
    checks = wanted(spec)
    if not checks:
        return
    inv = runner.inventory
    names = [n.name for n in inv.nodes]
    commands = {name: "; ".join(check_command(inv, spec, name, url, need) for _n, url, need in checks)
                for name in names}
    write_env_files(runner, spec)
    try:
        results = runner.run_each(commands, timeout=timeout)
    finally:
        remove_env_files(runner, spec)
    for name in names:
        res = results[name]
        answers = verdict(res.stdout, res.error or res.stderr, res.exit_code)
        for (setting, url, _need), answer in zip(checks + [("", "", "")] * len(answers), answers):
            if answer is not None:
                what = f"{setting}={url}: " if setting else ""
                raise PreflightFailed(f"{name}: {what}{answer}; {FIX.get(setting, 'fix the bucket settings')}")
