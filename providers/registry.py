"""Find providers by name: the built-ins, then entry points in group `reconciler.providers`.

A third-party package registers `name = "module:factory"`; the factory takes a
ProviderContext and returns an object implementing providers.base.Provider."""

from __future__ import annotations

import importlib
from collections.abc import Mapping

from providers.base import Provider, ProviderContext
from providers.errors import PluginError
from providers.options import Option

ENTRY_POINT_GROUP = "reconciler.providers"
BUILTIN = {
    "sim": "providers.sim:SimProvider",
    "aws": "providers.aws:AwsProvider",
    "gcp": "providers.gcp:GcpProvider",
    "azure": "providers.azure:AzureProvider",
}


# The extra (pyproject.toml) that installs each built-in cloud provider's SDK.
EXTRAS = {"aws": "aws", "gcp": "gcp", "azure": "azure"}


def _missing(name: str, e: ImportError) -> str:
    """What to install when a provider's SDK is missing: the built-in's extra, else the module a plugin lacks.
    (`from google.cloud import compute_v1` without the package is an ImportError naming google.cloud, not the module.)"""
    module = e.name if isinstance(e, ModuleNotFoundError) and e.name else f"a module it imports ({e})"
    if name in EXTRAS and BUILTIN.get(name) == _target(name):
        return (f"provider {name!r} needs {module}, which is not installed: pip install "
                f"'fleetops-reconciler[{EXTRAS[name]}]'")
    return f"provider {name!r} needs the Python module {module}, which is not installed: install it (or the package that provides it)"


def available() -> dict[str, str]:
    from importlib.metadata import entry_points  # (lazily: it imports the email package, which a plan needs not)

    found = dict(BUILTIN)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, ep.value)
    return found


def _target(name: str) -> str | None:
    """Where provider `name` is made ("module:factory"), None if nowhere. A built-in wins over an entry point of its
    name, so a built-in is found without reading every installed distribution's entry points (65 ms of each plan
    with ~120 distributions installed, more than the quick start's whole solve)."""
    return BUILTIN.get(name) or available().get(name)


def load_provider(name: str, ctx: ProviderContext) -> Provider:
    target = _target(name)
    if target is None:
        raise PluginError(f"unknown provider {name!r}; installed: {', '.join(sorted(available()))}")
    module, _, attr = target.partition(":")
    try:
        factory = getattr(importlib.import_module(module), attr)
    except ModuleNotFoundError as e:
        raise PluginError(_missing(name, e)) from e
    except ImportError as e:
        raise PluginError(f"provider {name!r} could not be loaded ({e}); install its extra, e.g. pip install 'fleetops-reconciler[{name}]'") from e
    except AttributeError as e:
        raise PluginError(f"provider {name!r}: {target} does not exist") from e
    try:
        provider = factory(ctx)
    except ImportError as e:  # a cloud SDK each built-in imports when it is made, not when it is listed
        raise PluginError(_missing(name, e)) from e
    if not isinstance(provider, Provider):
        raise PluginError(f"provider {name!r} ({target}) does not implement observe/offerings/create/delete")
    return provider


def declared_options(name: str) -> Mapping[str, Option] | None:
    """The `-o` options provider `name` takes (its factory's OPTIONS). None: it declares none (a plugin may read
    any key), or it is unknown or cannot be imported (loading it says why)."""
    target = _target(name)
    if target is None:
        return None
    module, _, attr = target.partition(":")
    try:
        factory = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError):
        return None
    return getattr(factory, "OPTIONS", None)
