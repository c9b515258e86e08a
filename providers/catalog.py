"""The shipped catalog of GPU instance types and list prices (providers/data/catalog.json).

Instance shapes are static facts, so validation can check a pool's types and a
job's gpu_type offline. Prices carry the catalog's date; providers with a live
price API (AWS spot history) override them."""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources

from providers.base import Offering


@dataclass(frozen=True)
class InstanceShape:
    cloud: str
    name: str
    gpus: int
    gpu_type: str | None
    cpu: float
    memory_gib: float
    on_demand: float
    spot: float | None
    regions: tuple[str, ...] | None  # None: offered in every catalog region of the cloud
    nvlink_domain: int = 1  # GPUs per NVLink/NVSwitch domain (1: PCIe only)


@dataclass(frozen=True)
class MigProfile:
    """One MIG profile of a GPU model: its compute slices (of 7), memory slices (of 8), and
    how many fit on one GPU at most."""

    name: str
    compute: int
    memory: int
    max_per_gpu: int


@dataclass(frozen=True)
class GpuModel:
    name: str
    memory_gib: float
    mig_profiles: dict[str, MigProfile]


@dataclass(frozen=True)
class Catalog:
    date: str
    regions: dict[str, dict[str, dict]]  # cloud -> region -> {zones, price_multiplier}
    shapes: dict[tuple[str, str], InstanceShape]  # (cloud, type) -> shape
    gpu_models: dict[str, GpuModel] = field(default_factory=dict)

    def shape(self, cloud: str, instance_type: str) -> InstanceShape | None:
        return self.shapes.get((cloud, instance_type))

    def types_of(self, cloud: str) -> list[str]:
        return sorted(t for c, t in self.shapes if c == cloud)

    def offering(self, cloud: str, region: str, zone: str, instance_type: str) -> Offering | None:
        """The catalog price of a type in a zone, or None if the catalog does not list it there."""
        shape = self.shape(cloud, instance_type)
        reg = self.regions.get(cloud, {}).get(region)
        if shape is None or reg is None or (shape.regions is not None and region not in shape.regions):
            return None
        mult = reg["price_multiplier"]
        spot = None
        if shape.spot is not None:
            # Spot prices differ a little between zones; keep it deterministic.
            jitter = (zlib.crc32(f"{zone}/{instance_type}".encode()) % 21 - 10) / 100.0
            spot = round(shape.spot * mult * (1 + jitter), 4)
        return Offering(
            cloud=cloud, region=region, zone=zone, instance_type=instance_type,
            gpus=shape.gpus, gpu_type=shape.gpu_type, cpu=shape.cpu, memory_gib=shape.memory_gib,
            on_demand_price=round(shape.on_demand * mult, 4), spot_price=spot, nvlink_domain=shape.nvlink_domain,
            prices_as_of=self.date,
        )


@lru_cache(maxsize=1)
def load_catalog() -> Catalog:
    raw = json.loads(resources.files("providers").joinpath("data/catalog.json").read_text())
    shapes = {}
    for cloud, c in raw["clouds"].items():
        for name, t in c["instance_types"].items():
            shapes[(cloud, name)] = InstanceShape(
                cloud=cloud, name=name, gpus=t["gpus"], gpu_type=t.get("gpu_type"), cpu=t["cpu"],
                memory_gib=t["memory_gib"], on_demand=t["on_demand"], spot=t.get("spot"),
                regions=tuple(t["regions"]) if "regions" in t else None, nvlink_domain=t.get("nvlink_domain", 1),
            )
    regions = {cloud: c["regions"] for cloud, c in raw["clouds"].items()}
    models = {
        name: GpuModel(name, m["memory_gib"], {p: MigProfile(p, *v) for p, v in m.get("mig_profiles", {}).items()})
        for name, m in raw.get("gpu_models", {}).items() if not name.startswith("_")
    }
    return Catalog(date=raw["date"], regions=regions, shapes=shapes, gpu_models=models)


def mig_layout_error(model: GpuModel | None, layout: list[str]) -> str | None:
    """Why a per-GPU MIG layout cannot be applied to a GPU model (None: it can). The rule is
    NVIDIA's budget: at most 7 compute slices and 8 memory slices per GPU, and each profile
    no more often than it fits."""
    if model is None or not model.mig_profiles:
        return f"{model.name if model else 'this GPU'} does not support MIG"
    bad = [p for p in layout if p not in model.mig_profiles]
    if bad:
        return f"{model.name} has no MIG profile {bad[0]!r} (it has {', '.join(model.mig_profiles)})"
    compute = sum(model.mig_profiles[p].compute for p in layout)
    memory = sum(model.mig_profiles[p].memory for p in layout)
    if compute > 7 or memory > 8:
        return f"the layout needs {compute}/7 compute and {memory}/8 memory slices of one {model.name}"
    for p in set(layout):
        if layout.count(p) > model.mig_profiles[p].max_per_gpu:
            return f"at most {model.mig_profiles[p].max_per_gpu} x {p} fit on one {model.name}"
    return None
