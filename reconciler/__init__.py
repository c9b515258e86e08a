"""fleetops reconciler: a declarative GitOps reconciler for multi-cloud ML compute fleets.

Pipeline: load -> observe -> solve -> plan -> apply -> status. The library API
lives in reconciler.api; the CLI (reconciler.cli) is a thin layer over it."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("fleetops-reconciler")  # from the git tag it was built at (setuptools-scm)
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0.0.0"
