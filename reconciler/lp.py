"""The LP relaxation of a CP-SAT model: bounds on each tier and on cost.

Pure. The model's variables (continuous, same bounds) and linear constraints as an LP,
solved with COIN-OR CLP (in OR-Tools' wheels; GLOP's dual simplex where a build lacks it).
The solver uses it to prove a warm start already good enough, to cut CP-SAT's cost
search, and to restrict that search to what the LP uses; the benchmark, to say how far
a plan's cost can be from the best possible at the same placed work."""

from __future__ import annotations

import time
from collections.abc import Callable

from ortools.linear_solver import pywraplp
from reconciler.cpsat import cp_model

from reconciler.errors import WallCap


def _readable(model: cp_model.CpModel):
    """The model as a Python protobuf message. OR-Tools' own proto object reads one field at a
    time through its bindings (0.5 s to walk a 58k-variable model); its binary export, parsed
    back, takes 0.03 s and walks in 0.1 s. The export goes through a file: it has no other."""
    import tempfile
    from pathlib import Path

    from ortools.sat import cp_model_pb2

    with tempfile.TemporaryDirectory(prefix="fleetops-lp-") as tmp:
        path = Path(tmp) / "model.pb"
        if not model.export_to_file(str(path)):
            raise RuntimeError("internal: could not export the CP-SAT model for its LP relaxation")
        out = cp_model_pb2.CpModelProto()
        out.ParseFromString(path.read_bytes())
    return out


_CONCLUDED = (pywraplp.Solver.OPTIMAL, pywraplp.Solver.INFEASIBLE, pywraplp.Solver.UNBOUNDED)


class LpMirror:
    """The LP relaxation of a CP-SAT model, built once and kept in step: constraints added to
    the model are added here too."""

    def __init__(self, model: cp_model.CpModel, deadline: Callable[[], float] | None = None):
        """`deadline`: the wall-clock safety cap (time.monotonic), asked at each solve; a solve it stops raises WallCap.
        (Unbounded, the LP of a 20k-job fleet's re-plan after a reclaim took 286 s with the cap at 230 s.)"""
        from ortools.linear_solver import linear_solver_pb2

        self.deadline = deadline

        proto = _readable(model)
        # CLP solved the 10k-instance fleet's LPs (65k columns, 33k rows) in 0.5 s where GLOP's
        # default primal simplex took 1.1-2.9 s and its dual simplex 0.6-1.4 s: same optima.
        self.lp = lp = pywraplp.Solver.CreateSolver("CLP") or pywraplp.Solver.CreateSolver("GLOP")
        if lp.SolverVersion().startswith("Glop"):
            lp.SetSolverSpecificParametersAsString("use_dual_simplex: true")
        lp.SuppressOutput()
        P = pywraplp.MPSolverParameters
        # `fresh` (from scratch, CLP's presolve and its choice of simplex) is for a caller that reads the optimum's
        # values: the cost LP, whose vertex guides the search. A caller that reads only the optimal value gets, the
        # first time, CLP's choice within a short wall-clock allowance (`quick`) and else the primal simplex from
        # scratch (`first`); then the primal simplex from the last optimal basis, presolve off (`warm`): a held
        # tier's row leaves that basis primal feasible (the last optimum reaches what is held) and only the
        # objective changes. On the 20k-job drift model (326k columns, 122k rows; CPU at load 7-8) a fresh solve
        # took 29-80 s a tier; the first by the primal simplex 8.4 s, the warm ones 0.8-3.8 s; on the 10k drift
        # 5-10 s fresh, 0.8-2 s warm. On the converged 10k fleet it is the other way round: CLP's choice 0.16 s, the
        # primal simplex 1.8 s (3.95 s at load 3). No rule was found to pick one per model, hence the allowance:
        # the optimal value is the same either way, so the time spent is all that depends on the clock.
        # CLP's own choice re-solving from the basis (presolve on) had taken 2.6 s where a fresh solve took 0.5 s.
        self.quick = P()
        self.quick.SetIntegerParam(P.INCREMENTALITY, P.INCREMENTALITY_OFF)
        self.fresh = P()
        self.fresh.SetIntegerParam(P.INCREMENTALITY, P.INCREMENTALITY_OFF)
        self.first = P()
        self.first.SetIntegerParam(P.INCREMENTALITY, P.INCREMENTALITY_OFF)
        self.first.SetIntegerParam(P.LP_ALGORITHM, P.PRIMAL)
        self.warm = P()
        self.warm.SetIntegerParam(P.INCREMENTALITY, P.INCREMENTALITY_ON)
        self.warm.SetIntegerParam(P.LP_ALGORITHM, P.PRIMAL)
        self.warm.SetIntegerParam(P.PRESOLVE, P.PRESOLVE_OFF)
        self.solves = {"fresh": 0, "warm": 0, "quick": 0}  # how each optimum was found (quick: fresh, within the allowance)
        self._basis = False  # the LP holds an optimal basis of its last solve
        self._quick_tried = False
        # CLP's choice's allowance: 0.5 s + 5 us a column (0.8 s at the converged 10k fleet's 65k columns, where it
        # needs 0.16 s; 2.1 s at the 20k drift's 326k, where it needs 63 s: the primal simplex then adds 8.4 s).
        self.quick_ms = 500 + len(proto.variables) // 200
        self.inf = lp.infinity()
        # Built as one MPModelProto and loaded at once: a call per coefficient took 1.6 s at 58k
        # variables. Rows with a negated literal or a repeated variable go the slow way after.
        mp = linear_solver_pb2.MPModelProto()
        for v in proto.variables:
            x = mp.variable.add()
            x.lower_bound, x.upper_bound = float(v.domain[0]), float(v.domain[-1])
        slow = []
        for c in proto.constraints:
            if not (c.HasField("linear") and len(c.linear.vars)) or len(c.enforcement_literal):
                continue  # (a row enforced by a literal holds only where it is true: read as always on, the LP of
                # the repeat search held every tenant's guarantee full, objective.stand_in_room; relaxed, it bounds)
            lin = c.linear
            dom = list(lin.domain)
            if dom[0] <= -(2**62) and dom[-1] >= 2**62:
                continue  # a hold let go (Search.complete's stage rows): it bounds nothing
            vars_ = list(lin.vars)
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

    def _add(self, terms, lo, hi):
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
        return ct

    def add(self, vars_: list[int], coeffs: list[int], offset: int, lo: float, hi: float):
        """lo <= sum(coeffs * vars) + offset <= hi (use +-2**62 for no bound); the row (its bounds may be reset)."""
        return self._add(list(zip(vars_, coeffs)), lo - offset if lo > -(2**62) else lo, hi - offset if hi < 2**62 else hi)

    def optimum(self, vars_: list[int], coeffs: list[int], offset: int, maximize: bool,
                fresh: bool = False) -> tuple[float, list[float]] | None:
        """(optimal value, the optimum's variable values), or None. fresh: from scratch, for a caller that reads
        the optimum's values, not only its value (where several vertices are optimal, a warm solve may end at another)."""
        obj = self.lp.Objective()
        obj.Clear()
        for v, c in zip(vars_, coeffs):
            obj.SetCoefficient(self.xs[v], obj.GetCoefficient(self.xs[v]) + float(c))
        obj.SetMaximization() if maximize else obj.SetMinimization()
        if self.lp.NumConstraints() == 0:
            return self._rowless(obj, offset)
        if not self._solve(fresh):
            return None
        # (the values in one response: a call per variable took 0.1 s a solve at 337k columns, the same values)
        from ortools.linear_solver import linear_solver_pb2

        resp = linear_solver_pb2.MPSolutionResponse()
        self.lp.FillSolutionResponseProto(resp)
        return obj.Value() + offset, list(resp.variable_value)

    def _rowless(self, obj, offset: int) -> tuple[float, list[float]] | None:
        """The optimum of an LP with no rows, each variable at the bound its objective coefficient favours (CLP answers
        such a model ABNORMAL, read as no optimum); None where a favoured bound is infinite (unbounded)."""
        sign = -1.0 if obj.maximization() else 1.0
        values = []
        for x in self.xs:
            c = obj.GetCoefficient(x) * sign
            v = x.lb() if c > 0 else x.ub() if c < 0 else (x.lb() if abs(x.lb()) != self.inf else x.ub() if abs(x.ub()) != self.inf else 0.0)
            if abs(v) == self.inf and c != 0:
                return None
            values.append(v)
        return sum(obj.GetCoefficient(x) * v for x, v in zip(self.xs, values)) + offset, values

    def _solve(self, fresh: bool) -> bool:
        """Solve from the last optimal basis if there is one (and not `fresh`), else (or if that fails) from scratch:
        the first time by CLP's choice within `quick_ms` of wall clock, then by the primal simplex. The optimal value
        is the same every way; where several vertices are optimal, not always the same vertex (`fresh` callers read it)."""
        if self._basis and not fresh:
            self.solves["warm"] += 1
            if self._run(self.warm) == pywraplp.Solver.OPTIMAL:
                return True
        self.solves["fresh"] += 1
        if not fresh and not self._quick_tried:
            self._quick_tried = True  # (once: a model it was too slow for will not get quicker)
            self._basis = self._run(self.quick, self.quick_ms) == pywraplp.Solver.OPTIMAL
            if self._basis:
                self.solves["quick"] += 1
                return True
        self._basis = self._run(self.fresh if fresh else self.first) == pywraplp.Solver.OPTIMAL
        return self._basis

    def _run(self, params, allowance_ms: int = 0) -> int:
        """One solve, within `allowance_ms` (0: none; CLP's clock, the process's CPU time) and the deadline (the wall
        clock's); past the deadline, WallCap."""
        while True:
            ms = allowance_ms
            if self.deadline is not None:
                left = int((self.deadline() - time.monotonic()) * 1000)
                if left <= 0:
                    raise WallCap
                ms = min(ms, left) if ms else left
            self.lp.SetTimeLimit(ms)
            cpu = time.process_time()
            st = self.lp.Solve(params)
            cpu_ms = (time.process_time() - cpu) * 1000
            self.lp.SetTimeLimit(0)  # (0: no limit)
            if st in _CONCLUDED or self.deadline is None or ms == allowance_ms:
                return st  # (stopped by the allowance: the caller's to judge)
            if cpu_ms < ms / 2:
                # Not stopped by the limit (CLP's clock is this process's CPU time, time.process_time's): an ABNORMAL
                # or NOT_SOLVED answer of its own, the caller's to judge. Solved again, it came back the same at once,
                # and an apply's plan span its wall-clock cap re-solving it (231 s instead of ~10 for a quickstart).
                return st
            if time.monotonic() >= self.deadline():
                raise WallCap
            # Stopped by the deadline's limit before the deadline: CLP's time limit counts the process's CPU time,
            # every thread's, so with other threads busy it stops early by the wall clock (0.17 s of a 0.3 s limit
            # beside three hashing threads), and an LP the cap had not stopped was read as one with no optimum. Solve
            # again with what is left (from the last basis where the parameters keep one, else from scratch).
