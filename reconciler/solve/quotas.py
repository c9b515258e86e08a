"""Cloud account quotas in the CP-SAT model: the new instances a plan buys never take more of a quota (AWS
Service Quotas' vCPUs per instance family and market, GCE's regional and global CPUs and GPUs, Azure's regional
and per-family cores) than the account has left of it when it was read. One row per quota over the offers that
count against it; instances kept are in the usage already, and one the plan deletes frees its units only after
the creates (apply is make before break), so hosts do not appear. The units are the ledger's (`quota_units`)."""

from __future__ import annotations

from reconciler.cpsat import cp_model

from reconciler.ledger import quota_headroom, quota_units


def add_cloud_quota_constraints(m: cp_model.CpModel, problem, offers, use: dict[str, object]) -> None:
    """`offers`: the problem's offers (new instances); `use`: offer key -> how many are bought."""
    for q in problem.quotas:
        terms = [(u, use[c.key]) for c in offers if (u := quota_units(q, c))]
        if terms:
            m.add(cp_model.LinearExpr.weighted_sum([v for _, v in terms], [u for u, _ in terms]) <= quota_headroom(q))


__all__ = ["add_cloud_quota_constraints"]
