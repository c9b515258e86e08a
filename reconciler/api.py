"""The library API the CLI and the tests call: validate, plan, apply, status.

Each function runs the pipeline load -> observe -> solve -> plan [-> apply -> status]
and returns plain objects; none of them prints."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from policies.guardrails import violations
from reconciler.apply import ApplyReport, apply_plan
from reconciler.errors import ApplyError, GuardrailError, StalePlanError
from reconciler.load import load
from reconciler.model import DesiredState
from reconciler.observe import Fleet, Observed
from reconciler.plan import Plan, make_plan
from reconciler.problem import Problem, build_problem
from reconciler.solve import Solution, solve
from reconciler.backend import backend_for
from reconciler.state import state_dir
from reconciler.status import write_status

DEFAULT_TIME_LIMIT = 20.0


@dataclass(frozen=True)
class PlanResult:
    plan: Plan
    desired: DesiredState
    observed: Observed
    problem: Problem
    solution: Solution


@dataclass(frozen=True)
class ApplyResult:
    plan: Plan
    report: ApplyReport
    status_dir: Path


def validate(config_dir: str | Path) -> DesiredState:
    return load(config_dir)


def _plan(desired: DesiredState, observed: Observed, provider: str, time_limit: float, allow_destroy: int | None) -> PlanResult:
    problem = build_problem(desired, observed, provider)
    solution = solve(problem, time_limit=time_limit)
    plan = make_plan(desired, observed, problem, solution)
    plan = replace(plan, violations=tuple(violations(plan, desired.guardrails, allow_destroy)))
    return PlanResult(plan, desired, observed, problem, solution)


def plan(config_dir: str | Path, *, provider: str = "sim", time_limit: float = DEFAULT_TIME_LIMIT,
         allow_destroy: int | None = None, options: dict | None = None, state: str | None = None) -> PlanResult:
    """`state`: the state backend URL (None/'local' or s3://bucket/prefix)."""
    config_dir = Path(config_dir)
    desired = load(config_dir)
    backend = backend_for(config_dir, state)
    fleet = Fleet(desired, state_dir(config_dir), provider, options)
    observed = fleet.observe(backend.load())
    return _plan(desired, observed, provider, time_limit, allow_destroy)


def apply(config_dir: str | Path, *, saved_plan: Plan | None = None, provider: str = "sim",
          time_limit: float = DEFAULT_TIME_LIMIT, allow_destroy: int | None = None, options: dict | None = None,
          state: str | None = None) -> ApplyResult:
    """Plan (or take a saved plan), check guardrails, apply, write status.

    Raises StalePlanError or GuardrailError before any provider call; raises
    ApplyError after writing status when some actions failed."""
    config_dir = Path(config_dir)
    desired = load(config_dir)
    backend = backend_for(config_dir, state)
    with backend.lock():
        current = backend.load()
        fleet = Fleet(desired, state_dir(config_dir), provider, options)
        observed = fleet.observe(current)
        if saved_plan is not None:
            if saved_plan.fleet != desired.fleet:
                raise StalePlanError(f"the plan is for fleet {saved_plan.fleet!r}, this config is fleet {desired.fleet!r}")
            if saved_plan.desired_digest != desired.digest:
                raise StalePlanError("stale plan: the desired state changed since the plan was made; run `reconcile plan` again")
            if saved_plan.observed_digest != observed.digest:
                raise StalePlanError("stale plan: the fleet changed since the plan was made (instances or placements); run `reconcile plan` again")
            the_plan = replace(saved_plan, violations=tuple(violations(saved_plan, desired.guardrails, allow_destroy)))
        else:
            the_plan = _plan(desired, observed, provider, time_limit, allow_destroy).plan
        if the_plan.violations:
            raise GuardrailError("refusing to apply; nothing was changed:\n" + "\n".join(f"  - {v}" for v in the_plan.violations))
        report = apply_plan(desired, observed, the_plan, fleet, current)
        backend.save(current)
        after = fleet.observe(current).instances
        status_dir = write_status(config_dir, desired, the_plan, report, list(after))
    result = ApplyResult(the_plan, report, status_dir)
    if not report.ok:
        done = f"{len(report.created)} created, {len(report.deleted)} deleted"
        err = ApplyError(f"apply partly failed ({done}; status written):\n" + "\n".join(f"  - {f}" for f in report.failures))
        err.result = result  # type: ignore[attr-defined]
        raise err
    return result


def read_status(config_dir: str | Path) -> dict:
    """The status files as one document: fleet summary, pools, jobs."""
    root = Path(config_dir) / "status"
    out: dict = {"fleet": None, "pools": {}, "jobs": {}}
    if (root / "fleet.yaml").exists():
        out["fleet"] = yaml.safe_load((root / "fleet.yaml").read_text())
    for kind in ("pools", "jobs"):
        for p in sorted((root / kind).glob("*.yaml")) if (root / kind).exists() else []:
            out[kind][p.stem] = yaml.safe_load(p.read_text())
    return out
