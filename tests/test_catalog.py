"""The price catalog: per-region prices with their source and date, no invented multipliers or per-zone jitter,
`reconcile catalog update` from the clouds' public price sources (tests/price_fake.py serves their documented
response shapes), and a config repo's pinned catalog.json."""

from __future__ import annotations

import csv
import json
import os
import re
import statistics
import subprocess
import sys
from datetime import date
from pathlib import Path

import pytest

from providers.catalog import CATALOG_FORMAT, load_catalog, parse_catalog, shipped_catalog_text
from reconciler.errors import ReconcileError
from tests.conftest import AWS_ENV
from tests.fleetkit import copy_quickstart, job, pool, tenant, topology, write_config

RECONCILE = [sys.executable, "-m", "reconciler.cli"]


def cli(*args, env=None, timeout=300):
    return subprocess.run([*RECONCILE, *map(str, args)], capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})


def test_every_shipped_price_names_a_dated_source_and_zones_of_a_region_share_it():
    """Before, spot prices got a per-zone jitter from a hash (zones chosen by hash, not price) and other regions a
    flat multiplier; now each price is the source's, per region, and says where it is from."""
    cat = load_catalog()
    raw = json.loads(shipped_catalog_text())
    assert not any("price_multiplier" in r for c in raw["clouds"].values() for r in c["regions"].values())
    for (cloud, t), shape in cat.shapes.items():
        assert shape.prices, f"{cloud} {t} has no price anywhere"
        for region, price in shape.prices.items():
            src = cat.sources[price.source]
            assert date.fromisoformat(src.date) and src.what
            zones = cat.regions[cloud][region]["zones"]
            assert price.zones is None or set(price.zones) < set(zones), (cloud, t, region, price.zones)
            offers = [cat.offering(cloud, region, z, t) for z in zones if price.offered_in(z)]
            assert all(cat.offering(cloud, region, z, t) is None for z in zones if not price.offered_in(z))
            assert {(o.on_demand_price, o.spot_price) for o in offers} == {(price.on_demand, price.spot)}, (cloud, t, region)
            assert all(o.price_source == f"catalog: {price.source}" and o.prices_as_of == src.date for o in offers)
    # The public prices the issue found the old catalog furthest from (AWS's 2025 cut).
    assert cat.offering("aws", "us-east-1", "us-east-1a", "p5.48xlarge").on_demand_price == 55.04
    assert cat.offering("aws", "us-east-1", "us-east-1a", "p4d.24xlarge").on_demand_price == pytest.approx(21.9576, abs=1e-3)
    # New types: 1-GPU H100, H200, B200, L40S, L4 and 4xV100 on AWS.
    for t, gpus, model in (("p5.4xlarge", 1, "H100"), ("p5en.48xlarge", 8, "H200"), ("p6-b200.48xlarge", 8, "B200"),
                           ("g6e.xlarge", 1, "L40S"), ("g6.2xlarge", 1, "L4"), ("p3.8xlarge", 4, "V100")):
        o = cat.offering("aws", "us-east-1", "us-east-1a", t)
        assert (o.gpus, o.gpu_type) == (gpus, model) and model in cat.gpu_models


PUBLIC = Path(__file__).parent / "data" / "public_prices"


def _excerpt(name: str) -> list[dict]:
    with open(PUBLIC / name) as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def test_shipped_gcp_and_azure_prices_are_the_public_rows_they_cite():
    """Every GCP and Azure price labelled with a SkyPilot snapshot is that snapshot's figure (the excerpt keeps its rows
    verbatim): a GPU machine type is its VM row plus its accelerator row, priced in exactly the zones that have both.
    Before, GCP and Azure carried last month's list prices (ND96asr_v4 spot $10.88 against $2.99 published)."""
    cat = load_catalog()
    gcp = _excerpt("skypilot-catalog_v8_gcp_vms_8427bbff.csv")
    vm = {(r["InstanceType"], r["AvailabilityZone"]): r for r in gcp if r["InstanceType"]}
    gpu = {(r["AcceleratorName"], int(r["AcceleratorCount"]), r["AvailabilityZone"]): r for r in gcp if not r["InstanceType"]}
    checked = set()
    for (cloud, t), shape in cat.shapes.items():
        for region, price in shape.prices.items():
            if price.source == "skypilot-v8-gcp":
                machine = t.split("+")[0]
                both = [z for z in cat.regions["gcp"][region]["zones"]
                        if (machine, z) in vm and (not shape.gpus or (shape.gpu_type, shape.gpus, z) in gpu)]
                assert both and [z for z in both if price.offered_in(z)] == both, (t, region, both)
                assert all(not price.offered_in(z) for z in cat.regions["gcp"][region]["zones"] if z not in both), (t, region)
                for z in both:
                    rows = [vm[(machine, z)]] + ([gpu[(shape.gpu_type, shape.gpus, z)]] if shape.gpus else [])
                    assert price.on_demand == pytest.approx(sum(float(r["Price"]) for r in rows), abs=1e-9), (t, z)
                    assert price.spot_in(z) == pytest.approx(sum(float(r["SpotPrice"]) for r in rows), abs=1e-9), (t, z)
                    assert (float(rows[0]["vCPUs"]), float(rows[0]["MemoryGiB"])) == (shape.cpu, shape.memory_gib), t
                checked.add((cloud, t, region))
            elif price.source == "skypilot-v6-azure":
                (row,) = [r for r in _excerpt("skypilot-catalog_v6_azure_vms_098741e7.csv")
                          if (r["InstanceType"], r["Region"]) == (t, region)]
                assert (price.on_demand, price.spot) == (float(row["Price"]), float(row["SpotPrice"])), t
                assert (float(row["vCPUs"]), float(row["MemoryGiB"])) == (shape.cpu, shape.memory_gib), t
                checked.add((cloud, t, region))
    # Every GCP and every Azure price is one. No public file has an Azure westeurope row, so no size is priced there
    # (before: last month's eastus list price times an invented 1.12, spot 1.9-4.1x the public eastus spot price).
    assert {(c, t, r) for (c, t), s in cat.shapes.items() for r in s.prices if c in ("gcp", "azure")} == checked
    assert not any("estimate" in key for key in cat.sources)
    assert cat.offering("azure", "westeurope", "westeurope-1", "Standard_ND96asr_v4") is None
    # The new types, with the shapes the public rows give them.
    for cloud, t, gpus, model, cpu, mem in (
            ("gcp", "a3-ultragpu-8g", 8, "H200", 224, 2952), ("gcp", "n1-standard-32+4xnvidia-tesla-v100", 4, "V100", 32, 120),
            ("azure", "Standard_NC40ads_H100_v5", 1, "H100", 40, 320), ("azure", "Standard_NC96ads_A100_v4", 4, "A100-80GB", 96, 880),
            ("azure", "Standard_NV36ads_A10_v5", 1, "A10", 36, 440)):
        s = cat.shape(cloud, t)
        assert (s.gpus, s.gpu_type, s.cpu, s.memory_gib) == (gpus, model, cpu, mem) and model in cat.gpu_models, t
    # Where the source offers a type in some zones only, so does the catalog: H200 in us-central1-b alone.
    assert cat.offering("gcp", "us-central1", "us-central1-b", "a3-ultragpu-8g").on_demand_price == pytest.approx(12.266 + 74.49392)
    assert cat.offering("gcp", "us-central1", "us-central1-a", "a3-ultragpu-8g") is None


def test_shipped_aws_prices_are_the_public_rows_they_cite():
    """Every AWS price labelled skypilot-v8 whose rows are excerpted is that file's figure: on-demand is the region's
    Price, spot the median SpotPrice over the region's zones that have one (to SkyPilot's 4 decimals), and a type
    no zone prices for spot has no spot price. Before, c6i.8xlarge, g4dn.12xlarge and p3.16xlarge carried last
    month's list prices (p3.16xlarge spot $7.34 against $4.16 published in us-east-1) and a us-west-2 estimate, and
    g4dn.xlarge/g5/g6/g6e an older snapshot's spot prices (g6e.48xlarge $8.30 against $10.23 in us-east-1)."""
    cat = load_catalog()
    rows: dict[tuple[str, str], list[dict]] = {}
    for r in _excerpt("skypilot-catalog_v8_aws_vms_e385a0d3.csv"):
        rows.setdefault((r["InstanceType"], r["Region"]), []).append(r)
    checked = set()
    for (cloud, t), shape in cat.shapes.items():
        for region, price in shape.prices.items():
            if cloud != "aws" or (t, region) not in rows:
                continue
            rs = rows[(t, region)]
            assert price.source == "skypilot-v8", (t, region, price.source)
            assert {float(r["Price"]) for r in rs} == {price.on_demand}, (t, region)
            spots = [float(r["SpotPrice"]) for r in rs if r["SpotPrice"]]
            if spots:
                assert price.spot == pytest.approx(statistics.median(spots), abs=1e-4), (t, region)
            else:
                assert price.spot is None, (t, region)
            assert (float(rs[0]["vCPUs"]), float(rs[0]["MemoryGiB"])) == (shape.cpu, shape.memory_gib), t
            assert (shape.gpus, shape.gpu_type) == ((int(float(rs[0]["AcceleratorCount"])), rs[0]["AcceleratorName"])
                                                     if rs[0]["AcceleratorName"] else (0, None)), t
            checked.add((t, region))
    # Every AWS price is an excerpted row's: no estimate, no last-month list price, no older snapshot (v7) left.
    assert checked == set(rows) == {(t, r) for (c, t), s in cat.shapes.items() if c == "aws" for r in s.prices}
    assert {p.source for (c, _), s in cat.shapes.items() if c == "aws" for p in s.prices.values()} == {"skypilot-v8"}
    assert cat.offering("aws", "us-east-1", "us-east-1a", "p3.16xlarge").spot_price == 4.1599


def test_h200_and_b200_mig_profiles_are_nvidias():
    """The H200 and B200 MIG profile tables were written from memory; each profile and how many fit on one GPU is now
    checked against NVIDIA's mig-parted default config (verbatim excerpt)."""
    text = (PUBLIC / "mig-parted_config-default_5ffc59fe.yaml").read_text()
    published = {m.group(1): int(m.group(2)) for m in re.finditer(r'"(\d+g\.\d+gb)": (\d+)', text)}
    models = load_catalog().gpu_models
    for name, memory in (("H200", "141"), ("B200", "180")):
        profiles = models[name].mig_profiles
        assert profiles and f"7g.{memory}gb" in profiles
        assert {p: published.get(p) for p in profiles} == {p: v.max_per_gpu for p, v in profiles.items()}, name


def test_a_type_is_priced_only_where_its_source_priced_it():
    cat = load_catalog()
    assert cat.offering("gcp", "europe-west4", "europe-west4-a", "a3-highgpu-8g") is None  # offered in europe-west4-b/-c only
    assert cat.offering("azure", "westeurope", "westeurope-1", "Standard_NC40ads_H100_v5") is None  # priced in eastus only
    with pytest.raises(ReconcileError, match="x.json: not a fleetops price catalog: .*source 'nowhere' is not in `sources`"):
        parse_catalog({"sources": {}, "clouds": {"aws": {"regions": {}, "instance_types": {
            "t": {"gpus": 0, "cpu": 1, "memory_gib": 1, "prices": {"r": {"on_demand": 1, "source": "nowhere"}}}}}}}, "x.json")


P4D = "clouds.aws.instance_types.p4d.24xlarge"


@pytest.mark.parametrize("edit, says", [
    (lambda t: t["prices"]["us-east-1"].update(on_demand=-50), f"{P4D}.prices.us-east-1.on_demand (USD per hour) is -50"),
    (lambda t: t["prices"]["us-east-1"].update(on_demand=0), f"{P4D}.prices.us-east-1.on_demand (USD per hour) is 0,"),
    (lambda t: t["prices"]["us-east-1"].update(on_demand=float("nan")), f"{P4D}.prices.us-east-1.on_demand (USD per hour) is nan"),
    (lambda t: t["prices"]["us-east-1"].update(spot=-1.5), f"{P4D}.prices.us-east-1.spot (USD per hour) is -1.5"),
    (lambda t: t["prices"]["us-east-1"].update(spot={"us-east-1a": float("inf")}), f"{P4D}.prices.us-east-1.spot.us-east-1a"),
    (lambda t: t["prices"]["us-east-1"].update(on_demand=1e9), "is 1000000000.0, not a number above 0 and at most 10000"),
    (lambda t: t.update(memory_gib=float("nan")), f"{P4D}.memory_gib is nan"),
    (lambda t: t.update(memory_gib=10 ** 6), f"{P4D}.memory_gib is 1000000, not a number above 0 and at most 32768"),
    (lambda t: t.update(gpus=10 ** 9), f"{P4D}.gpus is 1000000000, not a whole number from 0 to 64"),
    (lambda t: t.update(gpus=-8), f"{P4D}.gpus is -8"),
    (lambda t: t.update(gpus=2.5), f"{P4D}.gpus is 2.5, not a whole number"),
    (lambda t: t.update(cpu=0), f"{P4D}.cpu (vCPUs) is 0"),
    (lambda t: t.update(cpu=4096), f"{P4D}.cpu (vCPUs) is 4096"),
    (lambda t: t.update(nvlink_domain=0), f"{P4D}.nvlink_domain (GPUs per NVLink domain) is 0, not a whole number from 1 to 8"),
    # A list or a string where a map belongs was "AttributeError: 'list' object has no attribute 'items'" (s35).
    (lambda t: t.update(prices=list(t["prices"].values())), f"{P4D}.prices is a list, not a map of region -> {{on_demand, spot, source}}"),
    (lambda t: t["prices"].update({"us-east-1": "55"}), f"{P4D}.prices.us-east-1 is a string, not a map of on_demand, spot, source"),
])
def test_a_pinned_catalogs_numbers_are_range_checked_naming_the_entry_and_field(edit, says):
    """Before, parse_catalog took any float()/int(): a negative price planned `$0.00/h -> $-155.93/h` past the budget
    guardrail, NaN crashed the solver ("unexpected ValueError"), gpus: 10**9 ate memory until the plan was killed."""
    raw = json.loads(shipped_catalog_text())
    edit(raw["clouds"]["aws"]["instance_types"]["p4d.24xlarge"])
    with pytest.raises(ReconcileError) as e:
        parse_catalog(raw, "pinned/catalog.json")
    assert str(e.value).startswith("pinned/catalog.json: not a fleetops price catalog: ") and says in str(e.value), str(e.value)


@pytest.mark.parametrize("edit, says", [
    (lambda raw: raw["clouds"].update(aws=[]), "clouds.aws is a list, not a map of regions, instance_types"),
    (lambda raw: raw["clouds"]["aws"].update(instance_types=None), "clouds.aws.instance_types is null or missing, not a map of"),
    (lambda raw: raw["clouds"]["aws"]["instance_types"].update({"p4d.24xlarge": 1}), f"{P4D} is a number, not a map of"),
    (lambda raw: raw.update(sources=["aws"]), "sources is a list, not a map of source -> {date, what}"),
    (lambda raw: raw.update(gpu_models={"A100": []}), "gpu_models.A100 is a list, not a map of memory_gib, mig_profiles"),
    (lambda raw: raw["gpu_models"]["A100"].update(mig_profiles="1g.10gb"), "gpu_models.A100.mig_profiles is a string, not a map"),
])
def test_a_pinned_catalogs_maps_are_checked_naming_the_field(edit, says):
    """s35: a list or a string where the catalog has a map gave the text of an AttributeError ("'list' object has no
    attribute 'items'") inside the clean error, naming no field to fix."""
    raw = json.loads(shipped_catalog_text())
    edit(raw)
    with pytest.raises(ReconcileError) as e:
        parse_catalog(raw, "pinned/catalog.json")
    assert str(e.value).startswith("pinned/catalog.json: not a fleetops price catalog: ") and says in str(e.value), str(e.value)
    assert "attribute" not in str(e.value)


@pytest.mark.parametrize("fmt", [3, 1, "2", None])
def test_a_pinned_catalog_of_another_format_is_refused_not_misread(fmt):
    """Attacks s34: the format was never read, so a catalog written by a newer fleetops (or an older one's, before
    per-region prices) was planned from as if it meant what this one's fields mean."""
    raw = json.loads(shipped_catalog_text())
    raw["format"] = fmt
    with pytest.raises(ReconcileError) as e:
        parse_catalog(raw, "pinned/catalog.json")
    assert str(e.value).startswith(f"pinned/catalog.json: not a fleetops price catalog: its format is {json.dumps(fmt)}, "
                                   f"not {CATALOG_FORMAT} (the format this fleetops reads)"), str(e.value)


def test_the_shipped_catalog_is_within_the_bounds_and_a_plan_with_a_negative_price_changes_nothing(tmp_path):
    from providers.catalog import MAX_GPUS, MAX_MEMORY_GIB, MAX_PRICE, MAX_VCPUS

    shapes = load_catalog().shapes.values()
    assert max(s.gpus for s in shapes) * 4 <= MAX_GPUS and max(s.cpu for s in shapes) * 8 <= MAX_VCPUS
    assert max(s.memory_gib for s in shapes) * 8 <= MAX_MEMORY_GIB
    assert max(p.on_demand for s in shapes for p in s.prices.values()) * 80 <= MAX_PRICE
    qs = copy_quickstart(tmp_path)
    raw = json.loads(shipped_catalog_text())
    raw["clouds"]["aws"]["instance_types"]["p4d.24xlarge"]["prices"]["us-east-1"]["on_demand"] = -50
    (qs / "catalog.json").write_text(json.dumps(raw))
    res = cli("apply", qs, "--auto-approve")
    assert res.returncode == 1 and "unexpected" not in res.stderr, res.stderr
    assert f"{qs / 'catalog.json'}: not a fleetops price catalog: {P4D}.prices.us-east-1.on_demand (USD per hour) is -50" in res.stderr
    assert not (qs / ".reconcile" / "sim" / "cloud.json").exists()  # nothing launched


def test_catalog_update_leaves_out_a_price_its_source_gives_as_zero_or_less(monkeypatch):
    """What it writes, parse_catalog takes: a source's 0 or negative price is no price there (on-demand: the type
    loses its price in the region, listed; spot: no spot market), never a figure the next plan refuses."""
    import providers.pricesources as ps

    raw = json.loads(shipped_catalog_text())
    given = {"p4d.24xlarge": {"us-east-1": {"on_demand": 0.0, "spot": 5.0}},
             "p5.48xlarge": {"us-east-1": {"on_demand": 55.04, "spot": 0.0}, "us-west-2": {"on_demand": -1.0}}}
    monkeypatch.setitem(ps.FETCHERS, "aws", lambda cat, types, regions: (given, {"fake-1": {"date": "2026-12-01", "what": "t"}}))
    new, lines = ps.update_catalog(raw, load_catalog(), ["aws"], {"aws": ["us-east-1", "us-west-2"]})
    types = new["clouds"]["aws"]["instance_types"]
    assert "us-east-1" not in types["p4d.24xlarge"]["prices"] and "us-west-2" not in types["p5.48xlarge"]["prices"]
    assert types["p5.48xlarge"]["prices"]["us-east-1"] == {"on_demand": 55.04, "source": "fake-1"}
    assert "p4d.24xlarge in us-east-1" in lines[0]
    parse_catalog(new, "updated.json")


def test_a_fleet_of_types_the_catalog_learned_on_2026_11_29_validates_plans_and_applies_at_the_catalogs_prices(tmp_path):
    """A Pool naming a2-highgpu-2g was refused ("unknown gcp instance type"): the catalog knew 21/12/11 types; so was
    one naming g5.2xlarge or m6i.16xlarge until the AWS sizes the source prices were read too. Now one pool of a newly
    priced type per cloud, and an AWS A10G and CPU pool, validate, the plan creates each at its catalog price, and the
    apply leaves nothing to do."""
    cat = load_catalog()
    pools = {"aws-new": ("aws", "us-east-1", "us-east-1a", "g6e.2xlarge"),
             "aws-a10g": ("aws", "us-east-1", "us-east-1a", "g5.2xlarge"),
             "aws-cpu": ("aws", "us-east-1", "us-east-1a", "m6i.16xlarge"),
             "gcp-new": ("gcp", "us-central1", "us-central1-a", "a2-highgpu-2g"),
             "azure-new": ("azure", "eastus", "eastus-1", "Standard_NC48ads_A100_v4")}
    cfg = write_config(tmp_path / "fleet", [
        topology(clouds={c: {r: [z]} for c, r, z, _ in pools.values()}), tenant("t"),
        *[pool(name, c, r, [z], [t]) for name, (c, r, z, t) in pools.items()],
        job("a100x2", gpus=2, gpu_type="A100", cpu=8, mem=64), job("l40s", gpus=1, gpu_type="L40S", cpu=4, mem=32),
        job("a100-80gbx2", gpus=2, gpu_type="A100-80GB", cpu=16, mem=128), job("a10g", gpus=1, gpu_type="A10G", cpu=4, mem=16),
        job("cpu40", cpu=40, mem=160)])  # too big for what any GPU node has left: only m6i.16xlarge takes it
    res = cli("validate", cfg)
    assert res.returncode == 0, res.stderr
    res = cli("plan", cfg, "--format", "json")
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    assert sorted((c["cloud"], c["instance_type"], c["price"]) for c in plan["creates"]) == sorted(
        (c, t, cat.offering(c, r, z, t).on_demand_price) for c, r, z, t in pools.values())
    # As published (GCP: VM + 2 x A100 rows): g6e.2xlarge, g5.2xlarge, m6i.16xlarge, a2-highgpu-2g, NC48ads_A100_v4.
    assert sorted(c["price"] for c in plan["creates"]) == [1.212, 2.24208, 3.072, 7.346, 7.34677]
    assert all(j["action"] == "place" for j in plan["jobs"])
    assert cli("apply", cfg, "--auto-approve").returncode == 0
    assert cli("plan", cfg, "--detailed-exitcode").returncode == 0


@pytest.fixture
def prices():
    from tests.price_fake import PriceFake

    fake = PriceFake().start()
    yield fake
    fake.stop()


def _env(prices, **extra):
    return {**AWS_ENV, **prices.env(), **extra}


def test_catalog_update_writes_a_dated_catalog_the_config_repo_plans_with(prices, tmp_path):
    qs = copy_quickstart(tmp_path)
    res = cli("catalog", "update", "--dir", qs, "--region", "aws/us-east-1", "--region", "gcp/us-central1",
              "--region", "azure/eastus", env=_env(prices))
    assert res.returncode == 0, res.stderr
    today = date.today().isoformat()
    assert f"catalog written to {qs / 'catalog.json'} (dated {today})" in res.stdout
    raw = json.loads((qs / "catalog.json").read_text())
    aws, gcp, azure = (raw["clouds"][c]["instance_types"] for c in ("aws", "gcp", "azure"))
    # AWS: on-demand from GetProducts; spot: each zone's last change at or before now, however old (us-east-1a's
    # is 10 days old: still today's price), the superseded one not; the median of 30, 20 and 25.
    assert aws["p5.48xlarge"]["prices"]["us-east-1"] == {"on_demand": 55.04, "spot": 25.0, "source": f"aws-{today}"}
    assert aws["p4d.24xlarge"]["prices"]["us-east-1"] == {"on_demand": 21.957642, "source": f"aws-{today}"}
    # A type the source does not price there loses its price (not kept stale), and the summary says so.
    assert "us-east-1" not in aws["p6-b200.48xlarge"]["prices"] and "p6-b200.48xlarge in us-east-1" in res.stdout
    assert aws["p6-b200.48xlarge"]["prices"]["us-west-2"]["source"] == "skypilot-v8"  # a region not read keeps its own
    # GCP: the A2 family's per-vCPU and per-GiB prices times the shape, plus the GPU (12 x 0.031611 + 85 x 0.004237 + 2.933908).
    assert gcp["a2-highgpu-1g"]["prices"]["us-central1"]["on_demand"] == pytest.approx(3.673385, abs=1e-6)
    assert gcp["a2-highgpu-1g"]["prices"]["us-central1"]["spot"] == pytest.approx(12 * 0.009483 + 85 * 0.001271 + 0.88, abs=1e-6)
    assert "spot" not in gcp["g2-standard-4"]["prices"]["us-central1"]  # no Preemptible G2 SKU: no spot price
    assert "us-central1" not in gcp["a3-highgpu-8g"]["prices"]  # no A3/H100 SKUs served
    # Azure: the Linux Consumption meter and its Spot meter; Windows and Low Priority meters ignored; two pages.
    assert azure["Standard_NC4as_T4_v3"]["prices"]["eastus"] == {"on_demand": 0.526, "spot": 0.0526, "source": f"azure-{today}"}
    assert azure["Standard_D16s_v5"]["prices"]["eastus"] == {"on_demand": 0.768, "source": f"azure-{today}"}
    assert set(raw["sources"]) >= {f"aws-{today}", f"gcp-{today}", f"azure-{today}"} and raw["date"] == today

    # The config repo now plans with it, and the plan says where each price is from.
    res = cli("plan", qs)
    assert res.returncode == 0, res.stderr
    assert f"Prices: catalog: aws-{today} ({today})" in res.stdout.replace("\n", " ")


def test_an_unreachable_or_garbled_price_source_is_a_clear_error_and_nothing_is_written(prices, tmp_path):
    qs = copy_quickstart(tmp_path)
    res = cli("catalog", "update", "--dir", qs, "--cloud", "azure", env=_env(prices, FLEETOPS_AZURE_PRICES_ENDPOINT="http://127.0.0.1:9"))
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert "azure Retail Prices API (eastus): cannot reach http://127.0.0.1:9/api/retail/prices" in res.stderr
    prices.broken = "gcp"
    res = cli("catalog", "update", "--dir", qs, "--cloud", "gcp", env=_env(prices))
    assert res.returncode == 1 and "SKU X is not in the documented shape" in res.stderr and "nothing was written" in res.stderr
    assert not (qs / "catalog.json").exists()
    res = cli("catalog", "update", "--dir", qs, "--cloud", "ibm", env=_env(prices))
    assert res.returncode == 1 and "--cloud 'ibm': use aws, gcp or azure" in res.stderr


def test_a_garbled_pinned_catalog_is_an_error_naming_the_file(tmp_path):
    qs = copy_quickstart(tmp_path)
    (qs / "catalog.json").write_text('{"clouds": {"aws": ')
    res = cli("plan", qs)
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert f"{qs / 'catalog.json'}: cannot read the pinned price catalog" in res.stderr and "reconcile catalog update" in res.stderr


@pytest.mark.parametrize("case", ["fifo", "link out"])
def test_a_pinned_catalog_that_is_no_file_of_the_config_is_an_error_naming_it(tmp_path, case):
    """Audit: a fifo at catalog.json hung validate and plan for ever, a link (a pull request can commit one) was read
    wherever it led (to /dev/zero: until the machine ran out of memory).
    Each is refused as the config's YAML is, naming the file, before anything is planned."""
    qs = copy_quickstart(tmp_path / "repo")
    pinned = qs / "catalog.json"
    if case == "fifo":
        os.mkfifo(pinned)
        says = "not a regular file (a fifo, socket or device)"
    else:
        (tmp_path / "prices.json").write_text(shipped_catalog_text())
        pinned.symlink_to(tmp_path / "prices.json")
        says = f"a symlink out of the config directory ({tmp_path / 'prices.json'})"
    for args in (("validate", qs), ("plan", qs, "--time-limit", "0")):
        res = cli(*args, timeout=60)
        assert res.returncode == 1 and "Traceback" not in res.stderr and "unexpected" not in res.stderr, res.stderr
        assert f"{pinned}" in res.stderr and says in res.stderr, res.stderr


@pytest.mark.parametrize("target", [".git/prices.json", ".reconcile/prices.json", ".prices.json", "status/prices.json",
                                    "node_modules/prices.json", "gone.json"])
def test_a_pinned_catalog_linked_to_what_is_not_config_is_refused_as_the_yamls_link_is(tmp_path, target):
    """catalog.json committed as a link into .git/ (whose config holds CI's token), the state, a hidden file or status/
    was read as the pinned catalog: only a link out of the directory was refused, where load refuses these too (one
    rule, providers.files.not_a_link_target). A dangling link planned at the shipped prices as if nothing were pinned."""
    from typer.testing import CliRunner

    from reconciler.cli import app

    qs = copy_quickstart(tmp_path)
    if target != "gone.json":
        (qs / target).parent.mkdir(exist_ok=True)
        (qs / target).write_text(shipped_catalog_text())  # (a catalog that reads: refused for where it is, not what)
    (qs / "catalog.json").symlink_to(target)
    res = CliRunner().invoke(app, ["validate", str(qs)])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    says = "a dangling symlink" if target == "gone.json" else f"a symlink into {target}, which is not config"
    assert f"{qs / 'catalog.json'}: cannot read the pinned price catalog: {says}" in res.stderr, res.stderr


def test_a_region_the_shipped_catalog_does_not_price_is_priced_by_catalog_update(prices, tmp_path):
    """A westeurope pool is refused (the shipped catalog has no public westeurope price), and the refusal's advice is
    true: `catalog update --region azure/westeurope` prices the region from the Retail Prices API and the same config
    then validates. (The refusal said "not offered in westeurope": the size is offered there, only not priced.)"""
    from tests.fleetkit import TOPOLOGY, pool, tenant, topology, write_config
    from tests.price_fake import _retail

    cfg = write_config(tmp_path / "cfg", [
        topology(clouds={**TOPOLOGY, "azure": {**TOPOLOGY["azure"], "westeurope": ["westeurope-1"]}}), tenant("t"),
        pool("eu", "azure", "westeurope", ["westeurope-1"], ["Standard_D16s_v5"])])
    res = cli("validate", cfg)
    assert res.returncode == 1 and "Standard_D16s_v5 has no price in westeurope in the price catalog" in res.stderr, res.stderr
    assert "reconcile catalog update --cloud azure --region azure/westeurope" in res.stderr
    prices.azure_items = [*prices.azure_items, _retail("Standard_D16s_v5", "D16s v5", "Virtual Machines Dsv5 Series", 0.84, "westeurope")]
    res = cli("catalog", "update", "--dir", cfg, "--cloud", "azure", "--region", "azure/westeurope", env=_env(prices))
    assert res.returncode == 0, res.stderr
    raw = json.loads((cfg / "catalog.json").read_text())
    assert raw["clouds"]["azure"]["instance_types"]["Standard_D16s_v5"]["prices"]["westeurope"]["on_demand"] == 0.84
    res = cli("validate", cfg)
    assert res.returncode == 0, res.stderr


def test_a_pinned_catalog_cannot_change_what_a_known_type_is(tmp_path):
    """Audit: a config repo's catalog.json with g5.xlarge at 8 GPUs validated, and the plan put a 3-GPU job on GPUs 0-2
    of a new g5.xlarge (1 GPU): re-checked and launched as such (the AWS provider takes a known type's shape from the
    catalog). A pinned catalog sets prices and adds types; a known type's shape is refused, naming the field, and
    nothing is launched. A price change alone still plans at the pinned price."""
    qs = copy_quickstart(tmp_path)
    raw = json.loads(shipped_catalog_text())
    raw["clouds"]["aws"]["instance_types"]["g5.xlarge"]["gpus"] = 8
    (qs / "catalog.json").write_text(json.dumps(raw))
    from typer.testing import CliRunner

    from reconciler.cli import app

    runner = CliRunner()
    res = runner.invoke(app, ["apply", str(qs), "--auto-approve"])
    assert res.exit_code == 1 and "unexpected" not in res.stderr, res.stderr
    assert (f"{qs / 'catalog.json'}: clouds.aws.instance_types.g5.xlarge.gpus is 8, but a g5.xlarge has 1 GPUs (the shipped "
            "catalog)") in res.stderr, res.stderr
    assert not (qs / ".reconcile" / "sim" / "cloud.json").exists()
    raw = json.loads(shipped_catalog_text())
    raw["clouds"]["aws"]["instance_types"]["g5.xlarge"]["prices"]["us-east-1"]["on_demand"] = 0.5
    (qs / "catalog.json").write_text(json.dumps(raw))
    try:
        res = runner.invoke(app, ["plan", str(qs), "--format", "json"])
    finally:
        from providers.catalog import pin_catalog

        pin_catalog(None)  # (in process: the next test of this worker plans with the shipped catalog)
    assert res.exit_code == 0, res.stderr


def test_a_pull_request_that_lowers_catalog_json_prices_under_the_budget_is_shown_and_refused(tmp_path):
    """Audit: catalog.json in the config repo sets the prices the budget guardrail counts, so a pull request that priced
    p4d.24xlarge at $2/h (public: $21.96/h) planned two of them under max_hourly_budget 40 and apply launched them: a
    fleet of $53/h or more past a $40/h guardrail. The plan names each price catalog.json sets below the public one (human,
    markdown, JSON), the budget takes the public price, and apply refuses, launching nothing; a GuardrailPolicy with
    `allow_negotiated_prices: true` (a discount the team negotiated) budgets at catalog.json's prices."""
    qs = copy_quickstart(tmp_path)
    policies = qs / "policies.yaml"
    policies.write_text(policies.read_text().replace("max_hourly_budget: 150", "max_hourly_budget: 40"))
    raw = json.loads(shipped_catalog_text())
    raw["clouds"]["aws"]["instance_types"]["p4d.24xlarge"]["prices"]["us-east-1"]["on_demand"] = 2.0
    (qs / "catalog.json").write_text(json.dumps(raw))
    res = cli("plan", qs, "--format", "json")
    plan = json.loads(res.stdout)
    p4d = [c for c in plan["creates"] if c["instance_type"] == "p4d.24xlarge"]
    assert len(p4d) >= 2 and {c["price"] for c in p4d} == {2.0} and plan["cost_after"] < 40, res.stdout
    public = plan["cost_after"] + len(p4d) * (21.957642 - 2.0)
    note = ("x p4d.24xlarge on-demand in aws/us-east-1a at $2/h where the public price is $21.96/h (skypilot-v8 "
            "(2026-11-23), the shipped catalog); the budget guardrail counts the public price")
    assert any(n.startswith("priced from catalog.json: ") and note in n for n in plan["notes"]), plan["notes"]
    assert any(v.startswith(f"max_hourly_budget: the fleet would cost ${public:,.2f}/h at public prices, over the $40.00/h budget")
               for v in plan["violations"]), plan["violations"]
    human = cli("plan", qs).stdout
    assert "Note: priced from catalog.json:" in human and "at public prices" in human, human
    assert "priced from catalog.json:" in cli("plan", qs, "--format", "markdown").stdout
    res = cli("apply", qs, "--auto-approve")
    assert res.returncode != 0 and "at public prices, over the $40.00/h budget" in res.stderr, res.stdout + res.stderr
    assert not (qs / ".reconcile" / "sim" / "cloud.json").exists()  # nothing launched

    policies.write_text(policies.read_text().replace("max_hourly_budget: 40", "max_hourly_budget: 40\n  allow_negotiated_prices: true"))
    res = cli("apply", qs, "--auto-approve")
    assert res.returncode == 0, res.stdout + res.stderr
    # The kept instances: the budget sees their catalog.json price as the public one again when negotiated prices are
    # no longer allowed (a later pull request that drops the field is refused, not applied past the budget).
    plan = json.loads(cli("plan", qs, "--format", "json").stdout)
    assert plan["violations"] == [] and any("p4d.24xlarge on-demand in aws/us-east-1a at $2/h" in n and "(allow_negotiated_prices)" in n
                                            for n in plan["notes"]), plan
    policies.write_text(policies.read_text().replace("\n  allow_negotiated_prices: true", ""))
    plan = json.loads(cli("plan", qs, "--format", "json").stdout)
    assert any(f"${public:,.2f}/h at public prices" in v for v in plan["violations"]), plan


def test_a_tenants_budget_counts_the_public_price_of_what_catalog_json_prices_below_it(tmp_path):
    """The same for tenant_hourly_budgets: research's replicas on p4d.24xlarge priced at $2/h in catalog.json cost it
    under $20/h at those prices, and far more at the public $21.96/h: the plan says so and apply refuses."""
    qs = copy_quickstart(tmp_path)
    policies = qs / "policies.yaml"
    policies.write_text(policies.read_text().replace("max_hourly_budget: 150", "max_hourly_budget: 150\n  tenant_hourly_budgets: {research: 20}"))
    raw = json.loads(shipped_catalog_text())
    raw["clouds"]["aws"]["instance_types"]["p4d.24xlarge"]["prices"]["us-east-1"]["on_demand"] = 2.0
    (qs / "catalog.json").write_text(json.dumps(raw))
    plan = json.loads(cli("plan", qs, "--format", "json").stdout)
    on_p4d = {c["ref"] for c in plan["creates"] if c["instance_type"] == "p4d.24xlarge"}
    assert any(set(j["instances"]) & on_p4d for j in plan["jobs"] if j["tenant"] == "research"), plan["jobs"]
    assert [v for v in plan["violations"] if v.startswith("tenant_hourly_budgets: tenant research would cost $")
            and "at public prices, over its $20.00/h budget" in v], plan["violations"]
    res = cli("apply", qs, "--auto-approve")
    assert res.returncode != 0 and "tenant research would cost" in res.stderr, res.stdout + res.stderr
    assert not (qs / ".reconcile" / "sim" / "cloud.json").exists()
    policies.write_text(policies.read_text().replace("{research: 20}", "{research: 20}\n  allow_negotiated_prices: true"))
    assert json.loads(cli("plan", qs, "--format", "json").stdout)["violations"] == []
