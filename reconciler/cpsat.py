"""ortools' CP-SAT module, imported without pandas: every module of ours takes `cp_model` from here.

ortools.sat.python.cp_model imports pandas at its top for its *_series and `values` API (variables indexed by a
pandas Index), which the planner never calls; pandas was ~60% of importing the solver (0.4 of 0.65 s of CPU on the
shared machine, ~0.13 s on an idle core), paid by every `reconcile plan` that solves. Where pandas is not imported
yet, cp_model is imported against a stand-in module whose Index and Series refuse to be made, taken out of
sys.modules again at once: a later `import pandas` gets the real one, and cp_model's pandas API, if anything ever
called it, refuses (its isinstance checks fail, or making an Index or Series does) instead of answering wrong. Where pandas is imported already, cp_model uses it.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType


class _NoPandas:
    """cp_model's pd.Index / pd.Series where pandas was left out: isinstance() of anything is False, making one fails."""

    def __new__(cls, *args, **kwargs):
        raise RuntimeError("ortools' pandas API (cp_model *_series, CpSolver.values) is not available: reconciler.cpsat "
                           "imports cp_model without pandas")


def import_without_pandas(name: str) -> ModuleType:
    """Module `name` imported against the pandas stand-in (where pandas and it are not imported yet). Should a newer
    ortools ask the stand-in for more than Index and Series at import, it is imported again with the real pandas:
    slower, never broken (an AttributeError there would have failed every solving plan after an upgrade)."""
    if "pandas" in sys.modules or name in sys.modules:
        return importlib.import_module(name)
    stand_in = ModuleType("pandas", "stand-in while reconciler.cpsat imports ortools' cp_model (see there)")
    stand_in.Index = type("Index", (_NoPandas,), {})  # type: ignore[attr-defined]
    stand_in.Series = type("Series", (_NoPandas,), {})  # type: ignore[attr-defined]
    sys.modules["pandas"] = stand_in
    try:
        return importlib.import_module(name)
    except Exception:  # (what the stand-in lacks: AttributeError, or an ImportError of `from pandas import X`)
        sys.modules.pop(name, None)
        sys.modules.pop("pandas", None)
        return importlib.import_module(name)
    finally:
        if sys.modules.get("pandas") is stand_in:
            del sys.modules["pandas"]


cp_model = import_without_pandas("ortools.sat.python.cp_model")

__all__ = ["cp_model"]
