"""CPU seconds per stage of one `reconcile plan` process (issue 20.3's stage table), printed on stderr as one JSON line.

    python -m bench.pr_phases plan DIR [any `reconcile plan` option]    (e.g. --format json --no-memo)

Each stage is the CPU (time.process_time: every thread's, CP-SAT's and CLP's too) spent inside the functions named
below, exclusive: a stage called inside another counts for itself only (the tier LP inside the tiers stage is "LP";
an import made inside any stage is "imports"). What a solving plan imports anyway (the solver, the planner, rich) is
imported first, so the stages can be wrapped, and counted as imports. The wrappers cost ~1-2% of a 5 s plan; the
process's own total (`_process_cpu`, from the OS) is printed beside them. The plan printed is the command's own (the
same bytes as without this: a check for a change that should change no plan). Measure two trees the same hour,
alternated, on copies of one applied fleet (bench/README.md, "s38-pr").
"""

from __future__ import annotations

import builtins
import importlib
import json
import os
import resource
import sys
import time

_acc: dict[str, float] = {}
_calls: dict[str, int] = {}
_stack: list[list] = []  # [stage, CPU s when it (re)started]


def _enter(name: str) -> None:
    now = time.process_time()
    if _stack:
        top = _stack[-1]
        _acc[top[0]] = _acc.get(top[0], 0.0) + now - top[1]
    _stack.append([name, now])
    _calls[name] = _calls.get(name, 0) + 1


def _leave() -> None:
    now = time.process_time()
    name, t = _stack.pop()
    _acc[name] = _acc.get(name, 0.0) + now - t
    if _stack:
        _stack[-1][1] = now


def _wrap(name: str, fn):
    def timed(*a, **k):
        _enter(name)
        try:
            return fn(*a, **k)
        finally:
            _leave()

    timed.__wrapped__ = fn
    for attr in ("__name__", "__qualname__", "__doc__"):
        setattr(timed, attr, getattr(fn, attr, None) or name)
    return timed


_import = builtins.__import__


def _timed_import(name, globals=None, locals=None, fromlist=(), level=0):
    m = sys.modules.get(name) if level == 0 else None
    if m is not None and all(hasattr(m, f) for f in fromlist or ()):
        return _import(name, globals, locals, fromlist, level)  # (already imported: not a stage)
    _enter("imports")
    try:
        return _import(name, globals, locals, fromlist, level)
    finally:
        _leave()


def _module(name: str):
    _enter("imports")
    try:
        return importlib.import_module(name)
    finally:
        _leave()


def _patch(modname: str, attr: str, stage: str, cls: str | None = None) -> None:
    owner = _module(modname)
    owner = getattr(owner, cls) if cls else owner
    if hasattr(owner, attr):  # (an older tree may lack one: measured without it)
        setattr(owner, attr, _wrap(stage, getattr(owner, attr)))


def _patch_everywhere(modname: str, attr: str, stage: str) -> None:
    """A function imported by name into other modules: wrapped in each module loaded so far."""
    fn = getattr(_module(modname), attr)
    timed = _wrap(stage, fn)
    for mod in list(sys.modules.values()):
        try:
            if getattr(mod, attr, None) is fn:
                setattr(mod, attr, timed)
        except Exception:  # noqa: S110 (a lazy module that refuses the ask: nothing of ours)
            pass


# (module, attribute, stage[, class]): the stages of bench/README.md's table
STAGES = [
    ("reconciler.api", "load", "load"), ("reconciler.api", "_observe", "observe"), ("reconciler.api", "with_runtime", "observe"),
    ("reconciler.memo", "memo_key", "memo key"), ("reconciler.memo", "read", "memo read"), ("reconciler.memo", "keep", "memo keep"),
    ("reconciler.solve.model", "__init__", "CP-SAT model", "Model"), ("reconciler.solve.model", "tiers", "CP-SAT model", "Model"),
    ("reconciler.solve.model", "cost", "CP-SAT model", "Model"), ("reconciler.solve.model", "hint_from", "warm start", "Model"),
    ("reconciler.solve.strategy", "complete", "warm start", "Search"), ("reconciler.solve.strategy", "solve_tiers", "tiers"),
    ("reconciler.solve.strategy", "cost_stage", "cost stage"), ("reconciler.solve.strategy", "consolidate", "cost stage"),
    ("reconciler.solve.strategy", "polish", "polish"), ("reconciler.solve.strategy", "repair_stage", "repair stage"),
    ("reconciler.solve.strategy", "swap_exemptions", "swaps probe"), ("reconciler.solve.strategy", "place_more", "swaps probe"),
    ("reconciler.solve.strategy", "solve", "CP-SAT search", "Work"),
    ("reconciler.lp", "__init__", "LP", "LpMirror"), ("reconciler.lp", "optimum", "LP", "LpMirror"),
    ("reconciler.plan.quality", "guarantees_kept_short", "unlawful_evictions"),
    ("reconciler.cli", "_render", "JSON/render"), ("reconciler.cli", "_keep_hit_render", "JSON/render"),
    ("reconciler.plan.types", "to_json", "JSON/render", "Plan"),
]
EVERYWHERE = [("reconciler.problem", "build_problem", "build_problem"), ("reconciler.greedy", "greedy", "greedy"),
              ("reconciler.plan", "make_plan", "make_plan"), ("reconciler.plancheck", "unlawful_evictions", "unlawful_evictions")]


def report() -> None:
    while _stack:
        _leave()
    r = resource.getrusage(resource.RUSAGE_SELF)
    out: dict = {k: round(v, 3) for k, v in sorted(_acc.items(), key=lambda kv: -kv[1])}
    out["_process_cpu"] = round(r.ru_utime + r.ru_stime, 3)
    out["_calls"] = {k: _calls[k] for k in ("greedy", "make_plan", "build_problem", "LP", "CP-SAT search") if k in _calls}
    sys.stderr.write("PHASES " + json.dumps(out) + "\n")
    sys.stderr.flush()


def main() -> None:
    _acc["interpreter start"] = time.process_time()
    builtins.__import__ = _timed_import
    for name in ("reconciler.cli", "reconciler.api", "reconciler.problem", "reconciler.solve", "reconciler.solve.strategy",
                 "reconciler.greedy", "reconciler.plan", "reconciler.lp", "reconciler.memo", "reconciler.plancheck",
                 "reconciler.render", "reconciler.solve.model", "reconciler.plan.types", "reconciler.plan.quality",
                 "policies.guardrails"):
        _module(name)
    for spec in STAGES:
        _patch(*spec)
    for spec in EVERYWHERE:
        _patch_everywhere(*spec)
    exit_now = os._exit

    def exit_reported(code):  # (`reconcile plan` ends with os._exit once it has printed: no atexit)
        report()
        exit_now(code)

    os._exit = exit_reported
    sys.argv = ["reconcile", *sys.argv[1:]]
    from reconciler import cli

    _enter("cli")
    try:
        cli.main()
    finally:
        report()


if __name__ == "__main__":
    main()
