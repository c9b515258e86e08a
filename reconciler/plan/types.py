"""The plan's data: what it creates and deletes, what happens to each job, and how good it is.

Plain frozen dataclasses; the file they are saved as (its format version, its digest) is file.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Literal

from reconciler.ledger import SpotBallast, micro
from reconciler.plan.file import PLAN_FORMAT, RUN_CHANGES, encode, nest_site, read_body
from reconciler.site import OnSite, Site

JobAction = Literal["keep", "place", "move", "evict", "pending"]


@dataclass(frozen=True)
class CreateAction(OnSite):
    ref: str  # how the plan names the instance before it exists: "+1", "+2", ...
    key: str  # idempotency key: the same plan never creates it twice
    site: Site  # (its seven fields are the action's own in the plan file: file.py)
    price: float
    max_price: float | None
    placement_group: str | None = None  # launch into this cluster placement group (a gang's)
    reservation: str | None = None  # launch into this Reservation's capacity (price 0: its cost is committed)
    price_source: str = ""  # where `price` comes from and its date: "catalog: <source> (<date>)" or a live API

    @property
    def offer_key(self) -> str:
        """The offer it buys from: its site's, or a Reservation's own (problem.types.Capacity.offer_key)."""
        return self.site.offer_key + (f"@{self.reservation}" if self.reservation else "")


@dataclass(frozen=True)
class DeleteAction(OnSite):
    instance_id: str
    site: Site
    price: float
    reason: str


@dataclass(frozen=True)
class JobChange:
    job: str
    tenant: str
    action: JobAction
    instances: tuple[str, ...]  # one per replica: instance id or a create ref
    previous: tuple[str, ...]
    reason: str = ""
    gpus: tuple[tuple[int, ...], ...] = ()  # GPU indices per replica on its instance


@dataclass(frozen=True)
class RemovedJob:
    """A job the fleet runs that the config no longer has: it stops (apply gives its replicas no place). Listed so
    the plan says so: before, removing a running job's document read "No changes" (exit 0 with --detailed-exitcode)
    when its instance stayed, or "0 evicted" beside the deletes of its instances, and apply stopped it all the same."""

    job: str
    previous: tuple[str, ...]  # the instances it runs on, one per replica


@dataclass(frozen=True)
class RestartedJob:
    """A running job that keeps its place whose run spec changed (command, env, image, ...: runtime/assign.spec_hash):
    apply publishes the new spec and its agents restart it in place. Listed so the plan says so: before, editing a
    running job's `run` read "No changes" (exit 0 with --detailed-exitcode), so the controller never rolled it out."""

    job: str
    instances: tuple[str, ...]  # where it runs and restarts, one per replica
    # "restarts" (its run changed); "starts" (a job placed without `run`, a reservation, given one: its agents start it);
    # "stops" (its `run` taken out: its agents stop the process, the job keeps its place). Both read "No changes".
    change: str = "restarts"


@dataclass(frozen=True)
class SolverReport:
    status: str
    optimal: bool
    gap: float | None  # the solver's; read back from JSON, the plan's claim (quality.claimed_gap): None where it claims none
    seconds: float  # wall clock: shown to people, left out of the JSON (the same input gives the same JSON)
    tiers: tuple[dict, ...] = ()  # what each objective tier reached (name, value, bound, status, proven)
    scope: tuple[int, int] = (0, 0)  # existing instances solved, frozen as they are
    repairs: int = 0  # instances added by the packer where aggregate counts did not pack
    note: str = ""
    work: float = 0.0  # CP-SAT deterministic seconds spent (--time-limit bounds them)
    unpacked: int = 0  # jobs the solver placed that the packer could not: the plan does not reach its tiers
    backfilled: int = 0  # pending jobs the plan placed in room its packing left (plan/backfill.py): beyond the solver's answer
    narrowed: int = 0  # (job group, host) choices the solver's model left out (solve.model: too many): its bounds are of the rest
    greedy_parts: int = 0  # independent parts greedy best-fit answered, the others CP-SAT's (solve.parts): no tiers, no gap claimed
    held: int = 0  # running jobs the search held (api._lawful, Problem.held): its tiers and bound are of the plans that keep them

    @property
    def unproven(self) -> list[str]:
        """Tiers whose value is not proven best: the plan holds at least greedy's there."""
        return [t["name"] for t in self.tiers if not t.get("proven", t.get("status") in ("HELD", "OPTIMAL"))]


@dataclass(frozen=True)
class Consolidation:
    """Moves made only because a cheaper plan exists."""

    moved_replicas: int
    instances_removed: tuple[str, ...]
    # $/h the moves save (instances, egress, latency), before their one-time cost, against the best answer the
    # solver found that moves only what must move; None where it did not search one (plan/quality.consolidation)
    saving_per_hour: float | None
    move_cost: float  # one-time USD, as the PlacementPolicy prices a move
    # the jobs the room the moves free runs that the plan the saving is measured against leaves pending
    room_jobs: int = 0


@dataclass(frozen=True)
class Plan:
    id: str
    fleet: str
    desired_digest: str
    observed_digest: str
    creates: tuple[CreateAction, ...]
    deletes: tuple[DeleteAction, ...]
    jobs: tuple[JobChange, ...]
    cost_before: float  # USD per hour, instances
    cost_after: float
    solver: SolverReport
    violations: tuple[str, ...] = ()
    format: int = PLAN_FORMAT
    kept: dict[str, float] = field(default_factory=dict)  # existing instance id -> USD/h, for those that stay
    consolidation: Consolidation | None = None
    notes: tuple[str, ...] = ()  # what observe found worth saying (state vs placement tags)
    ballast: SpotBallast | None = None  # idle on-demand capacity paid for only to allow the spot in the plan
    # The scheduling rules' figures (licenses held, reservations used, deadline conditions), only
    # where the config has such rules: left out of the JSON when empty, so other plans are as before.
    rules: dict = field(default_factory=dict)
    removed: tuple[RemovedJob, ...] = ()  # running jobs the config no longer has (left out of the JSON when none)
    restarted: tuple[RestartedJob, ...] = ()  # running jobs whose run spec changed (left out of the JSON when none)

    @property
    def changed_jobs(self) -> list[JobChange]:
        return [j for j in self.jobs if j.action in ("place", "move", "evict")]

    @property
    def pending(self) -> list[JobChange]:
        return [j for j in self.jobs if j.action in ("pending", "evict")]

    @property
    def has_changes(self) -> bool:
        return bool(self.creates or self.deletes or self.changed_jobs or self.removed or self.restarted)

    @property
    def spend(self) -> int:
        """What the fleet budget counts of the fleet this plan leaves (ledger.micro: each kept instance's price and each
        create's, summed as integers; cost_after is rounded for show)."""
        return sum(map(micro, self.kept.values())) + sum(micro(c.price) for c in self.creates)

    def counts(self) -> dict[str, int]:
        """Actions and jobs by what happens to them: each job's action ("keep" counts every job kept in place), and, each
        job once, "unchanged" (kept, its run as it was), "restarts", "starts" and "stops" (kept, its run changed:
        RestartedJob.change). (The summary said "10 unchanged, 1 restarted" of 10 jobs: the restarted one twice.)"""
        c = {a: 0 for a in ("keep", "place", "move", "evict", "pending")}
        for j in self.jobs:
            c[j.action] += 1
        run = dict.fromkeys(RUN_CHANGES, 0)
        for r in self.restarted:
            run[r.change] += 1
        in_place = {r.job for r in self.restarted}
        unchanged = sum(j.action == "keep" and j.job not in in_place for j in self.jobs)
        return {"create": len(self.creates), "delete": len(self.deletes), **c, "unchanged": unchanged, **run,
                "remove": len(self.removed), "restart": len(self.restarted)}

    def to_json(self) -> str:
        """The plan file's text (file.py), encoded once: `reconcile plan` keeps it in the memo and reads it back for the
        render the memo keeps (0.05-0.09 s an encoding at 5k jobs); the plan is frozen."""
        text = self.__dict__.get("_json")
        if text is None:
            text = encode(self)
            object.__setattr__(self, "_json", text)
        return text

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        """A saved plan, refused when its format is another version's or its body was edited (file.py)."""
        return cls._from_body(read_body(text))

    def read_back(self) -> "Plan":
        """This plan as reading its own JSON back gives it (no solve time: what the plan memo gives back), without
        the checks a file from elsewhere needs (its format, digest and every field's type: this process wrote it).
        `reconcile plan` renders it for the memo after a solve: 0.27 -> 0.1 s of CPU at 5k jobs (shared machine)."""
        raw = json.loads(self.to_json())
        del raw["body_digest"]
        return self._from_body(raw)

    @classmethod
    def _from_body(cls, raw: dict) -> "Plan":
        solver = raw["solver"]
        cons = raw.get("consolidation")
        return cls(
            id=raw["id"], fleet=raw["fleet"], desired_digest=raw["desired_digest"], observed_digest=raw["observed_digest"],
            creates=tuple(CreateAction(**nest_site(c)) for c in raw["creates"]),
            deletes=tuple(DeleteAction(**nest_site(d)) for d in raw["deletes"]),
            jobs=tuple(JobChange(**{**j, "instances": tuple(j["instances"]), "previous": tuple(j["previous"]),
                                    "gpus": tuple(tuple(g) for g in j.get("gpus", ()))}) for j in raw["jobs"]),
            cost_before=raw["cost_before"], cost_after=raw["cost_after"],
            solver=SolverReport(**{"seconds": 0.0, **solver, "tiers": tuple(solver.get("tiers", ())), "scope": tuple(solver.get("scope", (0, 0)))}),
            violations=tuple(raw.get("violations", ())), kept=dict(raw.get("kept", {})),
            consolidation=Consolidation(**{**cons, "instances_removed": tuple(cons["instances_removed"])}) if cons else None,
            notes=tuple(raw.get("notes", ())),
            ballast=SpotBallast(**{**raw["ballast"], "instances": tuple(raw["ballast"]["instances"])}) if raw.get("ballast") else None,
            rules=dict(raw.get("rules", {})),
            removed=tuple(RemovedJob(r["job"], tuple(r["previous"])) for r in raw.get("removed", ())),
            restarted=tuple(RestartedJob(r["job"], tuple(r["instances"]), r.get("change", "restarts")) for r in raw.get("restarted", ())),
        )


__all__ = ["JobAction", "CreateAction", "DeleteAction", "JobChange", "RemovedJob", "RestartedJob", "SolverReport", "Consolidation", "Plan"]
