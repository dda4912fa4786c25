"""The suite's own rules (issue 25), checked on its files: unit tests start no process and open no socket, and
no test asserts a duration (a bound that is the claim goes into a drill or a benchmark that records it)."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
# A process or a socket in a unit test: subprocess/Popen/os.system calls, socket objects.
IMPURE = re.compile(r"\bsubprocess\.(run|Popen|call|check_call|check_output)\b|\bsocket\.socket\(|\bos\.system\(")
# An assert that compares a measured time: a clock read or a variable named for elapsed time, against a bound.
DURATION = re.compile(r"^\s*assert\b.*(monotonic\(\)|perf_counter\(\)|time\.time\(\)|\btook\b|\belapsed\b|"
                      r"\bseconds(_to_exit)?\b)[^=\n]*(<=?|>=?)\s*\S")


def offenders(pattern: re.Pattern, files) -> list[str]:
    """Matching lines of ``files`` (this file, which spells the patterns out, left out)."""
    return [f"{path.relative_to(TESTS)}:{n}: {line.strip()}" for path in files if path.name != Path(__file__).name
            for n, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]


def test_unit_tests_start_no_process_and_open_no_socket():
    found = offenders(IMPURE, (TESTS / "unit").rglob("*.py"))
    assert not found, "move these to tests/integration:\n" + "\n".join(found)


def test_no_test_asserts_a_duration():
    found = offenders(DURATION, TESTS.rglob("test_*.py"))
    assert not found, "a duration is a drill's or a benchmark's record, not an assert:\n" + "\n".join(found)


def test_test_file_names_are_unique_across_the_suite():
    """pytest imports test files by their basename (no packages here): two files of one name stop the whole run."""
    names: dict[str, list[str]] = {}
    for path in TESTS.rglob("test_*.py"):
        names.setdefault(path.name, []).append(str(path.relative_to(TESTS)))
    assert not {n: p for n, p in names.items() if len(p) > 1}, {n: p for n, p in names.items() if len(p) > 1}


def test_the_patterns_catch_what_they_are_for():
    assert IMPURE.search("res = subprocess.run(['sh'])") and IMPURE.search("with socket.socket() as s:")
    assert not IMPURE.search("from multinode.ssh.runner import STOP_SCRIPT")
    assert DURATION.search("    assert 6 <= took < 6 + 20") and DURATION.search("    assert elapsed >= 1.0")
    assert DURATION.search("    assert time.monotonic() - started < 60")
    assert DURATION.search("    assert result.seconds_to_exit <= drill.bound")
    assert not DURATION.search("    assert r['samples_per_s'] > 0") and not DURATION.search("    assert seconds == 3")
