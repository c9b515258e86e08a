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
