"""Issue 18, item 4: applies that leave states no plan would make (on the sim, through its tags
and the state file): a failed move's replacement put on top of the mover, and a
placement-group gang sent to a zone its old group cannot reach."""

from __future__ import annotations

from dataclasses import replace

from providers.placements import read_placements
from providers.sim import SimCloud
from reconciler import api
from reconciler.apply import apply_plan
from reconciler.load import load
from reconciler.observe import Fleet
from reconciler.state import load_state, save_state, state_dir
from tests.fleetkit import doc, job, pool, tenant, topology, write_config

SPOT = doc("SpotPolicy", "s", {"max_spot_fraction": 1.0, "max_price_fraction": 1.0, "min_instance_types": 1})


def _config(path, mover_spot: str, newcomer: bool):
    docs = [topology(), tenant("t"), SPOT,
            pool("od", "aws", "us-east-1", ["us-east-1a"], ["p4d.24xlarge"], hi=1),
            pool("sp", "aws", "us-east-1", ["us-east-1a"], ["p4d.24xlarge"], market="spot", hi=1),
            job("mover", gpus=8, gpu_type="A100", cpu=40, mem=500, spot=mover_spot)]
    if newcomer:
        docs.append(job("newcomer", gpus=8, gpu_type="A100", cpu=40, mem=500, spot="never"))
    return write_config(path, docs)


def test_a_failed_move_keeps_the_mover_and_its_replacement_off_its_gpus(tmp_path):
    """The mover goes to a new spot instance so the newcomer (spot: never) can take its on-demand
    one; the spot create fails (an ordinary capacity error). Before, the mover stayed and the
    newcomer was put there too: 16 of 8 GPUs, both on GPUs 0-7, in the tags and state.json."""
    cfg = _config(tmp_path / "c", "never", newcomer=False)
    api.apply(cfg)
    host = load_state(cfg).placements["mover"][0]
    _config(tmp_path / "c", "eligible", newcomer=True)
    desired = load(cfg)
    fleet = Fleet(desired, state_dir(cfg))
    state = load_state(cfg)
    observed = fleet.observe(state)
    p = api.plan(cfg).plan
    spot = next(c for c in p.creates if c.market == "spot")
    # The plan a solver makes when it keeps the on-demand instance: the mover to new spot
    # capacity, the newcomer onto the GPUs it frees.
    jobs = tuple(replace(j, instances=(spot.ref,), gpus=(tuple(range(8)),)) if j.job == "mover" else
                 replace(j, instances=(host,), gpus=(tuple(range(8)),)) for j in p.jobs)
    plan = replace(p, creates=(spot,), deletes=(), jobs=jobs)
    assert {j.job: j.action for j in plan.jobs} == {"mover": "move", "newcomer": "place"}
    SimCloud(state_dir(cfg)).exhaust("us-east-1a", market="spot")

    report = apply_plan(desired, observed, plan, fleet, state)
    save_state(cfg, state)
    assert spot.ref in report.failed_refs
    assert report.placements == {"mover": [host]}
    assert any(f.startswith("newcomer not put on " + host) for f in report.failures)
    saved = load_state(cfg)
    assert saved.placements == {"mover": [host]} and "newcomer" not in saved.gpus
    tags = next(i for i in SimCloud(state_dir(cfg)).instances() if i["id"] == host)["tags"]
    assert [pl.job for pl in read_placements(tags).placements] == ["mover"]
    # The next plan sees the fleet as it is: the newcomer is not running anywhere.
    nxt = api.plan(cfg).plan
    assert {j.job: j.previous for j in nxt.jobs} == {"mover": (host,), "newcomer": ()}
