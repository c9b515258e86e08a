"""Issue 18, item 4: applies that leave states no plan would make (on the sim, through its tags
and the state file): a failed move's replacement put on top of the mover, and a
placement-group gang sent to a zone its old group cannot reach."""

from __future__ import annotations

from dataclasses import replace

import pytest

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


def test_a_placement_group_gang_moved_to_another_zone_launches_into_a_group_there(tmp_path):
    """A cluster placement group lives in one zone (the sim refuses a launch elsewhere, as AWS
    does). Before, the gang's group had one name whatever the zone, so once its allowlist moved
    it to another zone every plan proposed new instances there inside the old group and every
    apply failed, forever."""
    def docs(allowed: str) -> list[dict]:
        return [topology(), tenant("t"),
                pool("pa", "aws", "us-east-1", ["us-east-1a"], ["p4d.24xlarge"], hi=2),
                pool("pb", "aws", "us-east-1", ["us-east-1b"], ["p4d.24xlarge"], hi=2),
                job("pretrain", gpus=8, gpu_type="A100", cpu=90, mem=1000, replicas=2, gang="placement-group", pools=[allowed])]
    cfg = write_config(tmp_path / "c", docs("pa"))
    first = api.apply(cfg, time_limit=5)
    assert first.report.ok and {c.zone for c in first.plan.creates} == {"us-east-1a"}
    write_config(tmp_path / "c", docs("pb"))
    moved = api.apply(cfg, time_limit=5)
    assert moved.report.ok, moved.report.failures
    assert {c.zone for c in moved.plan.creates} == {"us-east-1b"}
    world = [i for i in SimCloud(state_dir(cfg)).instances() if i["state"] == "running"]
    assert {i["zone"] for i in world} == {"us-east-1b"} and len({i["placement_group"] for i in world}) == 1
    assert not api.plan(cfg, time_limit=5).plan.has_changes


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def _gpu_block_problems(plan, recorded: dict[str, list[list[int]]], gpus_per_instance: int) -> list[str]:
    """From the plan alone: GPUs shared on an instance, a `keep` whose GPU indices changed, and a
    multi-GPU replica placed anew off an aligned block while one is free (README: multi-GPU
    replicas take an aligned block inside one NVLink domain)."""
    bad, used = [], {}
    for j in plan.jobs:
        if j.action not in ("keep", "place", "move"):
            continue
        if j.action == "keep" and j.job in recorded and [list(g) for g in j.gpus] != recorded[j.job]:
            bad.append(f"keep {j.job}: GPUs {recorded[j.job]} -> {j.gpus}")
        for r, (iid, g) in enumerate(zip(j.instances, j.gpus)):
            for i in g:
                if (iid, i) in used:
                    bad.append(f"{iid} GPU {i}: {used[(iid, i)][0]} and {j.job}")
                used[(iid, i)] = (j.job, r)
    for j in plan.jobs:
        if j.action not in ("place", "move"):
            continue
        for r, (iid, g) in enumerate(zip(j.instances, j.gpus)):
            n, b = len(g), _pow2(len(g))
            if n < 2 or (g == tuple(range(g[0], g[0] + n)) and g[0] % b == 0):
                continue
            # (what every other replica holds, the job's own other replicas on this instance too: an instance gang's
            # 2 x 3 GPUs beside a job on GPU 6 take (0, 1, 2) and (3, 4, 5), and no block of 4 is left for the second)
            taken = {i for (at, i), who in used.items() if at == iid and who != (j.job, r)}
            if any(not taken & set(range(s, s + b)) for s in range(0, gpus_per_instance - b + 1, b)):
                bad.append(f"{j.job} on {iid} GPUs {g} while an aligned block of {b} is free")
    return bad


def _gpu_churn(tmp_path, seed: int, steps: int) -> None:
    import random

    rng = random.Random(seed)
    base = [topology(), tenant("t"), pool("p", "aws", "us-east-1", ["us-east-1a"], ["p4d.24xlarge"], hi=3)]

    def docs(jobs):
        return base + [job(n, gpus=g, gpu_type="A100", cpu=4 * g, mem=40 * g, spot="never",
                           **({"replicas": 2, "gang": "instance"} if n.endswith("g") else {})) for n, g in sorted(jobs.items())]

    def new_job(name):
        gang = rng.random() < 0.3
        return name + ("g" if gang else ""), rng.choice([1, 2, 3, 4] if gang else [1, 1, 2, 2, 3, 4, 4, 6])

    jobs = dict(new_job(f"j{k}") for k in range(rng.randint(4, 10)))
    cfg = write_config(tmp_path / f"c{seed}", docs(jobs))
    for step in range(steps):
        res = api.plan(cfg, time_limit=2)
        problems = _gpu_block_problems(res.plan, load_state(cfg).gpus, 8)
        assert not problems, f"seed {seed} step {step}: {problems}"
        api.apply(cfg, saved_plan=res.plan)
        jobs.pop(rng.choice(sorted(jobs)))  # a config edit: one job goes, another comes
        jobs.update([new_job(f"n{step}")])
        write_config(tmp_path / f"c{seed}", docs(jobs))


def test_gpu_blocks_stay_whole_aligned_and_kept_across_plans_and_applies(tmp_path):
    """Issue 18 item 7's GPU property on a random fleet that runs work, with a job leaving and
    another arriving between applies (instance gangs included)."""
    _gpu_churn(tmp_path, 3, 2)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(10, 22))
def test_gpu_blocks_stay_whole_aligned_and_kept_on_many_fleets(tmp_path, seed):
    _gpu_churn(tmp_path, seed, 4)


def _gang_config(path):
    run = {"command": ["python3", "-c", "import os; print('RANK', os.environ['RANK'], 'WORLD', os.environ['WORLD_SIZE'])"]}
    return write_config(path, [
        topology(), tenant("t", gpus=32),
        pool("p", "aws", "us-east-1", ["us-east-1a", "us-east-1b"], ["p4d.24xlarge"], hi=3),
        job("gang", gpus=8, gpu_type="A100", cpu=90, mem=1000, replicas=2, gang="zone", run=run)])


def test_a_gang_whose_heal_fails_stops_its_survivor_and_is_pending_with_the_true_reason(tmp_path):
    """One replica's instance is interrupted and its zone runs out, so the heal's create fails. Before, the
    survivor stayed placed alone: state.json and its assignment had the gang at world_size 1 (restarted so),
    status said it ran (Placed: 1 replica), and the next plan called the heal "replicas changed (1 -> 2)" and
    deleted the survivor's host as "consolidated". A gang runs with all its replicas or none."""
    from reconciler.errors import ApplyError
    from reconciler.runtime.bus import Bus
    from reconciler.backend import backend_for

    cfg = _gang_config(tmp_path / "c")
    first = api.apply(cfg, time_limit=5)
    hosts = first.report.placements["gang"]
    assert len(set(hosts)) == 2 and {c.zone for c in first.plan.creates} == {"us-east-1a"}
    lost, survivor = hosts
    sim = SimCloud(state_dir(cfg))
    sim.interrupt(lost)
    sim.exhaust("us-east-1a")

    with pytest.raises(ApplyError) as e:
        api.apply(cfg, time_limit=5)
    report = e.value.result.report
    assert report.failed_refs and "gang" not in report.placements
    assert any(f.startswith(f"gang: stopped its surviving replica(s) on {survivor}") for f in report.failures), report.failures
    saved = load_state(cfg)
    assert "gang" not in saved.placements and "gang" not in saved.gpus
    # Nothing runs the gang at a smaller world size: its survivor's assignment is gone, its tags host nothing.
    assignments = Bus(backend_for(cfg, None)).assignments()
    assert not [r for doc in assignments.values() for r in doc["replicas"] if r["job"] == "gang"], assignments
    tags = next(i for i in sim.instances() if i["id"] == survivor)["tags"]
    assert read_placements(tags).placements == ()
    status = api.read_status(cfg)
    assert status["fleet"]["status"]["jobs"] == {"running": 0, "starting": 0, "unknown": 0, "reserved": 0, "pending": 1, "succeeded": 0, "failed": 0}
    gang = status["jobs"]["gang"]["status"]
    placed = next(c for c in gang["conditions"] if c["type"] == "Placed")
    assert gang["phase"] == "Pending" and gang["instances"] == []
    assert placed["status"] == "False" and placed["reason"] == "ProvisioningFailed", placed
    assert "InsufficientCapacity" in placed["message"] and "all its replicas or none" in placed["message"], placed

    # The next plan heals it, and says so: a lost replica replaced, not a resize, nor a consolidation.
    nxt = api.plan(cfg, time_limit=5).plan
    change = next(j for j in nxt.jobs if j.job == "gang")
    assert change.action == "place" and change.previous == (), change
    assert change.reason == f"replaces {lost}: gone (spot interruption or lost capacity)", change.reason
    assert {c.zone for c in nxt.creates} == {"us-east-1b"}
    assert [(d.instance_id, d.reason) for d in nxt.deletes] == [(survivor, "no longer needed")]
    healed = api.apply(cfg, time_limit=5)
    assert healed.report.ok and len(set(healed.report.placements["gang"])) == 2
    assert "gang" not in load_state(cfg).lost
    assert {r["world_size"] for doc in Bus(backend_for(cfg, None)).assignments().values() for r in doc["replicas"]} == {2}


def test_a_gang_one_of_whose_new_instances_fails_rolls_back_the_others_and_says_so(tmp_path):
    """Audit (apply under cloud failures, item 2): a new 3-replica gang, its third create refused. Before, the two
    instances launched for its other replicas stayed up, idle and billed, until a later run, and apply said "2 created"
    without saying the gang was not placed. Now they are deleted (nothing is placed on them: a gang runs with all its
    replicas or none), the summary counts them as rolled back, and the job says why it is not placed."""
    from reconciler.errors import ApplyError

    cfg = write_config(tmp_path / "c", [
        topology(), tenant("t", gpus=32), pool("p", "aws", "us-east-1", ["us-east-1a"], ["p4d.24xlarge"], hi=3),
        job("gang", gpus=8, gpu_type="A100", cpu=90, mem=1000, replicas=3, gang="zone")])
    sim = SimCloud(state_dir(cfg))
    sim.set_fault(reject_every=3)  # the third launch is refused (a partial batch failure)
    with pytest.raises(ApplyError, match=r"0 created, 2 rolled back, 0 deleted") as e:
        api.apply(cfg, time_limit=5)
    report = e.value.result.report
    assert list(report.failed_refs) == ["+3"] and report.created == {} and sorted(report.rolled_back) == ["+1", "+2"]
    assert report.placements == {} and report.deleted == []
    assert any(f.startswith("gang: not placed: the new instance for its replica(s) on +3 could not be created") and
               all(iid in f for iid in report.rolled_back.values()) for f in report.failures), report.failures
    assert [i["id"] for i in sim.instances() if i["state"] != "terminated"] == []  # nothing left idle and billed
    assert load_state(cfg).placements == {}
    gang = api.read_status(cfg)["jobs"]["gang"]["status"]
    assert gang["phase"] == "Pending" and "launch 3 rejected" in next(c for c in gang["conditions"] if c["type"] == "Placed")["message"]

    sim.set_fault(reject_every=None)
    healed = api.apply(cfg, time_limit=5)
    assert healed.report.ok and len(set(healed.report.placements["gang"])) == 3 and not healed.report.rolled_back
