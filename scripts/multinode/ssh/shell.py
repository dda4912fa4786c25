"""A persistent shell per node: every command of a run over one SSH session, not one session each.

An SSH exec session costs the node a login shell: sshd runs ``$SHELL -c <command>``, and a bash started by sshd
reads ``~/.bashrc`` -- where pyenv or conda initialisation costs 120 ms per session on the machine this was
measured on (one round of ``true`` on 32 nodes: 2.6-3.1 s; 0.08 s with an empty ``~/.bashrc``). A run used to open
six sessions per node (pre-flight, manifest, transfer, skew, job, sweep); pdsh opens one. A :class:`NodeShell` is
one session whose command is a small POSIX sh loop; each command is framed over its stdin and runs in
``$SHELL -c`` (bash, as before, minus the rc files: the environment the login shell exported is inherited), with
``/dev/null`` or its own data on stdin. The login shell's rc files run once per shell, like pdsh's one session.

Framing (see :func:`frame` and :class:`Reply`; ``<t>`` is a random token per shell, ``<n>`` the command's number):

* control -> node: ``"<script bytes> <data bytes>\\n"``, the script, the data;
* node -> control: ``"<t> <n> +\\n"`` on stdout once the command is read (the node answers), then its stdout, then
  ``"<t> <n> <exit code>\\n"``; on stderr its stderr, then ``"<t> <n>\\n"``. A marker need not start a line (the
  output may not end with one); only bytes that could begin a marker are held back until the next read.

The data a command does not read is drained, so the next command's frame starts where it should.
"""

from __future__ import annotations

import codecs
import secrets
import select
import shlex
import time
from collections.abc import Callable

import paramiko

# $1: the token. `read` and `head -c` take exactly what the frame says from stdin (both read no further than
# asked on a pipe or socket: dash's read reads byte by byte, GNU head -c reads at most the remaining count).
# SHLVL: bash reads ~/.bashrc when SSH_CLIENT is set and SHLVL (after its own +1) is below 2; the login shell's
# `exec` put it back to 0, so without this every command's bash would run the rc files again (measured: 85 ms each).
LOOP = r"""t=$1; n=0; sh=${SHELL:-/bin/sh}; export SHLVL=1
while IFS=' ' read -r slen dlen; do
  n=$((n+1))
  s=$(head -c "$slen"; echo x); s=${s%x}
  printf '%s %d +\n' "$t" "$n"
  if [ "$dlen" -gt 0 ]; then
    head -c "$dlen" | ( "$sh" -c "$s"; c=$?; cat >/dev/null; exit $c )
  else
    "$sh" -c "$s" </dev/null
  fi
  c=$?
  printf '%s %d %d\n' "$t" "$n" "$c"; printf '%s %d\n' "$t" "$n" >&2
done
"""


def start_command(token: str) -> str:
    """The SSH exec command that turns a session into a NodeShell."""
    return f"exec /bin/sh -c {shlex.quote(LOOP)} mn-shell {token}"


def frame(script: str, data: bytes = b"") -> bytes:
    """One command as the shell reads it."""
    body = script.encode()
    return f"{len(body)} {len(data)}\n".encode() + body + data


class ShellBroken(Exception):
    """The shell cannot be used again (its session ended, or a command overran its time)."""


class NoAnswer(ShellBroken):
    """The node did not acknowledge a command in time: it is unreachable or its session is gone."""


class _Stream:
    """One direction of a reply (stdout or stderr): passes output on, holds back what may be the end marker."""

    def __init__(self, marker: bytes, sink: Callable[[bytes], None]):
        self.marker, self.sink = marker, sink
        self.buffer = b""
        self.ended = False
        self.rest = b""  # what followed the marker (the exit code on stdout)

    def feed(self, data: bytes) -> None:
        if self.ended:
            self.rest += data
            return
        self.buffer += data
        at = self.buffer.find(self.marker)
        if at >= 0:
            self.sink(self.buffer[:at])
            self.rest, self.buffer, self.ended = self.buffer[at + len(self.marker):], b"", True
            return
        keep = self._partial()  # a marker may be split across reads: hold back what could be its start
        if len(self.buffer) > keep:
            self.sink(self.buffer[:len(self.buffer) - keep])
            self.buffer = self.buffer[len(self.buffer) - keep:]

    def _partial(self) -> int:
        """Length of the longest end of the buffer that is a beginning of the marker."""
        for size in range(min(len(self.marker) - 1, len(self.buffer)), 0, -1):
            if self.buffer.endswith(self.marker[:size]):
                return size
        return 0


class Reply:
    """Parses one command's reply from the two streams of the shell's channel (pure: fed bytes, no I/O)."""

    def __init__(self, token: str, number: int, out: Callable[[bytes], None], err: Callable[[bytes], None]):
        self.ack = f"{token} {number} +\n".encode()
        self.answered = False
        self._pending = b""
        self.out = _Stream(f"{token} {number} ".encode(), out)
        self.err = _Stream(f"{token} {number}\n".encode(), err)

    def feed_out(self, data: bytes) -> None:
        if not self.answered:
            # Whatever comes before the acknowledgement is not this command's: a login shell's rc file that prints
            # (a banner, conda's notices) says it before the first one. It is dropped, not taken as output.
            self._pending += data
            at = self._pending.find(self.ack)
            if at < 0:
                self._pending = self._pending[-(len(self.ack) - 1):]
                return
            self.answered, data, self._pending = True, self._pending[at + len(self.ack):], b""
        self.out.feed(data)

    def feed_err(self, data: bytes) -> None:
        self.err.feed(data)

    @property
    def done(self) -> bool:
        return self.err.ended and self.out.ended and b"\n" in self.out.rest

    @property
    def exit_code(self) -> int:
        return int(self.out.rest.split(b"\n", 1)[0])


class NodeShell:
    """One SSH session running :data:`LOOP`; one command at a time (the caller serializes)."""

    def __init__(self, transport: paramiko.Transport, open_timeout: float = 10.0):
        self.token = f"mn{secrets.token_hex(8)}"
        self.channel = transport.open_session(timeout=open_timeout)
        self.channel.exec_command(start_command(self.token))
        self.count = 0
        self.broken = False

    def close(self) -> None:
        self.broken = True
        try:
            self.channel.close()
        except Exception:  # closing a dead channel may raise; nothing to do about it
            pass

    def end(self) -> None:
        """Send end-of-input: the loop exits after its current command (a login shell still in its rc files
        gets there too); :meth:`ended` says when the node reported the exit."""
        self.broken = True
        try:
            self.channel.shutdown_write()
        except Exception:  # the session is already gone
            pass

    def stop(self) -> None:
        """End this shell's loop and whatever it runs now, on the node: the command of a timed-out call would
        otherwise run on to its own end (a closed SSH session without a terminal signals nothing to its processes).
        sshd made the session its own process group (setsid, OpenSSH session.c do_exec_no_pty), led by the loop:
        found by its token on a second session of the same connection, the group gets SIGTERM, then SIGKILL.
        What a command started in a session of its own (setsid) is not touched. Best effort: a connection that
        fails now leaves the node as it was."""
        group = f"$(pgrep -o -f '[m]n-shell {self.token}')"  # [m]: the pattern does not match this command itself
        kill = (f'g={group}; [ -n "$g" ] || exit 0; kill -TERM -- "-$g"; sleep 0.5; '
                'kill -0 -- "-$g" 2>/dev/null && kill -KILL -- "-$g"; exit 0')
        try:
            stopper = self.channel.get_transport().open_session(timeout=5)
            stopper.exec_command(kill)
            end = time.monotonic() + 10
            while not stopper.exit_status_ready() and time.monotonic() < end:
                time.sleep(0.05)
            stopper.close()
        except Exception:  # the connection is gone: nothing more can be done from here
            pass

    def ended(self) -> bool:
        return self.channel.closed or self.channel.exit_status_ready()

    def execute(self, script: str, data: bytes = b"", timeout: float | None = 60.0,
                out: Callable[[bytes], None] | None = None, err: Callable[[bytes], None] | None = None,
                answer_timeout: float | None = None) -> tuple[int, bytes, bytes]:
        """Run ``script`` (with ``data`` on stdin); (exit code, stdout, stderr). ``out``/``err``: called with the
        output as it arrives instead (the returned bytes are then empty). Raises :class:`NoAnswer` if the node does
        not acknowledge within ``answer_timeout`` and :class:`ShellBroken` on a lost session or after ``timeout``
        (the shell is closed then)."""
        if self.broken:
            raise ShellBroken("the shell was closed")
        self.count += 1
        chunks_out: list[bytes] = []
        chunks_err: list[bytes] = []
        reply = Reply(self.token, self.count, out or chunks_out.append, err or chunks_err.append)
        start = time.monotonic()
        end = None if timeout is None else start + timeout
        answer_end = None if answer_timeout is None else start + answer_timeout
        try:
            self.channel.sendall(frame(script, data))
            while not reply.done:
                now = time.monotonic()
                if not reply.answered and answer_end is not None and now > answer_end:
                    raise NoAnswer(f"no answer within {answer_timeout:.0f} s")
                if end is not None and now > end:
                    self.stop()
                    raise ShellBroken(f"command timed out after {timeout:.0f} s")
                if not self._pump(reply, 0.2):
                    raise ShellBroken("the SSH session ended")
        except ShellBroken:
            self.close()
            raise
        except Exception as error:  # the transport failed under us
            self.close()
            raise ShellBroken(f"{type(error).__name__}: {error}") from None
        return reply.exit_code, b"".join(chunks_out), b"".join(chunks_err)

    def _pump(self, reply: Reply, wait: float) -> bool:
        """Move whatever arrived into ``reply``; False once the session has ended with nothing left to read."""
        channel = self.channel
        if not (channel.recv_ready() or channel.recv_stderr_ready() or channel.closed or channel.eof_received):
            select.select([channel], [], [], wait)
        while channel.recv_stderr_ready():
            reply.feed_err(channel.recv_stderr(1 << 16))
        while channel.recv_ready():
            reply.feed_out(channel.recv(1 << 16))
        if reply.done:
            return True
        return not (channel.closed or channel.eof_received)


class TextSink:
    """Bytes -> str for a text stream (a LineSink): incremental UTF-8, bad bytes replaced."""

    def __init__(self, target):
        self.target = target
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def __call__(self, data: bytes) -> None:
        text = self.decoder.decode(data)
        if text:
            self.target.write(text)

    def close(self) -> None:
        text = self.decoder.decode(b"", final=True)
        if text:
            self.target.write(text)
        self.target.close()
