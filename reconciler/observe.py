"""Observe the fleet: ask every provider the pools use what exists and what can be bought.

This is the imperative edge of the pipeline: the result, `Observed`, is plain
data that the pure solver and planner consume."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from providers.base import Instance, Offering, PoolTarget, Provider, ProviderContext
from providers.registry import load_provider
from reconciler.model import DesiredState, Pool
from reconciler.state import State


@dataclass(frozen=True)
class PoolOffering:
    pool: str
    offering: Offering


@dataclass(frozen=True)
class Observed:
    instances: tuple[Instance, ...]
    offerings: tuple[PoolOffering, ...]
    placements: dict[str, tuple[str, ...]]  # job -> instance id per replica, from the last apply
    short: frozenset[tuple[str, str, str, str]] = frozenset()  # (cloud, zone, type, market) in cool-off
    lost: dict[str, tuple[str, ...]] = field(default_factory=dict)  # job -> its instances that vanished
    providers: dict[str, str] = field(default_factory=dict)  # pool -> provider name
    gpu_indices: dict[str, tuple[tuple[int, ...], ...]] = field(default_factory=dict)  # job -> GPUs per replica, as applied

    @property
    def digest(self) -> str:
        """What a saved plan was made against: instances and placements (not prices)."""
        body = {
            "instances": sorted((i.id, i.instance_type, i.zone, i.market, i.state, i.pool) for i in self.instances),
            "placements": {k: list(v) for k, v in sorted(self.placements.items())},
        }
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def pool_target(pool: Pool) -> PoolTarget:
    s = pool.spec
    section = getattr(s, s.cloud, None) if s.cloud in ("aws", "gcp", "azure") else None
    return PoolTarget(
        name=pool.name, cloud=s.cloud, region=s.region, zones=tuple(s.zones), instance_types=tuple(s.instance_types),
        settings=section.model_dump() if section is not None else {},
    )


def provider_for(pool: Pool, default: str) -> str:
    return pool.spec.provider or default


class Fleet:
    """The providers a desired state needs, loaded once per run."""

    def __init__(self, desired: DesiredState, state_dir: Path, default_provider: str = "sim", options: dict | None = None):
        self.desired = desired
        self.ctx = ProviderContext(fleet=desired.fleet, state_dir=state_dir, options=options or {})
        self.default = default_provider
        self._providers: dict[str, Provider] = {}

    def provider(self, name: str) -> Provider:
        if name not in self._providers:
            self._providers[name] = load_provider(name, self.ctx)
        return self._providers[name]

    def pools_by_provider(self) -> dict[str, list[Pool]]:
        out: dict[str, list[Pool]] = {}
        for pool in self.desired.pools.values():
            out.setdefault(provider_for(pool, self.default), []).append(pool)
        out.setdefault(self.default, [])  # always look for orphans in the default provider
        return out

    def observe(self, state: State) -> Observed:
        instances: list[Instance] = []
        offerings: list[PoolOffering] = []
        providers: dict[str, str] = {}
        for name, pools in sorted(self.pools_by_provider().items()):
            prov = self.provider(name)
            targets = [pool_target(p) for p in pools]
            instances.extend(i for i in prov.observe(targets) if i.alive)
            by_key = {(o.cloud, o.zone, o.instance_type): o for o in prov.offerings(targets)}
            for p, t in zip(pools, targets):
                providers[p.name] = name
                for z in t.zones:
                    for it in t.instance_types:
                        o = by_key.get((t.cloud, z, it))
                        if o is not None:
                            offerings.append(PoolOffering(p.name, o))
        alive = {i.id for i in instances}
        placements = {
            job: tuple(iids) for job, iids in state.placements.items()
            if job in self.desired.jobs and iids and all(i in alive for i in iids)
        }
        # A gang that lost any replica's instance is recorded as partially running: keep what survives.
        for job, iids in state.placements.items():
            if job in self.desired.jobs and job not in placements:
                surviving = tuple(i for i in iids if i in alive)
                if surviving:
                    placements[job] = surviving
        lost = {
            job: tuple(i for i in iids if i not in alive) for job, iids in state.placements.items()
            if job in self.desired.jobs and any(i not in alive for i in iids)
        }
        # GPU indices are kept per replica of a whole placement; a gang that lost replicas keeps
        # its survivors' indices in order.
        gpu_indices = {}
        for job, iids in placements.items():
            rec = state.gpus.get(job)
            full = state.placements.get(job, [])
            if rec and len(rec) == len(full):
                gpu_indices[job] = tuple(tuple(g) for i, g in zip(full, rec) if i in alive)
        return Observed(
            instances=tuple(sorted(instances, key=lambda i: i.id)), offerings=tuple(offerings),
            placements=placements, short=state.short_now(), providers=providers, lost=lost, gpu_indices=gpu_indices,
        )
