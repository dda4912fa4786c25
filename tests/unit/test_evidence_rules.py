"""The suite's own rules (issue 25), checked on its files: unit tests start no process and open no socket, and
no test asserts a duration (a bound that is the claim goes into a drill or a benchmark that records it).

A duration is asserted (issue 38) by an assert that orders a measured time -- a clock read, a variable named for
elapsed time or for a moment (``stopped_time``, ``action_at``) -- against a bound or another moment, or a time
against a ``timeout``, ``deadline`` or ``bound``; and by an assert right after a thread's bounded ``join(N)``,
which judges whatever happened in those N seconds (``waiter.join(3); assert not taken``). A test asserts the
order of events or the outcome instead. A wait may have a deadline as a hang guard only: its expiry fails the
test (``assert event.wait(60), ...``, or ``join(N)`` followed by ``assert not thread.is_alive()``)."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
# A process or a socket in a unit test: subprocess/Popen/os.system calls, socket objects.
IMPURE = re.compile(r"\bsubprocess\.(run|Popen|call|check_call|check_output)\b|\bsocket\.socket\(|\bos\.system\(")
# An assert that orders a measured time: a clock read, a variable named for elapsed time or for a moment (<x>_time,
# <verb>ed_at, action_at, visible_at), or a timeout/deadline/bound used as one, on either side of <, <=, >, >=.
_TIME = (r"(monotonic\(\)|perf_counter\(\)|time\.time\(\)|\btook\b|\belapsed\b|\bseconds(_to_exit)?\b|\w+_time\b|"
         r"\b\w+ed_at\b|\b(action|visible)_at\b|\btimeout\b|\bdeadline\b|\bbound\b)")
_ORDER = r"(?<![-<>=!])(<=?|>=?)(?![<>])"
DURATION = re.compile(rf"^\s*assert\b.*({_TIME}[^=\n]*{_ORDER}\s*\S|{_ORDER}\s*[\w.\[\]\"']*{_TIME})")
# A thread joined with a timeout: the next statement sees whatever happened in those seconds.
BOUNDED_JOIN = re.compile(r"\b([\w.]+)\.join\(\s*(timeout\s*=\s*)?[\d.]+\s*\)")


def offenders(pattern: re.Pattern, files) -> list[str]:
    """Matching lines of ``files`` (this file, which spells the patterns out, left out)."""
    return [f"{path.relative_to(TESTS)}:{n}: {line.strip()}" for path in files if path.name != Path(__file__).name
            for n, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]


def bounded_joins(text: str) -> list[tuple[int, str]]:
    """(line number, line) of each bounded ``join(N)`` whose next statement is an assert other than the hang guard
    ``assert not <thread>.is_alive()``: that assert judges what happened within N seconds."""
    lines = text.splitlines()
    found = []
    for n, line in enumerate(lines, 1):
        join = BOUNDED_JOIN.search(line)
        following = next((x.strip() for x in lines[n:] if x.strip() and not x.strip().startswith("#")), "")
        if join and following.startswith("assert ") and not following.startswith(f"assert not {join[1]}.is_alive()"):
            found.append((n, line.strip()))
    return found


def test_unit_tests_start_no_process_and_open_no_socket():
    found = offenders(IMPURE, (TESTS / "unit").rglob("*.py"))
    assert not found, "move these to tests/integration:\n" + "\n".join(found)


def test_no_test_asserts_a_duration():
    found = offenders(DURATION, TESTS.rglob("test_*.py")) + [
        f"{path.relative_to(TESTS)}:{n}: {line}" for path in TESTS.rglob("test_*.py") if path.name != Path(__file__).name
        for n, line in bounded_joins(path.read_text())]
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
    # issue 38: moments compared, timeouts as bounds, and what a bounded join lets through
    assert DURATION.search('    assert result.report["stopped_time"] < result.action_at, result')
    assert DURATION.search('        assert notice["action_at"] > notice["visible_at"]')
    assert DURATION.search("    assert took < timeout") and DURATION.search("    assert deadline >= time.monotonic()")
    assert not DURATION.search("    assert argv.index('--user') < image_at")  # a position, not a moment
    assert not DURATION.search("    assert r['step_time_s'] > 0 and proc.wait(timeout=150) == 1")
    assert not DURATION.search('    assert notice["action_at"] - notice["visible_at"] == WARNING_SECONDS')
    window = "waiter.join(3)  # it polls\nassert not taken.is_set()\n"
    assert bounded_joins(window) == [(1, "waiter.join(3)  # it polls")]
    assert bounded_joins("t.join(timeout=30)\n\n    assert results['long'].ok\n")
    assert not bounded_joins("reader.join(timeout=30)\nassert not reader.is_alive(), 'output still open'\n")
    assert not bounded_joins("reader.join(timeout=30)\nreturn ''.join(lines)\n") and not bounded_joins("t.join()\nassert x\n")
