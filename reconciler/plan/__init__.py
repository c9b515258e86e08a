"""Turn the solver's counts into a concrete, reviewable plan.

Pure. Decides which replica goes on which instance and GPUs (keeping running
replicas where they are), names the instances to create with idempotency keys
derived from the plan id, and says for each job whether it is kept, placed, moved,
evicted or pending (with a reason). It also says what the moves are for: healing
lost capacity, leaving an instance that must go, or consolidation (with the saving).

types.py is the plan's data, file.py the plan file, build.py makes a plan (its phases
in their own modules, named there), quality.py what a finished plan reaches.
"""

from reconciler.plan.build import make_plan, removed_jobs, restarted_jobs
from reconciler.plan.file import PLAN_FORMAT, body_digest, placement_group_name, plan_id
from reconciler.plan.quality import RANKS_HIGHER, UNPACKED, emitted_quality, outcome_rank, rule_summary, unpacked
from reconciler.plan.types import Consolidation, CreateAction, DeleteAction, JobAction, JobChange, Plan, RemovedJob, RestartedJob, SolverReport

__all__ = ["Plan", "CreateAction", "DeleteAction", "JobChange", "RemovedJob", "RestartedJob", "JobAction", "SolverReport", "Consolidation", "make_plan",
           "plan_id", "placement_group_name", "body_digest", "PLAN_FORMAT", "RANKS_HIGHER", "UNPACKED", "emitted_quality", "rule_summary",
           "outcome_rank", "unpacked", "removed_jobs", "restarted_jobs"]
