"""The shipped catalog of GPU instance types and list prices (providers/data/catalog.json).

Instance shapes are static facts, so validation can check a pool's types and a
job's gpu_type offline. Prices carry the catalog's date; providers with a live
price API (AWS spot history) override them."""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Catalog:
    date: str
    regions: dict[str, dict[str, dict]]  # cloud -> region -> {zones, price_multiplier}
    shapes: dict[tuple[str, str], InstanceShape]  # (cloud, type) -> shape

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
            on_demand_price=round(shape.on_demand * mult, 4), spot_price=spot, prices_as_of=self.date,
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
                regions=tuple(t["regions"]) if "regions" in t else None,
            )
    regions = {cloud: c["regions"] for cloud, c in raw["clouds"].items()}
    return Catalog(date=raw["date"], regions=regions, shapes=shapes)
