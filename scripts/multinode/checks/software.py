"""Software skew across nodes: refuse a job whose nodes do not run the same software, before it starts.

A node with another torch, NCCL or MPI fails mid-training with errors that do not say so (pytorch/pytorch
issue 108212). Before the job starts or anything is written locally, all nodes at once:

* :func:`check_versions`: Python, torch with its CUDA / ROCm (HIP) build, NCCL (the ``nvidia-nccl-*`` wheel),
  mpi4py and -- in MPI modes -- the MPI library (``mpirun --version``), compared with the head's; a node without
  torch is refused. Its probe (:func:`versions_probe`) runs inside the pre-flight round, one Python run per node;
  torch is not imported (its ``torch/version.py`` is read as text: an import costs 1-4 s per node), nor is
  importlib.metadata (metadata directories are listed instead);
* :func:`check_code`: after the sync of our training package, a SHA-256 of the synced code on every node,
  compared with the control machine's own (a user's project is checked by its manifest instead).

A difference is refused (:class:`~multinode.checks.preflight.PreflightFailed`, exit 2) with one table naming
the nodes that differ from the head and the differing values side by side; ``SKEW=warn`` prints the table
and runs anyway. The comparison (:func:`skew_table`) is pure.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import shlex
from pathlib import Path

from multinode.core.config import SKEW_MODES
from multinode.core.errors import PreflightFailed
from multinode.core.nodepaths import code_dir

# Left out of the code hash, as the sync leaves them out (caches and bytecode the nodes write themselves).
EXCLUDED = {"__pycache__", ".pytest_cache", ".ipynb_checkpoints"}

log = logging.getLogger(__name__)

# Fills ``info`` with the node's versions; argv[1] == "mpi" adds the MPI library.
VERSIONS = r'''
import importlib.util, json, os, re, sys
info = {"python": sys.version.split()[0]}
spec = importlib.util.find_spec("torch")
text = ""
if spec and spec.submodule_search_locations:
    path = os.path.join(list(spec.submodule_search_locations)[0], "version.py")
    text = open(path).read() if os.path.exists(path) else ""
def field(name):
    m = re.search(r"^%s\s*(?::[^=]*)?=\s*'?([^'\n]*)'?\s*$" % name, text, re.M)
    return None if not m or m.group(1) in ("None", "") else m.group(1)
info["torch"] = field("__version__") or ("not installed" if not spec else "unknown")
info["torch CUDA"] = field("cuda")
info["torch ROCm"] = field("hip")
# Installed distributions by their metadata directories, first on sys.path wins (importlib.metadata's answer,
# without its import: 45 ms per node and run, most of this probe).
dists = {}
for entry in sys.path:
    try:
        names = os.listdir(entry or ".")
    except OSError:
        continue
    for name in names:
        if name.endswith((".dist-info", ".egg-info")):
            dist, _, rest = name.rpartition(".")[0].partition("-")
            dists.setdefault(re.sub(r"[-_.]+", "_", dist).lower(), rest.split("-")[0])
def version(*names):
    return next((dists[n.replace("-", "_")] for n in names if n.replace("-", "_") in dists), None)
info["NCCL"] = version("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")
info["mpi4py"] = version("mpi4py")
if sys.argv[1] == "mpi":
    import shutil, subprocess
    mpirun = shutil.which("mpirun")
    out = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=10).stdout if mpirun else ""
    info["MPI"] = (out.strip().splitlines() or ["not installed"])[0]
'''

# After ``info = {}`` (argv: -, code directory, top-level paths): adds the SHA-256 of every synced file's
# relative path and content, sorted, to ``info`` and prints it as one JSON object.
CODE_HASH = r'''
import hashlib, json, os, sys
root, tops = sys.argv[2], sys.argv[3:]
h = hashlib.sha256()
files = []
for top in tops:
    base = os.path.join(root, top)
    if os.path.isfile(base):
        files.append(top)
    for d, dirs, names in os.walk(base):
        dirs[:] = [x for x in dirs if x not in ("__pycache__", ".pytest_cache", ".ipynb_checkpoints")]
        files += [os.path.relpath(os.path.join(d, n), root) for n in names if not n.endswith((".pyc", ".pyo"))]
for rel in sorted(files):
    h.update(rel.encode() + b"\0" + open(os.path.join(root, rel), "rb").read() + b"\0")
info["code sha256"] = h.hexdigest()
print(json.dumps(info))
'''


def code_hash(items: list[tuple[Path, str]]) -> str:
    """The control machine's hash of the synced tree (same files, same order as CODE_HASH on the node)."""
    files: dict[str, Path] = {}
    for local, rel in items:
        if local.is_file():
            files[rel] = local
            continue
        for path in local.rglob("*"):
            if path.is_file() and not (set(path.relative_to(local).parts) & EXCLUDED) \
                    and not path.name.endswith((".pyc", ".pyo")):
                files[f"{rel}/{path.relative_to(local).as_posix()}"] = path
    digest = hashlib.sha256()
    for rel in sorted(files):
        digest.update(rel.encode() + b"\0" + files[rel].read_bytes() + b"\0")
    return digest.hexdigest()


def skew_table(reports: dict[str, dict[str, str | None]], reference: str) -> str | None:
    """None when every node reports what ``reference`` (the head) does; else a table of the keys that differ,
    the reference first, then every node that differs from it."""
    ref = reports[reference]
    keys = sorted({k for r in reports.values() for k in r}, key=lambda k: list(ref).index(k) if k in ref else 99)
    differing = [k for k in keys if any(r.get(k) != ref.get(k) for r in reports.values())]
    if not differing:
        return None
    odd = [n for n, r in reports.items() if n != reference and any(r.get(k) != ref.get(k) for k in differing)]
    rows = [["node", *differing]] + [[n, *(str(reports[n].get(k)) for k in differing)] for n in [reference, *odd]]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    first = odd[0]
    what = ", ".join(f"{k} {reports[first].get(k)} vs {ref.get(k)}" for k in differing if reports[first].get(k) != ref.get(k))
    head = f"{first} runs other software than {reference} ({what})" + (f"; {len(odd) - 1} more node(s) differ" if len(odd) > 1 else "")
    return "\n".join([head + ":", *lines])


def _refuse_or_warn(table: str, mode: str, fix: str) -> None:
    if mode == "warn":
        log.warning("warning: %s\n(SKEW=warn: running anyway)", table)
        return
    raise PreflightFailed(f"{table}\n{fix}; SKEW=warn runs anyway")


# Appended to VERSIONS when a cache is kept: argv[2] gets what the answer depends on, one path per line (the
# interpreter, every directory on sys.path, torch's own, mpirun), for the fingerprint of PROBE_CACHE.
DEPENDS = r'''
deps = [os.path.realpath(sys.executable)] + [p for p in sys.path if p and os.path.isdir(p)]
if spec and spec.submodule_search_locations:
    deps += list(spec.submodule_search_locations)
if sys.argv[1] == "mpi" and mpirun:
    deps.append(mpirun)
with open(sys.argv[2], "w") as f:
    f.write("".join(d + "\n" for d in deps if "\n" not in d))
'''

# The probe's answer, kept on the node beside a fingerprint of what it depends on: PYTHONPATH, PATH, and the
# status (modification time, size, inode) of every path the last probe listed. Installing, removing or upgrading a
# package adds or removes entries of its site-packages directory, which changes that directory's time; a
# different interpreter, PYTHONPATH or mpirun changes the rest. While the fingerprint holds, the shell prints the
# kept answer and no Python starts (~30 ms of CPU per node and run: a second at 64 nodes on 2 cores).
# An edit inside an installed package that adds or removes no file is not seen: the answer is what the last
# full probe read. $1: cache file, $2: the python argv that prints the answer (it writes "$1.deps").
# While the answer is kept this starts three programs (sh, stat, cksum): the file is read with the shell's own `read`
# (it ran on every node in every run's pre-flight round, where head, xargs and tail made it six).
PROBE_CACHE = r'''c=$1; shift
fp() {
  set --; if [ -s "$c.deps" ]; then while IFS= read -r d; do set -- "$@" "$d"; done < "$c.deps"; fi
  { printf '%s\n' "$PYTHONPATH" "$PATH"; [ $# -eq 0 ] || stat -L -c '%n %y %s %i' -- "$@" 2>&1; } | cksum
}
if [ -s "$c" ]; then
  { IFS= read -r kept; if [ "$kept" = "$(fp </dev/null)" ]; then while IFS= read -r l; do printf '%s\n' "$l"; done; exit 0; fi; } < "$c"
fi
mkdir -p "${c%/*}" && out=$("$@" "$c.deps" 2>&1) || { printf '%s\n' "$out"; exit 1; }
printf '%s\n%s\n' "$(fp)" "$out" > "$c.tmp" && mv -f "$c.tmp" "$c"
printf '%s\n' "$out"
'''


def probe_cache(workdir: str, python: str, mpi: bool) -> str:
    """Where a node keeps its probe's answer: one file per interpreter, mode and probe code."""
    return f"{workdir}/.software/{_probe_key(python, mpi)}.json"


@functools.cache
def _probe_key(python: str, mpi: bool) -> str:  # the same for every node of a run: hashed once
    return hashlib.sha256(f"{python}\0{mpi}\0{VERSIONS}{DEPENDS}{PROBE_CACHE}".encode()).hexdigest()[:12]


def versions_probe(python: str, mpi: bool, cache: str | None = None) -> str:
    """The node's software as one JSON line (run inside the pre-flight round: no round trip of its own).
    ``cache``: a file on the node where the answer is kept while nothing it depends on changed (PROBE_CACHE)."""
    mode = "mpi" if mpi else "-"
    if cache is None:
        return shlex.join([python, "-c", VERSIONS + "\nprint(json.dumps(info))", mode])
    argv = [python, "-c", VERSIONS + DEPENDS + "\nprint(json.dumps(info))", mode]
    return shlex.join(["sh", "-c", PROBE_CACHE, "probe", cache, *argv])


def code_probe(python: str, code: str, tops: list[str]) -> str:
    """The SHA-256 of the synced code under ``code`` as one JSON line."""
    return shlex.join([python, "-c", "import json\ninfo = {}\n" + CODE_HASH, "-", code, *tops])


def _reports(inv, answers: dict[str, str], what: str) -> dict[str, dict]:
    reports = {}
    for node in inv.nodes:
        text = answers.get(node.name) or ""
        try:
            reports[node.name] = json.loads(text.strip().splitlines()[-1])
        except (ValueError, IndexError):
            why = (text.strip().splitlines() or ["no answer"])[-1]
            raise PreflightFailed(f"{node.name}: could not read its {what} with {inv.python} ({why})") from None
    return reports


def check_versions(inv, answers: dict[str, str], mode: str) -> dict[str, dict]:
    """Every node runs the same Python, torch (+CUDA/ROCm), NCCL, mpi4py (and MPI library), from each node's
    answer to :func:`versions_probe`; a node without torch is refused. {node: report}."""
    reports = _reports(inv, answers, "software versions")
    missing = [name for name, r in reports.items() if r.get("torch") == "not installed"]
    if missing:
        others = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise PreflightFailed(f"{missing[0]}: pre-flight check 'python with torch' failed: {inv.python} has no torch"
                              f"{others}; run 'make setup' (or fix the inventory's python)")
    table = skew_table(reports, inv.head.name)
    if table:
        _refuse_or_warn(table, mode, "give every node the same environment (make setup on each, or one image)")
    return reports


def check_code(runner, items: list[tuple[Path, str]], mode: str, timeout: float = 30.0) -> None:
    """After the sync, one SSH round: every node holds exactly the code the control machine sent."""
    inv = runner.inventory
    tops = sorted({rel for _, rel in items})
    answers = runner.run_each({n.name: code_probe(inv.python, code_dir(inv, n.name), tops) for n in inv.nodes},
                              timeout=timeout)
    reports = _reports(inv, {name: res.stdout or res.error or res.stderr for name, res in answers.items()}, "code")
    code = {name: {"code sha256": r.get("code sha256", "")[:16]} for name, r in reports.items()}
    table = skew_table({"control machine": {"code sha256": code_hash(items)[:16]}, **code}, "control machine")
    if table:
        _refuse_or_warn(table, mode, "the code on that node is not what was synced: run the job again")


__all__ = ["CODE_HASH", "SKEW_MODES", "VERSIONS", "check_code", "check_versions", "code_hash", "code_probe",
           "probe_cache", "skew_table", "versions_probe"]
