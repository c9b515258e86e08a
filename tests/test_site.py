"""Site: the seven fields hosts, offers, creates and deletes share, declared once; the plan file keeps them flat."""

from __future__ import annotations

from pathlib import Path

from reconciler.plan import CreateAction, DeleteAction, Plan
from reconciler.site import Site

SAVED = Path(__file__).parent / "data" / "saved_plan_v2.json"


def site(zone: str = "us-east-1a", market: str = "spot") -> Site:
    return Site("aws-a100", "sim", "aws", "us-east-1", zone, "p4d.24xlarge", market)


def test_a_plan_saved_before_actions_carried_a_site_loads_and_saves_byte_for_byte():
    """tests/data/saved_plan_v2.json was written by the code before this change (flat actions, one reserved
    create, one delete): it loads, its actions carry their sites, and it encodes to the same text, digest included."""
    text = SAVED.read_text()
    plan = Plan.from_json(text)
    assert plan.creates[0].site == site() and plan.creates[0].zone == "us-east-1a"
    assert plan.creates[1].site.pool == "gcp-cpu" and plan.creates[1].reservation == "r1"
    assert plan.deletes[0].site == Site("aws-cpu", "sim", "aws", "us-east-1", "us-east-1b", "m6i.4xlarge", "on-demand")
    assert plan.to_json() == text


def test_keys_derive_from_the_site_and_a_reservation_is_its_own_offer():
    s = site()
    assert s.offer_key == "aws-a100/us-east-1a/p4d.24xlarge/spot" and s.class_key == "aws-a100/*/p4d.24xlarge/spot"
    assert site("us-east-1b").class_key == s.class_key and site("us-east-1b").offer_key != s.offer_key
    plain = CreateAction("+1", "k-1", site(market="on-demand"), 1.0, None)
    reserved = CreateAction("+2", "k-2", site(market="on-demand"), 0.0, None, reservation="r1")
    assert plain.offer_key == "aws-a100/us-east-1a/p4d.24xlarge/on-demand" and reserved.offer_key == plain.offer_key + "@r1"


def test_actions_read_their_sites_fields_and_compare_by_value():
    d = DeleteAction("i-1", site(), 3.0, "no longer needed")
    assert (d.pool, d.cloud, d.region, d.zone, d.instance_type, d.market, d.provider) == \
        ("aws-a100", "aws", "us-east-1", "us-east-1a", "p4d.24xlarge", "spot", "sim")
    assert d == DeleteAction("i-1", site(), 3.0, "no longer needed") and d != DeleteAction("i-1", site("us-east-1b"), 3.0, "no longer needed")
    assert Site.of(d) == d.site


def shape(**kw) -> dict:
    return {"gpus": 8, "gpu_type": "A100", "cpu": 96.0, "memory_gib": 1152.0, "price": 9.0, "on_demand_price": 32.0, **kw}


def test_a_host_and_an_offer_of_one_site_share_its_keys_and_differ_in_kind():
    """Greedy opens the idle hosts of an offer key before it buys from the offer of that key: the key must agree."""
    from reconciler.problem import Host, Offer

    h = Host(key="i-1", site=site(), **shape(), instance_id="i-1")
    o = Offer(key=site().offer_key, site=site(), **shape(), max_new=3)
    assert h.offer_key == o.offer_key == site().offer_key and h.class_key == o.class_key == site().class_key
    assert (h.most, o.most) == (1, 3) and h.existing and not o.existing
    assert h.common() == {**o.common(), "key": "i-1"}
    assert Offer(key="i-1", site=site(), **shape()) != Host(key="i-1", site=site(), **shape(), instance_id="i-1")
    assert not hasattr(o, "instance_id") and not hasattr(o, "residents") and not hasattr(h, "max_new")
    reserved = Offer(key="k", site=site(market="on-demand"), **shape(price=0.0), reservation="r1")
    assert reserved.offer_key == site(market="on-demand").offer_key + "@r1"


def test_identical_idle_hosts_are_one_idle_class_not_an_offer():
    """solve/index.py counts identical idle hosts as one class: their site, shape and price, and their keys."""
    from reconciler.problem import Host, Offer
    from reconciler.solve.index import IdleClass, idle_classes

    hosts = [Host(key=k, site=site(), **shape(), instance_id=k) for k in ("i-2", "i-1")]
    busy = Host(key="i-3", site=site(), **shape(), instance_id="i-3", residents=(("d", "j", 1),))
    idle, members, idle_of = idle_classes(hosts + [busy])
    (ik, cls), = idle.items()
    assert isinstance(cls, IdleClass) and not isinstance(cls, (Host, Offer))
    assert cls.hosts == ("i-1", "i-2") and cls.most == 2 and cls.site == site() and cls.price == 9.0
    assert [h.key for h in members[ik]] == ["i-1", "i-2"] and idle_of == {"i-1": ik, "i-2": ik}
