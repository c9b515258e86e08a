"""The catalog of GPU instance types and their prices (providers/data/catalog.json, or the file a
config repo pins: `catalog.json` beside its YAML, written by `reconcile catalog update`).

Instance shapes are static facts, so validation can check a pool's types and a job's gpu_type
offline. Prices are per region, each naming its source and so its date: no regional multipliers and
no per-zone jitter (before, a flat 1.1x stood in for real regional prices 0.55x-3x apart, and spot
zones were chosen by a hash). A type is priced only where its source priced it. Providers with a
live spot price API (AWS spot history, the Azure Retail Prices API, GCP's Cloud
Billing Catalog with an API key: providers/livespot.py) override the catalog's spot prices at plan time."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path

from providers.base import Offering
from providers.errors import ReconcileError
from providers.files import NOT_CONFIG, loads_json, not_a_link_target, read_regular

CATALOG_FILE = "catalog.json"  # the name a config repo pins its catalog under
CATALOG_FORMAT = 2  # what a catalog's fields mean (format 1 had regional multipliers): another is refused, never misread


@dataclass(frozen=True)
class RegionPrice:
    """One type's prices in one region. `spot` is one price for the region's zones or zone -> price."""

    on_demand: float
    spot: float | dict[str, float] | None
    source: str  # a key of Catalog.sources
    zones: tuple[str, ...] | None = None  # the only zones the source offers the type in (None: every zone of the region)

    def spot_in(self, zone: str) -> float | None:
        return self.spot.get(zone) if isinstance(self.spot, dict) else self.spot

    def offered_in(self, zone: str) -> bool:
        return self.zones is None or zone in self.zones


@dataclass(frozen=True)
class PriceSource:
    key: str
    date: str  # when the prices were published or read (YYYY-MM-DD)
    what: str


@dataclass(frozen=True)
class InstanceShape:
    cloud: str
    name: str
    gpus: int
    gpu_type: str | None
    cpu: float
    memory_gib: float
    prices: dict[str, RegionPrice]  # region -> its prices; a region without an entry is one the type is not priced in
    nvlink_domain: int = 1  # GPUs per NVLink/NVSwitch domain (1: PCIe only)

    @property
    def regions(self) -> tuple[str, ...]:
        return tuple(sorted(self.prices))


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
    regions: dict[str, dict[str, dict]]  # cloud -> region -> {zones}
    shapes: dict[tuple[str, str], InstanceShape]  # (cloud, type) -> shape
    gpu_models: dict[str, GpuModel] = field(default_factory=dict)
    sources: dict[str, PriceSource] = field(default_factory=dict)
    path: str = ""  # where it was read from, for messages

    def shape(self, cloud: str, instance_type: str) -> InstanceShape | None:
        return self.shapes.get((cloud, instance_type))

    def describe_source(self, key: str) -> str:
        src = self.sources.get(key)
        return f"{key} ({src.date})" if src else key

    def offering(self, cloud: str, region: str, zone: str, instance_type: str) -> Offering | None:
        """The catalog price of a type in a zone, or None if the catalog does not price it in that region or its
        source does not offer it in that zone (a3-ultragpu-8g is in one zone of us-central1)."""
        shape = self.shape(cloud, instance_type)
        price = shape.prices.get(region) if shape else None
        if shape is None or price is None or not price.offered_in(zone):
            return None
        src = self.sources.get(price.source)
        return Offering(
            cloud=cloud, region=region, zone=zone, instance_type=instance_type,
            gpus=shape.gpus, gpu_type=shape.gpu_type, cpu=shape.cpu, memory_gib=shape.memory_gib,
            on_demand_price=price.on_demand, spot_price=price.spot_in(zone), nvlink_domain=shape.nvlink_domain,
            prices_as_of=src.date if src else self.date, price_source=f"catalog: {price.source}",
        )


class CatalogError(ReconcileError):
    pass


# Generous physical bounds on a catalog's figures (the shipped catalog's largest: 16 GPUs, 224 vCPUs, 2,952 GiB,
# $113.93/h): a figure past one is a typo or corruption, never an instance. NaN, inf, negative GPUs and negative or
# zero prices were taken before: a plan costed $-155.93/h past the budget guardrail, NaN crashed the solver ("cannot
# convert float NaN to integer"), and gpus: 10**9 ate memory until the plan was killed.
MAX_GPUS = 64  # per instance
MAX_VCPUS = 2048
MAX_MEMORY_GIB = 32 * 1024.0  # 32 TiB
MAX_GPU_MEMORY_GIB = 4096.0  # per GPU
MAX_PRICE = 10_000.0  # USD per instance-hour


def _number(v, what: str, lo: float, hi: float, *, above: bool = False, whole: bool = False) -> float:
    """`v` as a finite number in [lo, hi] ((lo, hi] with `above`), whole with `whole`; else a ValueError saying so."""
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and (lo < v if above else lo <= v) and v <= hi
    if not ok or (whole and v != int(v)):
        kind = "a whole number" if whole else "a number"
        raise CatalogError(f"{what} is {v!r}, not {kind} {'above' if above else 'from'} {lo:g}{'' if above else ' to'}"
                           f"{' and at most' if above else ''} {hi:g}")
    return int(v) if whole else float(v)


def is_price(v) -> bool:
    """Whether `v` is a price a catalog holds: a finite USD per hour above 0, at most MAX_PRICE (parse_catalog's rule)."""
    try:
        _number(v, "price", 0, MAX_PRICE, above=True)
    except CatalogError:
        return False
    return True


def parse_catalog(raw: dict, where: str) -> Catalog:
    """A Catalog from catalog.json's data; CatalogError naming the file and field when it is not one."""
    def bad(what: str) -> CatalogError:
        return CatalogError(f"{where}: not a fleetops price catalog: {what}. Rewrite it with `reconcile catalog update` "
                            "or delete it to use the shipped catalog.")

    def mapping(v, at: str, of: str) -> dict:
        """`v`, a JSON object (a list or a string where one belongs was an AttributeError's text, naming no field)."""
        if not isinstance(v, dict):
            raise bad(f"{at} is {_json_kind(v)}, not a map of {of}")
        return v

    if not isinstance(raw, dict) or not isinstance(raw.get("clouds"), dict):
        raise bad("no `clouds` map")
    if raw.get("format", CATALOG_FORMAT) != CATALOG_FORMAT or type(raw.get("format", CATALOG_FORMAT)) is not int:
        raise bad(f"its format is {json.dumps(raw['format'])[:40]}, not {CATALOG_FORMAT} (the format this fleetops reads)")
    try:
        sources = {k: PriceSource(k, str(mapping(v, f"sources.{k}", "date, what")["date"]), str(v.get("what", "")))
                   for k, v in mapping(raw.get("sources", {}), "sources", "source -> {date, what}").items()}
        shapes = {}
        for cloud, c in raw["clouds"].items():
            types = mapping(mapping(c, f"clouds.{cloud}", "regions, instance_types").get("instance_types"),
                            f"clouds.{cloud}.instance_types", "type name -> its shape and prices")
            for name, t in types.items():
                at = f"clouds.{cloud}.instance_types.{name}"
                prices = {}
                regional = mapping(mapping(t, at, "gpus, cpu, memory_gib, prices").get("prices", {}), f"{at}.prices",
                                   "region -> {on_demand, spot, source}")
                for region, p in regional.items():
                    here = f"{at}.prices.{region}"
                    mapping(p, here, "on_demand, spot, source")

                    def price(v, field: str) -> float:  # a price: above 0 (no spot market is no `spot`, not 0)
                        return _number(v, f"{here}.{field} (USD per hour)", 0, MAX_PRICE, above=True)
                    spot = p.get("spot")
                    if isinstance(spot, dict):
                        spot = {z: price(v, f"spot.{z}") for z, v in spot.items()}
                    elif spot is not None:
                        spot = price(spot, "spot")
                    if p.get("source", "") not in sources:
                        raise bad(f"{here}.source {p.get('source')!r} is not in `sources`")
                    zones = p.get("zones")
                    if zones is not None and not (isinstance(zones, list) and all(isinstance(z, str) for z in zones)):
                        raise bad(f"{here}.zones is not a list of zone names")
                    prices[region] = RegionPrice(price(p["on_demand"], "on_demand"), spot, p["source"],
                                                 tuple(zones) if zones is not None else None)
                gpus = _number(t["gpus"], f"{at}.gpus", 0, MAX_GPUS, whole=True)
                shapes[(cloud, name)] = InstanceShape(
                    cloud=cloud, name=name, gpus=gpus, gpu_type=t.get("gpu_type"),
                    cpu=_number(t["cpu"], f"{at}.cpu (vCPUs)", 0, MAX_VCPUS, above=True),
                    memory_gib=_number(t["memory_gib"], f"{at}.memory_gib", 0, MAX_MEMORY_GIB, above=True), prices=prices,
                    nvlink_domain=_number(t.get("nvlink_domain", 1), f"{at}.nvlink_domain (GPUs per NVLink domain)", 1,
                                          max(gpus, 1), whole=True),
                )
        regions = {cloud: c["regions"] for cloud, c in raw["clouds"].items()}
        models = {}
        for name, m in mapping(raw.get("gpu_models", {}), "gpu_models", "GPU model -> {memory_gib, mig_profiles}").items():
            if name.startswith("_"):
                continue
            profiles = {}
            mig = mapping(mapping(m, f"gpu_models.{name}", "memory_gib, mig_profiles").get("mig_profiles", {}),
                          f"gpu_models.{name}.mig_profiles", "profile -> [compute slices, memory slices, max per GPU]")
            for prof, v in mig.items():
                if not (isinstance(v, list) and len(v) == 3):
                    raise CatalogError(f"gpu_models.{name}.mig_profiles.{prof} is {v!r}, not [compute slices, memory slices, "
                                       "max per GPU]")
                at = f"gpu_models.{name}.mig_profiles.{prof}"
                profiles[prof] = MigProfile(prof, _number(v[0], f"{at}[0] (compute slices of 7)", 1, 7, whole=True),
                                            _number(v[1], f"{at}[1] (memory slices of 8)", 1, 8, whole=True),
                                            _number(v[2], f"{at}[2] (max per GPU)", 1, 7, whole=True))
            _number(m["memory_gib"], f"gpu_models.{name}.memory_gib", 0, MAX_GPU_MEMORY_GIB, above=True)
            models[name] = GpuModel(name, m["memory_gib"], profiles)
    except CatalogError as e:
        if str(e).startswith(where):
            raise
        raise bad(str(e)) from None
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise bad(f"{type(e).__name__}: {e}") from None
    return Catalog(date=str(raw.get("date", "")), regions=regions, shapes=shapes, gpu_models=models, sources=sources, path=where)


def _json_kind(v) -> str:
    return {list: "a list", str: "a string", bool: "true or false", int: "a number", float: "a number",
            type(None): "null or missing"}.get(type(v), type(v).__name__)


def shipped_catalog_text() -> str:
    return resources.files("providers").joinpath("data/catalog.json").read_text()


_pinned: Path | None = None


def pin_catalog(path: Path | None) -> None:
    """Plan with this catalog file instead of the shipped one (None: the shipped one). The CLI and API call
    this with a config directory's `catalog.json` when it has one, so a config repo plans with the prices it
    reviewed, not with whatever version of this package a runner installed."""
    global _pinned
    _pinned = Path(path).resolve() if path is not None else None


@lru_cache(maxsize=8)
def _load(path: str | None, mtime_ns: int) -> Catalog:
    if path is None:
        return parse_catalog(json.loads(shipped_catalog_text()), "the shipped catalog (providers/data/catalog.json)")
    try:
        raw = loads_json(read_catalog_file(path))
    except ValueError as e:  # also UnicodeDecodeError, a nest too deep, half a surrogate pair
        raise _unreadable(path, f"not valid JSON ({e})") from None
    pinned = parse_catalog(raw, path)
    _check_known_shapes(pinned, _load(None, 0), path)
    return pinned


# What a type is, as the cloud builds it: a pinned catalog sets prices (and adds types), never these of a type the
# shipped catalog knows. A pinned g5.xlarge of 8 GPUs was planned as such (a 3-GPU job on GPUs 0-2 of a 1-GPU
# instance), validated, re-checked and launched: the AWS provider takes a known type's shape from the catalog.
_SHAPE_FIELDS = (("gpus", "GPUs"), ("gpu_type", "GPU type"), ("cpu", "vCPUs"), ("memory_gib", "GiB of memory"),
                 ("nvlink_domain", "GPUs per NVLink domain"))


def _check_known_shapes(pinned: Catalog, shipped: Catalog, where: str) -> None:
    for key, shape in sorted(pinned.shapes.items()):
        known = shipped.shapes.get(key)
        if known is None:
            continue
        for attr, what in _SHAPE_FIELDS:
            if getattr(shape, attr) != getattr(known, attr):
                raise CatalogError(
                    f"{where}: clouds.{key[0]}.instance_types.{key[1]}.{attr} is {getattr(shape, attr)!r}, but a {key[1]} has "
                    f"{getattr(known, attr)!r} {what} (the shipped catalog): a pinned catalog sets prices and adds types, "
                    "it does not change what a known type is. Rewrite it with `reconcile catalog update` or delete it to "
                    "use the shipped catalog.")


def load_catalog() -> Catalog:
    if _pinned is None:
        return _load(None, 0)
    try:
        mtime = _pinned.stat().st_mtime_ns
    except OSError:
        mtime = -1
    return _load(str(_pinned), mtime)


@dataclass(frozen=True)
class PriceOverride:
    """A price a plan uses that the pinned catalog.json sets below the shipped (public) catalog's for the same type,
    region, zone and market, or that only catalog.json prices (`public` None: a type or region the shipped one lacks)."""

    cloud: str
    region: str
    zone: str
    instance_type: str
    market: str
    price: float  # catalog.json's, USD per hour
    public: float | None  # the shipped catalog's
    public_source: str = ""  # its source and date

    def describe(self) -> str:
        where = f"{self.instance_type} {self.market} in {self.cloud}/{self.zone}"
        if self.public is None:
            return f"{where} at ${self.price:,.4g}/h, a price only catalog.json gives (the shipped catalog has none to compare)"
        return (f"{where} at ${self.price:,.4g}/h where the public price is ${self.public:,.4g}/h "
                f"({self.public_source}, the shipped catalog)")


def price_override(cloud: str, region: str, zone: str, instance_type: str, market: str, price: float) -> PriceOverride | None:
    """The override when `price` is the pinned catalog.json's for this site and the shipped catalog prices it higher or
    not at all; None with no pinned catalog, or when the price is not catalog.json's (a live spot price, a reservation's
    0), or is at least the public one. A pull request that lowers catalog.json's prices lowers what the budget guardrail
    sees, not the bill: plans show these, and the guardrail budgets at the public price unless the GuardrailPolicy says
    `allow_negotiated_prices`."""
    if _pinned is None:
        return None
    pinned, shipped = load_catalog(), _load(None, 0)
    o = pinned.offering(cloud, region, zone, instance_type)
    mine = (o.spot_price if market == "spot" else o.on_demand_price) if o is not None else None
    if mine is None or abs(mine - price) > 1e-9:
        return None
    s = shipped.offering(cloud, region, zone, instance_type)
    public = (s.spot_price if market == "spot" else s.on_demand_price) if s is not None else None
    if public is not None and public <= mine + 1e-9:
        return None
    src = shipped.describe_source(shipped.shapes[(cloud, instance_type)].prices[region].source) if s is not None else ""
    return PriceOverride(cloud, region, zone, instance_type, market, mine, public, src)


def catalog_bytes() -> bytes:
    """What load_catalog parses: the pinned file's bytes, or the shipped catalog's. Raises CatalogError."""
    return shipped_catalog_text().encode() if _pinned is None else read_catalog_file(_pinned)


MAX_CATALOG_BYTES = 64 << 20  # the shipped one is 43 KB; every type of the three clouds in every region is a few MB


def read_catalog_file(path: str | Path) -> bytes:
    """A pinned catalog's bytes, read as the config's YAML is (providers.files: a fifo at its name hung validate and
    plan, a link to /dev/zero read until memory ran out); CatalogError naming the file if it cannot be read whole."""
    try:
        raw = read_regular(path, MAX_CATALOG_BYTES)
    except OSError as e:
        raise _unreadable(path, e.strerror or str(e)) from None
    if len(raw) > MAX_CATALOG_BYTES:
        raise _unreadable(path, f"larger than {MAX_CATALOG_BYTES >> 20} MiB")
    return raw


def _unreadable(path: str | Path, problem: str) -> CatalogError:
    return CatalogError(f"{path}: cannot read the pinned price catalog: {problem}. Rewrite it with `reconcile catalog "
                        "update` or delete it to use the shipped catalog.")


def catalog_for(config_dir: Path) -> Path | None:
    """The catalog file a config directory pins, if it has one. A link is refused where a YAML file's is (reconciler.load,
    by providers.files.not_a_link_target): out of the directory (a pull request could point it anywhere on the runner),
    into .git/ (the checkout's token), the state, a hidden file or status/; and a dangling one, which planned at the
    shipped prices as if nothing were pinned."""
    p = Path(config_dir) / CATALOG_FILE
    if not p.is_symlink():
        return p if p.exists() else None
    root = Path(config_dir).resolve()
    try:
        real = p.resolve(strict=True)
    except (OSError, RuntimeError) as e:
        problem = "a symlink loop" if "loop" in str(e).lower() else "a dangling symlink"
        raise _unreadable(p, f"{problem} ({os.readlink(p)}); fix or remove it") from None
    if not real.is_relative_to(root):
        raise _unreadable(p, f"it is a symlink out of the config directory ({real}); make it a file of the config")
    if not_a_link_target(inside := real.relative_to(root)):
        raise _unreadable(p, f"a symlink into {inside.as_posix()}, which is not config ({NOT_CONFIG}); make it a file of the config")
    return p


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
