"""Provider options (`-o KEY=VALUE`) are read one way by every cloud (providers/options.py): `<cloud>_<key>` wins over
`<key>`, and a value the option cannot take is a ProviderError naming the option and the value, never a Python
traceback nor a nonsense setting taken silently (an Azure parallelism of 0, a GCP one of 0.5, which int() made 0:
apply then ran one create at a time)."""

from __future__ import annotations

import math

import pytest

from providers.base import ProviderContext
from providers.errors import ProviderError
from providers.options import ProviderOptions


def test_the_clouds_own_key_wins_and_an_empty_value_is_no_value():
    o = ProviderOptions("gcp", {"endpoint": "https://arm", "gcp_endpoint": "http://gce", "project": "", "timeout": "5"})
    assert o.text("endpoint") == "http://gce" and o.text("project") is None and o.text("missing") is None
    assert ProviderOptions("azure", o.options).text("endpoint") == "https://arm"
    assert o.seconds("timeout", 60) == 5.0 and o.seconds("missing", 60) == 60 and o.seconds("project", 7) == 7


@pytest.mark.parametrize("raw, zero, ok", [("0", True, 0.0), ("0.001", False, 0.001), ("inf", True, math.inf), ("1e3", True, 1000.0),
                                           ("0", False, None), ("-1", True, None), ("nan", True, None), ("soon", True, None)])
def test_seconds_take_a_number_zero_only_where_it_means_something(raw, zero, ok):
    o = ProviderOptions("aws", {"wait": raw})
    if ok is not None:
        assert o.seconds("wait", 1, zero=zero) == ok
    else:
        with pytest.raises(ProviderError, match=rf"^aws: option wait={raw!r} must be a number of seconds, "):
            o.seconds("wait", 1, zero=zero)


@pytest.mark.parametrize("raw, least, ok", [("4", 1, 4), ("4.0", 1, 4), ("0", 0, 0), ("0", 1, None), ("2.5", 1, None),
                                            ("inf", 1, None), ("-3", 0, None), ("many", 1, None)])
def test_counts_are_whole_numbers(raw, least, ok):
    o = ProviderOptions("azure", {"n": raw})
    if ok is not None:
        assert o.count("n", 9, least=least) == ok and isinstance(o.count("n", 9, least=least), int)
    else:
        with pytest.raises(ProviderError, match=rf"^azure: option n={raw!r} must be a whole number, {least} or more$"):
            o.count("n", 9, least=least)


@pytest.mark.parametrize("raw, off", [("off", True), ("OFF", True), ("false", True), ("0", True), ("no", True), ("on", False), ("", False)])
def test_off_reads_the_usual_spellings(raw, off):
    assert ProviderOptions("gcp", {"live_spot": raw}).off("live_spot") is off


def _make(cloud: str, tmp_path, options: dict):
    if cloud == "aws":
        from providers.aws import AwsProvider as P
    elif cloud == "gcp":
        from providers.gcp import GcpProvider as P
        options = {"endpoint": "http://127.0.0.1:9", "project": "p", **options}  # no ADC lookup, no call at all
    else:
        from providers.azure import AzureProvider as P
    return P(ProviderContext(fleet="opts", state_dir=tmp_path, options=options))


@pytest.mark.parametrize("cloud, key, raw", [
    ("aws", "parallelism", "many"),       # before: "options parallelism and consistency_timeout must be numbers"
    ("aws", "parallelism", "0"),          # before: taken, and apply quietly ran 1 at a time
    ("aws", "consistency_timeout", "-5"),
    ("gcp", "parallelism", "0.5"),        # before: taken as 0 (so 1 at a time)
    ("gcp", "timeout", "0"),
    ("azure", "parallelism", "0"),        # before: taken (so 1 at a time)
    ("azure", "max_retries", "2.5"),      # before: taken as 2
    ("azure", "polling_interval", "soon"),
])
def test_a_bad_option_is_an_error_naming_it_and_its_value(cloud, key, raw, tmp_path):
    pytest.importorskip({"aws": "boto3", "gcp": "google.cloud.compute_v1", "azure": "azure.mgmt.compute"}[cloud])
    with pytest.raises(ProviderError, match=rf"^{cloud}: option {key}={raw!r} must be "):
        _make(cloud, tmp_path, {key: raw})


@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
def test_one_option_set_reaches_every_provider_and_each_takes_its_own(cloud, tmp_path):
    pytest.importorskip({"aws": "boto3", "gcp": "google.cloud.compute_v1", "azure": "azure.mgmt.compute"}[cloud])
    opts = {"parallelism": "7", "aws_parallelism": "3", "gcp_parallelism": "5", "azure_parallelism": "9"}
    assert _make(cloud, tmp_path, opts).parallelism == {"aws": 3, "gcp": 5, "azure": 9}[cloud]
    assert _make(cloud, tmp_path, {"parallelism": "7"}).parallelism == 7


def _qs(tmp_path):
    from tests.fleetkit import copy_quickstart

    return copy_quickstart(tmp_path / "cfg")


@pytest.mark.parametrize("provider, options, says", [
    # A typo fell through to the real https://ec2.us-east-1.amazonaws.com/; the known keys are named, the near one first.
    ("aws", {"endpont_url": "http://127.0.0.1:9"}, "no provider of this run takes 'endpont_url' (aws takes consistency_timeout, endpoint_url"),
    ("aws", {"endpont_url": "http://127.0.0.1:9"}, "did you mean 'endpoint_url'?"),
    ("aws", {"timeout": "soon"}, "no provider of this run takes 'timeout'"),  # GCP's option: taken silently by an AWS run
    ("aws", {"timeout": "-5"}, "no provider of this run takes 'timeout'"),
    ("aws", {"aws_timeout": "nan"}, "no provider of this run takes 'aws_timeout'"),
    ("sim", {"parallelism": "0"}, "no provider of this run takes 'parallelism' (sim takes none"),
    ("sim", {"gcp_timeout": "soon"}, "gcp: option timeout='soon' must be a number of seconds, more than 0"),
    ("aws", {"endpoint_url": "notaurl"}, "aws: option endpoint_url='notaurl' must be an http:// or https:// URL"),  # was "unexpected ValueError"
    ("gcp", {"endpoint": "127.0.0.1:9"}, "gcp: option endpoint='127.0.0.1:9' must be an http:// or https:// URL"),
    ("aws", {"live_spot": "of"}, "no provider of this run takes 'live_spot'"),
    ("gcp", {"live_spot": "of", "endpoint": "http://127.0.0.1:9"}, "gcp: option live_spot='of' must be on or off"),
])
def test_an_option_no_provider_of_the_run_takes_or_a_bad_value_is_refused_before_any_call(tmp_path, provider, options, says):
    from reconciler import api

    cfg = _qs(tmp_path)
    with pytest.raises(ProviderError) as e:
        api.plan(cfg, provider=provider, options=options, time_limit=1)
    assert says in str(e.value)
    assert not (cfg / ".reconcile" / "sim").exists()  # no provider was made, nothing was read


def test_another_clouds_own_option_is_taken_and_a_sim_run_still_plans(tmp_path):
    """One `-o` set may serve configs of several clouds: `gcp_project` in a sim run names GCP's option, no typo."""
    from reconciler import api

    assert api.plan(_qs(tmp_path), options={"gcp_project": "p", "azure_max_retries": "0"}, time_limit=1).plan.has_changes


def test_every_provider_declares_its_options_once_and_reads_only_those():
    """The options each built-in reads are the ones it declares (OPTIONS): none read without a declaration."""
    import re
    from pathlib import Path

    from providers.registry import declared_options

    root = Path(__file__).resolve().parent.parent / "providers"
    assert declared_options("sim") == {}
    for cloud in ("aws", "gcp", "azure"):
        read = set(re.findall(r"self\.options\.\w+\(\"(\w+)\"", (root / f"{cloud}.py").read_text()))
        assert read == set(declared_options(cloud)), cloud


def test_an_endpoints_query_string_never_reaches_the_error(tmp_path, monkeypatch):
    """A presigned-style endpoint was echoed whole in the connection error (`?X-Amz-Signature=...`)."""
    from reconciler import api
    from tests.conftest import AWS_ENV

    pytest.importorskip("boto3")
    for k, v in AWS_ENV.items():
        monkeypatch.setenv(k, v)
    aws = tmp_path / "aws"
    import shutil
    from pathlib import Path

    shutil.copytree(Path(__file__).resolve().parent.parent / "examples" / "aws-only", aws)
    with pytest.raises(ProviderError) as e:
        api.plan(aws, provider="aws", options={"endpoint_url": "http://127.0.0.1:9/?X-Amz-Signature=SECRETSIG&X-Amz-Credential=AKIA"})
    assert "SECRETSIG" not in str(e.value) and "AKIA" not in str(e.value)
    assert "http://127.0.0.1:9/?X-Amz-Signature=***&X-Amz-Credential=***" in str(e.value)


def test_redact_replaces_url_userinfo_and_the_secrets_of_query_strings():
    """A console link's ?project= stays (it is what the message is for); a signature, key or SAS sig goes."""
    from providers.redact import redact

    text = ('cannot reach "http://u:p@h:1/x?X-Amz-Signature=S&b=2" (https://h/p?key=K), raise it at '
            'https://console.cloud.google.com/iam-admin/quotas?project=p, s3://AKIA:SECRET@bucket/p or https://a.blob/c?sv=1&sig=abc%3D')
    assert redact(text) == ('cannot reach "http://***@h:1/x?X-Amz-Signature=***&b=2" (https://h/p?key=***), raise it at '
                            'https://console.cloud.google.com/iam-admin/quotas?project=p, s3://***@bucket/p or https://a.blob/c?sv=1&sig=***')



def test_redact_replaces_connection_string_keys_and_authorization_headers():
    """Secrets audit: redact knew URL shapes only; an Azure storage connection string's AccountKey= or
    SharedAccessSignature=, or an Authorization header an SDK error quotes, went through. The names stay."""
    from providers.redact import redact

    text = ("DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=c2VjcmV0+/a==;EndpointSuffix=core.windows.net and "
            "SharedAccessSignature=sv=2024&sig=abc; headers {'Authorization': 'Bearer eyJhbGciOi.x.y', 'x-ms-date': 'd'} "
            "Authorization: SharedKey acct:Zm9v")
    out = redact(text)
    assert out == ("DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=***;EndpointSuffix=core.windows.net and "
                   "SharedAccessSignature=***; headers {'Authorization': 'Bearer ***', 'x-ms-date': 'd'} "
                   "Authorization: SharedKey ***"), out


@pytest.mark.parametrize("endpoint, credential, refused", [
    ("https://example.invalid", None, True),  # a typo, or a hostile -o: the live token would go there
    ("https://management.azure.com.evil.example", None, True),
    ("https://management.azure.com", None, False),
    ("https://127.0.0.1:8443", "fake-for-tests", False),  # the local ARM fake, with its static test token
])
def test_a_real_azure_credential_is_never_sent_to_another_endpoint(endpoint, credential, refused):
    """The Azure SDK asks the credential for a token scoped to https://management.azure.com whatever base_url is: with
    `-o endpoint=` anything else and DefaultAzureCredential, a live management token went to that host (audit)."""
    from pathlib import Path

    from providers.azure import AzureProvider
    from providers.base import ProviderContext

    options = {"endpoint": endpoint, **({"credential": credential} if credential else {})}
    if refused:
        with pytest.raises(ProviderError, match="is not Azure Resource Manager .management.azure.com.: a real credential's token"):
            AzureProvider(ProviderContext("f", Path("/nonexistent"), options))
    else:
        AzureProvider(ProviderContext("f", Path("/nonexistent"), options))


def test_redact_masks_secret_looking_parameters_that_stand_in_no_url():
    """redact masked a query's secrets only after a URL scheme: `-o endpoint_url='notaurl?X-Amz-Signature=...'` echoed
    the signature in its error, as a bare sig=, token= or password= did. Their names stay; the harmless stay whole."""
    from providers.redact import redact

    text = ("option endpoint_url='notaurl?X-Amz-Signature=SIG1&X-Amz-Credential=AKIA1/x&b=2' bad; sv=2024&sig=SIG2 "
            "token=TOK1, password=PW1; db_password='PW2' X-Amz-Security-Token=TOK2 max_tokens=5 design=x key=value")
    out = redact(text)
    assert out == ("option endpoint_url='notaurl?X-Amz-Signature=***&X-Amz-Credential=***&b=2' bad; sv=2024&sig=*** "
                   "token=***, password=***; db_password='***' X-Amz-Security-Token=*** max_tokens=5 design=x key=value"), out


def test_a_secret_in_an_option_value_that_is_no_url_is_not_echoed(tmp_path):
    from reconciler import api

    with pytest.raises(ProviderError) as e:
        api.plan(_qs(tmp_path), provider="aws", options={"endpoint_url": "notaurl?X-Amz-Signature=SECRETSIG"}, time_limit=1)
    assert "SECRETSIG" not in str(e.value) and "X-Amz-Signature=***" in str(e.value), str(e.value)
