"""fleetops reconciler: a declarative GitOps reconciler for multi-cloud ML compute fleets.

Pipeline: load -> observe -> solve -> plan -> apply -> status. The library API
lives in reconciler.api; the CLI (reconciler.cli) is a thin layer over it."""

__version__ = "0.1.0"
