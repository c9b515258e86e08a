"""AWS EC2 through boto3.

Ownership is the `fleetops.io/fleet` tag: observe filters on it and delete
refuses anything without it. Creates are idempotent twice over: the ClientToken
is derived from the create key (EC2 returns the same instance for a retried
token), and an instance already carrying the key's tag is returned as is (some
EC2-compatible endpoints, moto among them, ignore ClientToken). EC2 remembers a
token for at least 24 h after its instance terminated and answers it with that
instance, terminated: apply then tries the next attempt's key (reconciler/apply.py).
A token reused with other parameters is IdempotentParameterMismatch, which only
says an earlier launch with it succeeded: the token's instance is looked up, and
a live one is the create's; the key is spent (KeySpentError) once it is terminated.

Each instance also carries the job replicas it hosts (providers/placements.py):
written with the launch's TagSpecifications, then kept current by
record_placements (CreateTags/DeleteTags on instances whose fleet tag is ours,
read first, as delete does), and read back by observe like any other tag.

boto3 is imported lazily. Credentials come from the standard AWS chain and are
never printed: errors carry only the AWS error code and message.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, ClassVar, Sequence

from providers.base import TAG_CREATE_KEY, TAG_FLEET, TAG_POOL, CreateRequest, Instance, Offering, PoolTarget, ProviderContext, Quota
from providers.catalog import load_catalog
from providers.offercache import DEFAULT_TTL_S, cached
from providers.livespot import DEFAULT_SPOT_TTL_S
from providers.placements import TAG_PLACEMENTS, PlacementRecord, is_placement_key, placement_tags
from providers.options import Option, ProviderOptions, count, seconds, text, url
from providers.errors import (AccessDeniedError, CapacityError, KeySpentError, OwnershipError, ProviderError, QuotaError,
                             TransientProviderError)

CAPACITY_CODES = {
    "InsufficientInstanceCapacity", "InsufficientCapacity", "InsufficientHostCapacity", "SpotMaxPriceTooLow", "Unsupported",
    "ReservationCapacityExceeded",  # a targeted capacity reservation is full
}
# Account limits, not a zone's capacity: a QuotaError naming the Service Quotas quota (by instance family and market).
QUOTA_CODES = {"VcpuLimitExceeded", "InstanceLimitExceeded", "MaxSpotInstanceCountExceeded"}
# EC2's vCPU quotas by the family letter(s) an instance type starts with: (on-demand quota, spot quota), Service Quotas codes.
VCPU_QUOTAS = {
    "p": (("L-417A185B", "Running On-Demand P instances"), ("L-7212CCBC", "All P Spot Instance Requests")),
    "g": (("L-DB2E81BA", "Running On-Demand G and VT instances"), ("L-3819A6DF", "All G and VT Spot Instance Requests")),
    "vt": (("L-DB2E81BA", "Running On-Demand G and VT instances"), ("L-3819A6DF", "All G and VT Spot Instance Requests")),
    "inf": (("L-1945791B", "Running On-Demand Inf instances"), ("L-B5D1601B", "All Inf Spot Instance Requests")),
    "trn": (("L-2C3B7624", "Running On-Demand Trn instances"), ("L-6B0D517C", "All Trn Spot Instance Requests")),
    "x": (("L-7295265B", "Running On-Demand X instances"), ("L-E3A00192", "All X Spot Instance Requests")),
    "f": (("L-74FC7D96", "Running On-Demand F instances"), ("L-88CF9481", "All F Spot Instance Requests")),
    "dl": (("L-6E869C2A", "Running On-Demand DL instances"), ("L-85EED4F7", "All DL Spot Instance Requests")),  # dl1, dl2q
    # HPC (hpc6a, hpc7g, ...) and High Memory (u-6tb1, u7i-12tb, ...) run On-Demand only: no Spot quota exists, so a
    # spot launch (which EC2 refuses) is named against the one there is. (Counted as Standard before, a plan read the
    # wrong quota's headroom and a refused launch named the wrong quota to raise.)
    "hpc": (("L-F7808C92", "Running On-Demand HPC instances"), ("L-F7808C92", "Running On-Demand HPC instances")),
    "u": (("L-43DA4232", "Running On-Demand High Memory instances"), ("L-43DA4232", "Running On-Demand High Memory instances")),
}
STANDARD_QUOTAS = (("L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances"),
                   ("L-34B43A08", "All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests"))
# IAM's refusals: EC2 answers UnauthorizedOperation, the JSON APIs (SSM, Service Quotas) AccessDeniedException.
DENIED_CODES = {"UnauthorizedOperation", "AccessDenied", "AccessDeniedException"}
_SERVICE_OF = {"GetParameter": "ssm", "GetServiceQuota": "servicequotas"}  # IAM's prefix of the calls not EC2's
# What a call needs besides its own action (README, Minimal IAM policy), named in its refusal: EC2 answers a refused
# launch "You are not authorized to perform this operation. Encoded authorization failure message: ...", naming none.
IMPLIED = {"RunInstances": "ec2:CreateTags for the tags it launches with, iam:PassRole for an instance profile",
           "CreatePlacementGroup": "ec2:CreateTags for the tag it is created with"}
TRANSIENT_CODES = {"RequestLimitExceeded", "Throttling", "ThrottlingException", "ServiceUnavailable", "InternalError", "Unavailable"}
DEFAULT_PARALLELISM = 100
# botocore's tries of one call, the first included: its standard-mode pauses before the 2nd..5th are random up to
# 1, 2, 4, 8 s, so a throttled call gives up within 15 s; the apply says so, and the next run tries again.
DEFAULT_MAX_ATTEMPTS = 5
FILTER_VALUES = 200  # values in one Describe call's filters (FilterLimitExceeded past them)
INSTANCE_TYPES_PER_CALL = 100  # DescribeInstanceTypes' InstanceTypes (EC2's API model: at most 100)
_EC2_ID = re.compile(r"i-[0-9a-f]{8,17}")
# EC2 keeps 90 days of spot price history; a row older than that is no price EC2 would give (moto's is from 2006).
SPOT_PRICE_MAX_AGE = timedelta(days=90)
SPOT_PRODUCTS = ("Linux/UNIX", "Linux/UNIX (Amazon VPC)")  # the spot prices asked for (EC2-Classic's and VPC's name)
STATES = {"pending": "pending", "running": "running", "stopping": "stopping", "stopped": "stopping",
          "shutting-down": "terminated", "terminated": "terminated"}


def client_token(key: str) -> str:
    """EC2 ClientTokens are at most 64 ASCII characters; keys are shorter, but be safe."""
    return key if len(key) <= 64 and key.isascii() else hashlib.sha256(key.encode()).hexdigest()[:64]


# GPU pools without aws.ami or aws.launch_template: the Deep Learning Base AMI (NVIDIA driver, CUDA, Docker and the
# NVIDIA Container Toolkit), found through its public SSM parameter, so the latest one is used in every region.
DEFAULT_GPU_AMI = "resolve:ssm:/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
SSM_PREFIX = "resolve:ssm:"


# botocore's loader of service models (EC2's is a JSON of megabytes), one for the process: every session reads the
# environment and the credentials afresh, but parses the models once. With a loader per session each provider paid
# for it again: 0.3-0.45 s an EC2 client against 0.04-0.06 s shared (2026-12-02, this 2-core machine), in every plan
# of a controller's loop and in every test against moto.
_LOADER: list = []


def aws_session():
    """A boto3 Session, or a ProviderError naming the AWS config or credentials file it could not read (a malformed
    ~/.aws/credentials was "unexpected ConfigParseError ... a bug in reconcile"; botocore's message names the file,
    never its contents) or the profile that is not there."""
    import boto3
    import botocore.session
    from botocore.exceptions import ConfigParseError, ProfileNotFound

    try:
        core = botocore.session.Session()
        if _LOADER:
            core.register_component("data_loader", _LOADER[0])
        session = boto3.session.Session(botocore_session=core)
        loader = core.get_component("data_loader")
        loader.search_paths[:] = list(dict.fromkeys(loader.search_paths))  # (boto3 appends its own path per session)
        _LOADER[:] = [loader]
        session.available_profiles  # noqa: B018 - reads the files now (lazily otherwise: at the first client, deep in a plan)
    except (ConfigParseError, ProfileNotFound) as e:
        raise ProviderError(f"aws: {e}: fix that file (or AWS_PROFILE), or point AWS_CONFIG_FILE / "
                            "AWS_SHARED_CREDENTIALS_FILE at readable ones") from None
    return session


class AwsProvider:
    name = "aws"
    placement_groups: ClassVar[bool] = True  # launches into a gang's group and reports it (base.keeps_placement_groups)
    # The `-o` options it takes (README, AWS), each checked when the provider is made.
    OPTIONS: ClassVar[dict[str, Option]] = {
        "endpoint_url": url(), "regions": text(), "parallelism": count(DEFAULT_PARALLELISM),
        "consistency_timeout": seconds(120), "placement_group_wait": seconds(180),
        "offerings_ttl": seconds(DEFAULT_TTL_S), "spot_price_ttl": seconds(DEFAULT_SPOT_TTL_S), "quotas_ttl": seconds(DEFAULT_TTL_S),
        "max_attempts": count(DEFAULT_MAX_ATTEMPTS),
    }

    def __init__(self, ctx: ProviderContext):
        from botocore.config import Config

        self.ctx = ctx
        self.options = ProviderOptions("aws", ctx.options, self.OPTIONS)
        self.endpoint = self.options.url("endpoint_url")
        self.session = aws_session()
        # One retry policy per call, botocore's, bounded: standard mode (exponential backoff with jitter, up to 20 s a
        # pause), `max_attempts` tries in all. An error it gave up on is marked retried, and apply does not retry it
        # again (before, adaptive mode's 9 tries ran inside apply's 4: 36 RunInstances a create under throttling).
        self.max_attempts = self.options.count("max_attempts")
        self.config = Config(retries={"mode": "standard", "total_max_attempts": self.max_attempts},
                             user_agent_extra="fleetops-reconciler")
        self.catalog = load_catalog()
        self._clients: dict[str, Any] = {}
        self._clients_lock = threading.Lock()
        # Creates (or deletes) apply runs at once in one region (reconciler/apply.py). EC2 throttles with
        # RequestLimitExceeded, which botocore retries (standard mode, max_attempts tries).
        self.parallelism = self.options.count("parallelism")
        # consistency_timeout: how long a just-launched instance may stay invisible to DescribeInstances.
        self.consistency_timeout = self.options.seconds("consistency_timeout")

    # -- plumbing ------------------------------------------------------------------
    def ec2(self, region: str):
        with self._clients_lock:  # apply calls in from worker threads; a boto3 Session is not thread-safe (clients are)
            if region not in self._clients:
                client = self.session.client("ec2", region_name=region, endpoint_url=self.endpoint, config=self.config)
                client.meta.events.register("needs-retry.ec2.RunInstances", _refusal_is_final)
                self._clients[region] = client
            return self._clients[region]

    def _image(self, settings: dict, instance_type: str) -> str | None:
        """What a pool's instance boots: aws.ami; else its launch template's image; else, for GPU types, a driver AMI."""
        if settings.get("ami") or settings.get("launch_template"):
            return settings.get("ami") or None
        shape = self.catalog.shape("aws", instance_type)
        return DEFAULT_GPU_AMI if shape is not None and shape.gpus else None

    def _ami(self, region: str, image: str) -> str:
        """An AMI id: `image` itself, or the value of the SSM parameter `resolve:ssm:NAME` names (as EC2 resolves it;
        resolved here so the plan-time check and the launch use the same AMI). Once per run and region."""
        if not image.startswith(SSM_PREFIX):
            return image
        cache = self.__dict__.setdefault("_amis", {})
        if (region, image) not in cache:
            with self._clients_lock:
                ssm = self.session.client("ssm", region_name=region, endpoint_url=self.endpoint, config=self.config)
            name = image[len(SSM_PREFIX):]
            try:
                cache[(region, image)] = self._call(f"get SSM parameter {name} in {region}",
                                                    lambda: ssm.get_parameter(Name=name))["Parameter"]["Value"]
            except ProviderError as e:
                if "ParameterNotFound" not in str(e):
                    raise
                raise ProviderError(f"{e}; set aws.ami to an AMI id, or to resolve:ssm:NAME of a parameter that exists") from None
        return cache[(region, image)]

    def _check_images(self, pool: PoolTarget) -> None:
        """Plan time: the AMI each of the pool's types boots exists in its region and this account may launch it
        (DescribeImages), so a mistyped, deregistered or other-region AMI is an error naming the pool before anything
        is launched, not a failed launch in the middle of an apply."""
        seen = self.__dict__.setdefault("_images_seen", set())
        for image in sorted({i for t in pool.instance_types if (i := self._image(dict(pool.settings), t))}):
            if (pool.region, image) in seen:
                continue
            try:
                ami = self._ami(pool.region, image)
            except ProviderError as e:
                raise type(e)(f"aws: pool {pool.name}: {e}") from None
            ec2 = self.ec2(pool.region)
            try:
                found = self._call(f"describe image {ami} in {pool.region}", lambda: ec2.describe_images(ImageIds=[ami]))["Images"]
            except ProviderError as e:
                if "InvalidAMIID" not in str(e):
                    raise
                found = []
            if not found:
                shown = ami if ami == image else f"{ami} ({image})"
                raise ProviderError(f"aws: pool {pool.name}: image {shown} does not exist in {pool.region} (or this account "
                                    "may not launch it); set aws.ami to one that does (GPU types default to the Deep "
                                    "Learning Base AMI's SSM parameter)")
            seen.add((pool.region, image))

    def _check_network(self, pool: PoolTarget) -> None:
        """Plan time: the pool's subnets exist, each in the zone it is given for, and its security groups exist in the
        subnets' VPC (DescribeSubnets, DescribeSecurityGroups), so a mistyped id, a subnet mapped to the wrong zone or
        a group of another VPC is an error naming the pool before anything is launched (RunInstances would refuse
        each launch with InvalidSubnetID.NotFound, InvalidGroup.NotFound or a zone/VPC mismatch)."""
        s = dict(pool.settings)
        subnets: dict[str, str] = {z: sid for z, sid in (s.get("subnets") or {}).items() if sid}
        groups = list(s.get("security_groups") or [])
        key = (pool.region, tuple(sorted(subnets.items())), tuple(sorted(groups)))
        seen = self.__dict__.setdefault("_networks_seen", set())
        if (not subnets and not groups) or key in seen:
            return
        ec2 = self.ec2(pool.region)

        def described(what: str, call, ids: list[str], field: str, id_field: str, missing_code: str) -> dict[str, dict]:
            try:
                found = self._call(f"describe {what} in {pool.region}", lambda: call(**{field: ids}))
            except ProviderError as e:
                if missing_code not in str(e):
                    raise
                raise ProviderError(f"aws: pool {pool.name}: {what} {', '.join(ids)}: {e}; set aws.{what.replace(' ', '_')} "
                                    f"to ids that exist in {pool.region}") from None
            return {x[id_field]: x for x in found[what.title().replace(' ', '')]}

        vpcs = set()
        if subnets:
            got = described("subnets", ec2.describe_subnets, sorted(set(subnets.values())), "SubnetIds", "SubnetId",
                            "InvalidSubnetID.NotFound")
            for zone, sid in sorted(subnets.items()):
                if sid not in got:
                    raise ProviderError(f"aws: pool {pool.name}: subnet {sid} (for {zone}) does not exist in {pool.region}")
                if got[sid].get("AvailabilityZone") != zone:
                    raise ProviderError(f"aws: pool {pool.name}: subnet {sid} is in {got[sid].get('AvailabilityZone')}, not "
                                        f"{zone}; aws.subnets maps each zone to a subnet of that zone")
                vpcs.add(got[sid].get("VpcId"))
        if groups:
            got = described("security groups", ec2.describe_security_groups, sorted(set(groups)), "GroupIds", "GroupId",
                            "InvalidGroup.NotFound")
            for g in groups:
                if g not in got:
                    raise ProviderError(f"aws: pool {pool.name}: security group {g} does not exist in {pool.region}")
                if vpcs and got[g].get("VpcId") not in vpcs:
                    raise ProviderError(f"aws: pool {pool.name}: security group {g} is in {got[g].get('VpcId')}, not the "
                                        f"subnets' VPC ({', '.join(sorted(v for v in vpcs if v))})")
        seen.add(key)

    def _call(self, what: str, fn, *, cloud_zone: tuple[str, str, str] | None = None, **kw):
        """One EC2 call with our error mapping. botocore already retried throttling and 5xx answers (and connection
        errors): such an error is TransientProviderError(retried=True), which apply does not retry again."""
        from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError
        from botocore.exceptions import ConnectionError as BotoConnectionError
        from botocore.parsers import ResponseParserError

        try:
            return fn(**kw)
        except ClientError as e:
            err = e.response.get("Error", {})
            code, msg = err.get("Code", "Unknown"), err.get("Message", "")
            text = f"aws: {what}: {code}: {msg}"
            if code in QUOTA_CODES and cloud_zone is not None:
                raise quota_error(text, self.region_of(cloud_zone[0]), cloud_zone[1], cloud_zone[2]) from None
            if code in CAPACITY_CODES and cloud_zone is not None:
                zone, itype, market = cloud_zone
                raise CapacityError(text, cloud="aws", zone=zone, instance_type=itype, market=market) from None
            if code in TRANSIENT_CODES:
                meta = e.response.get("ResponseMetadata", {})
                retried = bool(meta.get("MaxAttemptsReached") or meta.get("RetryAttempts"))
                tries = f" (after {int(meta.get('RetryAttempts') or 0) + 1} tries)" if retried else ""
                raise TransientProviderError(text + tries, retried=retried) from None
            if code in DENIED_CODES:
                raise denied_error(what, e.operation_name, code, msg) from None
            if code == "IdempotentParameterMismatch":  # the ClientToken launched with other parameters: create() looks
                raise KeySpentError(text) from None   # its instance up, live or spent
            raise ProviderError(text) from None
        except ResponseParserError:  # an answer botocore cannot read (an HTML 500 page from a proxy): no ResponseParserError
            # is a BotoCoreError, so it went up as a traceback; its text quotes the whole body
            raise TransientProviderError(f"aws: {what}: the endpoint's answer could not be read (not EC2's XML)") from None
        except BotoCoreError as e:  # connection errors, timeouts (botocore retried those), missing credentials
            raise TransientProviderError(f"aws: {what}: {type(e).__name__}: {e}",
                                         retried=isinstance(e, (BotoConnectionError, HTTPClientError))) from None

    @staticmethod
    def region_of(zone: str) -> str:
        return zone[:-1] if zone[-1:].isalpha() else zone

    def _regions(self, pools: Sequence[PoolTarget]) -> list[str]:
        extra = [r for r in (self.options.text("regions") or "").split(",") if r]
        return sorted({p.region for p in pools} | set(extra))

    # -- observe -------------------------------------------------------------------
    def _to_instance(self, region: str, d: dict) -> Instance:
        tags = {t["Key"]: t["Value"] for t in d.get("Tags", [])}
        return Instance(
            id=d["InstanceId"], provider=self.name, cloud="aws", region=region, zone=d["Placement"]["AvailabilityZone"],
            instance_type=d["InstanceType"], market="spot" if d.get("InstanceLifecycle") == "spot" else "on-demand",
            state=STATES.get(d["State"]["Name"], "terminated"), pool=tags.get(TAG_POOL, ""), tags=tags,
            placement_group=d.get("Placement", {}).get("GroupName", ""),
            launched_at=d["LaunchTime"].isoformat() if hasattr(d.get("LaunchTime"), "isoformat") else str(d.get("LaunchTime", "")),
        )

    def _describe(self, region: str, filters: list[dict]) -> list[Instance]:
        pages = self.ec2(region).get_paginator("describe_instances").paginate(Filters=filters, PaginationConfig={"PageSize": 100})
        out = []
        for page in self._call("describe_instances", lambda: list(pages)):
            for res in page["Reservations"]:
                out.extend(self._to_instance(region, d) for d in res["Instances"])
        return out

    def observe(self, pools: Sequence[PoolTarget]) -> list[Instance]:
        """The fleet's instances, stopping and stopped ones too (state `stopping`: their EBS volumes are still billed):
        not counted as capacity, left alone and noted (reconciler/observe.py). Left out, one vanished unreported."""
        found: list[Instance] = []
        for region in self._regions(pools):
            found += self._describe(region, [
                {"Name": f"tag:{TAG_FLEET}", "Values": [self.ctx.fleet]},
                {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]},
            ])
        return [i for i in found if i.tags.get(TAG_FLEET) == self.ctx.fleet]

    def find(self, ids: Sequence[str], pools: Sequence[PoolTarget]) -> list[Instance]:
        """The instances of `ids` (EC2 ids) observe's tag-filtered listing left out (base.InstanceFinder), asked by
        instance id in every region it looks in: a listing may not show an instance launched a moment ago yet
        ("Eventual consistency in the Amazon EC2 API"). Ours and not terminated only, as observe reports them."""
        wanted = sorted({i for i in ids if _EC2_ID.fullmatch(i)})
        found: list[Instance] = []
        for region in self._regions(pools) if wanted else ():
            for n in range(0, len(wanted), FILTER_VALUES):
                found += self._describe(region, [{"Name": "instance-id", "Values": wanted[n:n + FILTER_VALUES]}])
        return [i for i in found if i.tags.get(TAG_FLEET) == self.ctx.fleet and i.state != "terminated"]

    # -- offerings -----------------------------------------------------------------
    def offerings(self, pools: Sequence[PoolTarget]) -> list[Offering]:
        out: list[Offering] = []
        by_region: dict[str, list[PoolTarget]] = {}
        for p in pools:
            by_region.setdefault(p.region, []).append(p)
        for region, rpools in sorted(by_region.items()):
            for p in rpools:
                self._check_images(p)
                self._check_network(p)
            types = sorted({t for p in rpools for t in p.instance_types})
            ec2 = self.ec2(region)
            offered = self._zone_offers(ec2, region, types)
            spot, read_at = self._spot_prices(ec2, region, types)
            for p in rpools:
                for z in p.zones:
                    for t in p.instance_types:
                        # The catalog's offering, shape and NVLink domain included: a type it does not price here
                        # the solver cannot weigh.
                        cat = self.catalog.offering("aws", region, z, t) if (t, z) in offered else None
                        if cat is None:
                            continue
                        if (t, z) in spot:
                            cat = replace(cat, spot_price=spot[(t, z)], prices_as_of="", price_source=(
                                f"{cat.price_source} ({cat.prices_as_of}); spot: live EC2 DescribeSpotPriceHistory, read {read_at}"))
                        out.append(cat)
        return out

    def _zone_offers(self, ec2, region: str, types: list[str]) -> set[tuple[str, str]]:
        """{(type, zone)} the region's zones offer (DescribeInstanceTypeOfferings by availability zone), cached
        `offerings_ttl` seconds (default an hour) in .reconcile/cache/ like GCP's and Azure's: what a zone offers
        changes on the scale of weeks."""
        def read() -> list[list[str]]:
            out: list[list[str]] = []
            for n in range(0, len(types), FILTER_VALUES):
                pager = ec2.get_paginator("describe_instance_type_offerings").paginate(
                    LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": types[n:n + FILTER_VALUES]}])
                for page in self._call("describe_instance_type_offerings", lambda p=pager: list(p)):
                    out += [[o["InstanceType"], o["Location"]] for o in page["InstanceTypeOfferings"]]
            return out

        ttl = self.options.seconds("offerings_ttl")
        key = f"aws-offers-{region}-" + hashlib.sha256("\n".join(types).encode()).hexdigest()[:16]
        return {(t, z) for t, z in cached(self.ctx.state_dir, key, ttl, read)}

    def _described_vcpus(self, ec2, types: list[str]) -> dict[str, float]:
        """Default vCPUs of types from DescribeInstanceTypes, INSTANCE_TYPES_PER_CALL types a call. A type EC2 does not
        describe fails its whole call (InvalidInstanceType): that call's types are asked again in halves, so only such
        a type is left out."""
        from botocore.exceptions import ClientError

        def described(chunk: list[str]) -> list[dict] | None:
            try:
                return [d for page in ec2.get_paginator("describe_instance_types").paginate(InstanceTypes=chunk)
                        for d in page["InstanceTypes"]]
            except ClientError as e:
                if e.response.get("Error", {}).get("Code") == "InvalidInstanceType":
                    return None
                raise

        out: dict[str, float] = {}
        asks = [types[n:n + INSTANCE_TYPES_PER_CALL] for n in range(0, len(types), INSTANCE_TYPES_PER_CALL)]
        while asks:
            chunk = asks.pop()
            found = self._call("describe_instance_types", described, chunk=chunk)
            if found is None:
                asks += [chunk[:len(chunk) // 2], chunk[len(chunk) // 2:]] if len(chunk) > 1 else []
                continue
            out.update({d["InstanceType"]: float(d["VCpuInfo"]["DefaultVCpus"]) for d in found})
        return out

    def _spot_prices(self, ec2, region: str, types: list[str]) -> tuple[dict[tuple[str, str], float], str]:
        """({(type, zone): today's spot price}, when read), cached `spot_price_ttl` seconds (default 3600,
        providers/livespot.py) so a controller planning every minute does not page the history every minute.
        Types or zones without a row keep the catalog's price."""
        from providers.livespot import read_spot

        def fetch() -> dict[str, dict[str, float]]:
            got = self._call("describe_spot_price_history", lambda: latest_spot_prices(ec2, types, datetime.now(timezone.utc)))
            by_zone: dict[str, dict[str, float]] = {}
            for (t, z), price in got.items():
                by_zone.setdefault(z, {})[t] = price
            return by_zone

        ttl = self.options.seconds("spot_price_ttl")
        by_zone, read_at = read_spot(self.ctx.state_dir, "aws", [self.endpoint or "", region, *types], ttl, fetch)
        return {(t, z): p for z, prices in by_zone.items() for t, p in prices.items()}, read_at

    # -- quotas --------------------------------------------------------------------
    def quotas(self, pools: Sequence[PoolTarget]) -> list[Quota]:
        """The vCPU quotas the pools' types count against, per region and market: the applied value from Service
        Quotas (GetServiceQuota, cached `quotas_ttl` seconds, default an hour: limits change when someone raises
        them), and the usage counted live from DescribeInstances over the whole account (every pending or running
        instance of the quota's families and market, whoever launched it), which is how EC2 counts it."""
        by_region: dict[str, set[str]] = {}
        for p in pools:
            by_region.setdefault(p.region, set()).update(p.instance_types)
        ttl = self.options.seconds("quotas_ttl")
        out: list[Quota] = []
        for region, types in sorted(by_region.items()):
            ec2 = self.ec2(region)
            counts: dict[str, set[tuple[str, str, float]]] = {}
            shapes = self._vcpus(ec2, sorted(types))
            for t in sorted(types):
                for market in ("on-demand", "spot"):
                    if shapes.get(t):
                        counts.setdefault(vcpu_quota(t, market)[0], set()).add((t, market, shapes[t]))
            if not counts:
                continue
            limits = cached(self.ctx.state_dir, f"aws-quotas-{region}-" + hashlib.sha256(",".join(sorted(counts)).encode()).hexdigest()[:12],
                            ttl, lambda: self._limits(region, sorted(counts)))
            used = self._vcpu_usage(ec2, set(counts))
            for code in sorted(counts):
                name = _quota_name(code)
                out.append(Quota(cloud="aws", region=region, name=f"{name} ({code})", unit="vCPUs", limit=float(limits[code]),
                                 used=float(used.get(code, 0)), counts=tuple(sorted(counts[code])),
                                 how_to_raise=how_to_raise(code, region)))
        return out

    def _limits(self, region: str, codes: list[str]) -> dict[str, float]:
        with self._clients_lock:
            sq = self.session.client("service-quotas", region_name=region, endpoint_url=self.endpoint, config=self.config)
        return {code: float(self._call(f"get service quota ec2/{code} in {region}", lambda c=code: sq.get_service_quota(
            ServiceCode="ec2", QuotaCode=c))["Quota"]["Value"]) for code in codes}

    def _vcpus(self, ec2, types: list[str]) -> dict[str, float]:
        """Default vCPUs per type: the catalog's, else DescribeInstanceTypes'."""
        out = {t: s.cpu for t in types if (s := self.catalog.shape("aws", t)) is not None}
        missing = [t for t in types if t not in out]
        if missing:
            out.update(self._described_vcpus(ec2, missing))
        return out

    def _vcpu_usage(self, ec2, codes: set[str]) -> dict[str, float]:
        """vCPUs of every pending or running instance in the region (the whole account's), by the quota it counts in."""
        pages = self._call("describe_instances (quota usage)", lambda: list(ec2.get_paginator("describe_instances").paginate(
            Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}], PaginationConfig={"PageSize": 1000})))
        seen = [(d["InstanceType"], "spot" if d.get("InstanceLifecycle") == "spot" else "on-demand")
                for page in pages for r in page["Reservations"] for d in r["Instances"]]
        vcpus = self._vcpus(ec2, sorted({t for t, market in seen if vcpu_quota(t, market)[0] in codes}))
        used: dict[str, float] = {}
        for t, market in seen:
            code = vcpu_quota(t, market)[0]
            if code in codes:
                if t not in vcpus:
                    raise ProviderError(f"aws: the vCPUs of {t} (running in this account) are unknown: quota usage cannot be counted")
                used[code] = used.get(code, 0.0) + vcpus[t]
        return used

    # -- apply-time permission check -------------------------------------------------
    def preflight(self, creates: Sequence[CreateRequest], deletes: Sequence[Instance], instances: Sequence[Instance],
                  retag: Sequence[Instance] = ()) -> None:
        """Apply time, before anything is created (base.Preflight): EC2's dry runs (DryRun=True: DryRunOperation if the
        call would be allowed, UnauthorizedOperation if not; nothing is done) of every write the apply may send in each
        region it changes: a launch of each pool and market as it will be sent (its tags and instance profile too), a
        placement group as a gang creates it, the terminate of the instances the plan deletes (else of one of the
        fleet's: a failed gang is rolled back, and a later plan deletes what this one launches), and the placement tags'
        writes: CreateTags on an instance the apply retags (else on one it keeps), and DeleteTags of a chunk key on a
        retagged instance whose list spans several tags (a shorter list deletes the chunks it no longer needs:
        record_placements). A plan that only moves or stops jobs still retags, so is checked too.
        Without one of them an apply launched and then could not tag or delete: a replacement ran beside the instance it
        replaced, or a shrunk placement list failed half-written. An AccessDeniedError names every action missing.
        A region where the fleet has no instance yet cannot dry-run a terminate: EC2 authorises it against the
        instance's ARN and tags (the policy's condition reads its fleet tag), so it needs one of the fleet's; an id of
        no instance proves nothing (README, AWS: the first apply in a region). The placement groups' DeletePlacementGroup
        (clean_up, after the apply) is not asked: a refusal there leaves an empty group, retried by the next apply.
        Not at plan time: plans run with read-only credentials."""
        missing: dict[str, str] = {}  # action -> what was refused
        launching = {r.pool.region for r in creates}
        changing = launching | {i.region for i in deletes}
        for region in sorted(changing | {i.region for i in retag}):
            ec2 = self.ec2(region)
            if not self._honours_dry_run(ec2, region):
                continue
            for request in _one_per_launch([r for r in creates if r.pool.region == region]):
                self._dry_run_launch(ec2, request, missing)
            group = next((r for r in creates if r.pool.region == region and r.placement_group), None)
            if group is not None:
                self._dry_run(missing, "ec2:CreatePlacementGroup", f"create placement group in {region}",
                              ec2.create_placement_group, GroupName=group.placement_group, Strategy="cluster",
                              TagSpecifications=[{"ResourceType": "placement-group",
                                                  "Tags": [{"Key": TAG_FLEET, "Value": self.ctx.fleet}]}])
            leaving = {i.id for i in deletes}
            ours = sorted(i.id for i in instances if i.region == region and i.tags.get(TAG_FLEET) == self.ctx.fleet)
            if region in changing:
                gone = sorted(i.id for i in deletes if i.region == region) or ours[:1]
                for n in range(0, len(gone), FILTER_VALUES):
                    self._dry_run(missing, "ec2:TerminateInstances", f"terminate {', '.join(gone[n:n + 3])} in {region}",
                                  ec2.terminate_instances, InstanceIds=gone[n:n + FILTER_VALUES])
            rewritten = sorted((i for i in retag if i.region == region and i.id not in leaving), key=lambda i: i.id)
            kept = [i.id for i in rewritten][:1] or ([i for i in ours if i not in leaving][:1] if region in changing else [])
            if kept:
                self._dry_run(missing, "ec2:CreateTags", f"tag {kept[0]}'s placements", ec2.create_tags, Resources=kept,
                              Tags=[{"Key": TAG_PLACEMENTS, "Value": ""}])
            chunked = [(i.id, k) for i in rewritten for k in sorted(i.tags) if _chunk_beyond_first(k)][:1]
            if chunked:
                (iid, key), = chunked
                self._dry_run(missing, "ec2:DeleteTags", f"delete {iid}'s placement tag {key} (a shorter list)",
                              ec2.delete_tags, Resources=[iid], Tags=[{"Key": key}])
        if missing:
            raise AccessDeniedError(
                "aws: the credentials may not " + ", ".join(missing) + ", which this apply needs (EC2's dry runs: "
                + "; ".join(f"{a}: {why}" for a, why in missing.items()) + "); allow them (README, AWS: Minimal IAM policy) "
                "and apply again", actions=tuple(missing))

    def _honours_dry_run(self, ec2, region: str) -> bool:
        """The endpoint answers DryRun as EC2 does, asked with a read: one that ignored it would carry the dry-run writes
        out. (Real EC2 does; an EC2-compatible endpoint may not: its writes are then not dry-run.)"""
        try:
            self._call(f"describe_instances (dry run) in {region}", ec2.describe_instances, DryRun=True, MaxResults=5)
        except (AccessDeniedError, TransientProviderError):
            raise
        except ProviderError as e:
            return "DryRunOperation" in str(e)
        return False

    def _dry_run_launch(self, ec2, request: CreateRequest, missing: dict[str, str]) -> None:
        """A launch as create() sends it, dry-run; refused, asked again without its tags and instance profile, so the
        action missing is named (EC2's refusal of a launch names none)."""
        params = {k: v for k, v in self._run_params(request).items() if k != "ClientToken"}
        what = f"launch {request.market} {request.instance_type} in {request.zone} (pool {request.pool.name})"
        if self._dry_run({}, "", what, ec2.run_instances, **params) is None:
            return
        bare = {k: v for k, v in params.items() if k not in ("TagSpecifications", "IamInstanceProfile")}
        if self._dry_run(missing, "ec2:RunInstances", what, ec2.run_instances, **bare) is not None:
            return
        if "IamInstanceProfile" in params and self._dry_run(
                missing, "iam:PassRole", f"{what} with instance profile {request.pool.settings.get('iam_instance_profile')}",
                ec2.run_instances, **{**bare, "IamInstanceProfile": params["IamInstanceProfile"]}) is not None:
            return
        if self._dry_run(missing, "ec2:CreateTags", f"{what} with its tags (tag on create)", ec2.run_instances,
                         **{**bare, "TagSpecifications": params["TagSpecifications"]}) is None:
            missing.setdefault("ec2:RunInstances", f"{what} with its tags and instance profile together")  # (each alone passed)

    def _dry_run(self, missing: dict[str, str], action: str, what: str, fn, **kw) -> str | None:
        """Dry-run one call: None if EC2 would allow it, else its refusal (recorded in `missing` under `action`). Any
        other answer (an unknown AMI, a bad parameter) is the real call's to report, as it would without this."""
        try:
            self._call(f"{what} (dry run)", fn, DryRun=True, **kw)
        except AccessDeniedError as e:
            missing.setdefault(action, what)
            return str(e)
        except ProviderError:
            return None
        return None

    # -- create / delete -----------------------------------------------------------
    def create(self, request: CreateRequest) -> Instance:
        p = request.pool
        ec2 = self.ec2(p.region)
        existing = [i for i in self._describe(p.region, [{"Name": f"tag:{TAG_CREATE_KEY}", "Values": [request.key]}])
                    if i.state != "terminated" and i.tags.get(TAG_FLEET) == self.ctx.fleet]
        if existing:
            return existing[0]
        params = self._run_params(request)
        if request.placement_group:
            self._placement_group(ec2, request.placement_group, p.region)
            params["Placement"]["GroupName"] = request.placement_group
        sent_before = self._token_sent(p.region, params["ClientToken"])
        try:
            resp = self._call(f"run_instances {request.instance_type} in {request.zone}", ec2.run_instances,
                              cloud_zone=(request.zone, request.instance_type, request.market), **params)
        except KeySpentError as e:
            return self._launched_with(p.region, params["ClientToken"], request.key, str(e), sent_before)
        return self._to_instance(p.region, resp["Instances"][0])

    def _run_params(self, request: CreateRequest) -> dict[str, Any]:
        """RunInstances' parameters for a create, its placement group aside (created first: create())."""
        p = request.pool
        placed = placement_tags(request.placements) if request.placements is not None else {}
        s = dict(p.settings)
        params: dict[str, Any] = {
            "InstanceType": request.instance_type, "MinCount": 1, "MaxCount": 1, "ClientToken": client_token(request.key),
            "Placement": {"AvailabilityZone": request.zone},
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": _tag_list({**request.tags, **placed})},
                {"ResourceType": "volume", "Tags": _tag_list(request.tags)},
            ],
        }
        if s.get("launch_template"):
            lt = s["launch_template"]
            params["LaunchTemplate"] = {"LaunchTemplateId": lt} if lt.startswith("lt-") else {"LaunchTemplateName": lt}
        image = self._image(s, request.instance_type)
        if image:
            params["ImageId"] = self._ami(p.region, image)
        if "ImageId" not in params and "LaunchTemplate" not in params:
            raise ProviderError(f"aws: pool {p.name} needs aws.ami or aws.launch_template to launch instances of "
                                f"{request.instance_type} (GPU types default to the Deep Learning Base AMI)")
        if s.get("subnets", {}).get(request.zone):
            params["SubnetId"] = s["subnets"][request.zone]
        if s.get("security_groups"):
            params["SecurityGroupIds"] = list(s["security_groups"])
        if s.get("key_name"):
            params["KeyName"] = s["key_name"]
        if s.get("iam_instance_profile"):
            prof = s["iam_instance_profile"]
            params["IamInstanceProfile"] = {"Arn": prof} if prof.startswith("arn:") else {"Name": prof}
        if request.agent_state_url:  # cloud-init runs it at first boot: it installs and starts the node agent
            from providers.bootstrap import bootstrap_script

            params["UserData"] = bootstrap_script("aws", request.agent_state_url, None, mig=request.pool.mig)
        if request.capacity_reservation:  # a targeted launch: only into this reservation, or it fails
            params["CapacityReservationSpecification"] = {"CapacityReservationTarget": {"CapacityReservationId": request.capacity_reservation}}
        if request.market == "spot":
            opts: dict[str, Any] = {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}
            if request.max_price is not None:
                opts["MaxPrice"] = f"{request.max_price:.4f}"
            params["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": opts}
        return params

    def _token_sent(self, region: str, token: str) -> float | None:
        """When this state's last RunInstances with `token` was sent (time.time()), or None; and it is now. A file per
        token under .reconcile/cache/aws-client-tokens/, its mtime the time: written before every send, so whatever
        instance the token launched from here was launched by then. Unreadable or unwritable: None (no record)."""
        path = Path(self.ctx.state_dir) / "cache" / "aws-client-tokens" / (
            f"{region}-" + hashlib.sha256(token.encode()).hexdigest()[:32])
        try:
            before: float | None = path.stat().st_mtime
        except OSError:
            before = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()  # (an existing file's mtime set to now)
        except OSError:
            return None
        return before

    def _launched_with(self, region: str, token: str, key: str, error: str, sent_before: float | None = None) -> Instance:
        """After IdempotentParameterMismatch: EC2 says an earlier RunInstances with this token succeeded with other
        parameters (on a rerun a tag changed, or an SSM alias resolved to a newer AMI), not that its instance is gone.
        Its live instance is the create's (the key's tag lookup above may have missed it: eventual consistency), else
        the key is spent once every instance the token launched is terminated. Looked up by DescribeInstances'
        client-token filter and the key's tag; nothing visible is asked again with backoff for consistency_timeout
        (a just-launched instance may not show yet), then the key counts as spent (EC2 lists a terminated instance
        for about an hour, and keeps its token for at least 24 h). Not asked again when this state last sent the
        token over JUST_LAUNCHED ago (`sent_before`): its instance is older than that, and shows if it is alive. A
        plan key recurring days after its instance was reclaimed waited consistency_timeout (120 s) for an instance
        nothing would show, once per spent attempt key."""
        settled = sent_before is not None and time.time() - sent_before > JUST_LAUNCHED.total_seconds()
        pause, deadline = 0.2, time.monotonic() + (0.0 if settled else self.consistency_timeout)
        while True:
            found = {i.id: i for i in self._describe(region, [{"Name": "client-token", "Values": [token]}])}
            found.update({i.id: i for i in self._describe(region, [{"Name": f"tag:{TAG_CREATE_KEY}", "Values": [key]}])
                          if i.tags.get(TAG_FLEET) == self.ctx.fleet})
            ranked = sorted(found.values(), key=lambda i: (not i.alive, i.state == "terminated", i.id))
            if ranked and ranked[0].state != "terminated":
                return ranked[0]  # live, else stopped (not alive: apply tries the next key, as for a replayed token)
            if ranked:
                raise KeySpentError(f"{error}; {', '.join(f'{i.id} is terminated' for i in ranked)}")
            if settled:
                sent = datetime.fromtimestamp(sent_before, timezone.utc).strftime("%Y-%m-%dT%H:%MZ")  # type: ignore[arg-type]
                raise KeySpentError(f"{error}; no instance launched with it shows, and this state last sent it at {sent}, "
                                    "so terminated over an hour ago (EC2 lists one for about that long)")
            if time.monotonic() + pause > deadline:
                raise KeySpentError(f"{error}; no instance launched with it shows in {self.consistency_timeout:.0f} s "
                                    "(so terminated over an hour ago: EC2 lists one for about that long)")
            time.sleep(pause)
            pause = min(pause * 2, 5.0)

    def _placement_group(self, ec2, name: str, region: str) -> None:
        """A cluster placement group for a gang, created once (tagged with the fleet) and reused; clean_up deletes
        it once no instance is in it. A group that already exists is used only if its fleet tag is ours: the name
        may be someone else's."""
        try:
            self._call(f"create_placement_group {name}", ec2.create_placement_group, GroupName=name, Strategy="cluster",
                       TagSpecifications=[{"ResourceType": "placement-group", "Tags": [{"Key": TAG_FLEET, "Value": self.ctx.fleet}]}])
        except ProviderError as e:
            if "InvalidPlacementGroup.Duplicate" in str(e):
                found = self._call(f"describe_placement_groups {name}", ec2.describe_placement_groups, GroupNames=[name])
                groups = found.get("PlacementGroups", [])
                owner = {t["Key"]: t["Value"] for t in (groups[0].get("Tags", []) if groups else [])}.get(TAG_FLEET)
                if owner != self.ctx.fleet:
                    raise OwnershipError(f"aws: placement group {name} already exists and is not fleet {self.ctx.fleet!r}'s "
                                         f"(its {TAG_FLEET} tag is {owner!r}); refusing to launch into it") from None
                return
            if "PlacementGroupLimitExceeded" in str(e):
                raise QuotaError(str(e), cloud="aws", quota="placement groups per Region (500 per account)", region=region,
                                 how_to_raise=f"delete placement groups nothing uses (`aws ec2 describe-placement-groups "
                                 f"--region {region}`; this fleet deletes its own once their gang is gone), or ask AWS "
                                 "Support to raise the limit") from None
            raise

    def clean_up(self, pools: Sequence[PoolTarget], in_use: frozenset[str] = frozenset()) -> list[str]:
        """Delete this fleet's cluster placement groups that no instance is in any more (their gang is gone or was
        never launched): terminating the instances leaves the group, and the per-Region limit would then fail every
        later gang. `in_use`: groups observed instances are in (not tried). EC2 refuses a group whose members are
        still shutting down (InvalidPlacementGroup.InUse): asked again with backoff for `placement_group_wait`
        seconds (default 180), then left for a later run. Only groups tagged with this fleet are touched."""
        removed = []
        for region in self._regions(pools):
            ec2 = self.ec2(region)
            resp = self._call("describe_placement_groups", ec2.describe_placement_groups,
                              Filters=[{"Name": f"tag:{TAG_FLEET}", "Values": [self.ctx.fleet]}])
            for g in resp.get("PlacementGroups", []):
                tags = {t["Key"]: t["Value"] for t in g.get("Tags", [])}
                if tags.get(TAG_FLEET) != self.ctx.fleet or g.get("Strategy") != "cluster" or g["GroupName"] in in_use:
                    continue
                if self._delete_group(ec2, g["GroupName"]):
                    removed.append(f"{region}/{g['GroupName']}")
        return removed

    def _delete_group(self, ec2, name: str) -> bool:
        pause, deadline = 1.0, time.monotonic() + self.options.seconds("placement_group_wait")
        while True:
            try:
                self._call(f"delete_placement_group {name}", ec2.delete_placement_group, GroupName=name)
                return True
            except ProviderError as e:
                if "InvalidPlacementGroup.Unknown" in str(e):
                    return False
                if "InvalidPlacementGroup.InUse" not in str(e):
                    raise
                if time.monotonic() + pause > deadline:
                    return False  # members still shutting down: a later run deletes it
                time.sleep(pause)
                pause = min(pause * 2, 15.0)

    def _owned(self, instance: Instance, verb: str) -> dict | None:
        """The instance as EC2 describes it now, checked to be this fleet's before we `verb` it;
        None if it is already gone. Raises OwnershipError for anyone else's instance."""
        pause, deadline = 0.2, time.monotonic() + self.consistency_timeout
        while True:
            try:  # mapped as every call is (a throttled read is transient and says how often it was tried)
                resp = self._call(f"describe {instance.id}", self.ec2(instance.region).describe_instances,
                                  InstanceIds=[instance.id])
                break
            except ProviderError as e:
                if "InvalidInstanceID.NotFound" not in str(e):
                    raise
                if not _just_launched(instance):
                    return None
                # EC2 is eventually consistent: an instance launched a moment ago may not be visible yet ("Eventual
                # consistency in the Amazon EC2 API"; AWS advises retrying with backoff). Reading that as "already gone"
                # would skip its terminate and leak it, so retry, then give up without claiming anything.
                if time.monotonic() + pause > deadline:
                    raise TransientProviderError(f"aws: {instance.id} was launched at {instance.launched_at} and EC2 does not "
                                                 f"show it yet ({self.consistency_timeout:.0f} s); a rerun tries again") from None
                time.sleep(pause)
                pause = min(pause * 2, 5.0)
        found = [d for r in resp["Reservations"] for d in r["Instances"]]
        if not found or found[0]["State"]["Name"] in ("shutting-down", "terminated"):
            return None
        tags = {t["Key"]: t["Value"] for t in found[0].get("Tags", [])}
        if tags.get(TAG_FLEET) != self.ctx.fleet:
            raise OwnershipError(f"aws: refusing to {verb} {instance.id}: its {TAG_FLEET} tag is "
                                 f"{tags.get(TAG_FLEET)!r}, not {self.ctx.fleet!r}")
        return found[0]

    def delete(self, instance: Instance) -> None:
        if self._owned(instance, "terminate") is None:
            return
        ec2 = self.ec2(instance.region)
        self._call(f"terminate_instances {instance.id}", ec2.terminate_instances, InstanceIds=[instance.id])

    def record_placements(self, instance: Instance, record: PlacementRecord) -> None:
        """CreateTags with the new chunks and serial in one call, then DeleteTags for chunks the
        shorter list no longer needs (a leftover chunk is never read: the last chunk says so)."""
        found = self._owned(instance, "tag")
        if found is None:
            return
        ec2 = self.ec2(instance.region)
        new = placement_tags(record)
        stale = sorted(t["Key"] for t in found.get("Tags", []) if is_placement_key(t["Key"]) and t["Key"] not in new)
        self._call(f"create_tags {instance.id}", ec2.create_tags, Resources=[instance.id], Tags=_tag_list(new))
        if stale:
            self._call(f"delete_tags {instance.id}", ec2.delete_tags, Resources=[instance.id], Tags=[{"Key": k} for k in stale])


def denied_error(what: str, operation: str, code: str, message: str) -> AccessDeniedError:
    """An IAM refusal, naming the action: AWS's message names it ("... is not authorized to perform: ec2:X"), else it is
    the call's own (with what it implies: EC2 encodes the detail of a refused launch)."""
    named = re.search(r"not authorized to perform: \(?([a-z0-9-]+:[A-Za-z0-9]+)", message)
    action = named.group(1) if named else f"{_SERVICE_OF.get(operation, 'ec2')}:{operation}"
    implied = f" (or what it implies: {IMPLIED[operation]})" if not named and operation in IMPLIED else ""
    return AccessDeniedError(f"aws: {what}: {code}: the credentials may not {action}{implied}; allow it (README, AWS: "
                             f"Minimal IAM policy) and run again. AWS said: {message}", actions=(action,))


def _chunk_beyond_first(key: str) -> bool:
    """A placement chunk's key past the first (fleetops.io/placements-2, ...): one a shorter list deletes."""
    return is_placement_key(key) and key != TAG_PLACEMENTS and key[len(TAG_PLACEMENTS) + 1:].isdigit()


def _one_per_launch(requests: Sequence[CreateRequest]) -> list[CreateRequest]:
    """One create of each pool and market (they launch with the same image, network, profile and tags)."""
    seen: dict[tuple[str, str], CreateRequest] = {}
    for r in requests:
        seen.setdefault((r.pool.name, r.market), r)
    return list(seen.values())


def _refusal_is_final(response=None, operation=None, **_) -> None:
    """botocore's needs-retry hook for RunInstances: a capacity refusal ends the call. EC2 answers a stockout
    (InsufficientInstanceCapacity ...) with HTTP 500, a server error code, which standard mode retries like an outage:
    max_attempts launches and up to 15 s of backoff per create before apply could mark the zone short and go elsewhere.
    Raised here, ahead of botocore's own handler (a more specific event's handlers run first), which would otherwise
    also charge its retry quota for a retry not made."""
    parsed = response[1] if response is not None else {}
    if parsed.get("Error", {}).get("Code") in CAPACITY_CODES:
        from botocore.exceptions import ClientError

        raise ClientError(parsed, operation.name)


def latest_spot_prices(ec2, types: list[str], now: datetime) -> dict[tuple[str, str], float]:
    """The current Linux spot price per (type, zone). Asked with StartTime = now, DescribeSpotPriceHistory returns
    "the last price change before the start time, which is the effective price as of the start time" (EC2 API
    reference): however old that change is, it is today's price, so no row is dropped for its age except beyond
    the 90 days of history EC2 keeps. Its instance types and products are filter values, FILTER_VALUES a call
    together, so the types are asked in chunks, each paged (NextToken, 1000 rows a page by default). Used at plan
    time (AwsProvider) and by `reconcile catalog update`."""
    latest: dict[tuple[str, str], tuple[datetime, float]] = {}
    per_call = FILTER_VALUES - len(SPOT_PRODUCTS)
    for n in range(0, len(types), per_call):
        pages = ec2.get_paginator("describe_spot_price_history").paginate(
            InstanceTypes=types[n:n + per_call], ProductDescriptions=list(SPOT_PRODUCTS), StartTime=now, EndTime=now)
        for page in pages:
            for h in page["SpotPriceHistory"]:
                ts = h["Timestamp"]
                if now - ts > SPOT_PRICE_MAX_AGE:
                    continue
                key = (h["InstanceType"], h["AvailabilityZone"])
                if key not in latest or ts > latest[key][0]:
                    latest[key] = (ts, float(h["SpotPrice"]))
    return {k: v for k, (_, v) in latest.items()}


def vcpu_quota(instance_type: str, market: str) -> tuple[str, str]:
    """(Service Quotas code, name) of the vCPU quota an instance type's launches count against in its market."""
    family = instance_type.split(".", 1)[0]
    letters = "".join(c for c in family if c.isalpha())
    key = next((k for k in sorted(VCPU_QUOTAS, key=len, reverse=True) if letters.startswith(k)), None)
    on_demand, spot = VCPU_QUOTAS[key] if key else STANDARD_QUOTAS
    return spot if market == "spot" else on_demand


def how_to_raise(code: str, region: str) -> str:
    return (f"https://console.aws.amazon.com/servicequotas/home/services/ec2/quotas/{code} (region {region}), or "
            f"`aws service-quotas request-service-quota-increase --service-code ec2 --quota-code {code} "
            f"--desired-value <vCPUs> --region {region}`")


def quota_error(text: str, region: str, instance_type: str, market: str) -> QuotaError:
    """The Service Quotas quota an instance type's launch counts against, with where and how to raise it."""
    code, name = vcpu_quota(instance_type, market)
    return QuotaError(text, cloud="aws", quota=f"{name} ({code})", region=region, how_to_raise=how_to_raise(code, region))


def _quota_name(code: str) -> str:
    return next(n for c, n in [q for pair in VCPU_QUOTAS.values() for q in pair] + list(STANDARD_QUOTAS) if c == code)


JUST_LAUNCHED = timedelta(minutes=10)  # EC2's eventual consistency is documented in "a few minutes"; be generous


def _just_launched(instance: Instance) -> bool:
    """Launched within JUST_LAUNCHED: a NotFound for it may be eventual consistency, not absence."""
    try:
        launched = datetime.fromisoformat(instance.launched_at)
    except (TypeError, ValueError):
        return False  # of unknown age: not one of ours from this run
    if launched.tzinfo is None:
        launched = launched.replace(tzinfo=timezone.utc)
    return datetime.now(timezone.utc) - launched < JUST_LAUNCHED


def _tag_list(tags) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in sorted(tags.items())]
