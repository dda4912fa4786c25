"""A plan's words as the shell on the node reads them: literal words, and shell text evaluated where the command runs.

A launcher's argv and env are literal over SSH: every value is known when the plan is made, and
:func:`shell_join` quotes each word (it is ``shlex.join`` there). A batch script materialises the same plan for
nodes the scheduler picks (:mod:`multinode.backends.slurm.script`): some values are known only in the task --
the allocation's first host, the job id, the task's run directory -- and the launcher is given them as :class:`Sh`,
shell text that is written inside double quotes and never quoted away. :func:`cat` builds one value from both
kinds, so a launcher writes ``cat(host, f":{port}")`` once for either.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping

OPTION = re.compile(r"(--[\w-]+=)(.*)", re.S)


class Sh(str):
    """Shell text evaluated where the command runs (``$rundir``, ``$(...)``): written inside double quotes."""


def _in_double_quotes(text: str) -> str:
    """Literal text escaped for the inside of double quotes."""
    return re.sub(r'([\\"$`])', r"\\\1", text)


def cat(*parts: str) -> str:
    """One value from literal parts and :class:`Sh` parts: :class:`Sh` if any part is (the literal parts escaped)."""
    if not any(isinstance(part, Sh) for part in parts):
        return "".join(parts)
    return Sh("".join(part if isinstance(part, Sh) else _in_double_quotes(part) for part in parts))


def shell_word(word: str) -> str:
    """One word as shell text: a literal quoted (``shlex.quote``); :class:`Sh` in double quotes, after the ``=`` of
    an ``--option=value`` (the line reads as the option's value)."""
    if not isinstance(word, Sh):
        return shlex.quote(word)
    option = OPTION.fullmatch(word)
    return f'{option[1]}"{option[2]}"' if option else f'"{word}"'


def shell_join(argv: Iterable[str]) -> str:
    """A command line: :func:`shell_word` of every word."""
    return " ".join(shell_word(word) for word in argv)


def assignments(env: Mapping[str, str]) -> str:
    """``K=V`` words for ``env`` (before a command, or after ``export``)."""
    return " ".join(f"{name}={shell_word(value)}" for name, value in env.items())


def fixed(env: Mapping[str, str]) -> dict[str, str]:
    """The literal values of ``env``: what can be written down before the command runs."""
    return {name: value for name, value in env.items() if not isinstance(value, Sh)}
