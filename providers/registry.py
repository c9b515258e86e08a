"""Find providers by name: the built-ins, then entry points in group `reconciler.providers`.

A third-party package registers `name = "module:factory"`; the factory takes a
ProviderContext and returns an object implementing providers.base.Provider."""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from providers.base import Provider, ProviderContext
from providers.errors import PluginError

ENTRY_POINT_GROUP = "reconciler.providers"
BUILTIN = {
    "sim": "providers.sim:SimProvider",
    "aws": "providers.aws:AwsProvider",
    "gcp": "providers.gcp:GcpProvider",
    "azure": "providers.azure:AzureProvider",
}


def available() -> dict[str, str]:
    found = dict(BUILTIN)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, ep.value)
    return found


def load_provider(name: str, ctx: ProviderContext) -> Provider:
    target = available().get(name)
    if target is None:
        raise PluginError(f"unknown provider {name!r}; installed: {', '.join(sorted(available()))}")
    module, _, attr = target.partition(":")
    try:
        factory = getattr(importlib.import_module(module), attr)
    except ImportError as e:
        raise PluginError(f"provider {name!r} could not be loaded ({e}); install its extra, e.g. pip install 'fleetops-reconciler[{name}]'") from e
    except AttributeError as e:
        raise PluginError(f"provider {name!r}: {target} does not exist") from e
    provider = factory(ctx)
    if not isinstance(provider, Provider):
        raise PluginError(f"provider {name!r} ({target}) does not implement observe/offerings/create/delete")
    return provider
