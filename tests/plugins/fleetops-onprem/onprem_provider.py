"""A third-party provider, shipped as its own package: an on-prem rack with a fixed
number of DGX servers per zone. It depends only on the public provider contract."""

from __future__ import annotations

import json

from providers.base import TAG_CREATE_KEY, TAG_FLEET, TAG_POOL, Instance, Offering
from reconciler.errors import CapacityError, OwnershipError

RACK = {"dgx-a100": dict(gpus=8, gpu_type="A100", cpu=128, memory_gib=1024, on_demand_price=12.0)}
SERVERS_PER_ZONE = 2


class OnPremProvider:
    name = "onprem"

    def __init__(self, ctx):
        self.ctx = ctx
        self.path = ctx.state_dir / "onprem.json"

    def _load(self) -> dict:
        return json.loads(self.path.read_text()) if self.path.exists() else {"servers": {}}

    def _save(self, data: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(data))

    def _inst(self, s: dict) -> Instance:
        return Instance(id=s["id"], provider=self.name, cloud=s["cloud"], region=s["region"], zone=s["zone"],
                        instance_type=s["type"], market="on-demand", state="running", pool=s["tags"].get(TAG_POOL, ""), tags=s["tags"])

    def observe(self, pools):
        return [self._inst(s) for s in self._load()["servers"].values() if s["tags"].get(TAG_FLEET) == self.ctx.fleet]

    def offerings(self, pools):
        return [Offering(cloud=p.cloud, region=p.region, zone=z, instance_type=t, spot_price=None, **RACK[t])
                for p in pools for z in p.zones for t in p.instance_types if t in RACK]

    def create(self, request):
        data = self._load()
        for s in data["servers"].values():
            if s["tags"].get(TAG_CREATE_KEY) == request.key:
                return self._inst(s)
        if sum(s["zone"] == request.zone for s in data["servers"].values()) >= SERVERS_PER_ZONE:
            raise CapacityError(f"onprem: rack in {request.zone} is full", cloud=request.pool.cloud, zone=request.zone,
                                instance_type=request.instance_type, market=request.market)
        sid = f"dgx-{len(data['servers']) + 1:03d}"
        data["servers"][sid] = dict(id=sid, cloud=request.pool.cloud, region=request.pool.region, zone=request.zone,
                                    type=request.instance_type, tags={**request.tags, TAG_CREATE_KEY: request.key})
        self._save(data)
        return self._inst(data["servers"][sid])

    def delete(self, instance):
        data = self._load()
        s = data["servers"].get(instance.id)
        if s is None:
            return
        if s["tags"].get(TAG_FLEET) != self.ctx.fleet:
            raise OwnershipError(f"onprem: {instance.id} is not ours")
        del data["servers"][instance.id]
        self._save(data)
