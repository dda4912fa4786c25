"""The node shell's framing, pure: frames as the shell reads them, replies parsed from bytes arriving in any
chunking (the shell side runs for real in tests/integration/test_nodeshell_ssh.py and under every job)."""

from __future__ import annotations

import pytest

from multinode.ssh.shell import Reply, frame, start_command

TOKEN = "mn0123456789abcdef"


def test_a_frame_is_the_sizes_then_the_script_then_the_data():
    assert frame("echo hé", b"\x00\x01") == b"8 2\necho h\xc3\xa9\x00\x01"
    assert frame("true") == b"4 0\ntrue"


def test_the_shell_starts_as_one_exec_with_its_token():
    command = start_command(TOKEN)
    assert command.startswith("exec /bin/sh -c ") and command.endswith(f" mn-shell {TOKEN}")
    assert "export SHLVL=1" in command  # the login shell's rc files run once per shell, not per command


def feed_in_pieces(reply: Reply, out: bytes, err: bytes, size: int) -> None:
    for i in range(0, max(len(out), len(err)), size):
        reply.feed_err(err[i:i + size])
        reply.feed_out(out[i:i + size])


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_a_reply_is_parsed_whatever_the_chunking(size):
    outs, errs = [], []
    reply = Reply(TOKEN, 3, outs.append, errs.append)
    # The output does not end with a newline and holds things that look like other commands' markers.
    out = f"{TOKEN} 3 +\nline 1\n{TOKEN} 2 0\nno newline at the end".encode() + f"{TOKEN} 3 42\n".encode()
    err = f"warning\n{TOKEN} 33\npartial".encode() + f"{TOKEN} 3\n".encode()
    feed_in_pieces(reply, out, err, size)
    assert reply.done and reply.exit_code == 42
    assert b"".join(outs) == f"line 1\n{TOKEN} 2 0\nno newline at the end".encode()
    assert b"".join(errs) == f"warning\n{TOKEN} 33\npartial".encode()


def test_output_is_passed_on_at_once_unless_it_could_begin_the_end_marker():
    outs = []
    reply = Reply(TOKEN, 1, outs.append, lambda data: None)
    reply.feed_out(f"{TOKEN} 1 +\n".encode())
    reply.feed_out(b"epoch 1\n")
    assert b"".join(outs) == b"epoch 1\n"  # a whole line is shown while the job goes on
    reply.feed_out(b"tail mn01")
    assert b"".join(outs) == b"epoch 1\ntail "  # "mn01" may begin the marker: held back
    reply.feed_out(b"x\n")
    assert b"".join(outs) == b"epoch 1\ntail mn01x\n" and not reply.done


def test_no_acknowledgement_yet_means_not_answered_and_what_comes_before_it_is_dropped():
    reply = Reply(TOKEN, 1, lambda data: None, lambda data: None)
    reply.feed_out(f"{TOKEN} 1".encode())
    assert not reply.answered
    reply.feed_out(b" +\n")
    assert reply.answered
    outs = []
    noisy = Reply(TOKEN, 1, outs.append, lambda data: None)  # a login shell whose ~/.bashrc prints
    for piece in (b"Welcome to the node!\n" + b"x" * 4000, f"conda: base\n{TOKEN} 1".encode(), b" +\nreal output\n"):
        noisy.feed_out(piece)
    assert noisy.answered and b"".join(outs) == b"real output\n"


def test_done_needs_both_streams_and_the_whole_exit_code():
    reply = Reply(TOKEN, 5, lambda data: None, lambda data: None)
    reply.feed_out(f"{TOKEN} 5 +\n{TOKEN} 5 1".encode())
    assert not reply.done  # "1" may be the start of "127"
    reply.feed_out(b"27\n")
    assert not reply.done  # stderr has not ended yet
    reply.feed_err(f"{TOKEN} 5\n".encode())
    assert reply.done and reply.exit_code == 127
