"""fleetops reconciler: a declarative GitOps reconciler for multi-cloud ML compute fleets.

Pipeline: load -> observe -> solve -> plan -> apply -> status. The library API
lives in reconciler.api; the CLI (reconciler.cli) is a thin layer over it."""


def __getattr__(name: str) -> str:
    """`__version__`, read from the installed metadata when first asked (`reconcile --version`, the bootstrap):
    importlib.metadata imports the email package, 0.02 s of CPU that no plan needs."""
    if name != "__version__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        value = version("fleetops-reconciler")  # from the git tag it was built at (setuptools-scm)
    except PackageNotFoundError:  # imported from a source tree that was never installed
        value = "0.0.0"
    globals()["__version__"] = value
    return value
