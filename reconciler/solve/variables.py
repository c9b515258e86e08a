"""The model's values behind one interface: a CP-SAT variable where the model decides, a frozen
integer where it does not (a frozen host is kept: 1; a resident whose host goes stays nowhere: 0).

A frozen value stays a plain int rather than a fixed variable: at 10k instances most hosts are
frozen, and a variable each would grow the model the freezer exists to shrink. The rest of the
package asks this module, never the value's type, whether something is decided; expressions
built here fold the constants in (`wsum`)."""

from __future__ import annotations

from reconciler.cpsat import cp_model
from reconciler.units import MILLI_SCALED, room, scale, units  # noqa: F401 (the model's units, shared with the packer)


def is_variable(v) -> bool:
    """The model decides it (a CP-SAT variable or expression), as opposed to a frozen int."""
    return not isinstance(v, int)


def is_zero(v) -> bool:
    """Frozen at zero: nothing the model can place there."""
    return isinstance(v, int) and v == 0


def constant(expr) -> int | None:
    """The value of an expression that has no variable (a tier or cost over frozen parts only), else None."""
    return expr if isinstance(expr, int) else None


def solved(v, solution: list[int]) -> int:
    """The value `v` takes in a full solution vector (a frozen int is itself)."""
    return v if isinstance(v, int) else solution[v.index]


class Values(dict):
    """key -> a model value (variable or frozen int). A dict, so reads cost what a dict's do
    (the model reads these millions of times at 10k instances); what it adds is the questions
    the constraint families ask without looking at a value's type."""

    def variables(self) -> list:
        """Its CP-SAT variables, in insertion order (the order hints and searches walk)."""
        return [v for v in self.values() if not isinstance(v, int)]

    def variable_items(self) -> list[tuple]:
        return [(k, v) for k, v in self.items() if not isinstance(v, int)]

    def is_zero(self, key) -> bool:
        return is_zero(self[key])

    def is_variable(self, key) -> bool:
        return not isinstance(self[key], int)

    def solved(self, key, solution: list[int]) -> int:
        return solved(self[key], solution)


def wsum(terms):
    """A weighted sum of (coefficient, variable or int) pairs, fast; an int when no variable is left."""
    vs, cs, const = [], [], 0
    for c, v in terms:
        if isinstance(v, int):
            const += c * v
        elif c:
            vs.append(v)
            cs.append(c)
    expr = cp_model.LinearExpr.weighted_sum(vs, cs) if vs else 0
    return expr + const if const else expr


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def add_at_most_count(m: cp_model.CpModel, terms: list[tuple[int, object]], k: int, n, summed: bool = False) -> None:
    """m.add(lhs <= k * n), lhs `wsum(terms)` (or `LinearExpr.sum` of the variables, `summed`), n a variable or a
    sum of them, written straight to the model's proto in the form CP-SAT's own `add` gives it: variables by index,
    and a weighted sum of two or more terms compared with `k * n` turned round (k*n - lhs >= 0), as Python's operator
    dispatch does it (tests/test_solver_core.py checks the two the same, shape by shape). Building the expressions was
    most of the capacity rows' cost: 2M terms in the cuts alone of a 50k-job model. Any other shape goes through `add`."""
    lhs = [(c, v) for c, v in terms if c]
    n_vars, n_coeffs, n_off = flatten(n)
    if len(lhs) < 2 or k < 1 or n_off or not n_vars or any(c != 1 for c in n_coeffs):
        m.add((cp_model.LinearExpr.sum([v for _, v in lhs]) if summed else wsum(lhs)) <= k * n)
        return
    sign = 1 if summed else -1  # (lhs's sign in the row)
    idx = n_vars + [v.index for _, v in lhs]
    co = [-sign * k] * len(n_vars) + ([c for c, _ in lhs] if summed else [-c for c, _ in lhs])
    order = sorted(idx)
    if len(set(order)) != len(order):  # (a variable twice: CP-SAT merges them, its own way)
        m.add((cp_model.LinearExpr.sum([v for _, v in lhs]) if summed else wsum(lhs)) <= k * n)
        return
    if order != idx:  # (mostly in order already: the instances' variables come before their items')
        co = [c for _, c in sorted(zip(idx, co))]
    lin = m.proto.constraints.add().linear
    lin.vars.extend(order)
    lin.coeffs.extend(co)
    lin.domain.extend([INT64_MIN, 0] if summed else [0, INT64_MAX])


def flatten(expr):
    """(variable indices, coefficients, constant) of a linear expression."""
    from ortools.sat.python import cp_model_helper as cmh

    if isinstance(expr, int):
        return [], [], expr
    flat = cmh.FlatIntExpr(expr)
    return [v.index for v in flat.vars], list(flat.coeffs), flat.offset


def evaluate(values: list[int], expr) -> int:
    """A linear expression's value in a full solution vector."""
    if isinstance(expr, int):
        return expr
    vars_, coeffs, const = flatten(expr)
    return sum(c * values[i] for i, c in zip(vars_, coeffs)) + const


def set_hints(m: cp_model.CpModel, hints) -> None:
    """Replace the model's hint with (variable index, value) pairs, written to the proto at
    once (CpModel.add_hint per variable: 0.35 s per 100k hints)."""
    pairs = list(hints)
    m.clear_hints()
    h = m.proto.solution_hint
    h.vars.extend(i for i, _ in pairs)
    h.values.extend(int(n) for _, n in pairs)


def add_bound(m: cp_model.CpModel, expr, flat: tuple[list[int], list[int], int], value: int, sense: str) -> None:
    """m.add(expr >= value) (sense "max") or m.add(expr <= value) ("min"), `flat` its `flatten` (by index, merged),
    written as CP-SAT's `add` writes it (a test checks it): a tier held, or the cost's cut, without walking the
    expression again (0.1 s for the cost at 20k jobs). An expression with no variable goes through `add`."""
    vs, cs, off = flat
    if not vs:
        m.add(expr >= value) if sense == "max" else m.add(expr <= value)
        return
    lin = m.proto.constraints.add().linear
    lin.vars.extend(vs)
    lin.coeffs.extend(cs)
    lin.domain.extend([value - off, INT64_MAX] if sense == "max" else [INT64_MIN, value - off])


def set_full_hints(m: cp_model.CpModel, values: list[int]) -> None:
    """`set_hints(m, enumerate(values))`: the i-th variable hinted at values[i], every one, written at once
    (pairs built one by one took 0.1 s a hint at the 50k-job model's 337k variables)."""
    m.clear_hints()
    h = m.proto.solution_hint
    h.vars.extend(range(len(values)))
    h.values.extend(values)


__all__ = ["Values", "add_at_most_count", "add_bound", "room", "scale", "units", "is_variable", "is_zero", "constant", "solved", "wsum", "flatten", "evaluate", "set_full_hints", "set_hints"]
