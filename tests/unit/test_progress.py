"""multinode.core.progress: one line rewritten in place on a terminal, plain lines (once per change, no carriage
return) anywhere else; a line that stays (note) and the last one (done) on lines of their own."""

from __future__ import annotations

import io

from multinode.core.progress import Progress, is_terminal


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_each_change_is_one_plain_line():
    out = io.StringIO()
    progress = Progress("bootstrap", out, clock=lambda: 0.0)
    for text in ("0/2 ready", "0/2 ready", "1/2 ready"):
        progress.update(text)
    progress.note("node-0 is ready")
    progress.done("every node is ready")
    assert out.getvalue().splitlines() == ["bootstrap: 0/2 ready", "bootstrap: 1/2 ready", "node-0 is ready",
                                           "bootstrap: every node is ready (0s)"]
    assert "\r" not in out.getvalue() and not is_terminal(out)


def test_on_a_terminal_one_line_is_rewritten_and_ends_on_its_own_line():
    out, now = Terminal(), [0.0]
    with Progress("terraform apply", out, clock=lambda: now[0]) as progress:
        progress.update("aws_vpc.this[0]: Creating... and a long tail")
        now[0] = 12
        progress.update("short")
    text = out.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")  # the line left updating is ended when the wait ends
    frames = text.rstrip("\n").split("\r")[1:]
    assert frames[0] == "terraform apply: aws_vpc.this[0]: Creating... and a long tail (0s)"
    assert frames[1].rstrip() == "terraform apply: short (12s)" and len(frames[1]) == len(frames[0])  # old text blanked


def test_a_line_too_wide_for_the_terminal_is_cut_so_it_never_wraps(monkeypatch):
    import os

    monkeypatch.setattr("shutil.get_terminal_size", lambda *a: os.terminal_size((30, 24)))
    out = Terminal()
    Progress("x", out, clock=lambda: 0.0).update("y" * 100)
    assert len(out.getvalue().lstrip("\r")) == 29 and out.getvalue().endswith("...")


def test_a_commands_output_relayed_is_one_updating_line_on_a_terminal_and_every_line_elsewhere(tmp_path):
    from multinode.core.progress import relay

    build = ["STEP 1/2: FROM debian\n", "\n", "STEP 2/2: RUN pip install torch\n"]

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out, log = Terminal(), open(tmp_path / "build.log", "w")
    with log:
        assert relay("image cpu", build, out, log) == 3
    shown = out.getvalue()
    assert shown.count("\n") == 1 and "\rimage cpu: STEP 2/2: RUN pip install torch (" in shown  # one line, rewritten
    assert shown.rstrip("\n").rsplit("\r", 1)[1].startswith("image cpu: 3 lines; every line in ")  # cut to the width
    assert (tmp_path / "build.log").read_text() == "".join(build)
    plain = io.StringIO()
    relay("image cpu", build, plain)
    assert plain.getvalue() == "".join(build)  # a pipe, CI: every line as it came
