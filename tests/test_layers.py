"""The layers import downwards only: providers (the bottom: the Provider Protocol, the clouds, the catalog, the errors
they raise) import nothing of the reconciler, so a provider plugin, or a tool that only reads the catalog, needs no
solver, planner or CLI, and nothing the reconciler changes can break a provider by import."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in the file, the lazy ones inside functions included."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
    return out


def test_providers_import_nothing_of_the_reconciler():
    found = [f"{p.relative_to(ROOT)}:{line}: import {mod}" for p in sorted((ROOT / "providers").rglob("*.py"))
             for line, mod in _imports(p) if mod == "reconciler" or mod.startswith("reconciler.")]
    assert found == [], "providers/ must not import the layer above it:\n" + "\n".join(found)


def test_the_scan_sees_lazy_imports(tmp_path):
    """The scan is no tautology: an import inside a function, as the SDKs are imported, is found too."""
    f = tmp_path / "p.py"
    f.write_text("def create():\n    from reconciler.runtime.bootstrap import bootstrap_script\n    import reconciler.errors\n")
    assert _imports(f) == [(2, "reconciler.runtime.bootstrap"), (3, "reconciler.errors")]


def test_provider_errors_are_the_reconcilers():
    """Moving the errors down changed no class: `except ReconcileError` (the CLI's exit 1) and
    `except CapacityError` catch what providers raise, whichever module a caller names them from."""
    import providers.errors as low
    import reconciler.errors as high

    for name in low.__all__:
        assert getattr(high, name) is getattr(low, name)
        assert issubclass(getattr(low, name), high.ReconcileError)
    assert issubclass(high.ConfigError, low.ReconcileError) and high.ReconcileError.__name__ == "ReconcileError"
