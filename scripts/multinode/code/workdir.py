"""WORKDIR: which files of the user's project reach the nodes, and what a re-run has to send.

Contract:

* What is sent: in a git work tree, the tracked files and the untracked files git does not ignore
  (``git ls-files --cached --others --exclude-standard``, run in WORKDIR, so only its subtree);
  otherwise every file under WORKDIR. A WORKDIR that its enclosing work tree ignores (a virtualenv's
  site-packages inside a project that ignores ``.venv/``, a build directory) is a plain directory too:
  git's rules are the project's, and the user pointed at this directory, not at the project. In every
  case the default excludes (:data:`DEFAULT_EXCLUDES`) and the gitignore-style patterns of WORKDIR's
  ``.multinodeignore`` are left out (pathspec's ``GitIgnoreSpec``). Symbolic links are followed to files;
  directories are never followed. :attr:`Project.rule` says which rule chose the files (the sync line shows it).
* A WORKDIR larger than the limit (``WORKDIR_LIMIT_MB``, default :data:`DEFAULT_LIMIT_MB`) is refused
  in one line naming its largest paths, before anything is hashed or sent.
* :class:`Manifest`: every sent file's path, size, mode (the executable bit) and SHA-256. The node keeps
  the manifest of what it holds; :func:`plan_sync` (pure) compares it with the local one and says which
  files to send and which to delete -- a node without a manifest gets everything.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pathspec

from multinode.core.errors import UserError

DEFAULT_LIMIT_MB = 200
IGNORE_FILE = ".multinodeignore"
# Never project code: version control, virtual environments, bytecode, our own state directory.
DEFAULT_EXCLUDES = (".git/", ".venv/", "venv/", "__pycache__/", "*.pyc", "*.pyo", ".multinode/", ".pytest_cache/")


@dataclass(frozen=True)
class FileEntry:
    size: int
    mode: int  # 0o755 or 0o644: only the executable bit travels
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """Path (POSIX, relative to WORKDIR) -> FileEntry."""

    files: dict[str, FileEntry]

    @property
    def total_bytes(self) -> int:
        return sum(entry.size for entry in self.files.values())

    def to_json(self) -> str:
        return json.dumps({path: [e.size, e.mode, e.sha256] for path, e in sorted(self.files.items())},
                          separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "Manifest":
        """A node's manifest; anything unreadable counts as empty (the node then gets every file)."""
        try:
            data = json.loads(text) if text.strip() else {}
            return cls({path: FileEntry(int(v[0]), int(v[1]), str(v[2])) for path, v in data.items()})
        except (ValueError, TypeError, IndexError, AttributeError):
            return cls({})


@dataclass(frozen=True)
class SyncPlan:
    """What one node needs: files to send (with their bytes), files to delete, directories to prune."""

    send: tuple[str, ...]
    delete: tuple[str, ...]
    prune: tuple[str, ...]  # directories that held deleted files and hold no sent file: removed if empty
    send_bytes: int

    @property
    def empty(self) -> bool:
        """The node already holds exactly the project: nothing to send, delete or prune (no round trip)."""
        return not (self.send or self.delete or self.prune)


def plan_sync(local: Manifest, remote: Manifest) -> SyncPlan:
    """Pure: the files whose size, mode or hash differ (or that the node lacks), and the node's extras."""
    send = tuple(sorted(p for p, e in local.files.items() if remote.files.get(p) != e))
    delete = tuple(sorted(p for p in remote.files if p not in local.files))
    kept_dirs = {str(parent) for p in local.files for parent in Path(p).parents}
    gone_dirs = {str(parent) for p in delete for parent in Path(p).parents} - kept_dirs - {"."}
    prune = tuple(sorted(gone_dirs, key=lambda d: (-d.count("/"), d)))  # deepest first
    return SyncPlan(send, delete, prune, sum(local.files[p].size for p in send))


def exclude_spec(patterns: Iterable[str]) -> pathspec.PathSpec:
    """The default excludes plus ``patterns`` (gitignore syntax and precedence: the last match wins, so
    ``!keep.log`` after ``*.log`` keeps it; ``#`` comments and blank lines ignored)."""
    return pathspec.GitIgnoreSpec.from_lines([*DEFAULT_EXCLUDES, *patterns])


def filter_paths(paths: Iterable[str], patterns: Iterable[str] = ()) -> list[str]:
    """Pure: the paths (POSIX, relative) that no exclude pattern matches, sorted."""
    spec = exclude_spec(patterns)
    return sorted(p for p in paths if not spec.match_file(p))


def check_size(sizes: dict[str, int], limit_mb: int, workdir: str) -> None:
    """Pure: refuse a WORKDIR over ``limit_mb`` in one line naming its largest paths."""
    total = sum(sizes.values())
    if total <= limit_mb * 1024 * 1024:
        return
    largest = sorted(sizes.items(), key=lambda item: -item[1])[:3]
    named = ", ".join(f"{path} ({size / 2**20:.1f} MB)" for path, size in largest)
    raise UserError(
        f"WORKDIR={workdir} holds {total / 2**20:.1f} MB to sync, over the {limit_mb} MB limit; largest: {named}; "
        f"put data on the nodes or in object storage and list it in {IGNORE_FILE}, or raise WORKDIR_LIMIT_MB"
    )


def _git(cwd: Path, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, timeout=timeout)


def _work_tree(directory: Path) -> tuple[Path | None, bool]:
    """(the top of the git work tree ``directory`` lies in, or None; whether that work tree ignores ``directory``)."""
    try:
        top = _git(directory, "rev-parse", "--show-toplevel")
        if top.returncode != 0 or not top.stdout.strip():
            return None, False
        toplevel = Path(top.stdout.decode().strip()).resolve()
        rel = directory.resolve().relative_to(toplevel).as_posix()
        return toplevel, rel != "." and _git(toplevel, "check-ignore", "-q", "--", f"{rel}/").returncode == 0
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None, False


def ignored_by_work_tree(directory: Path) -> bool:
    """Does the git work tree around ``directory`` ignore it (then it is sent as a plain directory)?"""
    return _work_tree(directory)[1]


def _git_files(root: Path) -> tuple[list[str] | None, str]:
    """(tracked + untracked-not-ignored files under ``root``, the rule) where git's rules apply to ``root``; else
    (None, the rule): outside a work tree, or in a directory its work tree ignores, every file is walked."""
    toplevel, ignored = _work_tree(root)
    if toplevel is None:
        return None, "every file: not in a git work tree"
    if ignored:
        return None, f"every file: a directory git ignores in {toplevel}"
    listed = _git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard", timeout=60)
    if listed.returncode != 0:
        raise UserError(f"WORKDIR={root}: 'git ls-files' failed ({listed.stderr.decode().strip()}); fix the work tree "
                        f"or list what to leave out in {IGNORE_FILE} outside of git")
    return [p for p in listed.stdout.decode().split("\0") if p], f"git: tracked or not ignored in {toplevel}"


def _walk_files(root: Path, patterns: list[str]) -> list[str]:
    spec = exclude_spec(patterns)
    found = []
    for directory, dirs, files in os.walk(root):
        rel_dir = Path(directory).relative_to(root)
        # Prune excluded directories here: never descend into .git or .venv.
        dirs[:] = [d for d in dirs if not spec.match_file(f"{(rel_dir / d).as_posix()}/")]
        found += [(rel_dir / name).as_posix() for name in files]
    return found


def _ignore_patterns(root: Path) -> list[str]:
    ignore = root / IGNORE_FILE
    return ignore.read_text().splitlines() if ignore.is_file() else []


def selection(root: Path, extra_excludes: Iterable[str] = ()) -> tuple[dict[str, int], str]:
    """({relative path: size} of the regular files that would be sent, the rule that chose them)."""
    patterns = [*_ignore_patterns(root), *extra_excludes]
    listed, rule = _git_files(root)
    paths = filter_paths(listed if listed is not None else _walk_files(root, patterns), patterns)
    sizes = {}
    for rel in paths:
        try:
            info = (root / rel).stat()  # follows symbolic links
        except OSError:
            continue  # tracked but deleted in the work tree, or a dangling link
        if stat.S_ISREG(info.st_mode):
            sizes[rel] = info.st_size
    return sizes, rule


def build_manifest(root: Path, paths: Iterable[str]) -> Manifest:
    files = {}
    for rel in paths:
        path = root / rel
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
        info = path.stat()
        mode = 0o755 if info.st_mode & stat.S_IXUSR else 0o644
        files[rel] = FileEntry(info.st_size, mode, digest.hexdigest())
    return Manifest(files)


@dataclass(frozen=True)
class Project:
    """A WORKDIR ready to sync: its absolute root and the manifest of what is sent."""

    root: Path
    manifest: Manifest
    rule: str = ""  # which rule chose the files ("git: ...", "every file: ..."), said in the sync line


def load_project(workdir: str, limit_mb: int = DEFAULT_LIMIT_MB, extra_excludes: Iterable[str] = ()) -> Project:
    """Select, size-check and hash WORKDIR (one-line UserError when it is missing or too large)."""
    root = Path(workdir).expanduser()
    if not root.is_dir():
        raise UserError(f"WORKDIR={workdir} does not exist or is not a directory; pass your project's directory")
    root = root.resolve()
    sizes, rule = selection(root, extra_excludes)
    check_size(sizes, limit_mb, workdir)
    return Project(root, build_manifest(root, sizes), rule)
