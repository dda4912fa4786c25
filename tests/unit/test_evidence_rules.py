"""The suite's own rules (issue 25), checked on its files: unit tests start no process and open no socket, and
no test asserts a duration (a bound that is the claim goes into a drill or a benchmark that records it).

A duration is asserted (issue 38) by an assert that orders a measured time -- a clock read, a variable named for
elapsed time or for a moment (``stopped_time``, ``action_at``) -- against a bound or another moment, or a time
against a ``timeout``, ``deadline`` or ``bound``; and by an assert right after a thread's bounded ``join(N)``,
which judges whatever happened in those N seconds (``waiter.join(3); assert not taken``). A test asserts the
order of events or the outcome instead. A wait may have a deadline as a hang guard only: its expiry fails the
test (``assert event.wait(60), ...``, or ``join(N)`` followed by ``assert not thread.is_alive()``).

Issue 48 closed three ways around it: an assert spread over several lines is read whole (its statement, from the
syntax tree); a wait used as a bound -- its timeout computed from the workload (``timeout=SLEEP / 2``: the run must
end before the sleepers would), or a wait asserted *not* to end (``assert not done.wait(5)``: nothing within 5 s)
-- is a duration too; and so is timing in a shell command a test runs: a loop of sleeps whose end fails the command
(``for i in $(seq 50); do ...; sleep 0.09; done; exit 1``)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from multinode.core.config import DEFAULT_STALL_TIMEOUT

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


# A shell loop of sleeps that fails when it runs out: a deadline in shell (a loop that waits for an event with no
# failing exit after it is a hang guard's; one that only keeps a process alive is neither).
SHELL_DEADLINE = re.compile(r"(\bseq\s+\d+|\[\s*\$\w+\s+-lt\s+\d+\s*\]).*\bsleep\s+[\d.]+.*\bdone\b.*\bexit\s+[1-9]")
WAITS = {"wait", "wait_for", "join", "communicate", "cli", "run", "popen"}
RUN_WAITS = {"wait", "wait_for", "communicate", "cli"}  # waits on a run of ours (a Popen of it, its output, the CLI)


def _segment(lines: list[str], node: ast.AST) -> str:
    """The node's source on one line (``ast.get_source_segment`` splits the whole text at every call)."""
    def cut(n: int, start: int | None, end: int | None) -> str:  # the offsets count UTF-8 bytes
        return lines[n - 1].encode()[start:end].decode(errors="replace")

    if node.lineno == node.end_lineno:
        return cut(node.lineno, node.col_offset, node.end_col_offset).strip()
    parts = [cut(node.lineno, node.col_offset, None), *lines[node.lineno:node.end_lineno - 1],
             cut(node.end_lineno, None, node.end_col_offset)]
    return " ".join(" ".join(parts).split())


def duration_asserts(text: str, tree: ast.AST | None = None) -> list[tuple[int, str]]:
    """(line, statement) of each assert whose whole statement -- continuation lines joined -- orders a time."""
    found, lines = [], text.splitlines()
    for node in ast.walk(tree or ast.parse(text)):
        if isinstance(node, ast.Assert):
            statement = _segment(lines, node)
            if DURATION.search(statement):
                found.append((node.lineno, statement))
    return found


def bounds(text: str, tree: ast.AST | None = None) -> list[tuple[int, str]]:
    """(line, call) of each wait used as a bound: a timeout computed from a workload figure (arithmetic on a name),
    a wait on a run whose bound is the run's own STALL_TIMEOUT (the test's wait and the run's watchdog end together:
    the test cannot see the run's own verdict; unless the call turns the watchdog off), or an assert that a wait does
    not end (``assert not x.wait(5)``)."""
    found, lines = [], text.splitlines()
    for node in ast.walk(tree or ast.parse(text)):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in WAITS:
            timeouts = [k.value for k in node.keywords if k.arg == "timeout"]
            computed = any(isinstance(t, ast.BinOp) and any(isinstance(n, ast.Name) for n in ast.walk(t))
                           for t in timeouts)
            stall = (getattr(node.func, "attr", None) in RUN_WAITS
                     and any(isinstance(t, ast.Constant) and t.value == DEFAULT_STALL_TIMEOUT for t in timeouts)
                     and "--stall-timeout" not in _segment(lines, node))
            if computed or stall:
                found.append((node.lineno, _segment(lines, node)))
        if (isinstance(node, ast.Assert) and isinstance(node.test, ast.UnaryOp) and isinstance(node.test.op, ast.Not)
                and isinstance(node.test.operand, ast.Call)
                and getattr(node.test.operand.func, "attr", None) in {"wait", "wait_for", "join"}):
            found.append((node.lineno, _segment(lines, node)))
    return found


def shell_deadlines(text: str, tree: ast.AST | None = None) -> list[tuple[int, str]]:
    """(line, text) of each string (adjacent literals joined, as Python joins them; an f-string's fields as {})
    holding a shell deadline."""
    found = {}
    for node in ast.walk(tree or ast.parse(text)):
        if isinstance(node, ast.JoinedStr):
            value = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            value = node.value
        else:
            continue
        if SHELL_DEADLINE.search(" ".join(value.split())):
            found.setdefault(node.lineno, " ".join(value.split())[:160])  # an f-string's parts are strings too
    return sorted(found.items())


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
    found = []
    for path in TESTS.rglob("test_*.py"):
        if path.name != Path(__file__).name:
            text = path.read_text()
            tree = ast.parse(text)
            found += [f"{path.relative_to(TESTS)}:{n}: {line}" for check in (duration_asserts, bounds, shell_deadlines)
                      for n, line in check(text, tree)]
            found += [f"{path.relative_to(TESTS)}:{n}: {line}" for n, line in bounded_joins(text)]
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


def test_the_issue_48_patterns_catch_what_they_are_for():
    """Each pattern against the case that escaped the line rule, and against its hang-guard twin."""
    spread = "def t():\n    assert (result.seconds_to_exit\n            <= drill.bound), result\n"
    assert duration_asserts(spread) == [(2, "assert (result.seconds_to_exit <= drill.bound), result")]
    assert not offenders(DURATION, []) and not DURATION.search(spread.splitlines()[1])  # the line rule missed it
    assert not duration_asserts("def t():\n    assert (res.returncode\n            == 1), res.stdout\n")
    assert bounds("res = cluster.cli('train', timeout=SLEEP / 2)\n")  # test_scale's: the run must beat the sleepers
    assert bounds("assert not done.wait(5)\n") and bounds("assert not out.wait_for('x', timeout=3)\n")
    assert not bounds("assert done.wait(60), 'hung'\n") and not bounds("proc.wait(timeout=RUN_BOUND)\n")
    assert not bounds("res = cluster.cli('train', timeout=600)\n")
    assert bounds("code = proc.wait(timeout=300)\n")  # the run's own STALL_TIMEOUT: its watchdog and the wait race
    assert not bounds("res = cluster.cli('train', '--stall-timeout=0', timeout=300)\n")  # no watchdog to race
    polls = 'cmd = (f"for i in $(seq 50); do [ $(cat {p}) -ge 3 ] && exit 0; sleep 0.09; done; "\n       "exit 1")\n'
    assert shell_deadlines(polls)  # test_guard_switches's: three polls within 4.5 s, or the command fails
    assert shell_deadlines('c = "i=0; while [ $i -lt 40 ]; do sleep 0.2; i=$((i+1)); done; exit 3"\n')
    assert not shell_deadlines('c = "trap \'exit 3\' TERM; while :; do sleep 0.2; done"\n')  # alive until signalled
    assert not shell_deadlines('c = "until [ -e {f} ]; do sleep 0.1; done"\n')  # waits for an event: a hang guard
