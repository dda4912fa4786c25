"""Provider registry: ``PROVIDERS[name]()`` gives a provider. Unknown names list the valid ones."""

from __future__ import annotations

from collections.abc import Callable

from multinode.core.errors import UserError
from multinode.providers.base import Provider


def _local() -> Provider:
    from multinode.providers.local.provider import LocalProvider

    return LocalProvider()


def _aws() -> Provider:
    from multinode.providers.aws.provider import AwsProvider

    return AwsProvider()


def _hosts() -> Provider:
    from multinode.providers.hosts import HostsProvider

    return HostsProvider()


PROVIDERS: dict[str, Callable[[], Provider]] = {"local": _local, "aws": _aws, "hosts": _hosts}


def get_provider(name: str) -> Provider:
    try:
        factory = PROVIDERS[name]
    except KeyError:
        raise UserError(f"unknown PROVIDER {name!r}; valid providers: {', '.join(PROVIDERS)}") from None
    return factory()
