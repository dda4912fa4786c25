"""Provider registry: ``get_provider(name)`` gives a provider (its module is imported then). Unknown names list
the valid ones."""

from __future__ import annotations

from multinode.core.registry import Registry
from multinode.providers.base import Provider

PROVIDERS = Registry("PROVIDER", "providers", {
    "local": "multinode.providers.local.provider:LocalProvider",
    "aws": "multinode.providers.aws.provider:AwsProvider",
    "hosts": "multinode.providers.hosts:HostsProvider",
})


def get_provider(name: str) -> Provider:
    return PROVIDERS.create(name)
