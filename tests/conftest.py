"""Shared fixtures: a real moto server over HTTP for everything that speaks AWS, and the local Compute Engine and
Azure Resource Manager fakes the GCP and Azure providers' real SDK clients talk to."""

from __future__ import annotations

import os
import socket

import pytest

AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing-secret-never-printed",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}


def pytest_configure(config):
    """No sim agents by default for the whole run, module- and session-scoped fixtures included: those are
    set up before any function-scoped monkeypatch, and a module fixture's apply once left its quickstart's
    agents running after pytest exited (about 80 per run, hundreds on a shared machine).

    And compiled bytecode kept for the run where the environment asks for none to be written: the suite starts
    several hundred `reconcile` processes, and with PYTHONDONTWRITEBYTECODE set in a fresh checkout (CI) each one
    compiled the reconciler from source again (measured: 1.37-1.85 s for the quickstart's plan against 0.94-1.11 s
    with bytecode). The bytecode goes to a directory of the run's own (PYTHONPYCACHEPREFIX), never into the tree,
    and the worker processes and every process they start inherit it."""
    os.environ["FLEETOPS_SIM_AGENTS"] = "0"
    if os.environ.get("PYTHONDONTWRITEBYTECODE") and not os.environ.get("PYTHONPYCACHEPREFIX"):
        import tempfile

        config._fleetops_pycache = tempfile.mkdtemp(prefix="fleetops-tests-pycache-")
        os.environ["PYTHONPYCACHEPREFIX"] = config._fleetops_pycache
        del os.environ["PYTHONDONTWRITEBYTECODE"]


# Tests moved to the slow tier by their measured cost, in one place (CPU seconds, user + system of the test's worker and
# the processes it started, per test, over the whole CI tier on 2026-12-03: 1,700 tests, 910 s of CPU; the tier's
# pytest took 588 s of its 10 minutes on 2 cores after that session's merges, with the fresh install ~150 s more).
# Each has a cheaper sibling in the CI tier asking the same of a smaller case, named after it; `-m slow` runs them.
MEASURED_SLOW = {
    # 12.5 s: explain's "no gap claimed" on a scarce fleet; test_truth/test_explain_json check the plan's own line
    "tests/test_explain_reasons.py::test_explain_claims_a_cost_gap_only_where_the_plan_does",
    # 10.8 / 10.0 / 9.6 / 7.5 / 7.4 / 6.8 s: AWS fidelity on moto, several plans and applies each; CI keeps
    # test_full_plan_apply_converge_against_moto, test_cli_against_moto and the provider's unit tests
    "tests/test_aws_provider.py::test_a_reserved_instance_the_plan_replaces_gives_its_reservation_to_the_replacement_against_moto",
    "tests/test_aws_provider.py::test_a_mig_layout_is_tagged_at_launch_read_back_and_a_changed_one_replaces_the_instance",
    "tests/test_aws_provider.py::test_a_create_waiting_for_its_reservation_is_not_launched_when_the_delete_fails_against_moto",
    "tests/test_aws_provider.py::test_a_stopped_instance_is_noted_left_alone_and_its_work_placed_elsewhere",
    "tests/test_aws_provider.py::test_a_plan_before_ec2_lists_the_last_applys_instances_buys_nothing_twice",
    "tests/test_aws_provider.py::test_a_create_whose_key_holds_a_stopped_instance_launches_no_second_one",
    # 9.4 s (two regions): GCE's project quota; CI keeps test_aws_plans_within_the_vcpu_quota_service_quotas_reports
    "tests/test_cloud_quotas.py::test_gcp_plans_within_the_project_quota_gce_reports",
    # 7.7 s: random fleets under random quotas; CI keeps the quota rules' unit tests
    "tests/test_cloud_quotas.py::test_random_fleets_under_random_quotas_keep_every_rule",
    # 6.9 s: the exact optimum on fixed pools past the pattern slots; CI keeps the pattern tests beside it
    "tests/test_solve_families.py::test_fixed_pools_past_the_slots_counted_by_pattern_reach_the_exact_optimum_and_prove_it",
    # 6.2 s: a fleet of the catalog's 2026-11-29 types planned and applied; CI keeps the catalog's row checks
    "tests/test_catalog.py::test_a_fleet_of_types_the_catalog_learned_on_2026_11_29_validates_plans_and_applies_at_the_catalogs_prices",
    # 5.9 s / 4.2 s: a repaired answer's handoff, a part packed again; CI keeps the handed packing's and the group's tests
    "tests/test_plan_handoff.py::test_a_repaired_answer_takes_the_parts_its_repair_left_alone",
    "tests/test_plan_handoff.py::test_a_part_that_is_not_this_answers_is_packed_again",
    # 5.4 s / 3.8 s: bounds never below the model on random fleets; CI keeps test_bounds' fixed cases
    "tests/test_bounds.py::test_the_guaranteed_work_bound_is_never_below_what_the_model_reaches",
    "tests/test_bounds.py::test_the_tenants_rows_relaxation_is_never_below_what_the_model_reaches",
    # 5.0 s: alike empty instances packed by patterns; CI keeps the count-by-class test
    "tests/test_solver_core.py::test_alike_empty_instances_take_every_item_where_a_packing_by_patterns_exists",
    # 4.6 s: an AWS reclaimed replacement replaced again; CI keeps the sim's and GCP's
    "tests/test_create_keys.py::test_aws_reclaimed_replacement_is_replaced_again",
    # 5.3 s: AWS placement tags recovered without the state; CI keeps the sim's recovery tests in that file
    "tests/test_placement_tags.py::test_aws_records_placements_and_recovers_them_without_the_state",
    # 3.9 s: SIGKILL after 3 launches on moto; CI keeps the kill after 1
    "tests/test_crash_aws.py::test_sigkill_mid_apply_on_moto_then_rerun[3]",
    # 3.7 s / 4.6 s: the Azure Blob backend's garbled objects and lock race; CI keeps the GCS backend's (and S3's)
    "tests/test_cloud_backends.py::test_garbled_state_and_lock_objects_are_clear_errors[azblob]",
    "tests/test_cloud_backends.py::test_two_concurrent_applies_exactly_one_proceeds[azblob]",
}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """MEASURED_SLOW's tests carry the slow mark (before `-m 'not slow'` deselects)."""
    for item in items:
        if item.nodeid in MEASURED_SLOW or item.nodeid.split("[")[0] in MEASURED_SLOW:
            item.add_marker(pytest.mark.slow)


def pytest_unconfigure(config):
    """The run's bytecode directory goes with the run (only the process that made it removes it)."""
    if made := getattr(config, "_fleetops_pycache", None):
        import shutil

        shutil.rmtree(made, ignore_errors=True)


@pytest.fixture(autouse=True)
def _no_sim_agents(monkeypatch):
    """The sim starts one `reconcile agent` process per instance that runs something; tests that
    are not about the runtime plan and apply without them (tests/test_runtime_*.py turn them on)."""
    monkeypatch.setenv("FLEETOPS_SIM_AGENTS", "0")


@pytest.fixture(autouse=True)
def _shipped_catalog_after():
    """A test that plans a config pinning its own catalog.json (api.plan pins it for the process) leaves the shipped
    one pinned after it: the next test of the worker that reads load_catalog() directly saw bench.openb's test types."""
    yield
    from providers.catalog import pin_catalog

    pin_catalog(None)


@pytest.fixture
def aggregate_only(monkeypatch):
    """Every offer's new instances summed per dimension, as a large offer's are (no per-instance rows: solve/slots.py):
    for tests of what follows when a count does not pack (repairs, jobs dropped by the packer)."""
    from reconciler.solve import slots

    monkeypatch.setattr(slots, "per_instance", lambda o, bounds, need=None: False)


@pytest.fixture(scope="session")
def moto_server():
    """moto in server mode on 127.0.0.1 (a free port), for the whole session, behind EC2's
    ClientToken rules (tests/ec2_tokens.py): moto itself ignores the token; behind EC2's vCPU quotas with the
    Service Quotas API that reports them (tests/ec2_quotas.py): moto has neither; and behind EC2's limits on tag keys,
    tag values and ClientTokens (tests/ec2_params.py), which moto does not check."""
    import threading

    from moto.moto_server.threaded_moto_server import MotoRequestHandler
    from moto.server import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    from tests.aws_calls import ApiCalls
    from tests.ec2_params import ParameterRules
    from tests.ec2_quotas import Ec2Quotas
    from tests.ec2_tokens import ClientTokens

    quotas = Ec2Quotas(DomainDispatcherApplication(create_backend_app))
    tokens = ClientTokens(quotas)  # a replayed token is answered before any quota is counted, as EC2 does
    params = ParameterRules(tokens)  # a malformed request is refused before anything else looks at it
    calls = ApiCalls(params)  # every action sent, by its IAM name (tests/aws_calls.py)
    server = make_server("127.0.0.1", 0, calls, threaded=True, request_handler=MotoRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    host, port = server.server_address[:2]
    yield f"http://{host}:{port}", tokens, quotas, calls
    server.shutdown()
    thread.join()


@pytest.fixture(scope="session")
def moto_url(moto_server):
    return moto_server[0]


@pytest.fixture
def ec2_tokens(moto_server):
    """The ClientToken layer in front of moto: its counters (replays, mismatches) for assertions, and its lagging
    tag-filtered listings (lag_tag), reset after."""
    yield moto_server[1]
    moto_server[1].reset()


@pytest.fixture
def ec2_quotas(moto_server):
    """EC2's vCPU quotas and Service Quotas in front of moto (tests/ec2_quotas.py): limits set by the test, reset after."""
    yield moto_server[2]
    moto_server[2].reset()


@pytest.fixture
def aws_calls(moto_server):
    """The AWS actions (IAM names) sent to the session's moto server from now on (tests/aws_calls.py)."""
    moto_server[3].take()
    return moto_server[3]


@pytest.fixture
def aws_env(monkeypatch, moto_url):
    for k, v in AWS_ENV.items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(k, raising=False)
    return moto_url


ARM_RESOURCE_GROUP = "fleetops-gpu"  # the resource group examples/azure-only launches into
# The subscription and subnet examples/azure-only names: the fake ARM's, since a NIC joins only a subnet of its own
# subscription and location (the provider checks that at plan time, the fake at create time).
ARM_SUBSCRIPTION = "00000000-0000-0000-0000-000000000000"
ARM_SUBNET = (f"/subscriptions/{ARM_SUBSCRIPTION}/resourceGroups/fleetops-net/providers/Microsoft.Network/virtualNetworks/"
              "fleetops-vnet/subnets/gpu")


@pytest.fixture
def gce():
    """tests/gce_fake.py on 127.0.0.1 over HTTP, for one test."""
    from tests.gce_fake import GceFake

    fake = GceFake().start()
    yield fake
    fake.stop()


@pytest.fixture
def arm(tmp_path):
    """tests/arm_fake.py on 127.0.0.1 over HTTPS (a certificate made for this test), for one test."""
    from tests.arm_fake import ArmFake

    fake = ArmFake(tmp_path / "tls", subscription=ARM_SUBSCRIPTION, resource_groups=(ARM_RESOURCE_GROUP, "other-team")).start()
    assert fake.add_network("fleetops-vnet", resource_group="fleetops-net", location="eastus", subnets=("gpu",)) == [ARM_SUBNET]
    yield fake
    fake.stop()


def arm_options(arm, **extra: str) -> dict[str, str]:
    """Azure provider options pointing the real SDK at the ARM fake, with its test-only credential."""
    return {"endpoint": arm.base_url, "ca_bundle": arm.ca_path, "credential": "fake-for-tests",
            "subscription_id": arm.subscription, "resource_group": ARM_RESOURCE_GROUP, "polling_interval": "0.01", **extra}


@pytest.fixture(scope="session")
def gcs_emulator():
    """gcp-storage-emulator with GCS's generation preconditions (tests/gcs_emulator.py), for the session."""
    from tests.gcs_emulator import GcsEmulator

    emu = GcsEmulator().start()
    yield emu
    emu.stop()


@pytest.fixture(scope="session")
def azurite():
    """Azurite's blob service (tests/azurite.py), for the session; skips where Node.js is absent."""
    from tests.azurite import Azurite

    emu = Azurite()
    yield emu
    emu.stop()


@pytest.fixture
def hung_endpoint():
    """A server that accepts connections and never answers (a hung or overloaded store, a proxy blackholing it): the
    kernel completes the handshake; nothing ever reads the request. Yields its listening socket."""
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(8)
    try:
        yield hung
    finally:
        hung.close()
