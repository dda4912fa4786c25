"""One shape for every registry of the package (providers, launchers, runtimes, backends): a name -> the class
that implements it, given as ``"module:Class"`` and imported on first use (the AWS provider's boto3 costs a
``make train`` on local nodes nothing). An unknown name is one line listing the valid ones, e.g.
``unknown PROVIDER 'gcp'; valid providers: local, aws, hosts`` (pipx: ``Unknown backend 'x'. Valid backends: ...``).
"""

from __future__ import annotations

import importlib
from typing import Any

from multinode.core.errors import UserError


class Registry:
    """``name -> "module:Class"``; :meth:`load` gives the class, :meth:`create` an instance."""

    def __init__(self, what: str, plural: str, entries: dict[str, str]):
        self.what, self.plural, self.entries = what, plural, dict(entries)

    def __iter__(self):
        return iter(self.entries)

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    def load(self, name: str) -> Any:
        try:
            module, _, attribute = self.entries[name].partition(":")
        except KeyError:
            raise UserError(f"unknown {self.what} {name!r}; valid {self.plural}: {', '.join(self.entries)}") from None
        return getattr(importlib.import_module(module), attribute)

    def create(self, name: str, *args: Any) -> Any:
        return self.load(name)(*args)
