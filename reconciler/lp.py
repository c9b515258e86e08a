"""The LP relaxation of a CP-SAT model, solved with GLOP: a lower bound on cost.

Pure. Converts the model's variables (to continuous, same bounds) and its linear
constraints to an LP and minimises the model's objective. Used by the benchmark to
say how far a plan's cost can be from the best possible at the same placed work."""

from __future__ import annotations

from ortools.linear_solver import pywraplp
from ortools.sat.python import cp_model


def lp_bound(model: cp_model.CpModel, objective: dict[int, int] | None = None, offset: int = 0) -> float | None:
    """Minimum of `objective` (variable index -> coefficient; default: the model's own objective)
    over the LP relaxation; None if the LP has no optimum (infeasible or unbounded)."""
    res = lp_solve(model, objective, offset)
    return None if res is None else res[0]


def lp_solve(model: cp_model.CpModel, objective: dict[int, int] | None = None, offset: int = 0) -> tuple[float, list[float]] | None:
    """(minimum, value of every variable) of the LP relaxation, or None."""
    proto = model.proto
    lp = pywraplp.Solver.CreateSolver("GLOP")
    inf = lp.infinity()
    xs = []
    for i, v in enumerate(proto.variables):
        dom = list(v.domain)
        xs.append(lp.NumVar(float(dom[0]), float(dom[-1]), f"v{i}"))
    for c in proto.constraints:
        if not c.has_linear():
            continue  # the model is linear; anything else (none today) is left out, which only weakens the bound
        lin = c.linear
        if not len(lin.vars):
            continue
        dom = list(lin.domain)
        coeffs: dict[int, float] = {}
        shift = 0.0
        for var, coef in zip(lin.vars, lin.coeffs):
            if var >= 0:
                coeffs[var] = coeffs.get(var, 0.0) + coef
            else:  # a negated boolean literal: coef * (1 - x)
                coeffs[-var - 1] = coeffs.get(-var - 1, 0.0) - coef
                shift += coef
        lo = float(dom[0]) - shift if dom[0] > -(2**62) else -inf
        hi = float(dom[-1]) - shift if dom[-1] < 2**62 else inf
        ct = lp.Constraint(lo, hi)
        for var, coef in coeffs.items():
            ct.SetCoefficient(xs[var], coef)
    obj = lp.Objective()
    if objective is None:
        o = proto.objective
        objective = dict(zip(o.vars, o.coeffs))
        offset = o.offset
    for i, c in objective.items():
        obj.SetCoefficient(xs[i], float(c))
    obj.SetMinimization()
    lp.SuppressOutput()
    status = lp.Solve()
    if status != pywraplp.Solver.OPTIMAL:
        return None
    return obj.Value() + offset, [x.solution_value() for x in xs]


class LpMirror:
    """The LP relaxation of a CP-SAT model, built once and kept in step: constraints added to
    the model are added here too, and re-solves start from GLOP's last basis."""

    def __init__(self, model: cp_model.CpModel):
        from ortools.linear_solver import linear_solver_pb2

        proto = model.proto
        self.lp = lp = pywraplp.Solver.CreateSolver("GLOP")
        lp.SuppressOutput()
        self.inf = lp.infinity()
        # Built as one MPModelProto and loaded at once: a call per coefficient took 1.6 s at 58k
        # variables. Rows with a negated literal or a repeated variable go the slow way after.
        mp = linear_solver_pb2.MPModelProto()
        for v in proto.variables:
            dom = list(v.domain)  # (the proto's repeated fields do not take [-1])
            x = mp.variable.add()
            x.lower_bound, x.upper_bound = float(dom[0]), float(dom[-1])
        slow = []
        for c in proto.constraints:
            if not (c.has_linear() and len(c.linear.vars)):
                continue
            lin = c.linear
            vars_ = list(lin.vars)
            dom = list(lin.domain)
            if min(vars_) < 0 or len(set(vars_)) != len(vars_):
                slow.append((list(zip(vars_, lin.coeffs)), dom[0], dom[-1]))
                continue
            ct = mp.constraint.add()
            ct.var_index.extend(vars_)
            ct.coefficient.extend(float(k) for k in lin.coeffs)
            ct.lower_bound = float(dom[0]) if dom[0] > -(2**62) else -self.inf
            ct.upper_bound = float(dom[-1]) if dom[-1] < 2**62 else self.inf
        err = lp.LoadModelFromProto(mp)
        if err:
            raise RuntimeError(f"internal: the LP relaxation did not load: {err}")
        self.xs = lp.variables()
        for terms, lo, hi in slow:
            self._add(terms, lo, hi)

    def _add(self, terms, lo, hi) -> None:
        coeffs: dict[int, float] = {}
        shift = 0.0
        for var, coef in terms:
            if var >= 0:
                coeffs[var] = coeffs.get(var, 0.0) + coef
            else:
                coeffs[-var - 1] = coeffs.get(-var - 1, 0.0) - coef
                shift += coef
        ct = self.lp.Constraint(float(lo) - shift if lo > -(2**62) else -self.inf, float(hi) - shift if hi < 2**62 else self.inf)
        for var, coef in coeffs.items():
            ct.SetCoefficient(self.xs[var], coef)

    def add(self, vars_: list[int], coeffs: list[int], offset: int, lo: float, hi: float) -> None:
        """lo <= sum(coeffs * vars) + offset <= hi (use +-2**62 for no bound)."""
        self._add(list(zip(vars_, coeffs)), lo - offset if lo > -(2**62) else lo, hi - offset if hi < 2**62 else hi)

    def optimum(self, vars_: list[int], coeffs: list[int], offset: int, maximize: bool) -> tuple[float, list[float]] | None:
        obj = self.lp.Objective()
        obj.Clear()
        for v, c in zip(vars_, coeffs):
            obj.SetCoefficient(self.xs[v], obj.GetCoefficient(self.xs[v]) + float(c))
        obj.SetMaximization() if maximize else obj.SetMinimization()
        if self.lp.Solve() != pywraplp.Solver.OPTIMAL:
            return None
        return obj.Value() + offset, [x.solution_value() for x in self.xs]
