"""Fleets the slow property tiers found on 2026-11-26 that the planner got wrong (issues 18 and 19), each the
failing `Fleet` exactly as the property test printed it. All are fixed and kept as regression tests; a new
finding that is not fixed yet goes here as a strict xfail (a strict xfail that passes fails the run, so its fix is
told to make it a plain test).

- fleet11: greedy's plan evicted t1's protected job j7 when the on-demand buffer broke (its only on-demand host
  must go; settle_spot gave up the spot host running j7 instead of buying on-demand room, as CP-SAT does), and
  `apply --plan`'s re-check refused it. And j6's pending reason blamed the solver for a placement the problem's
  offer size ruled out (the one instance it allowed stands idle for the buffer).
- fleet12: CP-SAT's plan put tenant t2 at 1/1 of its work on spot, over its tenant_max_spot_fraction 0.5, because
  the packer dropped t2's on-demand job the solver had counted in the share.
- fleet13: j4 (a 2 x 8-GPU gang on two spot p4d, pool max 1, fleet max_spot_fraction 0.25, WhenEmpty) was evicted
  with "pools at max_instances"; with that limit lifted it was still evicted: under WhenEmpty the gang may only
  stay or stop, and the reason now says so with what the running fleet breaks.
- fleet14: planning never ended: greedy's settle_spot released the same emptied spot host forever.
- fleet20: a spot offer no job fits was offered 0 times, so a fleet needing a second spot zone used no spot.
- fleet21: CP-SAT moved running work onto an identical instance in another zone where a plan of the same rank
  kept it: the model gave NVLink work no room beside a running job's GPU, even where one NVLink domain spans them all.
- fleet15: CP-SAT ranked below greedy: the problem protected a same-instance gang running split over two
  instances (it must move whole), so moving it counted as a guarantee kept and a protected job was evicted.
- fleet16: apply's re-check refused stopping spot work that only an instance which must go (a cloud the guardrails
  no longer allow) kept within spot diversity: it read the rules the fleet breaks now off the fleet with it.
- fleet17: CP-SAT moved a same-instance gang running split to a new instance identical to the one it left, which
  the plan deleted (keep_identical asked for a job running whole there).
- fleet18: greedy's answer broke a pool minimum under a budget (it held back the price of an idle spot host it
  would not open), CP-SAT could not complete it, and it was the plan.
- fleet19: greedy's plan evicted a protected MIG placement-group gang running over a spot and an on-demand instance
  of one zone and type (a pool at max_instances): greedy and the model kept such a gang only on one offer.
- fleet23: greedy's plan kept a same-instance gang where it ran but gave it other GPUs: the packer took a running
  item's own GPUs back only for 1-replica items.
- fleet22: CP-SAT evicted t1's protected low j5 and placed t2's pending normal j12 in its room,
  counting t1's normal j6 (running, but it must leave its spot instance) as the higher class that took j5's place (a second guarantee tier now keeps a tenant's running work, moved or not).
- fleet25: apply's re-check refused an honest plan that evicted a guaranteed job because the fleet as it ran left a
  pool minimum unmet, whose price under the budget was that job's instance: the re-check did not count an unmet
  minimum among the fleet-wide rules the fleet breaks now.
- fleet26: greedy's answer released the only instance of a pool at min_instances 1 (a spot host spot diversity could
  not keep) and could not buy another under the budget; CP-SAT could not complete that answer and emitted it. Greedy
  now gives up a dearer kept host for the minimum, CP-SAT starts from its own answer where greedy's is proven
  incomplete, and apply --plan refuses such a plan (the re-check checked pool maximums only).
- fleet27: under preemption: Never, the guarantee tier let t1's new normal job stand in for its evicted protected
  low job; no class takes another's place there, so nothing stands in.
- fleet24: j3 (A100-80GB, only in az-a100-80: on-demand, max 1) is pending on "pools at max_instances; other
  capacity is blocked by the on-demand buffer"; with max_instances lifted it was still pending: the offer was sized
  to the one instance j3's work needs, which the optimum kept idle for the buffer. Every on-demand offer may now hold
  the buffer's idle capacity too (capacity.size_offers, its ballast), and fleet11's j6, pending so beside its
  offer's one idle instance, now runs beside it.
- fleet28 (the slow reason tier, 2026-11-29, on main and on the session's first main): j0 (A10G) pending with "the
  planner offers at most 1 new g5.12xlarge on-demand there ... and this plan's +1 stands idle for the on-demand
  buffer (50% of the spot GPUs)": fleet24's kind, fixed by the same sizing.
- fleet29 (audit of main, 2026-11-29: a 500-job scenario after a spot interruption, reduced): the packer left a
  critical running job over, beside a low one it could displace (the greedy pass's leftovers were not traded up), so
  CP-SAT's plan evicted it inside its tenant's guarantee; on the 500 jobs that plan also ranked above greedy's (the
  packed plans were compared without the guarantees) and `apply --plan` refused it, and every plan after it. Fixed
  both ways. And the solver put on idle instances, summed as a class, what does not pack there: where the planner's
  packing of an idle class leaves items over, the repair stage now gives the class per-instance rows and searches
  the answer again around it, every other placement held (it keeps i78, and all four jobs run).
- fleet30 (the same audit, a 60-job scenario): right after an apply, the unchanged config's plan evicted a running job
  for pending work of its own tenant (first of its own class; with that forbidden, its low job for a normal one): the
  protected set filled the guarantee by priority then name, leaving room in it that no running job fit, which the
  pending job took. It fills within a class largest first now, and a tier keeps a tenant's running work from being
  stopped for its own new work of that class or below.
- fleet32 (the slow property tier, 2026-11-29, right after fleet30's fix): t3 (4 GPUs guaranteed) runs a 1-GPU and a
  4-GPU low job, which its guarantee cannot both hold, and one must leave spot; the model protects the 4-GPU job
  (largest first within a class, fleet30), the oracle protected the 1-GPU one (by name) and ranked CP-SAT's plan,
  which keeps the larger, below greedy's. The oracle now fills a guarantee as the README says the planner does.
- fleet34 (the slow reason tier, 2026-11-29, right after fleet30's fix): t1's low j0 must leave its p4d (its latency
  cap is 5 ms from gcp/us-central1) and nothing in reach holds it; the new tier against stopping a tenant's running
  work for its own new work counted j0 as stopped, held t1's new low work at 0 through the work tiers, and after its
  release only 6 of 7 came back: j6 (CPU) stayed pending, "the solver did not find that placement". A job a rule
  moves is not counted as stopped now.
- fleet36 (audit19, 2026-11-29, an 80-job generated fleet reduced to 17 jobs): the plan right after a cold apply moved
  3 jobs and swapped 2 instances for one, cents an hour: consolidate's search found an answer a little cheaper than
  the applied one (within the gap limit the cold plan stopped at). A saving within the gap limit is no consolidation
  now.
- fleet37 (audit19, 2026-11-29, an 80-job random fleet after a spot interruption and a "change job" edit, reduced):
  a tenant's on-demand job changed and has no room; its spot share holds only with it, so CP-SAT placed it by evicting
  another tenant's guaranteed job (the guarantees tier tied: one protected job lost either way), and greedy stopped the
  tenant's spot job, which apply's re-check refused as taken for a share the fleet keeps: every plan was refused. A
  job that changed restarts, so the fleet that can stay (ledger.staying_ledger) does not hold it and the share is
  broken without it: the share may take the tenant's spot work, which is no unit of the guarantees tier then, and a
  tenant's own rule broken now licenses only its own work's evictions at apply's re-check.
- fleet39 (the slow property tier, right after fleet37's fix): leaving a tenant's spot job out of the first guarantees
  tier let its own low jobs outweigh it; the first tier now leaves out the tenant over its spot share whole.
- fleet41 (the slow property tier, right after fleet39's fix): with a fleet-wide rule broken as well, leaving a tenant
  over its spot share out of the first guarantees tier kept another tenant's one protected job over its two; the
  tier leaves it out only where the tenant's own rules alone are broken.
- fleet42 (the slow property tier, right after): greedy gave up a whole spot host for one tenant's spot share, stopping
  another tenant's guaranteed job beside it; it takes out only the tenant's spot job now.
- fleet43 (the slow reason tier; also before today's changes): a pending reason was true of the plan, but the limit
  it named was also what moved a running job out of the room the pending job would take; lifted alone, the running job
  stayed and the pending job still waited. The reason names both now ("several limits bind at once").
- fleet44, fleet45 (audit20 findings 6 and 5): greedy kept running jobs in class order, a resized job first in its
  new shape, so it restarted in place in another tenant's guaranteed job's room, or its own tenant's job of its class;
  apply's re-check refused those plans (and CP-SAT's at short limits, which kept greedy's answer). Greedy keeps every
  job as it runs first now.
- fleet46 (audit20 finding 1): a CPU same-instance gang counted 1 work unit in its tenant's spot share whatever its
  replicas; it counts 1 per replica now.
- fleet47 (audit20 finding 2): a tenant's new work waited one plan behind its running job that another tenant
  reclaims (the swaps tier counted that stop as a swap), so the plan after the apply placed it. A stop made while the
  tenant's new work waits is no swap now: the problem is solved again with it exempt (objective.swap_exemptions).
- fleet48 (the slow reason tier): under WhenEmpty, a pool over its max could lose an instance only with its jobs: the
  model held running jobs to the moves forced on them alone; a rule the fleet breaks now licenses moves too.
- fleet49 (the slow reason tier): a running job that had to leave its host (spot required on on-demand) got no
  variable where its tenant's lower job could make room; such work counts as needing room now.
- fleet50, fleet51 (audit21 findings 2, 3, 5): a shrunk gang under WhenEmpty was evicted from the instance it fits on
  (the model counted every running item as kept), a shrunk gang's stays past its first replicas stopped the plan
  ("internal: ... no room left"), and a resized gang's move read "consolidation: a cheaper packing".
- fleet52 (the stable-run exploration): after a grown gang no longer fit and was evicted, the swaps tier counted its
  stop as a swap and held its tenant's new work at 0, CP-SAT's answer ranked below greedy's, and the emitted plan
  (greedy's) kept the instance the gang left empty; the next plan deleted it. The same fix as fleet47's.
- fleet53, fleet54, fleet55 (the stable-run exploration): a gang grown past its instance's free room was offered no
  room where its tenant's lower jobs ran (only jobs not running or resized counted as needing room), so the plan of
  the edit evicted it, bought it an identical instance or evicted another job, and the plan after the apply placed it
  in the lower jobs' room. A gang running fewer replicas than it asks needs room now (rules.wants_room).
- fleet56 (the stable-run exploration): a host whose stays were fewer than the identical jobs running on it had every
  one of them called staying, and the job left over had no room: "internal: ... no room left" stopped every plan.
- fleet57 (the same): the probe for a stop that is no swap held every tier at the answer's value, so another
  tenant's borrowed job held the room the stopped job's tenant's guaranteed work would reclaim; it holds only the
  tiers ranked above the swaps tier now.
- fleet58 (the same): the room a consolidation frees was searched with every tier held at least at its floor, so a
  low job placed anew kept room its tenant's normal job wanted, and the plan after the apply evicted it for that job.
  claim_room searches the tiers again in their order now (the floors below a raised tier let go).
- fleet59 (the slow property tier): a tenant's spot share held only with its spot-required job on an on-demand host;
  the plan rightly evicted its other job too, and apply's re-check refused it. The fleet that can stay leaves out
  the jobs a rule moves now.
- fleet60 (the slow property tier): a normal job a rule moved took its tenant's low job's room; apply's re-check
  counted only jobs placed anew, resized or healed as arriving work and refused the plan. Movers arrive too now.
- fleet61 (made by hand from fleet60, 2026-11-29): the same with the job leaving a removed pool; the re-check's list
  of jobs that cannot stay missed a host that must go, and refused the plan. One definition now (rules.cannot_stay).
- fleet62 (the stable-run exploration with the new edits): a low gang grown from 2 to 3 replicas stopped its tenant's
  running low job for the quota: the ledger counted the gang at 3 replicas as it ran 2 (its tenant "over its
  ceiling" now, so anything of it could stop), and the tiers counted the grown gang as running work kept. It ranks as
  new work now (rules.settled_jobs) and the fleet as it runs holds the replicas that run (Demand.as_it_runs).
- fleet63 (the exploration, right after fleet62's fix): a gang grown past its instance moved in greedy's plan; its
  move counted as one for other work, so CP-SAT's tiers stopped it, ranked below greedy, and greedy's plan (not the
  cheapest) was emitted, so the next plan consolidated. A gang that restarts may move where it restarts now.
- fleet64 (the exploration with the new edits): under preemption: Never, a pool removed moved t3's j4 into the room
  of t3's running j5 of its class: the swaps tier, let go with the moves tiers for the consolidation, no longer
  held, and apply's re-check refused the plan. A consolidation stops nothing the held answer keeps now
  (strategy.keep_running).
- fleet38 (audit19, slow; a 150-job hand-made config, not reduced): under a short work limit (`--time-limit 6`) the
  plan after a cold apply evicted t4's j123 while placing t4's new work of its class: the warm start's completion summed
  the tiers unscaled, the fair share outweighed the guarantees, and the tiers' floors were far below greedy's own
  answer. Each tier is scaled to its bound in the completion now.
- fleet40 (found reducing fleet38, at the default limit): under preemption: Never a running job was stopped for its
  tenant's budget while its tenant's new work was placed; the tier against that counted only new work of its class or
  below (as under LowerPriority); under Never it counts every class.
- fleet31 (the same audit, seen at 500 jobs): `apply --plan` refused a plan that healed a critical gang after a spot
  interruption in its tenant's low job's room (the re-check did not count a gang that runs short as arriving work).
- fleet65 to fleet72: the stable-run explorations of 2026-11-29 (each test's docstring says what and why).
- fleet73, fleet74 (the mid-size exploration at the default 20 s, slow): the warm start's completion let the fair share
  outweigh the guarantees, and a tier's even share of the work left the cold plan's first tier unproven; the plan
  after the apply evicted a guaranteed critical gang, or placed four more jobs.
- fleet75, fleet76 (the solver property tier on larger fleets): room a quota's stop frees was offered to no other
  tenant's pending work, so CP-SAT ranked below greedy or paid more at its rank.
- fleet77 (the slow property tier, 2026-12-01, not reproduced: kept, no test), fleet78 to fleet86 (the slow tiers'
  random fleets, and the licenses/deadlines tier drawn at random, 2026-12-01): each test's docstring says what and
  why. fleet87 (the slow property tier, 2026-12-02): the property's own count of a guarantee was wrong (its test).
  fleet88 (the slow property tier, 2026-12-02, with plancheck.KeptInstead): greedy gave up a spot CPU host for a GPU
  spot share (its test). fleet89 (the slow property tier, 2026-12-02): greedy's plan charged t3 $6.42/h of its $5/h
  tenant budget, which apply's re-check refuses: a stop greedy made for room, undone unasked once the job it was made
  for had spent the budget it freed elsewhere (its test). fleet90 and fleet91 (the slow property tier, 2026-12-02):
  the re-check refused both planners' plans, which gave a pool's one slot to one tenant's guarantee over another's
  (no plan at all), and greedy kept borrowed running work before guaranteed in a pool over its max (their tests).
  fleet92 (the same run): greedy gave up a guaranteed job's spot host for spot diversity, which a spot instance bought
  elsewhere mended (its test); fleet93: that fix's first form bought spot for diversity before a tenant's spot work
  had given up spot (its test). fleet94 and fleet95 (the slow property tier, 2026-12-02, at 52921ca too): greedy's
  plan broke the on-demand buffer (fleet94) and evicted t2's guaranteed j8 with a pool over its max and the buffer
  broken now (fleet95), which apply's re-check refuses (CP-SAT's plans are emitted). fleet96 (the same tier, after
  both fixes; at 52921ca too): greedy's plan evicted t2's guaranteed j8 while the buffer and t1's budget are broken
  now: the cheapest spot host kept for diversity took the pool slot the buffer's ballast needed (its test). fleet97
  (the slow property tier, 2026-12-02; at f3d8ec5 too): greedy's plan evicted t2's guaranteed j4: an idle on-demand
  host the pool's max refused as the spot share's mend was not asked again once a release freed the slot (its test).
  fleet98 (the slow property tier, 2026-12-02): greedy's plan broke spot diversity with a spot instance settle_spot bought
  for it and left alone once the spot host beside it was given up (its test).
  fleet99 and fleet100 (made by hand, 2026-12-02, for two greedy orderings noted with fleet97): greedy's settle_spot asked
  a spot host it had tried for diversity again, not the spot instance to buy beside it, and gave up t1's guaranteed j8;
  and kept a pool's one slot for a spot job over the on-demand job of its rank the spot share then needed, and lost two
  jobs where CP-SAT lost one (their tests). fleet101 (the slow property tier, 2026-12-02, on main too): greedy's plan
  stopped t3's guaranteed MIG gang j9 under WhenEmpty for spot rules its tenant's new on-demand work then kept (its test).
  fleet102 (the slow lifecycle machine, 2026-12-02; on main too; a replayed sequence, no file): the plan right after an
  apply was no no-op, t2's guarantee filled again by class once its new high job ran, under preemption: Never (its
  test). fleet103 (the slow property tier, 2026-12-02, on main too): greedy gave up t1's guaranteed j5's spot host for
  spot diversity where a spot instance bought in a second zone, with on-demand ballast for the spot share, kept it (its
  test). fleet104 (the same tier, 2026-12-02, after fleet103's fix): greedy's plan evicted t1's guaranteed j5 with spot
  diversity and the spot share broken: what settle_spot had refused for diversity while a spot host held the ballast's
  pool slot was not asked again once that host was given up (its test).
  fleet105 (the same tier, 2026-12-02, on main): greedy's plan evicted t2's guaranteed MIG gang j3 whose spot host
  settle_spot gave up (pool az-mig at max 1): t1's new normal job and t1's protected low job took the room left on
  the one instance kept; protected running work is placed anew before new work now, but where its own tenant's higher
  class waits (its test). fleet106 and fleet107 (the same tier, 2026-12-02, on this branch; greedy's plans the same on
  main): greedy's plan evicted t1's guaranteed high j2, and t2's guaranteed low j8: an idle on-demand host settle_spot
  kept for the spot share, which held without it once the spot host beside it was given up, kept the budget from the
  on-demand host they ran on (their tests). fleet108 (the same tier, 2026-12-02, on this branch; greedy's plan the same on
  main): greedy's plan left t1 1/1 on spot, over its tenant_max_spot_fraction 0.5: t2's new high j10 (spot share 0)
  took the on-demand a2-highgpu-1g where t1's j3 ran, and t1's CPU j2 stayed on its spot host; a stop made after
  settle_spot was never asked about the stopped work's tenant's spot share (its test). fleet109 (the
  same tier, 2026-12-02, on the integration branch): CP-SAT's plan ranked below greedy's: searching again with stand-ins
  counted in their rooms, the model counted t2's running high job moved into its low job's room as the room its new
  high job stood in for, so t1's guaranteed job was stopped again, and the hold round kept t1's low job where greedy
  puts its higher job (its test). fleet110 (the slow lifecycle machine, 2026-12-02; on main too; a replayed sequence,
  no file): `reconcile plan` failed ("internal error: the plan would stop running work that no rule requires
  stopping"): t1's j4, resized to j5's shape, was given the stay the solver counted for running j5, restarted in place
  and stopped j5 (its test). fleet111 (the slow lifecycle machine, 2026-12-02, seed 4242032; on main too; the fleet
  before the plan, minimised): the plan right after an apply moved t1's critical j4 from the spot A100 where its high
  j2 ran to an on-demand one in the same slot of its pool (max 1): the plan before had been refused that placement, as
  j4 landed on no instance j2 ran on; a new instance in the slot of a deleted one is its room now (its tests).
  fleet113 (a session reading plancheck's two readings of that slot, 2026-12-03; hand-made): the re-check's weighing
  of a stop with the job kept instead (KeptInstead) read any new instance of the deleted instance's pool as its room,
  at max_instances or not, so a stop for a higher job bought beside it passed while a fleet-wide rule was broken; it
  reads slots_bought_again now (its tests). fleet114 (the same session): one higher job in the room of several
  stopped jobs of its tenant excused each stop (own_higher_class_room counted no units; it counts them now, as the
  model's stand-in room does: its tests). Greedy's
  plan of fleet111 (the h5 hunt, 2026-12-03) left the spot-required j5 pending on the spot share where CP-SAT bought
  on-demand ballast beside it; greedy buys it too now (its test). fleet116 (the h5 hunt, 2026-12-03, made by hand: max_spot_fraction
  and a budget binding together; on main too): of t1's two identical jobs on twin spot hosts, the plan ran the one its
  guarantee does not hold and stopped the guaranteed one, claiming its "guarantees kept" tier at 14 where the plan
  keeps 7 (its test). fleet117 (the same hunt: identical jobs on hosts that are no twins; on main too): the model
  counted any kept job of a protected job's class of identical jobs as it, so CP-SAT stopped t1's guaranteed j0 to
  delete its instance and kept the unguaranteed j2, claiming the tier at its bound; the model counts a protected job
  kept per host now (objective.protected_kept), and the plan moves j0 into j2's room (its test).
  fleet118 (the slow property tier, 2026-12-03, seed 3333; on main too): greedy kept the idle on-demand host cheapest per
  GPU for the spot share, which mended nothing and took a pool's last slot, and gave up t1's guaranteed j2's spot
  host (its test). fleet122, fleet123 (the h5 guarantee sweep, tests/test_guarantee_sweep.py, 2026-12-03; on main too):
  t2's critical job took the host of t1's guaranteed job while t1's borrowed twin ran on (CP-SAT's answer; the net
  fell back to greedy's); both plans stopped t1's guaranteed job and kept its twin, CP-SAT's emitted with the tier
  claimed short (its tests). fleet120 (h2, 2026-12-03, trace33's shape at three jobs): under a
  lowered max_spot_fraction greedy keeps the spot hosts and buys idle on-demand ballast where moving the spot-eligible
  work into free on-demand room is cheaper; greedy's own plan moves it now, CP-SAT's warm start does not (its test). fleet121
  (the same session): greedy's ballast bought the cheapest single offer that mends the share alone where two small
  ones were cheaper (its test).
  fleet124 (s34-repair, 2026-12-03, made by hand: trace33's repair at 60 CPU jobs): pool p at its max 24, its jobs
  filling 24 m6i.4xlarge in sum but needing 27; the repair stage found no answer on 27 (the pool's max) nor a packing
  on 24, and its search again left the 12 jobs packed past the count pending, so greedy's plan was emitted. The items
  packed past the count may now go elsewhere (`strategy.placed_elsewhere`: pool q), every tier held (its test).
  fleet125 (the same session): fleet124 with the 12 small jobs running on 6 m6i.2xlarge of pool q, whose type q no
  longer allows: the items past the count were running jobs the answer moved, as on trace33 (its test).
  fleet119 (the h10 session, 2026-12-03, made by hand: fleet117 without its budget, and t3's A100 job
  in a part of its own; on main too): where one independent part fell back to greedy best-fit, the whole answer was
  called greedy's, and the other part's CP-SAT answer, which stopped t1's guaranteed j0, was emitted unchecked with its
  tiers claimed proven (its test).
  fleet127, fleet128 (the h7 hunt, 2026-12-03, random fleets with pool minimums under lowered budgets; on main too): a
  pool minimum the budget holds only on spot, where the spot share (fleet127) or spot diversity (fleet128) refuses
  spot alone: no plan keeps every rule, the model was infeasible and greedy's plan deleted the instance that met the
  minimum, which `apply --plan` refused. Load refuses such a config now, with a bound on what the minimums cost under
  the spot rules (its tests). fleet129 (the same hunt): greedy bought no spot for a spot-only pool's minimum under an
  on-demand buffer (its restraint on spot), and the answer under the minimum beat its spot-first pass's on cost; the
  minimums met rank first now (its test). fleet130, fleet131 (the same hunt's last two, 2026-12-03): greedy left a pool
  minimum unmet where CP-SAT meets it: an `either` pool's minimum bought on-demand took the one slot a spot-only
  pool's minimum needed for its second spot zone (fleet130), and under a budget each minimum was owed its on-demand
  price where greedy meets it on spot too, more than the budget before anything was bought (fleet131). fleet132 (s35's
  stable-run hunt): every plan was refused as stopping a guaranteed job that a tenant's own broken ceiling, through its
  spot share, requires stopping (its test). fleet133 (the same hunt): greedy's plan launched into a Reservation past its
  count (a Reservation's hosts not opened yet now hold its room). fleet134 (s36, a second public trace converted:
  Alibaba's DLRM serving trace, bench/dlrm.py): greedy gave one tenant all the borrowed room where the fair-share tier
  splits it (its test). fleet135 (the same trace's plans, all greedy's, reduced): a pool at its max_instances modelled
  in sum, whose counts did not pack (memory per instance), is counted instance by instance now (its test). fleet126
  (s36's slow property tier): greedy held a tenant's protected job back for its own waiting higher class that could
  not take its room, and another tenant's work took it; fixed with fleet140's greedy plan (their tests). fleet141 (s37's
  slow property tier): greedy held a tenant's protected job back for its own higher class until its own turn; that
  class found no room and another tenant's new job took the protected job's slot. Such a job is placed first now and
  gives way only while the higher class is asked (its test; tests/test_greedy_preemption.py). fleet142 (s38's slow
  property tier): a protected job a pool's max kept out found no room; another tenant's higher class then stopped its
  own tenant's protected job (lawful), and new work took the room that freed. A protected job waiting for room is asked
  again as soon as a stop frees some (its test; tests/test_greedy_preemption.py). fleet143 (s38's
  guarantee sweep past its 200 seeds): the sweep held CP-SAT's first answer, which counts a stand-in wherever it lands,
  to its claim; the emitted plan's was true (its test). fleet144 (the same sweep): greedy reclaimed a borrowed twin's
  room by host name, stopping the guaranteed job of two identical ones (its test). fleet145 (s38's hand attack): greedy
  reclaimed a borrowed normal job's host before its tenant's low job's, then moved it there (its test). fleet146 (s38's
  lifecycle machine, greedy alone): greedy's plan right after an apply moved a running job, naming no rule: its pass
  moving spot work ran on the kept fleet's reading of the share, no rule broken as the fleet ran (its test). fleet147
  (the same machine, greedy alone): greedy's first plan placed a low job and left its tenant's normal gang out;
  the plan right after stopped the low job, protected, for the gang, which borrows beside it: a higher class takes a
  lower one's place inside the guarantee only (its test). fleet148
  (s38's slow property tier): greedy gave up the spot host of a guaranteed job to mend the on-demand buffer (open)."""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import pytest

from providers.base import Instance
from tests.test_properties import Fleet, check_fleet, solve_both
from tests.test_truth import check_reasons

FINDINGS = Path(__file__).parent / "data" / "findings"


# The findings' deadlines are dates the exploration drew on the day it ran, and the plans read the real clock: from
# 2026-12-04 every one would be past, and the finding's jobs no deadline work at all. Each is moved as far as the clock
# has since this instant, so it stays as far ahead of the plans as it was then.
RECORDED = datetime(2026, 11, 29, 12, tzinfo=timezone.utc)


def fleet(name: str) -> Fleet:
    import datetime as dt

    f = eval((FINDINGS / f"{name}.txt").read_text(), {"Fleet": Fleet, "Instance": Instance, "datetime": dt})  # noqa: S307 - our own test data
    shift = datetime.now(timezone.utc) - RECORDED
    for d in f.docs:
        if d["kind"] == "Job" and isinstance(d["spec"].get("deadline"), datetime):
            d["spec"] = {**d["spec"], "deadline": d["spec"]["deadline"] + shift}
    return f


def test_greedy_keeps_a_protected_job_when_the_on_demand_buffer_breaks():
    check_fleet(fleet("fleet11"), time_limit=5)


def _fleet11_planned(docs=None):
    """fleet11 planned as the CLI plans it: (desired, observed, planned), where planned(desired, problem=None) returns
    (problem, solution, plan), with the problem built from the config unless one is given."""
    import tempfile
    from dataclasses import replace

    from reconciler.load import load
    from reconciler.plan import make_plan
    from reconciler.problem import build_problem
    from reconciler.solve import solve
    from tests.fleetkit import catalog_observed, write_config

    f = fleet("fleet11")
    with tempfile.TemporaryDirectory() as d:
        desired = load(write_config(Path(d), docs or f.docs))
    observed = replace(catalog_observed(desired, f.instances, f.placements), gpu_indices=f.gpu_indices)

    def planned(desired, problem=None):
        problem = problem or build_problem(desired, observed)
        solution = solve(problem, time_limit=4, workers=1)
        return problem, solution, make_plan(desired, observed, problem, solution)
    return desired, observed, planned


def test_a_job_runs_beside_the_instance_the_buffer_keeps_idle():
    """fleet11: j6 (1 A100-80GB) fits only Standard_NC24ads_A100_v4 in az-a100-80 (on-demand, max 2), whose
    instance is also where the on-demand buffer's idle GPU is cheapest. The problem offered one instance there (sized
    to the work that fits it; room for idle buffer instances only where the other on-demand offers' could not hold
    them), the plan (OPTIMAL) kept it idle and left j6 pending. The offer now also has a ballast instance
    (capacity.size_offers): the plan buys two, one runs j6 and the other stands idle."""
    desired, _, planned = _fleet11_planned()
    problem, solution, plan = planned(desired)
    (o,) = [o for o in problem.offers() if o.pool == "az-a100-80"]
    assert (o.max_new, o.ballast) == (2, 1)
    j6 = next(j for j in plan.jobs if j.job == "j6")
    assert j6.action == "place", j6.reason
    assert sorted((c.instance_type, c.market) for c in plan.creates) == [("Standard_NC24ads_A100_v4", "on-demand")] * 2


def test_a_job_an_offers_size_keeps_out_is_told_so_and_explain_agrees():
    """Where the problem offers fewer new instances than the rules allow (here fleet11's problem with its A100-80GB
    offer sized as before size_offers gave it ballast: one instance, the buffer's), the pending job's reason says
    so, not "the solver did not find that placement" (not true of the plan: the problem offered no such
    placement), and explain prints the same reason."""
    from dataclasses import replace

    from reconciler.explain import explain_job

    desired, observed, planned = _fleet11_planned()
    problem, _, _ = planned(desired)
    caps = tuple(replace(c, max_new=1, ballast=0) if c.pool == "az-a100-80" else c for c in problem.capacities)
    problem, solution, plan = planned(desired, replace(problem, capacities=caps))
    j6 = next(j for j in plan.jobs if j.job == "j6")
    assert j6.action == "pending" and "the solver did not find" not in j6.reason, j6.reason
    assert [(c.ref, c.instance_type, c.market) for c in plan.creates] == [("+1", "Standard_NC24ads_A100_v4", "on-demand")]
    assert ("but the planner offers at most 1 new Standard_NC24ads_A100_v4 on-demand there (an offer is sized to the work that "
            "fits it) and this plan's +1 stands idle for the on-demand buffer (25% of the spot GPUs)") in j6.reason, j6.reason
    e = explain_job("j6", desired, observed, problem, plan, lambda d: planned(d)[2])
    assert e.summary == f"pending: {j6.reason}"


def test_cp_sat_keeps_each_tenants_spot_share():
    """Fixed: the packer dropped t2's 4-GPU job the solver had counted, leaving t2's spot job over its share;
    the plan now takes that spot job out too (plan/tenant_spot.py, settle_tenant_spot; tests/test_rules.py has it reduced)."""
    check_fleet(fleet("fleet12"), time_limit=5)


def test_an_evicted_gangs_reason_names_what_binds():
    """Fixed: under WhenEmpty the gang may only stay or stop, so its reason is WhenEmpty and what the running fleet
    breaks (here the pool over max_instances, spot diversity and the spot share), not a pool limit whose lift would
    not place it (the model never offers it a move)."""
    check_reasons(fleet("fleet13"))
    from tests.test_truth import _plan_docs

    f = fleet("fleet13")
    _, plan = _plan_docs(f.docs, f)
    j4 = next(j for j in plan.jobs if j.job == "j4")
    assert j4.action == "evict"
    assert j4.reason.startswith("evicted: under consolidation: WhenEmpty a running gang stays where it runs or stops, never moves"), j4.reason
    assert "pool aws-a100 has 2 instances, over its max_instances" in j4.reason
    assert "the fleet is 100.0% spot, over max_spot_fraction 0.25" in j4.reason


def test_greedy_settles_spot_in_finite_time_on_fleet14():
    """fleet14 (16 documents, 7 running instances; t1 may not run on spot and runs j4, j5 there): `reconcile plan`
    hung in greedy.settle_spot, the warm start, before any wall-clock cap applies. Releasing j4's host left a zero in
    greedy's stay counts, which still ranked the emptied host (reopened for spot diversity) as the one to release,
    and releasing an empty host changed nothing. Run in a child so a hang is a failure, not a stuck run."""
    import subprocess
    import sys

    code = ("import os; os.environ['FLEETOPS_SIM_AGENTS'] = '0'\n"
            "from tests.test_open_findings import fleet\nfrom tests.test_properties import check_fleet\n"
            "check_fleet(fleet('fleet14'), time_limit=5)\n")
    try:
        subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parent.parent, check=True, timeout=120)
    except subprocess.TimeoutExpired as e:
        raise AssertionError("planning fleet14 did not end within 120 s") from e


def test_a_same_instance_gang_running_split_is_not_protected_on_fleet15():
    """fleet15 (one p4d pool at max 1, two p4d running; t1, no quota, runs the 3 x 2-GPU `gang: instance` j5 split over
    i0 and i1 and three 1-GPU jobs on i0): j5 must move whole, so it is new work, not running work its guarantee
    protects. The problem still protected it (a same-instance gang is one item of `bundle` replicas, and the split
    test asked `d.gang`, false for it), so CP-SAT counted moving j5 as a guarantee kept and evicted the protected j2
    for it; greedy kept j2, j3 and j4 and ranked better."""
    import tempfile
    from dataclasses import replace

    from reconciler.load import load
    from reconciler.problem import build_problem
    from tests.fleetkit import catalog_observed, write_config

    f = fleet("fleet15")
    with tempfile.TemporaryDirectory() as d:
        desired = load(write_config(Path(d), f.docs))
    problem = build_problem(desired, replace(catalog_observed(desired, f.instances, f.placements), gpu_indices=f.gpu_indices))
    assert problem.tenants["t1"].protected_jobs == ("j2", "j3", "j4")
    check_fleet(f, time_limit=5)


def test_apply_accepts_stopping_spot_work_that_only_an_instance_that_must_go_kept_diverse_on_fleet16():
    """fleet16: spot diversity asks for 2 instance types and 2 zones; the fleet as it runs has them only through i0,
    a spot instance in azure, which the GuardrailPolicy no longer allows. Without i0 every spot instance left is one
    n2-standard-16 in us-central1-a, so no spot work can stay, and both plans stop t3's j10 (spot: required), inside
    its guarantee. Apply's re-check refused that ('evicted, but it runs inside tenant t3's guarantee and no rule
    requires stopping it'), and would have refused keeping it too (diversity, which the fleet as it runs keeps): it
    read the rules the fleet breaks now off the fleet with i0. It reads them off the fleet that can stay as well."""
    check_fleet(fleet("fleet16"), time_limit=5)


def test_no_move_to_an_identical_instance_for_a_split_gang_on_fleet17():
    """fleet17: j4 (3 x 2-GPU, gang: instance) runs split over the p4d i0 and i1 (us-east-1b, on-demand; pool at max
    1). CP-SAT deleted both and bought +1, the same p4d in the same zone, for j4 and j13. keep_identical keeps a
    deleted instance instead of its new twin only for jobs that run on it whole (their recorded GPUs), and a split
    gang runs whole nowhere, so j4 moved from i0 and i1 to an identical instance. Now any job that ran on the deleted
    instance is enough: i0 stays, with j4 and j13."""
    check_fleet(fleet("fleet17"), time_limit=5)


def test_greedy_reserves_for_a_pool_minimum_what_it_may_open_on_fleet18():
    """fleet18: aws-cpu must keep 1 instance (min_instances), a $15/h budget, an on-demand buffer of 25% (so greedy
    opens no idle spot host, its own restraint). Under a budget greedy holds back the cheapest instance of each unmet
    pool minimum, and it priced aws-cpu's at the spot i0 ($0.29/h) it then would not open: it kept the $14.69/h i1,
    and the on-demand m6i ($0.77/h) no longer fit the budget. Its answer broke the pool minimum, CP-SAT could not
    complete it, and that answer was the plan. The floor is now the cheapest instance greedy may open for it."""
    check_fleet(fleet("fleet18"), time_limit=5)


def test_greedy_keeps_a_protected_mig_placement_group_gang_on_fleet19():
    """fleet19: t1's protected j4 (2 x MIG 2g.20gb, gang: placement-group) runs on i1 (spot) and i2 (on-demand) of
    az-mig, one zone and one type, the pool at its max_instances 3/3. Greedy kept a placement-group gang only on one
    offer (pool, zone, type and market), so it re-placed j4 and, the pool full, evicted it: 'pools at max_instances
    (az-mig 3/3); the job needs 2 new instances'. A gang's rule is problem.gang_split's (one zone; one type for a
    placement group), read now by greedy's keep and heal and by the model, whose placement-group site was the offer
    too (it could not complete greedy's answer once greedy kept j4). Greedy keeps j4 where it runs; CP-SAT moves
    i2's replica onto a new spot instance of i1's offer and deletes i2 and the idle i3, which pays."""
    from tests.test_properties import solve_both

    f = fleet("fleet19")
    check_fleet(f, time_limit=5)
    _, _, (solution, plan), (_, gplan) = solve_both(f, time_limit=5)
    assert next(j for j in gplan.jobs if j.job == "j4").action == "keep"
    assert solution.status == "OPTIMAL" and next(j for j in plan.jobs if j.job == "j4").action != "evict"


def test_a_fleet_that_needs_a_second_spot_zone_may_buy_one_idle_spot_instance_there():
    """fleet20 (the pending-reason tier, 2026-11-26 evening): min_zones 2, t2's j5 and j1 (1 A100-80GB each) fit a
    spot Standard_NC24ads_A100_v4 (pool max 1), and an idle spot g5.xlarge in us-east-1a makes the second zone. j1
    was told 'pools at max_instances'; with that lifted (and t1's A10G job gone) the plan put j5 on on-demand and
    left j1 pending over t2's $5 budget, "OPTIMAL": sized to the work that fits it, the g5 offer was offered 0
    times, so no spot could be used at all. A spot offer may now stand for one idle instance where the SpotPolicy
    asks for diversity."""
    check_reasons(fleet("fleet20"))


def test_cp_sat_does_not_move_work_the_cheaper_plan_of_the_same_rank_keeps():
    """fleet21 (the slow property tier on final main, 2026-11-26 18:10): pool aws-a100 (us-east-1a/b, max 1) runs
    j12 (1 GPU) on the p4d i0 in us-east-1b. CP-SAT's plan, OPTIMAL at gap 0, deleted i0 and bought an identical p4d
    in us-east-1a for j12 and six jobs ($2 of restarts, $25.71/h as the README counts it); greedy's kept i0 and,
    backfilling j2 onto it, reached the same rank at $25.63/h. The cause: the model offered j2 (2 GPUs, nvlink) no
    room on i0, as NVLink work went only where no GPU is taken, so keeping i0 placed 49 work units where the move
    placed 63. On a p4d one NVLink domain spans every GPU (Capacity.one_nvlink_domain), so j2 may join j12 there
    (tests/test_gpu_indices.py has the rule in plain data). It passed on main too once the pool's small offers were
    modelled instance by instance (solve/slots.py) and a new twin of a deleted instance in the pool's other zone may
    give it back (plan/stability.zone_free)."""
    check_fleet(fleet("fleet21"), time_limit=5)


def test_a_same_instance_gang_placed_where_it_runs_keeps_its_gpus_on_fleet23():
    """fleet23 (the slow property tier on this branch, 19:45): t1's j12 (2 x 2 GPUs, gang: instance) runs on the
    p4d i3 at GPUs (0, 1), (2, 3). Greedy's answer places it anew on i3 (an item placed on its own host, not one
    that stays; t1 runs far over its 4-GPU quota), and the plan says keep; the packer gave a running item its own GPUs back only when
    it was one replica, so j12 got (6, 7), (0, 1) and a 'keep' that restarts it on other GPUs (the oracle: running
    replicas keep theirs). It now takes back every replica's GPUs of the item where they are free."""
    check_fleet(fleet("fleet23"), time_limit=5)


def test_another_tenants_work_takes_no_protected_jobs_room_on_fleet22():
    """fleet22 (the slow property tier on this branch, 2026-11-26 19:23): pool gcp-cpu (n2-standard-16, max 2) runs
    t1's low j4, j5, j11 (4 vCPU each, protected: t1 has no quota) on the on-demand i0 and t1's normal j6 (12 vCPU,
    spot: never) on the spot i1, which it must leave; t2's normal j12 (12 vCPU) is pending. Two instances hold 32
    vCPU; t1's work is 24, j12 12, so j12 runs only if a t1 job stops. Greedy keeps j4, j5, j11, moves j6 to a new
    on-demand instance and leaves j12 pending. CP-SAT (OPTIMAL) evicts j5 and places j12: in the guarantee tier
    (objective.guarantees_tiers) t1's protected low units are covered by those kept or by t1's new higher-class
    work, and j6, running but not protected (it must move), counts as new normal work, so t1's guarantee reads 3 of
    3 with j5 gone; the next tier, guaranteed normal work, then prefers placing j12. The oracle's check_stability
    does not accept a running job that moves as the higher class that displaced j5 (only pending or changed
    work), while its ranking (_guarantee_kept) did, as the model did: the stand-in was counted whether or not j6
    needed j5's room. Fixed by a second guarantee tier (objective.guarantees_tiers, TenantRules.moving_jobs):
    t1's running work kept, j6 counted as its own unit wherever it runs, so evicting j5 keeps 3 of 4 there.
    (No running job as a stand-in in the first tier also passed here but failed tests/test_stability.py's
    split-gang test: the model cannot tell in aggregate whether the moving job needed the protected job's room.)"""
    import tempfile
    from dataclasses import replace

    from reconciler.load import load
    from reconciler.problem import build_problem
    from tests.fleetkit import catalog_observed, write_config
    from tests.invariants import moving_jobs, protected_jobs

    f = fleet("fleet22")
    with tempfile.TemporaryDirectory() as d:
        desired = load(write_config(Path(d), f.docs))
    observed = replace(catalog_observed(desired, f.instances, f.placements), gpu_indices=f.gpu_indices)
    t1 = build_problem(desired, observed).tenants["t1"]
    assert (set(t1.protected_jobs), t1.moving_jobs) == ({"j4", "j5", "j11"}, ("j6",))
    assert (set(protected_jobs(desired, observed, "t1")), moving_jobs(desired, observed, "t1")) == ({"j4", "j5", "j11"}, ["j6"])
    check_fleet(f, time_limit=5)



def test_apply_accepts_an_eviction_that_an_unmet_pool_minimum_needs_under_the_budget_on_fleet25():
    """fleet25 (the slow property tier on main, 2026-11-26 22:50): t1's low j2 (2 x A100, protected: t1 has no quota)
    runs on i0, an a2-highgpu-4g ($14.69/h); aws-cpu asks for min_instances 1 (an m6i.4xlarge) and the fleet has none;
    max_hourly_budget is $15. Buying the minimum leaves no budget for i0, so both planners stop j2 (and run j0 on an
    a2-highgpu-1g). The oracle accepts it (the fleet as it runs breaks a pool rule); `apply --plan`'s re-check refused
    it: ledger.broken_rules named a pool over its maximum but not one under its minimum."""
    check_fleet(fleet("fleet25"), time_limit=5)


def test_cp_sat_plans_from_its_own_start_where_greedys_answer_breaks_a_pool_minimum_on_fleet26():
    """fleet26 (the slow property tier on main, 2026-11-26 23:12): aws-cpu (min 1, max 1) has only i0, a spot
    m6i.4xlarge that spot diversity (min_zones 2) cannot keep; gcp-a100's a2-highgpu-4g ($14.69/h) runs t1's j10;
    max_hourly_budget $15. Greedy gave up i0 and could not buy an on-demand m6i ($0.77/h) under the budget: its answer
    left the pool under its minimum, CP-SAT could not complete it, and the plan was that answer ("CP-SAT could not
    complete greedy's answer"). Where the completion is proven infeasible CP-SAT now starts from its own answer,
    greedy's as a hint only (tried on 2026-11-26 and reverted: the 1k fleet under a $6,000 budget failed to complete
    a valid answer then, the budget being two rules; one rule since). The plan: an on-demand m6i for j1, j10 moved
    to an a2-highgpu-1g."""
    from tests.invariants import check_plan, check_stability
    from tests.test_properties import solve_both

    desired, observed, (_, plan), _ = solve_both(fleet("fleet26"), 5)
    assert plan.solver.status != "GREEDY_FALLBACK", plan.solver.note
    check_plan(desired, observed, plan)
    check_stability(desired, observed, plan)
    assert {(c.site.pool, c.site.instance_type, c.site.market) for c in plan.creates} == {
        ("aws-cpu", "m6i.4xlarge", "on-demand"), ("gcp-a100", "a2-highgpu-1g", "on-demand")}


def test_greedys_plan_keeps_the_pool_minimum_on_fleet26():
    """Greedy's own plan (--time-limit 0, and the fallback) on fleet26 released i0 and bought nothing for the pool's
    minimum: it had to give up the a2-highgpu-4g for a smaller instance to afford it, which it did not try. Now
    greedy.pool_minimums gives up the kept host whose work ranks lowest where the budget alone refuses the minimum
    (`_give_way`), and places its job anew: j10 on an a2-highgpu-1g."""
    from reconciler.problem import build_problem
    from tests.invariants import check_plan, check_stability
    from tests.test_properties import recheck, solve_both

    desired, observed, _, (_, gplan) = solve_both(fleet("fleet26"), 5)
    check_plan(desired, observed, gplan)
    check_stability(desired, observed, gplan)
    assert recheck(gplan, desired, observed, build_problem(desired, observed))[1] == []
    assert {j.job: j.action for j in gplan.jobs if j.action != "pending"} == {"j1": "move", "j10": "move"}


def test_apply_refuses_a_plan_that_leaves_a_pool_under_its_minimum_on_fleet26():
    """`apply --plan` of a plan that leaves aws-cpu under its minimum (fleet26's plan without its m6i, j1 stopped:
    what greedy's plan was) is refused with the pool named: the re-check had checked pool maximums only."""
    from dataclasses import replace

    from reconciler.problem import build_problem
    from tests.test_properties import recheck, solve_both

    desired, observed, _, (_, gplan) = solve_both(fleet("fleet26"), 5)
    m6i, a2 = sorted(gplan.creates, key=lambda c: c.site.pool != "aws-cpu")
    one = replace(a2, ref=m6i.ref, key=m6i.key)  # (the creates are numbered: the a2's becomes the first)
    jobs = tuple(replace(j, action="evict", instances=(), gpus=(), reason="") if j.job == "j1" else
                 replace(j, instances=(one.ref,)) if j.job == "j10" else j for j in gplan.jobs)
    broken = replace(gplan, creates=(one,), jobs=jobs)
    refused = recheck(broken, desired, observed, build_problem(desired, observed))[1]
    assert refused == ["the plan breaks a rule the fleet keeps now: pool aws-cpu has 0 instances, under its min_instances 1"]


def test_no_job_stands_in_for_a_protected_one_under_preemption_never_on_fleet27():
    """fleet27 (the slow property tier on main, 2026-11-26 23:12; also on the session's first main): preemption: Never;
    t1 (no quota: all it runs is guaranteed) runs low j1 (spot: required, so it must leave the on-demand i0) and low j2
    on i0. Moving j1 to a new spot instance makes the on-demand buffer (50%) ask for idle room on i0 that j2 holds.
    CP-SAT (OPTIMAL) evicted j2 and placed t1's new normal j10: the guarantee tier counted j10 as the higher class that
    took j2's place, which preemption: Never does not allow. Now nothing stands in under Never (objective.protected_tier,
    and the oracle's ranking alike): j2 stays."""
    check_fleet(fleet("fleet27"), time_limit=5)

def test_lifting_the_named_limit_places_the_job_on_fleet24():
    """fleet24 (the slow reason tier on main, 2026-11-26 22:45; also on the session's first main, b6e3c92): SpotPolicy
    on_demand_buffer_percent 50 with spot A10G/A100 capacity; j3 (1 x A100-80GB) fits only az-a100-80
    (Standard_NC24ads_A100_v4, on-demand, max 1). The plan keeps that one instance idle for the buffer and says j3
    waits for "pools at max_instances (az-a100-80 1/1); other capacity is blocked by the on-demand buffer". Lifted to
    max 2, the plan (OPTIMAL) still left j3 pending: "the planner offers at most 1 new Standard_NC24ads_A100_v4
    on-demand there ... and this plan's +2 stands idle for the on-demand buffer". The cause was
    problem/capacity._ballast_bound: an on-demand offer got room for idle buffer instances beyond its items' bound
    only when all on-demand offers' bounds together could not hold the idle capacity; here the p4d offers' bounds could,
    but the optimum bought the idle GPU where it is cheapest, on the A100-80GB offer, whose one instance j3 needed. So
    the sized problem was not a relaxation of the config and its "OPTIMAL" was not the config's. Now every on-demand
    offer may hold the whole idle need (capacity.size_offers: `ballast`, instances that get no per-instance slots), so
    lifted to max 2 the plan buys both and j3 runs."""
    check_reasons(fleet("fleet24"))


def test_each_pending_reason_on_fleet28_names_a_limit_that_lifted_alone_places_the_job():
    """fleet28: an A10G job pending beside its offer's one instance, which the plan kept idle for the on-demand buffer
    (the reason blamed the offer's size, which the optimum had spent on the buffer). Since every on-demand offer may
    hold the buffer's idle need (capacity.size_offers), every reason names a limit that lifted alone places the job."""
    check_reasons(fleet("fleet28"))


def test_the_plan_after_apply_evicts_no_job_for_its_own_class_on_fleet30():
    """fleet30 (audit of main, 2026-11-29, from a 60-job scenario of its own): one tenant, vision (20 GPUs guaranteed,
    burst 30, tenant_hourly_budgets $80), eleven jobs. The cold plan (OPTIMAL) runs normal j0058 (4 x A100) and leaves
    normal j0037 (2 x A100) pending on the tenant budget: 28 units of normal work where j0037 gives 14. Applied and
    planned again unchanged, the plan (OPTIMAL) evicts j0058 and places j0037: a running job stopped for pending work
    of its own class and tenant, which the README's "Priorities" forbids ("a running job is never evicted for work of
    its own class"), and the plan right after an apply is not a no-op.
    Cause: after the apply the guarantee's protected jobs (problem.tenants._fill: highest priority first, then by
    name) were the high jobs (16 GPUs), j0001 (1 GPU) and the MIG j0033, not j0014 (4 GPUs: 21 > 20), so 3 GPUs of the
    guarantee were left that no running normal job fit; the tier "guaranteed normal work" filled them with j0037 (the
    protected tier holds j0001 in the guarantee), the budget made room by stopping j0058, which counted as borrowed,
    and "borrowed running normal jobs kept" came after. The cold plan put j0014 in the guarantee instead (no running
    work, no protected set). With a tier against stopping a tenant's running work for its own new work of that class
    (objective.swaps_tier) the plan evicted the low MIG j0033 for j0037 instead (a higher class of its tenant may);
    with the protected set filled largest first within a class (j0014, as the applied plan had), the plan is a
    no-op. tests/test_stability.py has the same-class case on its own (a new job of a tenant, a running one stopped).
    The oracle lets both through (check_stability: j0058's tenant borrows and j0058 is not protected); the
    property's no-op after apply does not."""
    from tests.test_properties import check_stable_run

    check_stable_run(fleet("fleet30"), [], None)


def _cp_sat_plan(f, time_limit: float = 5, lost: dict | None = None):
    """(desired, observed, problem, plan): CP-SAT's plan of fleet f as make_plan packs it (the API's fallback to
    greedy's plan not applied); `lost`: each job's instances that vanished (a spot interruption, as observe says)."""
    import tempfile
    from dataclasses import replace

    from reconciler.load import load
    from reconciler.plan import make_plan
    from reconciler.problem import build_problem
    from reconciler.solve import solve
    from tests.fleetkit import catalog_observed, write_config

    with tempfile.TemporaryDirectory() as d:
        desired = load(write_config(Path(d), f.docs))
    observed = replace(catalog_observed(desired, f.instances, f.placements), gpu_indices=f.gpu_indices, lost=lost or {})
    problem = build_problem(desired, observed)
    return desired, observed, problem, make_plan(desired, observed, problem, solve(problem, time_limit=time_limit, workers=1))


def test_the_packer_leaves_over_the_least_important_work_on_fleet29(monkeypatch):
    """fleet29 (audit of main, 2026-11-29, from a 500-job scenario after a spot interruption; reduced): gcp-cpu (spot
    n2-standard-16: 16 vCPU, 64 GiB) runs nlp's critical j0449 (4 vCPU, 16 GiB) on i78; i76 and i77 are idle. CP-SAT
    deletes i78 and puts j0449, infra's j0369 (priority 5: 4 vCPU, 60 GiB) and two more on the two idle instances,
    which hold them only in sum (the idle class's row is summed over its instances). The packer, host by host, left
    j0449 over on i76 beside j0369: its greedy pass's leftovers were not traded up (only the filling pass's were),
    so the plan evicted a critical job inside its tenant's guarantee for a low one, `apply --plan` refused the plan
    (and, on the scenario's 500 jobs, every plan after it). Now j0449 takes j0369's place; j0369 waits.
    The repair stage no longer hands the packer that answer (strategy.idle_repair: the next test), so the packer is
    asked here with the idle repair left out, as it was asked then."""
    from reconciler.plancheck import recheck
    from reconciler.solve import strategy
    from tests.invariants import check_plan, check_stability

    monkeypatch.setattr(strategy, "idle_repair", lambda search, sol, hint, lb, reports: (sol, hint))
    desired, observed, problem, plan = _cp_sat_plan(fleet("fleet29"), time_limit=15)
    check_plan(desired, observed, plan)
    check_stability(desired, observed, plan)
    assert recheck(plan, desired, observed, problem)[1] == []
    acts = {j.job: j.action for j in plan.jobs}
    assert (acts["j0449"], acts["j0369"]) == ("move", "pending"), acts


def test_the_solver_places_on_idle_instances_only_what_packs_on_fleet29():
    """Fixed: fleet29's CP-SAT answer placed four jobs on the two idle n2-standard-16 (i76, i77) and deleted i78: 24
    of 32 vCPU and 108 of 128 GiB in sum, but j0369 (60 GiB) fills one alone and the other three need 20 vCPU of 16,
    so one job the solver placed was left over ('the CP-SAT plan runs 1101, its solution placed 1106'), though
    keeping i78 places all four. Idle instances of one offer are one class whose row is summed over its instances
    (Scale, 'Idle instances as a class'), and the repair stage repacked only new instances of offers. Now, where the
    planner's packing of an idle class leaves items over, the repair stage gives that class per-instance rows
    (slots.extend_idle_slots) and searches the answer again around it, every other placement held
    (strategy.idle_repair): here it keeps i78, where j0449 stays, and all four jobs run (the cost $0.494/h ->
    $0.726/h, the tiers as before)."""
    check_fleet(fleet("fleet29"), time_limit=15)
    desired, observed, problem, plan = _cp_sat_plan(fleet("fleet29"), time_limit=15)
    acts = {j.job: (j.action, j.instances) for j in plan.jobs}
    assert acts["j0449"] == ("keep", ("sim-gcp-00078",)), acts["j0449"]
    assert all(acts[j][0] == "place" for j in ("j0369", "j0404", "j0428")), acts
    assert plan.deletes == ()


def test_an_idle_class_gets_a_row_for_each_of_its_hosts_on_fleet29_at_40_times_its_size():
    """fleet29 40 times over (160 jobs; 80 idle hosts, 40 hosts each running a critical job): the answer keeps 50 of
    the 80 idle hosts and puts there 80 items that pack only on more of them. With rows for the 50 kept hosts alone
    the repair's best left 30 jobs pending (greedy placed all 160 and ranked above); with a row for each of the 80
    (slots.extend_idle_slots) every job runs."""
    import copy
    from dataclasses import replace

    f, k = fleet("fleet29"), 40
    docs = []
    for d in f.docs:
        if d["kind"] == "Job":
            docs += [{**copy.deepcopy(d), "metadata": {"name": f"{d['metadata']['name']}-{c}"}} for c in range(k)]
        elif d["kind"] == "Pool" and d["metadata"]["name"] == "gcp-cpu":
            docs.append({**d, "spec": {**d["spec"], "max_instances": 16 * k}})
        else:
            docs.append(d)
    insts = [replace(base, id=f"sim-gcp-{3 * c + i:05d}") for c in range(k) for i, base in enumerate(f.instances)]
    check_fleet(Fleet(docs, insts, {f"j0449-{c}": (f"sim-gcp-{3 * c + 2:05d}",) for c in range(k)}, {}), time_limit=15)


def test_apply_accepts_a_gang_healed_in_a_lower_jobs_room_on_fleet31():
    """fleet31 (audit of main, 2026-11-29, seen on a 500-job scenario after a spot interruption): tenant t (no quota:
    all it runs whole is protected) runs low l (2 x A100) and one replica of its critical gang g (2 x 2 A100) on i0,
    an a2-highgpu-4g, the pool's only allowed instance; g's other replica's instance is gone. The plan heals g around
    its survivor, on i0, and stops l: a higher class of its own tenant, as the README allows and the oracle accepts.
    `apply --plan` refused it ("evicted, but it runs inside tenant t's guarantee and no rule requires stopping it"):
    the re-check counted as arriving work only a job placed anew or restarted in a new shape, not a gang that does
    not run whole now (healed or grown), which the planner counts as new work."""
    from reconciler.plancheck import recheck
    from tests.invariants import check_plan, check_stability

    desired, observed, problem, plan = _cp_sat_plan(fleet("fleet31"), lost={"g": ("i9",)})
    check_plan(desired, observed, plan)
    check_stability(desired, observed, plan)
    acts = {j.job: (j.action, j.reason) for j in plan.jobs}
    assert acts["g"] == ("move", "replaces i9: gone (spot interruption or lost capacity)") and acts["l"][0] == "evict", acts
    assert recheck(plan, desired, observed, problem)[1] == []


def test_a_packed_plan_that_takes_a_guarantee_ranks_below_one_that_keeps_it():
    """api._plan emits greedy's plan where CP-SAT's, once packed, ranks below it (plan.outcome_rank). The rank began
    at the running work per class: a plan that stopped tenant a's protected critical job (1 GPU) and kept tenant b's
    borrowed critical job (2 GPUs) ranked above one that kept a's and stopped b's, against the README's order
    (guarantees first). On the 500-job scenario of fleet29 (before the packer's fix there) the packed CP-SAT plan lost
    a protected job, ranked above greedy's by its running critical work, was emitted, and `apply --plan` refused it."""
    from dataclasses import replace

    from reconciler.plan import outcome_rank
    from tests.fleetkit import doc, instance, job, pool, topology

    docs = [topology(), doc("Tenant", "a", {}), doc("Tenant", "b", {"quota": {"gpus": 0, "burst": {"gpus": 8}}}),
            pool("p", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-4g"], hi=1),
            job("ja", tenant="a", gpus=1, gpu_type="A100", cpu=8, mem=60, priority="critical"),
            job("jb", tenant="b", gpus=2, gpu_type="A100", cpu=8, mem=60, priority="critical")]
    f = Fleet(docs, [instance("i0", "p", "gcp", "us-central1", "us-central1-a", "a2-highgpu-4g")],
              {"ja": ("i0",), "jb": ("i0",)}, {"ja": ((0,),), "jb": ((2, 3),)})
    _, observed, problem, plan = _cp_sat_plan(f)
    assert problem.tenants["a"].protected_jobs == ("ja",) and problem.tenants["b"].protected_jobs == ()

    def stopping(name):
        return replace(plan, jobs=tuple(replace(j, action="evict", instances=(), gpus=(), reason="x") if j.job == name else j
                                        for j in plan.jobs))
    assert outcome_rank(problem, stopping("jb"), observed) > outcome_rank(problem, stopping("ja"), observed)


def test_the_oracle_and_the_planner_protect_the_same_running_jobs_on_fleet32():
    """fleet32: of t3's two running low jobs, which its 4-GPU guarantee cannot both hold, the 4-GPU one is protected
    (the largest first within a class); CP-SAT's plan keeps it and ranks at least as high as greedy's."""
    check_fleet(fleet("fleet32"), time_limit=5)


def test_a_job_a_rule_moves_does_not_hold_back_its_tenants_new_work_on_fleet34():
    """fleet34: t1's running low j0 must leave its instance and has nowhere to go; its tenant's pending low jobs all
    run (j6 on a new m6i.4xlarge), and each pending reason names a limit that, lifted alone, places the job."""
    check_reasons(fleet("fleet34"))


def _cold_apply_replan(f: Fleet, time_limit: float, now=None):
    """Plan `f` cold on the simulated cloud, apply that plan, and plan again unchanged: (first, second) PlanResults."""
    import tempfile

    from reconciler import api
    from tests.fleetkit import write_config

    with tempfile.TemporaryDirectory() as d:
        cfg = write_config(Path(d) / "cfg", f.docs)
        first = api.plan(cfg, time_limit=time_limit, now=now)
        api.apply(cfg, saved_plan=first.plan, time_limit=time_limit, allow_destroy=100)
        return first, api.plan(cfg, time_limit=time_limit, now=now)


def test_the_plan_after_a_cold_apply_moves_nothing_on_fleet36():
    """fleet36 (audit19, 2026-11-29: `bench.generate --jobs 80 --seed 17 --tenants 2 --quota-fraction 0.3 --rules`,
    reduced to 17 jobs; no instances run): the cold plan proves every tier and reports a gap under 0.1%. Applied, the
    unchanged config's next plan moved 3 running jobs (job-00002 "a cheaper packing", job-00034 and job-00037 "its
    instance is removed"), bought one instance and deleted two, for cents an hour, against "the plan right after an
    apply is a no-op". The cold plan's cost stage stopped at an answer within the gap limit of CP-SAT's bound; the next
    plan's consolidate() searched with the holds released (its "already within the gap" test read only the cost LP's
    bound, about 15% below here) and found an answer a few cents an hour cheaper. A saving within the gap limit of
    the held answer's cost is no consolidation now (strategy.consolidate)."""
    first, again = _cold_apply_replan(fleet("fleet36"), time_limit=4)
    assert not first.plan.solver.unproven
    changes = [(j.job, j.action, j.previous, j.instances, j.reason) for j in again.plan.jobs if j.action in ("move", "evict", "place")]
    assert not again.plan.has_changes, (len(again.plan.creates), len(again.plan.deletes), changes)


FLEET37_SHAPES = {"a": {"gpus": 0, "gpu_type": None, "mig": None, "nvlink": False, "cpu": 4.0, "memory_gib": 16.0}}


def test_a_resized_job_takes_no_guarantee_for_its_tenants_spot_share_on_fleet37():
    """fleet37 (audit19, 2026-11-29: a 80-job random fleet after a spot interruption and the edit "change job", reduced):
    i0 (m6i.4xlarge, 16 vCPU, on-demand, its pool at max 1) runs t3's `a` (5 vCPU now; apply recorded it with 4:
    FLEET37_SHAPES) and t4's `b` (12 vCPU); i1 (spot) runs t3's `s`; t3's tenant_max_spot_fraction is 0.5. As the
    fleet runs, t3 is 1 of 2 work units on spot. `a` changed: it restarts in its new shape, which has no room but
    b's, and a job whose resources change waits rather than evict another tenant's guaranteed job (README,
    Stability). Without `a` the share is broken (1 of 1 on spot), so the share may take `s` (README, Spot policy: a
    share the fleet, as it can stay, already breaks). Before: CP-SAT's plan (OPTIMAL) restarted `a` in place and
    evicted t4's `b` ("pools at max_instances": the guarantees tier lost one protected job either way, and the tiers
    below kept more running high work); greedy's kept `b` and stopped `s`, and `apply --plan`'s re-check refused
    both (b: another tenant's guarantee; s: taken for a share the fleet as it ran kept). Every plan of this fleet
    was refused. Now both stop `a` and `s` and keep `b`, and the re-check accepts that; a plan that evicts `b`
    instead is refused (t3's broken share licenses t3's evictions only)."""
    import tempfile
    from dataclasses import replace

    from reconciler.load import load
    from reconciler.plan import make_plan
    from reconciler.plancheck import recheck
    from reconciler.problem import build_problem
    from reconciler.solve import solve
    from tests.fleetkit import catalog_observed, write_config
    from tests.invariants import check_stability

    f = fleet("fleet37")
    with tempfile.TemporaryDirectory() as d:
        desired = load(write_config(Path(d), f.docs))
    observed = replace(catalog_observed(desired, f.instances, f.placements), gpu_indices=f.gpu_indices, shapes=FLEET37_SHAPES)
    problem = build_problem(desired, observed)
    assert problem.tenants["t4"].protected_jobs == ("b",) and "a" not in problem.tenants["t3"].protected_jobs
    for name, tl in (("CP-SAT", 4), ("greedy", 0)):
        plan = make_plan(desired, observed, problem, solve(problem, time_limit=tl, workers=1))
        assert {j.job: j.action for j in plan.jobs} == {"a": "evict", "b": "keep", "s": "evict"}, [(j.job, j.action, j.reason) for j in plan.jobs]
        check_stability(desired, observed, plan)
        assert recheck(plan, desired, observed, problem)[1] == [], name
    taking_b = replace(plan, jobs=tuple(replace(j, action="evict", instances=()) if j.job == "b" else j for j in plan.jobs))
    assert any(e.startswith("job b: evicted, but it runs inside tenant t4's guarantee") for e in recheck(taking_b, desired, observed, problem)[1])


def test_a_tenant_over_its_spot_share_keeps_its_normal_job_before_its_low_ones_on_fleet39():
    """fleet39 (the slow property tier, 2026-11-29, right after fleet37's fix): t1 (tenant_max_spot_fraction 0) runs
    its normal j12 on a spot m6i.4xlarge and its low j10, j11 on the on-demand one; the pool is over its max, so one
    instance goes and j12 must move onto the on-demand one, where only it and one low job fit. Greedy moves j12 and
    stops j11; CP-SAT stopped j12: fleet37's fix had left t1's spot job out of the guarantees tier (its broken share
    may take it), so t1's two low jobs outweighed it. The first tier now leaves out every unit of a tenant over its
    spot share (so it never ties with another tenant's), and the next counts them all."""
    check_fleet(fleet("fleet39"), time_limit=5)


def test_a_pool_over_its_max_moves_running_work_under_when_empty_on_fleet48():
    """fleet48 (the slow reason tier, 2026-11-29; the same before this session): two spot n2-standard-16 in gcp-cpu
    (max 1) run t1's low j0 and t3's low j5 (i0) and t1's normal j11 (12 vCPU, spot required; i1); consolidation is
    WhenEmpty. One instance must go. Lifting t1's spot share from the plan (its reason for j11), CP-SAT's plan, OPTIMAL,
    evicted j11 and kept the low jobs; greedy's kept all three (j0 beside j11, j5 onto an on-demand m6i). Under
    WhenEmpty the model held every running job to the moves a rule forces on it alone (its instance must go), which no
    single instance was here; a rule the fleet breaks now (the pool over its max) licenses moves as it licenses
    evictions (moves.add_when_empty)."""
    from tests.test_truth import check_reasons

    check_reasons(fleet("fleet48"))


def test_a_running_job_that_must_leave_may_take_its_tenants_lower_jobs_room_on_fleet49():
    """fleet49 (the slow reason tier, 2026-11-29; the same before this session): t1's normal j11 (12 vCPU, spot required)
    runs on an on-demand m6i, so it must leave; the only spot instance runs t1's low j0 and t3's low j5 (8 vCPU free).
    With t1's spot share lifted (its reason), j0 may move onto on-demand room to make room for j11 (a higher class of
    its tenant), but the model offered j11 no variable there: only new or resized work was "pending" where a host's
    room is counted with what a lower job could free, and both plans evicted j11. Running work that must leave counts
    as work that needs room now (in the model's variables and in the freezer)."""
    from tests.test_truth import check_reasons

    check_reasons(fleet("fleet49"))


def _resize_gang(docs_of, before: int, after: int):
    """Apply docs_of(before) on the sim, then plan docs_of(after): (the plan, the plan right after applying it)."""
    import tempfile

    from reconciler import api
    from tests.fleetkit import write_config
    from tests.invariants import check_plan

    with tempfile.TemporaryDirectory() as t:
        cfg = write_config(Path(t) / "c", docs_of(before))
        api.apply(cfg)
        write_config(cfg, docs_of(after))
        first = api.plan(cfg)
        check_plan(first.desired, first.observed, first.plan)
        api.apply(cfg, saved_plan=first.plan, allow_destroy=100)
        return first.plan, api.plan(cfg).plan


@pytest.mark.parametrize("mode,before,after,gpus", [("zone", 3, 2, 2), ("zone", 3, 2, 4), ("placement-group", 3, 2, 4), ("zone", 2, 3, 4)])
def test_a_resized_gang_stays_where_it_fits_under_when_empty_on_fleet50(mode, before, after, gpus):
    """fleet50 (audit21 findings 2 and 5, 2026-11-29): one running gang on p4d.24xlarge, consolidation WhenEmpty, its
    replicas changed. Shrunk, it fits where it runs, but the model counted every running item as kept while it is
    placed (3, where 2 can stay): one was a move, which WhenEmpty forbids, so the plan evicted the gang ("a running
    gang stays where it runs or stops ... it cannot stay"), deleted its instance, and the plan after the apply bought
    a new one for it. A gang keeps at most the items it asks now. Its move read "consolidation: a cheaper packing";
    it says its replicas changed."""
    from tests.fleetkit import doc, job, pool, tenant, topology

    def docs(n: int) -> list[dict]:
        return [topology(), tenant("t"), pool("p4d", "aws", "us-east-1", ["us-east-1a"], ["p4d.24xlarge"], hi=2),
                doc("PlacementPolicy", "pp", {"consolidation": "WhenEmpty"}),
                job("j0", "t", gpus=gpus, gpu_type="A100", cpu=8 * gpus, mem=60 * gpus, replicas=n, gang=mode)]

    plan, again = _resize_gang(docs, before, after)
    j0 = next(j for j in plan.jobs if j.job == "j0")
    assert j0.action == "move" and j0.reason.startswith(f"replicas changed ({before} -> {after}): restarts"), (j0.action, j0.reason)
    if after < before:
        assert set(j0.instances) <= set(j0.previous) and not plan.creates, (j0.instances, j0.previous, plan.creates)
    assert not again.has_changes, [(j.job, j.action, j.reason) for j in again.jobs]


def test_a_shrunk_gang_keeps_the_replicas_the_solver_keeps_on_fleet51():
    """fleet51 (audit21 finding 3, 2026-11-29): a high 3 x 4-A100 zone gang runs over two a2-highgpu-4g (spot) and an
    a2-highgpu-8g it shares with a low job, beside a normal 1-A100 job; shrunk to 2 replicas, every plan of that config
    stopped with "internal: demand d2:j2 placed 1 jobs but has no room left for j2": the solver kept replicas on its
    second and third hosts, and the plan read a gang's stays by replica position among the first two only."""
    from tests.fleetkit import doc, job, pool, tenant, topology

    def docs(n: int) -> list[dict]:
        j0 = job("j0", "t1", gpus=4, gpu_type="A100", cpu=32, mem=240, priority="low", spot="never")
        j0["spec"]["resources"]["nvlink"] = True
        return [topology(), tenant("t1"),
                pool("gcp-a100", "gcp", "us-central1", ["us-central1-a", "us-central1-b"], ["a2-highgpu-1g", "a2-highgpu-4g", "a2-highgpu-8g"],
                     market="either", hi=5),
                doc("SpotPolicy", "sp", {"max_spot_fraction": 0.5, "max_price_fraction": 1.0}),
                doc("PlacementPolicy", "pp", {"consolidation": "WhenUnderutilized", "preemption": "LowerPriority"}),
                job("j2", "t1", gpus=4, gpu_type="A100", cpu=32, mem=240, replicas=n, gang="zone", priority="high"), j0,
                job("j1", "t1", gpus=1, gpu_type="A100", cpu=8, mem=60, priority="normal")]

    plan, again = _resize_gang(docs, 3, 2)
    j2 = next(j for j in plan.jobs if j.job == "j2")
    assert j2.action == "move" and len(j2.instances) == 2, (j2.action, j2.instances, j2.reason)


def test_a_pending_reason_lifted_alone_places_the_job_on_fleet43():
    """fleet43 (the slow reason tier, 2026-11-29; the same on main before today's changes): t1's low j0 runs on the
    only gcp-cpu instance, a spot n2-standard-16, and t1's tenant_max_spot_fraction is 0, so j0 moves to an on-demand
    m6i and t2's j5 (GCP only) takes part of its room; t1's low j11 (12 vCPU, spot required) would fit the 12 vCPUs
    left and is pending for "tenant spot share", true of the plan. Lifted, j0 no longer has to move, and a running job
    does not move for work of its own class (the moves tier): j0, j5 and two more low jobs fill the instance and j11
    stayed pending ("the instances that could hold it are full"). The rule that blocks j11 is also what frees its room:
    a way of placing a job that holds it only in room its running jobs of its class or above leave in the plan
    carries a refusal saying so (diagnosis._with_vacated), and the reason reads "several limits bind at once with it
    for room on i0: the room it would take on i0 is running j0's, which leaves it in this plan"."""
    from tests.test_truth import check_reasons

    check_reasons(fleet("fleet43"))


def _resized(docs, insts, placements, shapes, gpu_indices=None):
    """(desired, observed, problem) of a fleet whose running jobs `shapes` ran in other shapes than they ask now."""
    import tempfile
    from dataclasses import replace

    from reconciler.load import load
    from reconciler.problem import build_problem
    from tests.fleetkit import catalog_observed, write_config

    with tempfile.TemporaryDirectory() as d:
        desired = load(write_config(Path(d), docs))
    observed = replace(catalog_observed(desired, insts, placements), gpu_indices=gpu_indices or {}, shapes=shapes)
    return desired, observed, build_problem(desired, observed)


def _both_plans(desired, observed, problem):
    from reconciler.plan import make_plan
    from reconciler.solve import solve

    return [(name, make_plan(desired, observed, problem, solve(problem, time_limit=tl, workers=1))) for name, tl in (("CP-SAT", 4), ("greedy", 0))]


@pytest.mark.parametrize("preemption", ["Never", "LowerPriority"])
def test_a_resized_job_waits_rather_than_take_another_tenants_guarantee_on_fleet44(preemption):
    """fleet44 (audit20 finding 6, 2026-11-29): ta's a1 grows from 4 to 12 vCPU on i0 (m6i.4xlarge, 16 vCPU, its pool at
    max 1) beside tb's b1 (8 vCPU, inside tb's 8-vCPU guarantee). A job whose resources change is new work and waits
    rather than evict another tenant's guaranteed job (README, Stability). Greedy's plan (the fallback, and CP-SAT's
    warm start) restarted a1 in place and evicted b1 ("pools at max_instances"): greedy kept running jobs in class
    order, a1 (the larger) first in its new shape. It keeps every job as it runs first now, then restarts a resized one
    in place where it still fits."""
    from reconciler.plancheck import recheck
    from tests.fleetkit import doc, instance, job, pool, topology
    from tests.invariants import check_stability

    docs = [topology(), doc("Tenant", "ta", {}), doc("Tenant", "tb", {"quota": {"cpu": 8}}),
            pool("cpu", "aws", "us-east-1", ["us-east-1a"], ["m6i.4xlarge"], hi=1),
            job("a1", "ta", cpu=12, mem=8), job("b1", "tb", cpu=8, mem=8), doc("PlacementPolicy", "pp", {"preemption": preemption})]
    shapes = {"a1": {"gpus": 0, "gpu_type": None, "mig": None, "nvlink": False, "cpu": 4.0, "memory_gib": 8.0}}
    desired, observed, problem = _resized(docs, [instance("i0", "cpu", "aws", "us-east-1", "us-east-1a", "m6i.4xlarge")],
                                          {"a1": ("i0",), "b1": ("i0",)}, shapes)
    for name, plan in _both_plans(desired, observed, problem):
        assert {j.job: j.action for j in plan.jobs}["b1"] == "keep", (name, [(j.job, j.action, j.reason) for j in plan.jobs])
        check_stability(desired, observed, plan)
        assert recheck(plan, desired, observed, problem)[1] == [], name


def test_a_resized_job_does_not_take_its_own_tenants_job_of_its_class_on_fleet45():
    """fleet45 (audit20 finding 5, reduced, 2026-11-29): tenant tt (2 GPUs) runs high x and y on one a2-highgpu-4g (its
    pool at max 1); y grows from 1 to 2 A100s. A resized job is new work and may take only a lower class's place in
    its tenant, so y waits. Greedy's plan stopped x to restart y in place; with another tenant over its own spot share
    (a tenant's rule, which licenses only that tenant's work), apply's re-check refused it, and at short limits on a
    250-job fleet CP-SAT emitted the same and `apply --plan` raised StalePlanError."""
    from reconciler.plancheck import recheck
    from tests.fleetkit import doc, instance, job, pool, topology
    from tests.invariants import check_stability

    docs = [topology(), doc("Tenant", "tt", {"quota": {"gpus": 2}}),
            pool("gpu", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-4g"], market="on-demand", hi=1),
            job("x", "tt", gpus=1, gpu_type="A100", cpu=4, mem=8, priority="high"),
            job("y", "tt", gpus=2, gpu_type="A100", cpu=4, mem=8, priority="high"),
            doc("Tenant", "tu", {}), pool("cpu", "gcp", "us-central1", ["us-central1-a"], ["n2-standard-16"], market="spot", hi=1),
            job("u", "tu", cpu=4, mem=8), doc("SpotPolicy", "sp", {"tenant_max_spot_fraction": {"tu": 0.0}})]
    insts = [instance("i0", "gpu", "gcp", "us-central1", "us-central1-a", "a2-highgpu-4g"),
             instance("i1", "cpu", "gcp", "us-central1", "us-central1-a", "n2-standard-16", "spot")]
    shapes = {"y": {"gpus": 1, "gpu_type": "A100", "mig": None, "nvlink": False, "cpu": 4.0, "memory_gib": 8.0}}
    desired, observed, problem = _resized(docs, insts, {"x": ("i0",), "y": ("i0",), "u": ("i1",)}, shapes,
                                          {"x": ((0,),), "y": ((1,),)})
    for name, plan in _both_plans(desired, observed, problem):
        assert {j.job: j.action for j in plan.jobs}["x"] == "keep", (name, [(j.job, j.action, j.reason) for j in plan.jobs])
        check_stability(desired, observed, plan)
        assert recheck(plan, desired, observed, problem)[1] == [], name


@pytest.mark.parametrize("gang_mode", ["zone", "instance"])
def test_a_cpu_gang_counts_each_replica_in_its_tenants_spot_share_on_fleet46(gang_mode):
    """fleet46 (audit20 finding 1, 2026-11-29): tenant t (tenant_max_spot_fraction 0.5) has an on-demand CPU job `a`
    and a 2-replica CPU gang `g` that requires spot. As a same-instance gang, `g` was one item of 1 work unit
    (Demand.size: 1 for CPU work, whatever the replicas), so CP-SAT placed it on spot: 2 of 3 replicas, over the
    share. As a zone gang it counted 2 and waited. CPU work counts 1 per replica now, in either mode."""
    from tests.fleetkit import doc, job, pool, tenant, topology
    from tests.test_properties import Fleet

    docs = [topology(), tenant("t"),
            pool("od", "aws", "us-east-1", ["us-east-1a"], ["m6i.4xlarge"], market="on-demand", hi=2),
            pool("sp", "gcp", "us-central1", ["us-central1-a"], ["n2-standard-16"], market="spot", hi=2),
            doc("SpotPolicy", "sp", {"tenant_max_spot_fraction": {"t": 0.5}}),
            job("a", "t", cpu=4, mem=8, spot="never"),
            job("g", "t", cpu=4, mem=8, replicas=2, gang=gang_mode, spot="required")]
    check_fleet(Fleet(docs), time_limit=4)


def _fleet47_docs(share: bool) -> list[dict]:
    from tests.fleetkit import doc, job, pool, topology

    j1 = job("j1", "t3", gpus=2, gpu_type="A100", cpu=16, mem=120, replicas=2, gang="placement-group", priority=50, spot="required")
    j1["spec"]["resources"]["nvlink"] = True
    return [topology(),
            pool("aws-a10g", "aws", "us-east-1", ["us-east-1a"], ["g5.xlarge", "g5.12xlarge"], market="either", hi=2),
            pool("gcp-a100", "gcp", "us-central1", ["us-central1-a", "us-central1-b"], ["a2-highgpu-4g"], market="spot", hi=3),
            doc("Tenant", "t1", {}), doc("Tenant", "t3", {"quota": {"gpus": 2, "burst": {"gpus": 6}}}), j1,
            job("j4", "t1", gpus=1, gpu_type="A10G", cpu=4, mem=16, priority="critical", spot="preferred"),
            job("j5", "t3", gpus=1, gpu_type="A10G", cpu=4, mem=16, priority="normal", spot="required"),
            job("j6", "t3", gpus=4, gpu_type="A10G", cpu=40, mem=160, priority="high", spot="required"),
            doc("SpotPolicy", "sp", {"max_price_fraction": 1.0, **({"tenant_max_spot_fraction": {"t1": 0.5}} if share else {})}),
            doc("PlacementPolicy", "pp", {"consolidation": "WhenEmpty", "preemption": "Never"})]


def _fleet47_runs():
    """(the plan of each step, the plan right after its apply): step 0 without t1's spot share, step 1 with it."""
    import tempfile

    import yaml

    from reconciler import api

    out = []
    with tempfile.TemporaryDirectory() as d:
        cfg = Path(d) / "cfg"
        cfg.mkdir()
        for share in (False, True):
            (cfg / "fleet.yaml").write_text(yaml.safe_dump_all(_fleet47_docs(share), sort_keys=False))
            first = api.plan(cfg)
            api.apply(cfg, saved_plan=first.plan, allow_destroy=100)
            out.append((first.plan, api.plan(cfg).plan))
    return out


def test_the_plan_after_a_reclaim_is_a_no_op_on_fleet47():
    """fleet47 (audit20 finding 2, 2026-11-29; at the default limit, either preemption): adding t1's spot share of 0.5
    moves t1's critical j4 onto on-demand A10G room; the pool is at its max, so t3's borrowed high j6 is evicted for
    it (another tenant may reclaim borrowed room). The same plan leaves t3's new j1 (an A100 gang that t3's burst holds
    once j6 stops) pending, and the plan right after its apply placed j1: not a no-op. The swaps tier
    (objective.swaps_tier) counted j6's stop as a swap for j1 and held j1 at 0 through the work tiers, though j6 stops
    for t1's j4 either way. A stop made while the tenant's new work waits is no swap now (objective.swap_exemptions)."""
    for plan, again in _fleet47_runs():
        assert not again.has_changes, [(j.job, j.action, j.reason) for j in again.jobs if j.action != "keep"]


def test_the_reasons_of_a_reclaim_say_what_the_plan_does_on_fleet47():
    """fleet47's plan with t1's spot share (above): j1's reason claimed "the solver did not find that placement" in an
    OPTIMAL plan, j4's move onto dearer on-demand room read "consolidation: a cheaper packing", and the spot instance
    it and j6 left, under WhenEmpty, "consolidated: its replicas fit more cheaply elsewhere" (audit20 finding 2). They
    say what the plan does now: j4 leaves spot for its tenant's share, the instance is emptied, and j1 is placed in the
    same plan (j6's stop is no swap: `objective.swap_exemptions`; before, it waited for the next plan)."""
    plan = _fleet47_runs()[1][0]
    reason = {j.job: j.reason for j in plan.jobs}
    assert {j.job: j.action for j in plan.jobs}["j1"] == "place", reason["j1"]
    assert {j.job: j.action for j in plan.jobs}["j4"] == "move" and reason["j4"].startswith("leaves spot (") and "tenant t1" in reason["j4"], reason["j4"]
    assert plan.deletes and all(d.reason.startswith("emptied: ") for d in plan.deletes), [d.reason for d in plan.deletes]


def test_greedy_gives_up_only_the_tenants_spot_job_for_its_share_on_fleet42():
    """fleet42 (the slow property tier, 2026-11-29, right after apply's re-check began to license a tenant's own broken
    rule for its own work only): one spot a2-highgpu-4g (its pool at max 1, GCP the only cloud allowed) runs t2's j9
    and t1's j10; t1's tenant_max_spot_fraction is 0. Greedy's plan gave up the whole spot host for t1's share,
    stopping t2's guaranteed j9 too, and the re-check refused it. Greedy now takes out only the tenant's spot job
    (`_release_tenant_spot`): j9 stays, j10 waits (the pool has no room for an on-demand instance)."""
    check_fleet(fleet("fleet42"), time_limit=5)


def test_a_tenant_over_its_spot_share_still_counts_where_the_fleet_breaks_a_fleet_wide_rule_on_fleet41():
    """fleet41 (the slow property tier, 2026-11-29, right after fleet39's fix): three m6i.4xlarge in a pool of max 1 (two
    spot), t1 (tenant_max_spot_fraction 0) runs seven low and normal CPU jobs, t2 one 12-vCPU job. One on-demand
    instance stays; it holds t1's normal j12 and either t1's j11 or t2's j10. Greedy keeps j11 and j12; CP-SAT kept
    j10 and j12 (fewer protected jobs), as fleet37's fix left t1 (over its share) out of the first guarantees tier.
    With a fleet-wide rule broken (the pool over its max) anyone's work may go and the most guarantees kept decide:
    the first tier leaves a tenant out only where the tenant's own rules alone are broken."""
    check_fleet(fleet("fleet41"), time_limit=5)


@pytest.mark.slow
def test_the_plan_after_a_short_cold_plan_stops_no_job_for_its_own_class_on_fleet38():
    """fleet38 (audit19, 2026-11-29, a hand-made 150-job config: tests/data/findings/fleet38.yaml): planned cold with
    `time_limit=6` (the work tiers unproven: 22 placed, 13 created), applied, and planned again at 6, the plan evicted
    t4's j123 ("its tenant's quota goes to its higher-priority work first: j17") while it placed t4's new j127 and j71,
    of j123's class or below: an eviction check_stability calls unlicensed. The warm start's completion (greedy's
    placements, every other variable set to its best) summed the tiers unscaled, so the fair share (hundreds of
    thousands) outweighed the guarantees (units): it counted running critical work as borrowed, 91 of the 294 protected
    units greedy's placements keep, the tiers held those floors, the first spent its share of the work getting back
    to 294, and the tiers after could not undo greedy's swap. Scaled per tier (Search.completion), the warm start
    keeps 294 and the plan after the apply evicts nothing."""
    import shutil
    import tempfile

    from reconciler import api
    from tests.invariants import check_stability

    with tempfile.TemporaryDirectory() as d:
        cfg = Path(d) / "cfg"
        cfg.mkdir()
        shutil.copy(FINDINGS / "fleet38.yaml", cfg / "fleet.yaml")
        first = api.plan(cfg, time_limit=6)
        api.apply(cfg, saved_plan=first.plan, time_limit=6, allow_destroy=1000)
        again = api.plan(cfg, time_limit=6)
        check_stability(again.desired, again.observed, again.plan)


@pytest.mark.slow  # (26.7 s: a plan of fleet38's config at the default work limit, fleet38's own test is slow too; every
# default-tier random fleet is checked for stops no rule requires: test_properties' check_stability)
def test_a_running_job_is_not_stopped_for_its_tenants_new_work_under_preemption_never_on_fleet40():
    """fleet40 (2026-11-29, found while reducing fleet38: the fleet its short cold plan applied, tests/data/findings/fleet40:
    the sim's cloud and the state apply wrote, under fleet38.yaml): preemption is Never and t1's hourly budget binds.
    The next plan at the default limit stopped t1's running j30 ("tenant budget: t1 spends $24.81/h of its $25.00/h")
    while it placed t1's new work, j128 of j30's class among it: the tier against stopping a tenant's running work for
    its own new work counted only new work of its class or below, as under LowerPriority, where a higher class may take
    a lower one's place; under Never none may. It counts new work of every class there now."""
    import shutil
    import tempfile

    from reconciler import api
    from tests.invariants import check_stability

    with tempfile.TemporaryDirectory() as d:
        cfg = Path(d) / "cfg"
        (cfg / ".reconcile" / "sim").mkdir(parents=True)
        shutil.copy(FINDINGS / "fleet38.yaml", cfg / "fleet.yaml")
        shutil.copy(FINDINGS / "fleet40" / "state.json", cfg / ".reconcile" / "state.json")
        for f in ("cloud.json", "cloud.journal"):
            shutil.copy(FINDINGS / "fleet40" / "sim" / f, cfg / ".reconcile" / "sim" / f)
        again = api.plan(cfg)
        check_stability(again.desired, again.observed, again.plan)


def test_the_plan_after_a_grown_gang_is_evicted_is_a_no_op_on_fleet52():
    """fleet52 (the stable-run exploration, 2026-11-29, the end of the session; the same before it): a 2-replica gang
    runs over two a2-highgpu-8g (gcp-a100 at max 2) beside 1-GPU jobs; grown to 3 replicas it no longer fits and is
    evicted. The plan of that edit was greedy's (GREEDY_FALLBACK) and kept the instance the gang leaves empty; the plan
    right after its apply deleted it ("no longer needed"): not a no-op. The swaps tier had counted the gang's stop as a
    swap for its tenant's new 1-GPU jobs and held them at 0, so CP-SAT's answer ranked below greedy's. The stop is no
    swap (the jobs wait, and it stops all the same: objective.swap_exemptions): solved again, CP-SAT's plan places the
    jobs and deletes the emptied instance, and is emitted."""
    edit, again = _fleet52_grown(time_limit=4)
    assert edit.solver.status != "GREEDY_FALLBACK", edit.solver.note
    # (the instance goes because its one job stops, not for a cheaper packing)
    assert [d.reason for d in edit.deletes] == ["emptied: every job on it stops in this plan (their reasons say why)"], edit.deletes
    assert not again.has_changes, ([(x.instance_id, x.reason) for x in again.deletes], [(j.job, j.action) for j in again.jobs if j.action != "keep"])


def _fleet52_grown(time_limit: float):
    """fleet52 planned and applied (time_limit 4), its gang grown, planned and applied at `time_limit`, planned again
    at it: (the edit's plan, the plan after its apply)."""
    import tempfile

    from reconciler import api
    from tests.fleetkit import write_config
    from tests.test_properties import _edit

    f = fleet("fleet52")
    with tempfile.TemporaryDirectory() as d:
        cfg = write_config(Path(d) / "c", f.docs)
        api.apply(cfg, saved_plan=api.plan(cfg, time_limit=4).plan, time_limit=4, allow_destroy=100)
        write_config(cfg, _edit(f.docs, "grow gang", None))
        edit = api.plan(cfg, time_limit=time_limit).plan
        api.apply(cfg, saved_plan=edit, time_limit=time_limit, allow_destroy=100)
        return edit, api.plan(cfg, time_limit=time_limit).plan


def test_greedys_plan_gives_up_the_instance_a_grown_gang_leaves_empty_on_fleet52():
    """fleet52's edit planned by greedy alone (`--time-limit 0`, and the plan whenever CP-SAT's is not taken): greedy's
    warm start keeps every host of the fleet before placing, and kept the instance the evicted gang left empty, idle;
    the plan after its apply deleted it. A host nothing went on goes now where no rule needs it (greedy
    `drop_idle_hosts`)."""
    edit, again = _fleet52_grown(time_limit=0)
    assert len(edit.deletes) == 1 and {j.job: j.action for j in edit.jobs}["j1"] == "evict", edit.deletes
    assert not again.has_changes, ([(x.instance_id, x.reason) for x in again.deletes], [(j.job, j.action) for j in again.jobs if j.action != "keep"])


def _named(name: str):
    """A draw that picks the job named `name` from a sampled_from strategy (a finding's recorded draw)."""
    return lambda strategy: next(e for e in strategy.elements if e["metadata"]["name"] == name)


@pytest.mark.parametrize("name, edits, draw", [
    ("fleet53", ["grow gang"], None),
    ("fleet54", ["grow gang"], None),
    ("fleet55", ["change resources", "none", "grow gang"], _named("j3")),
])
def test_a_grown_gang_takes_its_tenants_lower_jobs_room_in_the_plan_of_the_edit(name, edits, draw):
    """fleet53-55 (the stable-run exploration, 2026-11-29; the same before this session): a normal zone gang grown by a
    replica past its instance's free room, its tenant's low jobs beside it. The model offered the grown gang no room
    where those jobs ran (it counted as new work only jobs not running or resized, not a gang running fewer replicas than
    it asks), so the plan of the edit evicted it (fleet53: "pools at max_instances"), or bought an identical instance
    for it (fleet54: "j3 moves from sim-aws-00001 to +1, an identical instance"), or evicted another job for the buffer
    (fleet55); the plan after the apply then placed it anew in the low jobs' room. A gang running short counts as
    needing room now (`rules.wants_room`): it grows in place, its tenant's lower jobs stopped, in one plan. (fleet53 and
    fleet54 are kept without the exploration's deadlines, which the real clock reads: they fail before without them.)"""
    from tests.test_properties import check_stable_run

    check_stable_run(fleet(name), edits, draw)


def test_a_placement_group_gang_grown_by_a_replica_grows_on_the_instance_it_runs_on(tmp_path):
    """Audit21 (noticed, 2026-11-29): a `gang: placement-group` of 2 x 2 A100s runs on one p4d (8 GPUs); grown to 3
    replicas it has room for the third beside its own two. The model offered placement-group gangs no room on running
    instances (their members launch together into the group), so the plan bought an identical p4d in the group, moved
    the gang whole onto it and deleted the first. The instances a placement-group gang runs on are in its group: it
    grows there now, and the plan after the apply is a no-op."""
    from reconciler import api
    from tests.fleetkit import job, pool, tenant, topology, write_config
    from tests.invariants import check_plan, check_stability

    def docs(replicas):
        return [topology(), tenant("t"), pool("p", "aws", "us-east-1", ["us-east-1a"], ["p4d.24xlarge"], hi=3),
                job("g", gpus=2, gpu_type="A100", cpu=8, mem=60, replicas=replicas, gang="placement-group")]

    cfg = write_config(tmp_path / "c", docs(2))
    api.apply(cfg, saved_plan=api.plan(cfg, time_limit=4).plan, time_limit=4, allow_destroy=100)
    write_config(cfg, docs(3))
    res = api.plan(cfg, time_limit=4)
    check_plan(res.desired, res.observed, res.plan)
    check_stability(res.desired, res.observed, res.plan)
    (g,) = res.plan.jobs
    assert not res.plan.creates and not res.plan.deletes, (res.plan.creates, res.plan.deletes)
    assert set(g.instances) == set(g.previous) and len(g.instances) == 3 and g.reason.startswith("replicas changed (2 -> 3)"), g
    api.apply(cfg, saved_plan=res.plan, time_limit=4, allow_destroy=100)
    assert not api.plan(cfg, time_limit=4).plan.has_changes


def test_a_host_whose_stays_are_fewer_than_its_running_jobs_gives_each_stay_to_one_job_on_fleet56():
    """fleet56 (the stable-run exploration, 2026-11-29; the same before this session): twelve identical low jobs run
    four to an instance on three g5.12xlarge (the pool at its max); a critical job added takes one low job's GPU. The
    answer keeps 11 of the 12 (stays 4, 3 and 4), but the packer called every job on a host with any stay left
    "staying", chose the first 11 in name order (four on the host with three stays), and the twelfth had no room: every
    plan of that config stopped with "internal: demand d1:j0 placed 11 jobs but has no room left for j2". Each staying
    job takes its host's count now, as the items are assigned (plan/assign.choose_jobs)."""
    from tests.test_properties import check_stable_run

    check_stable_run(fleet("fleet56"), ["interrupt spot", "new job", "raise quota"], _named("j5"))


def test_a_tenants_guaranteed_work_reclaims_borrowed_room_in_the_plan_that_stops_its_gang_on_fleet57():
    """fleet57 (the stable-run exploration, 2026-11-29; the same before this session): one a2-highgpu-4g under a
    $15/h budget runs t1's low gang j0; grown to 3 replicas it no longer fits and stops. The plan of that edit gave the
    room to t2's borrowed gang j3 while t1's guaranteed low work (j10-j14) waited behind j0's stop (the swaps tier),
    and the plan after the apply evicted j3 to place it. j0's stop is no swap (all of t1's new work waits), and the
    probe for it now holds only the tiers ranked above the swaps tier of j0's class: held at the answer's borrowed
    work, it found no room for t1's work and the problem was not solved again."""
    from tests.test_properties import check_stable_run

    check_stable_run(fleet("fleet57"), ["grow gang"], None)


def test_the_plan_after_a_raised_budget_is_applied_is_a_no_op_on_fleet58():
    """fleet58 (the stable-run exploration, 2026-11-29; the same before that session; at the default limit too): the
    fleet budget raised from $15 to $60/h. With running work held where it runs (the moves tier), the tiers reach
    'guaranteed high work' 0 and 'guaranteed normal work' 70. The consolidation then moves the running jobs for cost,
    and `claim_room` searched for more work in the room they free with every tier held at least where it was: so t1's
    high j25 took room, but t1's normal, spot-required j7 could take the room of t1's low j3 (placed anew) only by
    bringing 'guaranteed low work' below its floor of 50, and waited. The plan after the apply evicted j3 for j7 (a
    higher class of its tenant: licensed), so it was not a no-op. (Found first as a zone class and a zone offer that
    could not share an instance; they can: the floors were the cause.) claim_room searches the tiers again in their
    order now, each from where the ones above it are held, the floors below let go, as the tiers would have ordered
    the room had it been free when they were solved; the cost's bound is taken again at the tiers it reaches."""
    from tests.test_properties import check_stable_run

    check_stable_run(fleet("fleet58"), ["lower budget"], lambda strategy: 60.0)


def test_a_tenant_spot_share_that_holds_only_with_a_job_that_must_leave_licenses_its_other_jobs_on_fleet59():
    """fleet59 (the slow property tier, 2026-11-29, the end of the session; the same before it): t2's only jobs, j0 and
    j5, are spot-required, and its spot share is 0.5. j0 runs on the spot i0, j5 on the on-demand i1, which it must
    leave. Without j5, t2 runs all its work on spot, so j0 must go too, and CP-SAT's plan evicts both. Apply's re-check
    (and the stability oracle) read the fleet as it runs, where the share holds, and as it can stay without only
    resized jobs: they called j0's eviction unlicensed and refused the plan, so every plan of that fleet was refused.
    The fleet that can stay leaves out the jobs a rule moves now (`ledger.jobs_that_must_leave`)."""
    check_fleet(fleet("fleet59"), time_limit=5)


def test_a_running_job_a_rule_moves_may_take_its_tenants_lower_jobs_room_on_fleet60():
    """fleet60 (the slow property tier, 2026-11-29, right after fleet59's fix; the same before this session): t2's
    normal, spot-required j5 runs on the on-demand i1, which it must leave; the only spot room is t2's low j0's on i0.
    CP-SAT moves j5 there and evicts j0: a higher class of its tenant, which a running job a rule moves counts as
    (README: it needs room as new work does). Apply's re-check (and the stability oracle) counted only jobs placed
    anew, resized or healed as arriving work, refused the plan, and so every plan of the fleet. A job a rule moves,
    placed elsewhere, arrives too now."""
    check_fleet(fleet("fleet60"), time_limit=5)


def test_a_running_job_leaving_a_removed_pool_may_take_its_tenants_lower_jobs_room_on_fleet61():
    """fleet61 (made by hand from fleet60, 2026-11-29, after noticing three copies of "cannot stay where it runs"):
    t2's normal j5 runs on i1, in a pool no longer in the config; the only room is t2's low j0's on i0 (the pool at
    max_instances). CP-SAT moves j5 there and evicts j0, as in fleet60. The model's forced moves counted a host that
    must go, but `jobs_that_must_leave` (which apply's re-check reads for the movers that arrive as new work) did
    not: the re-check refused the plan, so every plan of the fleet. Both read rules.cannot_stay now."""
    check_fleet(fleet("fleet61"), time_limit=5)


def test_a_gang_grown_past_its_tenants_ceiling_waits_rather_than_stop_its_tenants_job_of_its_class_on_fleet62():
    """fleet62 (the stable-run exploration with the remove-pool and move-allowlist edits, 2026-11-29; the same before
    this session): t3 (guarantee 4 GPUs, ceiling 12) runs its low 2 x 2-GPU gang j1, j4, j7 and the 1-GPU j8: 11 GPUs.
    j1 grown to 3 replicas needs 13. The plan stopped j8 for j1's third replica: a swap (README, Stability: a grown
    gang ranks as new work and never takes the place of its tenant's running jobs of its class). Two causes: the fleet
    as it runs counted j1 at the 3 replicas it asks (the ledger books a job's quota at its replicas), so t3 read over
    its ceiling now and any of its work could go; and the tiers counted the grown j1 as running work kept. Now j1 is
    stopped and waits ("quota exhausted: tenant t3 uses 7/12 GPUs in this plan, the job needs 6 more")."""
    from tests.test_properties import check_stable_run

    check_stable_run(fleet("fleet62"), ["grow gang"], lambda strategy: None)


def test_a_grown_gang_may_move_where_it_restarts_on_fleet63():
    """fleet63 (the stable-run exploration, 2026-11-29, after fleet62's fix; not before it): t3's low 2 x 2-GPU gang j1
    on a 4-GPU spot a2-highgpu-4g, grown to 3 replicas, no longer fits there, and the gcp pool is at its max of 3
    instances. Once a grown gang ranked as new work (fleet62),
    nothing kept it running above the moves tier, whose count took its move to a new instance for a move for other
    work: CP-SAT stopped j1, ranked below greedy's plan (which moved it) and emitted greedy's plan, whose next plan
    consolidated j2 onto the new p4d. A gang that runs other replicas than it asks restarts, so its running items may
    move where it restarts (moves.must_move, as a resized job's), and CP-SAT moves it."""
    from tests.test_properties import check_stable_run

    check_stable_run(fleet("fleet63"), ["grow gang"], lambda strategy: None)


def test_a_consolidation_makes_no_stop_for_its_tenants_own_work_on_fleet64():
    """fleet64 (the stable-run exploration with the remove-pool edit, 2026-11-29; the same before this session, with
    the edit): preemption: Never, a $40/h budget. Pool gcp-a100 is removed, so t3's j4 must leave its instance; the
    only other A100 pool (aws-a100, max 1) runs an on-demand p4d full with t1's j14, t3's j19 and j20 and t3's
    spot-never j5. With running work held (the moves tiers), j4 has no room and stops. The consolidation let go of
    the moves tiers and, with them, of the swaps tiers: its cost stage swapped the on-demand p4d for a cheaper spot one,
    moved everything there but j5 (spot: never) and put j4 in j5's place, a stop for the tenant's own work of its
    class. Apply's re-check refused the plan (so every plan of the fleet). A consolidation's cost stage keeps every
    running job the held answer keeps now (strategy.keep_running: it moves work for cost, and the room it frees goes
    to pending work by the tiers' order)."""
    from tests.test_properties import check_stable_run

    check_stable_run(fleet("fleet64"), ["remove pool"], lambda strategy: "gcp-a100")


def test_a_grown_gangs_room_is_offered_to_every_job_of_the_shape_on_fleet65():
    """fleet65 (the stable-run exploration, 2026-11-29; the same before this session): WhenEmpty, a gcp pool at its max
    of 1 instance (an a2-highgpu-8g) running t2's critical 2-GPU j14 and t1's critical 3 x 2-GPU gang j8. j8 grown to 4
    replicas no longer fits and stops (WhenEmpty: it stays or stops). Its 6 GPUs went to j0, j11, j13 and t3's
    borrowed high j9, the jobs the warm start put there: the host's free room counted j8 as staying, so only the warm
    start's groups had a variable there, and t1's guaranteed low j6 (2 NVLink GPUs) waited. The plan after the apply
    evicted j9 for it (reclaimed borrowed capacity), so it was not a no-op. A resident that does not run as it may run
    on (rules.settled_jobs) no longer counts in a host's free room (index.free_room)."""
    from tests.test_properties import check_stable_run

    check_stable_run(fleet("fleet65"), ["grow gang"], lambda strategy: None)


def test_a_reservation_freed_by_a_delete_is_used_in_the_same_plan_on_fleet66():
    """fleet66 (the stable-run exploration, 2026-11-29; the same before this session): a Reservation of one p4d in
    us-east-1a, held by sim-aws-00002; the aws-a100 pool at its max of 2. t1's quota raised, its high placement-group
    gang j3 (3 x 2 GPUs) needs a new instance launched into its group, so the plan deletes the reserved instance
    (its low jobs stop, licensed) and buys a p4d on-demand in us-east-1a at $21.96/h: a fully used reservation has no
    offer (problem.capacity.reserved_offers), and nothing tells the model a delete frees it. The plan after the apply
    moves j2 and j3 to a new reserved p4d at $0 (a priced consolidation that pays: licensed, but not a no-op). Open:
    the fix needs the reservation offered whatever holds it, a row counting its holders kept and its new instances
    against its count (the ledger's reservation check already does), and apply deleting a reservation's holder before
    launching into it (creates run first today, and the cloud would refuse a launch into a full reservation)."""
    from tests.test_properties import check_stable_run

    check_stable_run(fleet("fleet66"), ["remove pool", "raise quota"], lambda strategy: "gcp-cpu")


def test_a_job_a_rule_moves_does_not_hold_its_tenants_new_work_back_on_fleet67():
    """fleet67 (the stable-run exploration on up to 45 jobs, 2026-11-29; caused by a first fix of fleet64 that counted
    a job a rule moves as new work in the swaps tier, and not before it): pool gcp-a100 removed, t1's critical j16
    moves to an AWS p4d, and t1's borrowed critical gang j2 stops there (higher tiers). t1's new critical j13 (4 A10G,
    another pool) waited: with j16 counted as t1's new work placed beside j2's stop, `swap_exemptions` did not exempt
    the stop, and the swaps tier held j13 at 0; the plan after the apply placed it. The swaps tier counts movers as
    it did; fleet64's consolidation is kept from stopping running work another way (strategy.keep_running)."""
    from tests.test_properties import check_stable_run

    check_stable_run(fleet("fleet67"), ["remove pool"], lambda strategy: "gcp-a100")


def test_a_tenants_spot_share_held_only_by_its_grown_gang_licenses_its_spot_work_on_fleet68():
    """fleet68 (the stable-run exploration, 2026-11-29, with its jobs' deadlines taken out; the same at the session's
    start): t3 (tenant_max_spot_fraction 0.5) runs its low gang j2 on an on-demand p4d and its low j0 on a spot
    instance. j2 grown past t3's GPU limit restarts and has no room, so it stops; without it t3 would run all its work
    on spot, so j0 must go too, as for a resized job (fleet37). The fleet that can stay (ledger.staying_ledger, and
    the stability oracle's) held the grown gang as it runs, so apply's re-check refused the plan (and every plan of
    the fleet). A gang grown or short of a replica is left out of it now (rules.runs_settled)."""
    from tests.test_properties import check_stable_run

    check_stable_run(fleet("fleet68"), ["interrupt spot", "remove pool", "grow gang"], lambda strategy: "sim-azure-00002")


def test_a_running_job_stopped_for_its_tenants_higher_work_may_move_where_it_takes_a_lower_ones_room_on_fleet69():
    """fleet69 (the stable-run exploration with the fail-a-create edit, 2026-11-29; the same at the last session's
    start): t2's new critical job (a copy of j13 on gcp-a100) takes the room of t2's running high j25 there. j25 was
    stopped: as running work it was offered no host where it in turn may stop a resident (only pending work was), and
    the plan after the apply placed it where it stopped t2's low j1. A running job where pending work may stop it is
    offered those hosts too (Model._displaced): it moves in one plan, as the moves tier allows for a higher class."""
    from tests.test_properties import check_stable_run

    check_stable_run(fleet("fleet69"), ["change resources", "fail a create"], _named("j13"))


def test_a_consolidation_that_frees_room_for_work_places_it_at_the_cheapest_on_fleet70():
    """fleet70 (the stable-run exploration on up to 45 jobs, 2026-11-29; the same at the last session's start): the
    fleet budget raised from $15 to $60/h. The plan consolidated (t1's running j2 and j5 free to move for cost), gave
    the room to pending work (claim_room: t1's j1, j4 and j8 placed), then priced that work with running work fixed
    where the consolidation had put it: two p4d on-demand for j1, j4, j8 and t3's j10, $55.20/h, "FEASIBLE, gap 39.7%".
    The plan after the apply moved j4 and j8 beside j10 and j1, j2, j5 onto one a2-highgpu-4g spot, $36.85/h. The last
    cost stage now lets running work move for cost again (every running job kept: strategy.keep_running), so the
    consolidation and the work it makes room for are priced together."""
    from tests.test_properties import check_stable_run

    check_stable_run(fleet("fleet70"), ["lower budget"], lambda strategy: 60.0)


def test_a_tenants_guarantee_holds_the_jobs_the_last_plan_kept_in_it_on_fleet71():
    """fleet71 (the stable-run exploration with fail-a-create, 2026-11-29; the same at the last session's start): t3
    (guarantee 2 GPUs) runs its critical j25 (1 GPU, A100-80GB, inside the guarantee) and low j1. t3's new critical job
    (2 GPUs) takes j1's place: the plan keeps j25 in the guarantee (the tier keeping running jobs comes first) and the
    new job on borrowed capacity. After the apply both run, and the guarantee is filled again by priority and size
    (problem/tenants._fill): the new job inside, j25 borrowed, so t2's pending normal j19, inside t2's guarantee,
    reclaims j25's instance (the only A100-80GB one). A licensed reclaim, but in the plan after the apply. The state
    now records since which apply each job has run (State.since, a move keeps it), and the fill takes the
    longest-running first within a class, as the plan that placed them kept them."""
    from tests.test_properties import check_stable_run

    check_stable_run(fleet("fleet71"), ["fail a create"], _named("j1"))


def test_a_tenants_guarantee_holds_the_jobs_the_last_plan_kept_in_it_under_fair_share_on_fleet72():
    """fleet72 (the stable-run exploration, 2026-11-29; the same at the session's start): fleet71's cause through the
    fair share. t1 (2 GPUs guaranteed, burst 6) runs critical j24 and normal j20 (1 GPU each) inside its guarantee; its
    critical j11, resized to 2 GPUs, takes the room of borrowing t3's j21 and j5 on borrowed capacity (2 GPUs, whole or
    nothing, against t3's 0). After the apply the guarantee is filled again, largest first: j11 inside, j24 and j20
    borrowed, and the fair share of borrowed capacity now stops t1's j20 for t3's j21, in the plan after the apply.
    Fixed with fleet71 (State.since, the fill longest-running first)."""
    from tests.test_properties import check_stable_run

    check_stable_run(fleet("fleet72"), ["grow gang", "change resources", "raise quota"], _named("j11"))


@pytest.mark.slow
def test_a_guaranteed_critical_gang_is_not_evicted_for_a_full_pool_on_fleet73():
    """fleet73 (the mid-size stable-run exploration at the default 20 s, 2026-11-29, seventh session; the same at
    bac9012 and 75debb9): a fleet of up to 150 jobs with pools and quotas scaled. In the plan after the cold apply,
    t2's critical gang j110 (inside its tenant's guarantee) was evicted from sim-aws-00002/00003 with "pools at
    max_instances (aws-a100 3/3); the job needs 2 new instances": fleet-wide limits never license taking a guarantee.
    The warm start's completion summed the tiers, and the fair share of borrowed capacity (812,500, counting every job
    the model chose to call borrowed) outweighed the guarantees: it put t1's and t2's protected work all on borrowed
    capacity (0 of 168 units kept each), the guarantees tier was held at that floor, and losing j110 cost nothing there.
    The completion now follows the tiers' order (the guarantees' and the guaranteed part's tiers first, held while the
    borrowed part's are completed: Search.completion), and a tenant's fair share counts no more than its room above
    the guarantee. Then the cold plan's first tier was left at 644 of 665 units (an even share of the tiers' work,
    0.33 deterministic s, where 0.4 proves it) and the plan after the apply placed the rest, evicting seven jobs: a tier
    may now take a quarter of the tiers' work left (TIER_SHARE; one that proves its optimum stops early)."""
    from tests.test_properties import check_stable_run

    check_stable_run(fleet("fleet73"), ["none"], lambda strategy: None, time_limit=20)


@pytest.mark.slow
def test_the_plan_after_applying_a_mid_size_fleet_places_nothing_more_on_fleet74():
    """fleet74 (the same exploration, the same at bac9012 and 75debb9): the cold plan left j27, j33, j5 (a 2-replica
    gang) and j58 pending, and the plan right after its apply bought one instance and placed all four there: not a
    no-op. The cold plan's tiers were not proven (fleet73's causes: the completion's floors and the tiers' even share
    of the work); fixed with fleet73."""
    from tests.test_properties import check_stable_run

    check_stable_run(fleet("fleet74"), ["none"], lambda strategy: None, time_limit=20)


def test_room_a_quota_stop_frees_is_offered_to_other_tenants_work_on_fleet75():
    """fleet75 (the solver property tier on larger fleets, 2026-11-29, eighth session; the same on main before it): t2's
    low j3 runs on the only A10G host, and t2's pending normal A100 gang j6 needs the GPUs of t2's quota that j3 holds,
    so j3 stops (a higher class of its tenant). t1's pending high j1 (A10G) then fits in j3's room, where greedy placed
    it; CP-SAT's model offered j1 no variable on that host (it was full, and j1 may not evict another tenant's job), so
    its plan left j1 pending and ranked below greedy's. A host whose resident may stop for its own tenant's higher class
    at the tenant's quota is offered to every pending group of its shape (rules.quota_shedding)."""
    check_fleet(fleet("fleet75"), time_limit=5)


def test_room_a_quota_stop_frees_is_priced_as_greedy_prices_it_on_fleet76():
    """fleet76 (the same run, the same cause as fleet75): greedy put t1's critical j1 and high j10 in the room t2's low
    j3 leaves on the A10G host for t2's own higher work at its quota; CP-SAT, offered no variable there, bought more
    A100 capacity and its plan cost $64.45/h against greedy's $60.78/h at the same rank, "OPTIMAL, gap 0"."""
    check_fleet(fleet("fleet76"), time_limit=5)


def test_an_answer_whose_idle_class_does_not_pack_is_told_apart_on_fleet29(monkeypatch):
    """strategy.beyond_count, which values a tier's LP-guided answer as packed (emitted_value), on the answer the
    repair stage gets for fleet29 (above): its four jobs on the two idle n2-standard-16 pack only in sum, so it is
    refused (None: an idle class's leftovers are no new work to count out); the answer idle_repair makes of it (i78
    kept) packs."""
    from reconciler.solve import strategy

    seen = []
    real = strategy.idle_repair

    def spy(search, sol, hint, lb, reports):
        out = real(search, sol, hint, lb, reports)
        seen.append((search, list(hint), list(out[1])))
        return out

    monkeypatch.setattr(strategy, "idle_repair", spy)
    _cp_sat_plan(fleet("fleet29"), time_limit=15)
    (search, before, after), *_ = seen
    assert before != after
    assert strategy.beyond_count(search, before) is None
    assert strategy.beyond_count(search, after) == []


def both_plans_keep_every_rule(f: Fleet, **expected: tuple[str, tuple[str, ...]]) -> None:
    """CP-SAT's plan and greedy's give each named job its expected (action, instances), and both keep every rule."""
    desired, observed, (solution, plan), (gsol, gplan) = solve_both(f, time_limit=5)
    for p in (plan, gplan):
        actions = {j.job: (j.action, j.instances) for j in p.jobs}
        assert {job: actions[job] for job in expected} == expected, (p.solver.status, actions)
    check_fleet(f, time_limit=5, solved=(desired, observed, (solution, plan), (gsol, gplan)))


@contextmanager
def _explored(n: int, kind: str):
    """bench.explore_mixed's fleet n in a temporary directory: generated, planned, checked, applied and planned again
    (`check`: every rule, apply's re-check, a no-op after the apply), then edited by its own draw, which must be `kind`.
    Yields the edited config. Inside it, the solver's wall-clock safety cap is an hour: each plan is then the one its
    work limit gives, as on an idle machine. At the cap's 230 s a busy CI runner (load ~11 on 2 cores) got greedy's
    plan, a fleet and an answer these tests were not written for (the quota fleet's test took greedy's plan for
    CP-SAT's and stopped one of its jobs: _lawful, given a greedy answer, has no other fallback and refused it)."""
    import tempfile

    from bench.explore_mixed import check, edit, fleet
    from bench.trace import generate
    from reconciler.solve import strategy

    jobs, nodes, rng = fleet(n)
    with tempfile.TemporaryDirectory() as d, pytest.MonkeyPatch.context() as mp:
        mp.setattr(strategy, "WALL_SLACK", 3600.0)
        cfg = generate(Path(d) / "c", jobs, n, "mixed", nodes=nodes)
        check(cfg, "cold")
        assert edit(cfg, rng) == kind
        yield cfg


# (in the slow tier with fleet 210 below: 12-16 s each on this machine, a tier proven on a 400-540-job fleet; CI's
# whole run reached 739 s on 2026-12-01, over its 10 minutes)
@pytest.mark.slow
def test_a_plan_after_tenant_quotas_are_set_on_a_mixed_cluster_passes_applys_recheck():
    """bench.explore_mixed's fleet 80 (428 trace jobs on 31 / 13 / 23 / 23 fixed nodes of 8 / 4 / 2 / 1 GPUs), planned,
    applied, then tenant quotas set: on main at 5e91380 the plan after the edit left its "guarantees kept" tier
    FEASIBLE at 2,416 of 2,471 and evicted job-00007 and others inside team-2's guarantee, which no rule required:
    apply's re-check refused the plan the planner had just made. The tier's LP-guided neighbourhood now proves it at
    2,471: every rule holds, the re-check accepts, and the plan after its apply is a no-op (`check` asserts each)."""
    from bench.explore_mixed import check

    with _explored(80, "quota") as cfg:
        res = check(cfg, "after quota")
        tiers = {t["name"]: t for t in res.plan.solver.tiers}
        assert tiers["guarantees kept"]["value"] == tiers["guarantees kept"]["bound"], tiers["guarantees kept"]


def test_a_plan_whose_guarantees_tier_is_not_proven_never_stops_a_guaranteed_job_no_rule_requires(monkeypatch):
    """The same fleet 80 after its quota edit, with the tiers' neighbourhood search off (strategy.RINS_FROM) and half
    the budget for the tiers (FIXED_TIERS_WORK), as on main at 5e91380: CP-SAT's answer, its "guarantees kept" tier
    FEASIBLE, evicted job-00007 and job-00111 inside team-2's guarantee, which no rule requires stopping. `reconcile
    apply` without --plan does not re-check the plan it makes: it stopped both jobs. Now the planner applies the
    re-check's rule to its own answer and emits greedy's plan, which stops only what a rule requires, saying why.
    (Since the guaranteed work tiers' whole-job bounds the cold plan, and so the fleet, differ, and CP-SAT's answer here
    stops no guaranteed job; the rule is asked of that answer with one evicted, as main's answer then was.) The apply
    of the plan keeps every job it keeps running."""
    from dataclasses import replace

    from reconciler import api
    from reconciler.plan import make_plan
    from reconciler.plancheck import recheck, unlawful_evictions
    from reconciler.runtime.publish import demanding
    from reconciler.solve import solve, strategy

    with _explored(80, "quota") as cfg:
        monkeypatch.setattr(strategy, "RINS_FROM", 10**9)
        monkeypatch.setattr(strategy, "FIXED_TIERS_WORK", strategy.TIERS_WORK)  # (the tiers' half, as on a fleet that buys)
        res = api.plan(cfg, time_limit=20)
        assert res.solution.status != "GREEDY_FALLBACK", res.solution.note  # (CP-SAT's answer: greedy's has no fallback)
        assert not recheck(res.plan, res.desired, res.observed, res.problem)[1]
        running = res.observed.placements

        def greedy():
            fallback = solve(res.problem, time_limit=0)
            return fallback, make_plan(demanding(res.desired, res.observed), res.observed, res.problem, fallback)

        def stopping(job: str):
            return replace(res.plan, jobs=tuple(replace(j, action="evict", instances=(), gpus=()) if j.job == job else j
                                                for j in res.plan.jobs))

        # (the applied cold plan differs from main's then, so which guaranteed jobs run does too: the first one whose
        # stop the rule refuses, in the plan's order)
        job = next(j.job for j in res.plan.jobs if j.action == "keep" and unlawful_evictions(stopping(j.job), res.observed, res.problem))
        plan, solution = api._lawful(res.observed, res.problem, stopping(job), res.solution, greedy)
        assert solution.status == plan.solver.status == "GREEDY_FALLBACK"
        assert f"no rule requires stopping, {job} first" in plan.solver.note
        assert {j.job: j.action for j in plan.jobs}[job] == "keep"
        assert api._lawful(res.observed, res.problem, res.plan, res.solution, greedy)[0] is res.plan  # (a lawful plan as it is)
        api.apply(cfg, saved_plan=res.plan, time_limit=20, allow_destroy=10**6)  # (the plan as made: not solved again)
        after = api.plan(cfg, time_limit=0).observed.placements
        kept = [j.job for j in res.plan.jobs if j.action == "keep"]
        assert job in kept and all(after.get(j) == running[j] for j in kept)


# (in the slow tier: 21-46 s each on the 2-core CI machine, whose default tier reached 609 s on 2026-12-01, over its
# 10 minutes; the same suite at the session's first commit took 563 s there that day)
@pytest.mark.slow
def test_work_on_a_pool_over_its_max_is_offered_room_its_tenants_lower_work_holds_after_a_shrink():
    """bench.explore_mixed's fleet 147 (302 trace jobs on 20 / 19 / 28 / 11 fixed nodes of 8 / 4 / 2 / 1 GPUs), its
    pools shrunk to 80% after the first apply: the search chooses which instances go, so the running work on them was
    neither pending nor forced to move, and the model offered it no host where a lower job of another tenant runs whose
    own tenant's higher work could take that room. The plan kept 1,057 of 1,190 running normal units, at
    `--time-limit 80` too, evicting normal jobs while low ones stayed; the plan after its apply placed 12 normal jobs by
    evicting low ones (each low job's tenant's own normal work arriving): not a no-op. Now such work is offered that
    room as new work is, and the plan after the shrink's apply is a no-op (`check`: every rule, the re-check too)."""
    from bench.explore_mixed import check

    with _explored(147, "shrink") as cfg:
        res = check(cfg, "after shrink")
        tiers = {t["name"]: t for t in res.plan.solver.tiers}
        assert tiers["guaranteed running normal jobs kept"]["value"] > 1_100, tiers["guaranteed running normal jobs kept"]


# (in the slow tier with fleet 210 below: 12-16 s each on this machine, a tier proven on a 400-540-job fleet; CI's
# whole run reached 739 s on 2026-12-01, over its 10 minutes)
@pytest.mark.slow
def test_a_fixed_clusters_tiers_get_the_work_its_cost_stage_does_not_need():
    """bench.explore_mixed's fleet 41 (540 trace jobs on 39 / 12 / 36 / 18 fixed nodes of 8 / 4 / 2 / 1 GPUs), its pools
    shrunk to 80% after the first apply: with half the budget for the tiers, as on a fleet that buys, the plan kept
    1,834 of its 1,869 running normal units (FEASIBLE; at `--time-limit 80` it proves 1,869), and the plan after its
    apply evicted three low jobs for normal ones: not a no-op. On a fixed cluster (every pool's min_instances its max)
    the instances cost the same whatever the answer, so the tiers now get most of the budget (strategy.tiers_work): the
    tier is proven and the plan after the shrink's apply is a no-op (`check`: every rule, the re-check too)."""
    from bench.explore_mixed import check

    with _explored(41, "shrink") as cfg:
        res = check(cfg, "after shrink")
        tiers = {t["name"]: t for t in res.plan.solver.tiers}
        assert tiers["guaranteed running normal jobs kept"]["value"] == tiers["guaranteed running normal jobs kept"]["bound"]


# (in the slow tier with fleet 210 below: 12-16 s each on this machine, a tier proven on a 400-540-job fleet; CI's
# whole run reached 739 s on 2026-12-01, over its 10 minutes)
@pytest.mark.slow
def test_a_tiers_neighbourhoods_have_the_work_to_reach_a_shrunk_clusters_running_work():
    """bench.explore_mixed's fleet 208 (435 trace jobs on 18 / 18 / 51 / 36 fixed nodes of 8 / 4 / 2 / 1 GPUs), its pools
    shrunk to 80% after the first apply: the tier keeping the running normal jobs had three neighbourhoods of 0.12
    deterministic s each (strategy.TIER_RINS_SHARE at half), which stalled at 1,596 of its 1,617 units; the normal work
    tier stopped at 16,030 of 16,170, and the plan after the shrink's apply evicted team-0's and team-1's low jobs for
    their normal ones: not a no-op (fleet 207 after its priorities changed: the same). With three quarters the normal
    work tier is proven and the plan after the apply is a no-op (`check`: every rule, the re-check too)."""
    from bench.explore_mixed import check

    with _explored(208, "shrink") as cfg:
        res = check(cfg, "after shrink")
        tiers = {t["name"]: t for t in res.plan.solver.tiers}
        assert tiers["guaranteed normal work"]["value"] == tiers["guaranteed normal work"]["bound"], tiers["guaranteed normal work"]


# (in the slow tier: 21-46 s each on the 2-core CI machine, whose default tier reached 609 s on 2026-12-01, over its
# 10 minutes; the same suite at the session's first commit took 563 s there that day)
@pytest.mark.slow
def test_an_exhausted_neighbourhood_opens_the_room_of_its_tenants_running_lower_work():
    """bench.explore_mixed's fleet 210 (543 trace jobs on 29 / 12 / 59 / 10 fixed nodes of 8 / 4 / 2 / 1 GPUs), some
    priorities changed after the first apply: the high work tier's neighbourhoods were proven optimal at 72,100 of its
    73,500 (neither the tier's LP optimum nor the answer so far used the room of team-0's running low job-00373, so
    they held it shut), and the plan after the apply placed team-0's high job-00487 there, evicting it: not a no-op.
    A neighbourhood exhausted below the tier's bound is now searched again with the room a group's pending work may take
    from its own tenant's running lower jobs open (strategy.own_lower_room): the tier is proven at 73,500 and the plan
    after the apply is a no-op (`check`: every rule, the re-check too)."""
    from bench.explore_mixed import check

    with _explored(210, "raise") as cfg:
        res = check(cfg, "after raise")
        tiers = {t["name"]: t for t in res.plan.solver.tiers}
        assert tiers["guaranteed high work"]["value"] == tiers["guaranteed high work"]["bound"], tiers["guaranteed high work"]


def test_a_critical_cpu_job_in_its_tenants_low_jobs_room_ranks_as_the_model_ranks_it():
    """fleet78 (the slow tier's random fleets, 2026-12-01): t2's new critical 12-vCPU job takes the room of its running
    low 4-vCPU jobs j5 and j6 on i0 (its own higher class, inside its guarantee). The plan is OPTIMAL and lawful, but the
    property test's ranking (tests/invariants._guarantee_kept) counted the critical job as standing in for one 4-vCPU
    unit, where the model counts three (objective.stand_in_units): "CP-SAT ranks (4, ...) below greedy (6, ...)"."""
    check_fleet(fleet("fleet78"), time_limit=5)


def test_the_property_tests_check_the_plan_the_planner_emits():
    """fleet79 (the slow tier's random fleets, 2026-12-01): the first search's answer evicts t1's protected low j0, and
    the planner searches it again (api._lawful) and emits a plan that keeps it. The property test checked the first
    answer; it now checks the emitted plan (api.emitted)."""
    check_fleet(fleet("fleet79"), time_limit=5)


def test_a_plan_whose_backfill_gives_a_lower_class_room_to_its_tenants_higher_class_is_checked_by_class():
    """fleet80 (the slow tier's random fleets, 2026-12-01; on main before this session's changes too): greedy's answer
    left t3's normal spot-required j1 pending (the spot share refused a first spot instance) and put t3's low 4-GPU j2 on
    the spot instance bought later; the plan's backfill gives j2's room to j1 (backfill._displace: the README's order, a
    tenant's higher class first), 210 of the answer's 280 work units summed. The property test took any plan running
    less than its answer for the packer's known drop at max_instances; it now ranks such a plan by class."""
    check_fleet(fleet("fleet80"), time_limit=5)


def test_a_way_topped_up_from_the_buffers_idle_room_says_the_buffer_blocks_it_on_fleet81():
    """fleet81 (the slow reason tier's random fleets, 2026-12-01; on main before this session's changes too): t2's
    2 x 8-GPU zone gang j1 waited with "not placed by this plan, although 1 new p4d.24xlarge on-demand in aws-a100
    (aws/us-east-1b) would hold it under every pool, budget, quota and spot rule; the solver did not find that
    placement", where that way tops one new p4d up with the idle p4d the on-demand buffer (25% of t1's spot g5) stands
    on, which the buffer refuses. The ways topped up from room are asked the buffer now, as ways in room alone were:
    "pools at max_instances (aws-a100 1/2); the job needs 2 new instances; other capacity is blocked by the on-demand
    buffer", and lifting that limit places it (`check_reasons`)."""
    from tests.test_truth import check_reasons

    check_reasons(fleet("fleet81"))


def test_deadline_work_ranks_first_within_its_class_in_the_plans_order_on_fleet82():
    """fleet82 (the licenses / reservations / deadlines property tier's fleets drawn at random, 14 jobs, 2026-12-01; on
    main before this session's changes too): one spot g5.12xlarge (4 A10G) in a pool of one, t1's normal 4-GPU j4 and
    priority-50 1-GPU j1 with the same deadline. The tiers rank deadline work first within its class (rank x size:
    j4's 28 above j1's 7), so CP-SAT runs j4 there; greedy runs j1 (the higher priority). The plans' order
    (plan.quality.outcome_rank, which decides whether greedy's plan replaces CP-SAT's where its counts did not pack)
    and the test oracle's left the deadline tier out and ranked greedy's above: an emitted "greedy's ranks higher by
    the tiers" would have been untrue. Both count it now."""
    from reconciler.plan import outcome_rank
    from reconciler.problem import build_problem
    from tests.test_properties import solve_both

    desired, observed, (solution, plan), (gsol, gplan) = solve_both(fleet("fleet82"), time_limit=5)
    problem = build_problem(desired, observed)
    assert "j4" in {j.job for j in plan.jobs if j.action == "place"} and "j1" in {j.job for j in gplan.jobs if j.action == "place"}
    assert outcome_rank(problem, plan, observed) > outcome_rank(problem, gplan, observed)
    check_fleet(fleet("fleet82"), time_limit=5, solved=(desired, observed, (solution, plan), (gsol, gplan)))


def test_running_work_a_pool_maximum_kept_out_stays_where_the_spot_rules_free_its_host_on_fleet83():
    """fleet83 (the slow property tier, 2026-12-01, after the saved-plan re-check stopped licensing every eviction while
    a fleet-wide rule is broken): pool az-a100-80 at max 1 runs three 1-GPU instances (i0 spot with j5, i1 on-demand with
    j7, i2 spot idle), the spot share at most 25%, preemption Never, and t1's new priority-50 j1 waits. Greedy kept j5
    (first in its order) and so not j7 (the pool's one slot taken), then gave up i0 for the spot share and placed the
    new j1 on i1: j7 stopped for new work, which preemption Never forbids (a stricter re-check tried that day refused
    greedy's plan, the planner's fallback; it was taken back: fleet85). Now running work the maximum kept out is asked
    again after the spot rules are settled: j7 stays on i1, as CP-SAT plans."""
    from tests.test_properties import solve_both

    desired, observed, (solution, plan), (gsol, gplan) = solve_both(fleet("fleet83"), time_limit=5)
    kept = {j.job for j in gplan.jobs if j.action == "keep"}
    assert "j7" in kept and {d.instance_id for d in gplan.deletes} == {"i0", "i2"}, [(j.job, j.action) for j in gplan.jobs]
    check_fleet(fleet("fleet83"), time_limit=5, solved=(desired, observed, (solution, plan), (gsol, gplan)))


@pytest.mark.parametrize("name", ["fleet84", "fleet85", "fleet86"])
def test_mending_a_pool_maximum_may_stop_work_another_spot_rule_then_needs_stopped(name):
    """fleet84, fleet85 (the slow property tier, 2026-12-01, with the saved-plan re-check's stricter rule of that day:
    a guaranteed job's stop passes only where it mends a rule broken now). fleet85: pool az-a100-80 at max 1 runs three
    on-demand instances (j2 on i0), t1's low j1 runs on a spot g5.xlarge, the SpotPolicy asks a 25% on-demand buffer.
    Mending the maximum deletes the idle on-demand instances, and then the buffer breaks: j1 on spot has to stop. The
    buffer was not broken now, so the stricter rule refused CP-SAT's plan and greedy's alike and no plan was emitted
    ("internal error: the plan would stop running work that no rule requires stopping"). The rule was taken back; these
    fleets hold any stricter one to the planner's own plans. fleet86 (the slow property tier, 2026-12-02, with
    plancheck.KeptInstead): the fleet broke pool gcp-cpu's maximum, the spot buffer and t1's own spot share; greedy
    stopped t1's j3 and j9, which t1's spot share licenses, and the re-check refused it: with a fleet-wide rule broken
    it weighed every stop by the plan with the job kept, and forgot that a tenant's own broken rule lets its work go."""
    check_fleet(fleet(name), time_limit=5)


def test_a_cpu_jobs_room_stands_in_for_lost_cpu_work_only_on_fleet87():
    """fleet87 (the slow property tier, 2026-12-02): t1's normal 4-vCPU j10 must leave its pool (allowlist) and its
    low 1-GPU j8 its instance; CP-SAT moves j10 and places the new critical 12-vCPU j6, greedy stops j10 for j6. The
    property counted greedy's plan 45 guaranteed units to CP-SAT's 44: j6, taking the room of three j10s, stood in for
    3 units of the lost j8, a GPU job, which CPU work's room does not hold (README, Tenants: a CPU job counts for as many
    of its tenant's smaller CPU jobs as it takes the room of; GPU work by its own units). Counted so, both keep 44."""
    check_fleet(fleet("fleet87"), time_limit=5)


def test_greedy_gives_up_no_spot_host_that_cannot_mend_the_spot_share_on_fleet88():
    """fleet88 (the slow property tier, 2026-12-02): five spot A100 instances in a pool at max 1 and two spot CPU hosts;
    the fleet is all spot, over max_spot_fraction 0.25 (counted in GPUs). Greedy's settle_spot gave up the spot host of
    lowest-ranked work first: t2's guaranteed low j6 on a spot m6i.4xlarge, which holds no GPU and so mends nothing.
    The host, reopened later, took t1's new j4, and j6 was stopped: another tenant's guaranteed work for new work
    (which plancheck.KeptInstead refuses: the rule broken now needs no stop of j6). CP-SAT kept j6."""
    desired, observed, (solution, plan), (gsol, gplan) = solve_both(fleet("fleet88"), time_limit=5)
    assert next(j for j in gplan.jobs if j.job == "j6").action == "keep"
    check_fleet(fleet("fleet88"), time_limit=5, solved=(desired, observed, (solution, plan), (gsol, gplan)))


def test_greedy_undoes_no_stop_whose_budget_the_higher_job_spent_elsewhere_on_fleet89():
    """fleet89 (the slow property tier, 2026-12-02): t3 ($5/h) runs its high j1 on i0, an a2-highgpu-1g at $3.67/h;
    its critical j8 on the on-demand p4d (+1) costs $2.74/h, over the budget beside j1. Greedy's _place_displacing
    stopped j1 to free i0, and j8, planned with j1's charge gone, went first fit on the p4d; j1's stop was then undone
    with no rule asked (j8 took none of i0's room): t3 at $6.42/h. Planned with the freed room first, and the stops it
    takes no room of undone before anything is placed, j8 takes i0 and j1 stops for it."""
    desired, observed, (solution, plan), (gsol, gplan) = solve_both(fleet("fleet89"), time_limit=5)
    jobs = {j.job: j for j in gplan.jobs}
    assert jobs["j8"].instances == ("i0",) and jobs["j1"].action == "evict", {k: (v.action, v.instances) for k, v in jobs.items()}
    check_fleet(fleet("fleet89"), time_limit=5, solved=(desired, observed, (solution, plan), (gsol, gplan)))


def test_a_tenants_guarantee_held_by_its_higher_job_in_its_own_room_weighs_against_anothers_on_fleet90():
    """fleet90 (the slow property tier, 2026-12-02; at 52921ca too): seven A100-80GB instances in a pool lowered to max
    1 under a $15/h budget; t3's running normal j0 on i0 and its new high j3, t2's (no quota: all it runs guaranteed)
    normal j4 and j6 on i2 and i3. One slot, and either tenant's guarantee gives: both planners give it to t3, j3 in
    j0's room (its own higher class). The re-check weighed j4's stop with j3 waiting (another tenant's new work) and
    i0 then idle, but left j0 stopped, so keeping j4 "broke no rule", and both plans were refused: no plan at all
    ("internal error ... refusing to emit it"). With j3 waiting, j0 is back where it ran, and keeping j4 beside it
    breaks the pool's max: the stop is lawful."""
    from reconciler.plancheck import recheck
    from reconciler.problem import build_problem

    desired, observed, (solution, plan), (gsol, gplan) = solve_both(fleet("fleet90"), time_limit=5)
    actions = {j.job: j.action for j in plan.jobs}
    assert actions["j3"] == "place" and actions["j4"] == actions["j6"] == actions["j0"] == "evict", actions
    for p in (plan, gplan):
        assert not recheck(p, desired, observed, build_problem(desired, observed))[1]
    check_fleet(fleet("fleet90"), time_limit=5, solved=(desired, observed, (solution, plan), (gsol, gplan)))


def test_greedy_keeps_guaranteed_running_work_before_borrowed_when_a_pool_is_over_its_max_on_fleet91():
    """fleet91 (the slow property tier, 2026-12-02; at 52921ca too): a pool lowered to max 1 runs t3's borrowed low j0
    (quota 0 GPUs, burst 4) on i0 and t1's guaranteed low j6 on i1. Greedy kept running work in its placing order
    (class, ..., name): j0 took the one slot and j6 was evicted, and apply's re-check refused greedy's plan (CP-SAT's
    kept j6). Guaranteed running work is kept first now, as the model's first tier ranks it."""
    desired, observed, (solution, plan), (gsol, gplan) = solve_both(fleet("fleet91"), time_limit=5)
    for p in (plan, gplan):
        actions = {j.job: j.action for j in p.jobs}
        assert actions["j6"] == "keep" and actions["j0"] == "evict", (p.solver.status, actions)
    check_fleet(fleet("fleet91"), time_limit=5, solved=(desired, observed, (solution, plan), (gsol, gplan)))


def test_greedy_buys_spot_diversity_before_giving_up_a_guaranteed_jobs_spot_host_on_fleet92():
    """fleet92 (the slow property tier, 2026-12-02; at 52921ca too): t2's guaranteed low j8 runs on i2, the fleet's one
    spot instance (a g5.xlarge in us-east-1a), and the SpotPolicy asks for two spot zones. Greedy's settle_spot gave up
    i2 (diversity holds once no spot is left); a spot a2-highgpu-1g bought in GCP later mended the rule, i2 was reopened
    for t1's new j0, and j8 was stopped for it: apply's re-check refused greedy's plan (CP-SAT's kept j8 and bought
    that spot instance idle). Greedy now buys the spot instance the rule asks for before it gives up running work."""
    both_plans_keep_every_rule(fleet("fleet92"), j8=("keep", ("i2",)))


def test_greedy_buys_no_spot_for_diversity_while_a_tenant_must_give_up_spot_work_on_fleet93():
    """fleet93 (the slow property tier, 2026-12-02, on this session's fleet92 change): two spot m6i.4xlarge, t1's CPU
    j7 on i0 while t1's spot share is 0, and two spot instance types asked for. settle_spot bought a spot g5.xlarge for
    the second type, then j7 gave up spot and i0 went: the g5 stood alone and greedy's plan broke min_instance_types.
    No spot is bought for diversity while a tenant is over its own spot share (what stays on spot is not settled)."""
    check_fleet(fleet("fleet93"), time_limit=5)


def test_greedy_keeps_running_work_again_only_where_the_on_demand_buffer_holds_on_fleet94():
    """fleet94 (the slow property tier, 2026-12-02; at 52921ca too): a 50% on-demand buffer, t1's low j1 on i3 (the
    fleet's one on-demand instance, 1 GPU) and a $15/h budget. Greedy kept t1's j6 first, so j1 waited on t1's quota;
    settle_spot then gave up j6's spot host and kept i3 idle beside a g5.xlarge bought for the buffer (2 idle GPUs, 50%
    of the 4 left on spot). keep_running, asked again after, put j1 back on i3 without asking the buffer, and greedy's
    plan left 1 idle on-demand GPU of the 2 needed (no budget for more ballast). Running work kept again takes the
    buffer's room only where the buffer still holds (or holds with ballast bought): j1 is evicted, as CP-SAT's plan does."""
    desired, observed, (solution, plan), (gsol, gplan) = solve_both(fleet("fleet94"), time_limit=5)
    actions = {j.job: j.action for j in gplan.jobs}
    assert actions["j1"] == "evict", (gplan.solver.status, actions)
    assert "i3" not in {d.instance_id for d in gplan.deletes}, gplan.deletes
    check_fleet(fleet("fleet94"), time_limit=5, solved=(desired, observed, (solution, plan), (gsol, gplan)))


def test_greedy_buys_spot_diversity_and_ballast_before_giving_up_a_guaranteed_jobs_spot_host_on_fleet95():
    """fleet95 (the slow property tier, 2026-12-02; at 52921ca too): t2's guaranteed low j8 runs on i1, a spot A100
    in eastus-1, kept alone while the SpotPolicy asks for two spot zones and a 50% on-demand buffer (pool gcp-a100 is
    over its max now). Greedy's settle_spot bought no ballast while diversity was broken, and bought no spot for
    diversity while the buffer was broken, so it gave up i1 and j8 with it; two on-demand A100s filled the pool after,
    and apply's re-check refused greedy's plan (CP-SAT's kept j8). Greedy now mends diversity first where ballast then
    mends the buffer, as the model may, and keeps j8."""
    both_plans_keep_every_rule(fleet("fleet95"), j8=("keep", ("i1",)))


def test_greedy_asks_the_next_spot_host_for_diversity_before_giving_up_a_guaranteed_jobs_spot_host_on_fleet96():
    """fleet96 (the slow property tier, 2026-12-02, after the fleet94 and fleet95 fixes; at 52921ca too): t2's
    guaranteed low j8 runs on i2, a spot A100 in eastus-1, kept alone while the SpotPolicy asks for two spot zones and a
    50% on-demand buffer. settle_spot kept the cheapest idle spot host of another zone, i0 (a spot g5.12xlarge), but it
    took aws-a10g's one slot (max 1), the only pool with room for on-demand ballast: nothing mended the buffer, i0 was
    closed, and i2 was given up at once with j8 on it; apply's re-check refused greedy's plan (CP-SAT's kept j8 beside
    i3, the spot a2-highgpu-4g in GCP, and an on-demand g5.12xlarge). Greedy now asks the next spot host for diversity
    (i3, then a spot instance to buy) before it gives up running work, and keeps j8 as CP-SAT does."""
    both_plans_keep_every_rule(fleet("fleet96"), j8=("keep", ("i2",)))


def test_greedy_asks_an_idle_on_demand_host_again_once_a_spot_host_given_up_frees_its_pool_slot_on_fleet97():
    """fleet97 (the slow property tier, 2026-12-02; at f3d8ec5 too): pool az-a100-80 (max 2) runs three 1-GPU
    instances: t1's guaranteed high j2 on spot i0, t1's guaranteed low j9 on spot i5 and t2's guaranteed low j4 on
    on-demand i1, under max_spot_fraction 0.5. Greedy kept j2 and j9 (one slot each), so the spot share broke; the idle
    on-demand i1 was its first mend, but the pool's max refused it then, and settle_spot dropped it for good. It gave
    up i5 (j9), and the slot freed went to an on-demand A100 bought as ballast, identical to i1: j4 found no slot when
    running work was kept again, and t1's new critical j5 took i1, where j4 ran; apply's re-check refused greedy's
    plan (CP-SAT's kept j4, and j5 took j2's room, its own tenant's lower class). A spare host refused now is asked
    again after the next release: i1 stays, j4 with it, and greedy's plan is CP-SAT's. (Since fleet136, CP-SAT's plan
    is another that ranks higher: its first answer's stand-in, j5 on i1, was not in the room of t1's lost j9, so it
    kept 7 guarantee units of the 14 it claimed; searched again with stand-ins in their rooms, t1's high j2 moves to
    i1, lawfully (the spot share), j5 takes j9's slot i5: 14 kept, and t1's high job runs, where greedy's stops it.)"""
    from tests.invariants import ranking

    desired, observed, (solution, plan), (gsol, gplan) = solve_both(fleet("fleet97"), time_limit=5)
    assert {j.job: (j.action, j.instances) for j in gplan.jobs}["j4"] == ("keep", ("i1",)), gplan.jobs
    assert ranking(desired, observed, plan) > ranking(desired, observed, gplan)
    check_fleet(fleet("fleet97"), time_limit=5, solved=(desired, observed, (solution, plan), (gsol, gplan)))


def test_greedy_keeps_no_spot_bought_for_diversity_once_the_spot_hosts_beside_it_are_given_up_on_fleet98():
    """fleet98 (the slow property tier, 2026-12-02, on main): one pool, az-mig (Standard_NC24ads_A100_v4 only, either
    market, max 3), t3's low MIG j0 on i0 (spot, eastus-1), and a SpotPolicy asking for 2 spot instance types and 2
    zones: no spot can keep it. settle_spot bought a spot instance in eastus-2 for the second zone (fleet92's mend), found
    no second type to buy, and gave up i0; the spot instance bought stayed, alone, and j0 was placed on it: greedy's plan
    broke spot diversity. The spot bought for diversity goes once every spot host beside it is given up; j0 moves to an
    on-demand instance, as in CP-SAT's plan."""
    desired, observed, (solution, plan), (gsol, gplan) = solve_both(fleet("fleet98"), time_limit=5)
    assert not [c for c in gplan.creates if c.market == "spot"], gplan.creates
    check_fleet(fleet("fleet98"), time_limit=5, solved=(desired, observed, (solution, plan), (gsol, gplan)))


def test_greedy_asks_a_spot_instance_to_buy_for_diversity_not_a_host_it_tried_on_fleet99():
    """fleet99 (made by hand, 2026-12-02): t1's guaranteed spot-required j8 runs on i2, a spot A100 in eastus-1; the
    SpotPolicy asks for two spot zones and a 50% on-demand buffer. settle_spot kept i0 (an idle spot g5.xlarge in
    us-east-1a) for the second zone, but it took aws-a10g's one slot, the only room for on-demand ballast, and was closed;
    _diversity_buy then named i0 again (the cheapest, tied at $0.4886/h with a spot g5.xlarge to buy in aws-a10g-b, a
    host first), tried already, so i2 was given up and j8 with it, and t2's new critical j0 took az-a100-80's slot.
    CP-SAT's plan keeps j8, buying the spot g5.xlarge in us-east-1b and an on-demand one in aws-a10g to stand idle. A spot
    instance tried is not asked again: greedy's plan is CP-SAT's."""
    both_plans_keep_every_rule(fleet("fleet99"), j8=("keep", ("i2",)))


def test_greedy_keeps_a_pools_on_demand_running_job_first_where_the_spot_share_needs_it_on_fleet100():
    """fleet100 (made by hand, 2026-12-02): az-a100-80 (max 1) runs t1's normal j1 on spot i0 and t2's normal j2 on
    on-demand i1, and t2's low j3 runs on i2, a spot T4; max_spot_fraction 0.5 and a 50% on-demand buffer, with room
    for one on-demand T4 as ballast. Greedy kept running work in its placing order: j1 took the pool's slot, j2 was kept
    out, the spot share (2 of 2 GPUs, 2 of 3 with the T4) gave up i2 and j3 with it, and greedy kept one job of three;
    CP-SAT keeps j2 and j3 (the T4 bought to stand idle) and evicts j1 (j1 and j2 rank alike). Where a pool's maximum
    keeps an on-demand host with running work out while a spot rule on-demand capacity mends is broken, greedy also
    plans keeping the on-demand jobs first among running work ranked alike, and takes that answer where it ranks
    above. Not always first: where spot diversity needs the spot job kept, the placing order's answer stays."""
    desired, observed, (solution, plan), (gsol, gplan) = solve_both(fleet("fleet100"), time_limit=5)
    for p in (plan, gplan):
        actions = {j.job: (j.action, j.instances) for j in p.jobs}
        assert actions["j2"] == ("keep", ("i1",)) and actions["j3"] == ("keep", ("i2",)), (p.solver.status, actions)
    check_fleet(fleet("fleet100"), time_limit=5, solved=(desired, observed, (solution, plan), (gsol, gplan)))


def test_greedy_keeps_a_gang_that_may_not_move_again_where_its_host_is_opened_again_on_fleet101():
    """fleet101 (the slow property tier, 2026-12-02; on main too): under WhenEmpty, t3's guaranteed low MIG gang j9 and
    t2's high j3 run on i1, a spot A100 in eastus-2; the SpotPolicy asks for two spot instance types, a 50% on-demand
    buffer and at most half of t3's work on spot. Kept as it runs, the fleet breaks all three (t3 runs j9 alone), so
    settle_spot gave up i1, before t3's new critical j7 (on-demand) was placed; the keep_fleet pass opened i1 again for
    j3 and bought a spot g5.xlarge for the second type, but j9, a running gang that may only stay or stop, was not asked
    again, and apply's re-check refused greedy's plan (j9 stopped where keeping it breaks no rule the plan keeps; CP-SAT's
    plan kept it). A gang that may not move is kept again once the new work is placed, where its hosts are open."""
    both_plans_keep_every_rule(fleet("fleet101"), j9=("keep", ("i1", "i1")))


def test_greedy_buys_spot_for_diversity_while_the_fleets_spot_share_is_broken_where_ballast_mends_it_on_fleet103():
    """fleet103 (the slow property tier, 2026-12-02; on main too): t1's guaranteed low j5 runs alone on i0, a spot
    g5.xlarge in us-east-1a (aws-a10g: spot, max 1); max_spot_fraction 0.25 and two spot zones asked. Kept, it breaks
    both. settle_spot asked for a spot instance in a second zone with the fleet's spot share checked, which the share
    (1 of 1 GPUs on spot, broken already) refused for every one; with diversity broken no ballast was bought, so i0 was
    given up, and t2's new normal j8 took aws-a10g's one slot: apply's re-check refused greedy's plan. CP-SAT's keeps j5
    beside a spot A100 in eastus-2 and an on-demand p4d (the A100 work, and the share). The spot share is not asked of a
    spot instance bought for diversity, as of a spot host kept for it: the ballast asked after mends it, or it is undone."""
    both_plans_keep_every_rule(fleet("fleet103"), j5=("keep", ("i0",)))


class _Draws:
    """Hypothesis's `data` stand-in for replaying a lifecycle machine's sequence: each draw returns the next value."""

    def __init__(self, values):
        self.values = list(values)

    def draw(self, strategy, label=None):
        return self.values.pop(0)


def test_the_plan_after_applying_a_reclaimed_high_jobs_replacement_is_a_no_op_on_fleet102(monkeypatch):
    """fleet102 (the slow lifecycle machine, 2026-12-02, seed 192029729994492918464157863499741042829; on main too),
    replayed step by step as the machine drew it (a sequence, not one fleet: the State's record of the apply matters).
    preemption Never, WhenUnderutilized, max_spot_fraction 0.5; t2's quota 4 GPUs (burst 8), t1 and t3 unlimited; pool
    a100 (on-demand, max 2) runs t2's low j3 and t1's low j5 on two a2-highgpu-1g. t1's low j6 (2 A100, NVLink) is added,
    and t2's high j4 (4 A10G) loses its spot g5.12xlarge to a reclaim. The apply's plan (OPTIMAL) re-places j4 on a new
    spot g5.12xlarge as borrowed work (t2's guarantee holds its running j3) and leaves j6 pending, "pools at
    max_instances (a100 2/2)". Right after the apply, j4 runs, and t2's guarantee is filled again by class
    (problem/tenants._fill): high j4 inside, low j3 borrowed (State.since then ordered only within a class: fleet71). t1's
    guaranteed j6 may then take borrowed room, and the plan moves j3 and j5 onto one new a2-highgpu-4g beside j6 (and j2
    to a spot g5.xlarge), $11.36/h -> $18.19/h: the fleet does not converge. Either the plan that places a tenant's new
    higher-class work should fill the guarantee as the plan after its apply will (j3 borrowed now, j6 placed now), or the
    fill should keep the jobs the last plan kept in the guarantee across classes too. The latter, since under preemption:
    Never no class takes another's place: the guarantee holds the longest-running first across classes (README,
    Tenants; problem/tenants._fill), and since fleet112 under LowerPriority too."""
    import tests.test_lifecycle_machine as life

    monkeypatch.setattr(life, "note", lambda text: None)  # (hypothesis's, outside a hypothesis test)
    gang = ["eligible", 2, "zone"]
    start = [None, {"gpus": 4, "burst": {"gpus": 8}}, None, "either", 3, "on-demand", 2, "on-demand", 1, "spot", 1,
             0.5, 0, "WhenUnderutilized", "Never", 5,
             "a10g", 0, "t1", "low", *gang, "a10g", 0, "t1", "low", *gang, "a100", 0, "t2", "low", *gang,
             "a10g", 1, "t2", "high", *gang, "a100", 0, "t1", "low", *gang]
    machine = life.FleetLifeSlow()
    try:
        machine.start(_Draws(start))
        machine.edit(_Draws(["a100nv", 0, "t1", "low", *gang]), "add_job")
        machine.reclaim_spot(0)
        machine.reclaim_spot(0)
        machine.apply_it(saved=False, allow=False)
    finally:
        machine.teardown()


def test_greedy_asks_again_for_diversity_a_release_made_possible_on_fleet104():
    """fleet104 (the slow property tier, 2026-12-02, after fleet103's fix): t1's guaranteed low j5 runs on i0, a spot
    g5.xlarge, and t1's low j6 on i1, a spot p4d holding aws-a100's one slot, both in us-east-1a; max_spot_fraction 0.25
    and two spot zones asked. settle_spot tried the spot A100s to buy in eastus for the second zone while i1 held the
    slot the on-demand p4d ballast needs: no ballast, each undone and marked tried. i1 was given up, but what was tried
    was not asked again, so i0 went too and t2's new j8 took its place: apply's re-check refused greedy's plan. CP-SAT's
    keeps j5 beside a spot A100 in eastus and an on-demand p4d. What was refused for want of ballast is asked again
    once after each release now (cleared after every release, settle_spot kept and gave up the same idle spot host
    without end: the revert 98aef55)."""
    both_plans_keep_every_rule(fleet("fleet104"), j5=("keep", ("i0",)))


def test_greedy_places_t2s_guaranteed_gang_before_new_work_on_fleet105():
    """fleet105 (the slow property tier, 2026-12-02, on main; seed 162308898016606114539372159019356780063): az-mig (one
    zone's Standard_NC24ads_A100_v4, 7 x 1g.10gb, max_instances 1) runs six instances; t2's protected low zone gang j3
    runs over the spot i0 and the on-demand i1, t1's protected low jobs beside it; max_spot_fraction 0.25 is broken.
    settle_spot gave up i0 (no ballast: the pool is at its max), and greedy placed t1's new normal j7 first, then t1's
    protected low j1 in the last room on i1: t2's j3 was evicted, and apply's re-check refused greedy's plan (t1's new
    work may take only t1's own protected work's place). CP-SAT's plan moves j3 whole onto i1 beside j7. Protected
    running work not kept is placed before new work now, but where its own tenant's higher class waits."""
    desired, observed, (solution, plan), (gsol, gplan) = solve_both(fleet("fleet105"), time_limit=5)
    for p in (plan, gplan):
        actions = {j.job: (j.action, j.instances) for j in p.jobs}
        assert actions["j3"] == ("move", ("i1", "i1")), (p.solver.status, actions)
        assert actions["j7"] == ("place", ("i1",)), (p.solver.status, actions)
    check_fleet(fleet("fleet105"), time_limit=5, solved=(desired, observed, (solution, plan), (gsol, gplan)))


def test_greedy_drops_the_idle_on_demand_host_the_spot_share_holds_without_on_fleet106():
    """fleet106 (the slow property tier, 2026-12-02, on this branch after fleet105's fix; seed
    86462951940573544463132473592388124538; greedy's plan is the same on main): gcp-a100 (max 2) runs three
    instances, i0 (on-demand a2-highgpu-1g, idle), i1 (on-demand a2-highgpu-4g: t1's low j1 and high j2) and i2 (spot
    a2-highgpu-4g: t1's high j9), over the $15/h budget and the 0.25 spot share. Greedy kept j9 on i2 first, which left
    the budget no room for i1; settle_spot kept the idle i0 for the share, then gave up i2 all the same, and i0 held
    the budget i1 needed when the running work was asked again: j2 was evicted and new work placed, and apply's
    re-check refused greedy's plan. CP-SAT's keeps j2 on i1 and moves j9 beside it. What settle_spot opened for the
    share and it holds without is closed before running work is asked again; greedy keeps j2 on i1 now. And it moves j9
    into t1's low j1's room, as CP-SAT does (it kept j1 and evicted j9: a protected running job placed anew took no
    protected job's room, though it keeps its own units; greedy._place_displacing)."""
    both_plans_keep_every_rule(fleet("fleet106"), j2=("keep", ("i1",)), j9=("move", ("i1",)), j1=("evict", ()))


def test_greedy_keeps_t2s_guaranteed_job_the_budget_had_room_for_on_fleet107():
    """fleet107 (the slow property tier, 2026-12-02, right after fleet106 was found; seed
    290526139111248997918985806750343138103; greedy's plan is the same on main): gcp-a100 (max 2) runs i0 (on-demand
    a2-highgpu-4g, $14.69/h: t1's low j0 and t2's guaranteed low j8), i1 and i2 (idle a2-highgpu-1g, spot and on-demand)
    and i3 (spot a2-highgpu-4g: t1's j1), over the $15/h budget, the spot share and t1's 4-GPU quota. Greedy kept j1 on
    i3 first (the budget then refused i0), settle_spot kept the idle on-demand i2 for the share and gave up i3 all the
    same; i2 still held the budget i0 needed, so j8 was evicted and apply's re-check refused greedy's plan. Fixed as
    fleet106: greedy keeps j8 on i0 now."""
    desired, observed, (solution, plan), (gsol, gplan) = solve_both(fleet("fleet107"), time_limit=5)
    actions = {j.job: (j.action, j.instances) for j in gplan.jobs}
    assert actions["j8"] == ("keep", ("i0",)), (gplan.solver.status, actions)
    check_fleet(fleet("fleet107"), time_limit=5, solved=(desired, observed, (solution, plan), (gsol, gplan)))


def test_greedy_keeps_t1s_spot_share_when_its_on_demand_job_gives_way_on_fleet108():
    """fleet108 (the slow property tier, 2026-12-02, on this branch after fleet107's fix; seed
    64256263978342057788832142507043075303; greedy's plan the same on main): t1 runs its CPU j2 on the spot m6i.4xlarge
    i1 and its A100 j3 on the on-demand a2-highgpu-1g i4 (gcp-a100, max 1), tenant_max_spot_fraction t1 0.5 and t2 0.
    Greedy's plan placed t2's new high j10 on i4 (`_place_reclaiming`: j3 borrows past t1's 0-GPU guarantee), evicted j3
    and kept j2 on i1: t1 had 1/1 on spot, over its 0.5 (check_plan), as nothing asked a tenant's share again once
    settle_spot had settled it and a stop took the tenant's on-demand work. CP-SAT's moves j2 and j3 and keeps every
    rule. Greedy now mends the share after each job placed (`_mend_tenant_spot`): j2 leaves spot, placed anew on an
    on-demand m6i.4xlarge."""
    check_fleet(fleet("fleet108"), time_limit=5)


def test_a_running_job_moved_into_its_tenants_lower_jobs_room_is_no_room_for_a_stand_in_on_fleet109():
    """fleet109 (the slow property tier, 2026-12-02, seed 196565461454183289081317592521045664663, on the integration
    branch): az-a100-80 (max 2) has four spot A100-80GB instances; t1's low j3 runs on i0, t2's high j4 on i1 and its low
    j5 on i2 (t1 and t2 have no quota: all they run is guaranteed). Two instances stay, so one of j3 and j5 must stop;
    t1's new j10 (priority 50) may take j3's room, t2's new high j12 (spot never) only a new on-demand instance. CP-SAT's
    first answer kept j4, placed j12 and stopped j3 and j5 (j12 counted for j5 wherever it landed): j3 was stopped for
    another tenant's new work, and `_lawful` searched again with stand-ins counted in their rooms. There the model
    moved j4 onto i2, j5's instance, and counted that item as t2's higher work in j5's room (objective.stand_in_room
    bounded a group's items there by those not staying where they run, and a moved running job's item is one), while
    the stand-in's units came from j12 on its new instance: j3 stopped again. The hold round then kept a t1 low job
    running, where greedy's plan puts j10 in j3's room: CP-SAT's plan (j3, j4) ranked below greedy's (j10, j4). Only
    new work stands in, as plancheck's `_arriving` reads it: a running job moved for no rule is no item in the room."""
    desired, observed, (solution, plan), (gsol, gplan) = solve_both(fleet("fleet109"), time_limit=5)
    actions = {j.job: (j.action, j.instances) for j in plan.jobs}
    assert actions["j10"] == ("place", ("i0",)) and actions["j4"] == ("keep", ("i1",)), (plan.solver.note, actions)
    check_fleet(fleet("fleet109"), time_limit=5, solved=(desired, observed, (solution, plan), (gsol, gplan)))


def test_a_resized_job_restarts_in_no_room_the_count_keeps_for_its_running_twin_on_fleet110(monkeypatch):
    """fleet110 (the slow lifecycle machine, 2026-12-02, seed 275936409248231398711704013558303347147; on main too),
    replayed as the machine drew it (a sequence, no file). t1 (no quota) runs five low jobs, applied: three 1-GPU A10G
    jobs on a g5.12xlarge and two CPU jobs (spot: never) on the cpu pool's one m6i.4xlarge (max 1): j4 (4 vCPU, 16 GiB)
    and j5 (12 vCPU, 48 GiB). j4 is resized to j5's shape: the two are one class of identical jobs now, and one
    m6i.4xlarge holds one of them. The solver kept one of the class's jobs running where it runs (a stay on the host,
    counted as running work kept: only j5 may run on as it runs); the plan gave that stay to j4, the first by name, so j4
    restarted in place and j5 was evicted for its own tenant's new work of its class. Apply's re-check refuses that,
    every search again and greedy's plan (the same assignment) did too, and `reconcile plan` failed with "internal error:
    the plan would stop running work that no rule requires stopping". plan/assign.choose_jobs gives a class's stays to
    its settled running jobs first: j5 stays, and j4 is stopped (it waits for room in its new shape)."""
    import tests.test_lifecycle_machine as life

    monkeypatch.setattr(life, "note", lambda text: None)  # (hypothesis's, outside a hypothesis test)

    a10g, cpu = ["a10g", 0, "t1", "low", "eligible", 2, "zone"], ["t1", "low", "never", 2, "zone"]
    start = [None, None, None, "either", 1, "either", 1, "on-demand", 1, "spot", 1, 0.5, 0, "WhenUnderutilized", "LowerPriority", 5,
             *a10g, *a10g, *a10g, "cpu", 0, *cpu, "cpu", 1, *cpu]
    machine = life.FleetLifeSlow()
    try:
        machine.start(_Draws(start))
        machine.edit(_Draws([machine._named("Job", "j4"), 1]), "change_resources")
        machine.plan_it()
        actions = {j.job: (j.action, j.instances) for j in machine.plan.jobs}
        assert actions["j5"][0] == "keep" and actions["j4"][0] == "evict", actions
    finally:
        machine.teardown()


def test_a_higher_class_job_bought_in_the_slot_of_its_tenants_deleted_instance_takes_its_room_on_fleet111():
    """fleet111 (the slow lifecycle machine, 2026-12-02, seed 4242032; on main too; the fleet before the plan that broke
    convergence, minimised): pool a100 (max 1) runs i1, a spot a2-highgpu-4g with t1's high j2; t1 (no quota: all it
    runs is guaranteed) adds a critical 4-GPU NVLink j4 and a spot-required 4-GPU A10G j5 (max_spot_fraction 0.5). The
    cheapest plan deletes i1 and buys an on-demand a2-highgpu-4g in its slot for j4 (on-demand room for the spot share
    too), $18.19/h; the re-check refused it (j4 landed on no instance j2 ran on), so the plan put j4 on i1 with an idle
    on-demand g5.12xlarge for the share, $20.56/h, and the plan right after its apply moved j4 to the on-demand A100
    all the same. A new instance bought in the slot of one the job ran on that the plan deletes, its pool at
    max_instances, is its room (plancheck.slots_bought_again)."""
    desired, observed, (solution, plan), (gsol, gplan) = solve_both(fleet("fleet111"), time_limit=5)
    actions = {j.job: (j.action, j.instances) for j in plan.jobs}
    new = {c.ref: (c.site.pool, c.site.instance_type, c.site.market) for c in plan.creates}
    assert actions["j2"][0] == "evict" and actions["j4"][0] == "place", (plan.solver.note, actions)
    assert new.get(actions["j4"][1][0]) == ("a100", "a2-highgpu-4g", "on-demand"), (actions, new)
    assert "i1" in {d.instance_id for d in plan.deletes} and plan.cost_after < 18.2, plan.cost_after
    check_fleet(fleet("fleet111"), time_limit=5, solved=(desired, observed, (solution, plan), (gsol, gplan)))


def test_the_repeat_search_counts_a_higher_class_job_in_a_deleted_instances_slot_as_its_room_on_fleet111():
    """fleet111 searched as api._lawful searches again (Problem.stand_in_rooms): the model counted t1's critical j4 in
    its high j2's room only where it landed on i1, not on the on-demand A100 bought in i1's slot (pool a100 at max 1),
    which plancheck counts (slots_bought_again): its plan kept i1 for j4 with an idle on-demand g5.12xlarge for the
    spot share, $20.56/h, where $18.19/h keeps every rule (objective._bought_again_rooms)."""
    import tempfile
    from dataclasses import replace

    from reconciler.load import load
    from reconciler.plan import make_plan
    from reconciler.plancheck import unlawful_evictions
    from reconciler.problem import build_problem
    from reconciler.solve import solve
    from tests.fleetkit import catalog_observed, write_config

    f = fleet("fleet111")
    with tempfile.TemporaryDirectory() as d:
        desired = load(write_config(Path(d), f.docs))
    observed = replace(catalog_observed(desired, f.instances, f.placements), gpu_indices=f.gpu_indices)
    problem = build_problem(desired, observed)
    plan = make_plan(desired, observed, problem, solve(replace(problem, stand_in_rooms=True), time_limit=5))
    new = {c.ref: (c.site.pool, c.site.instance_type, c.site.market) for c in plan.creates}
    j4 = next(j for j in plan.jobs if j.job == "j4")
    assert j4.action == "place" and new.get(j4.instances[0]) == ("a100", "a2-highgpu-4g", "on-demand"), (j4, new)
    assert plan.cost_after < 18.2 and not unlawful_evictions(plan, observed, problem), plan.cost_after


def test_the_plan_after_applying_a_higher_class_job_in_a_deleted_instances_slot_is_a_no_op_on_fleet111(monkeypatch):
    """fleet111 replayed as the lifecycle machine drew it (shortened): t1 runs two low A10G jobs on a g5.12xlarge and
    its high j2 on a spot a2-highgpu-4g (pool a100 at max 1); it adds the critical j4 and the spot-required j5. The plan
    is applied and planned again: a no-op (it moved j4, j1 and j3 for $2.37/h less, 3 creates and 3 deletes)."""
    import tests.test_lifecycle_machine as life

    monkeypatch.setattr(life, "note", lambda text: None)  # (hypothesis's, outside a hypothesis test)

    def job(kind, shape, priority, spot):
        return [kind, shape, "t1", priority, spot, 2, "zone"]

    start = [None, None, None, "either", 3, "either", 1, "on-demand", 3, "spot", 2, 0.5, 0, "WhenUnderutilized", "LowerPriority", 3,
             *job("a10g", 0, "low", "eligible"), *job("a100nv", 0, "high", "eligible"), *job("a10g", 0, "low", "eligible")]
    machine = life.FleetLifeSlow()
    try:
        machine.start(_Draws(start))
        machine.edit(_Draws(job("a100nv", 1, "critical", "eligible")), "add_job")
        machine.edit(_Draws(job("a10g", 1, "low", "required")), "add_job")
        machine.plan_it()
        machine.apply_it(saved=False, allow=False)  # (checks the plan after it is a no-op)
    finally:
        machine.teardown()


def test_a_tenants_new_higher_class_job_placed_beside_its_guaranteed_job_leaves_it_guaranteed_on_fleet112(monkeypatch):
    """fleet112 (the slow lifecycle machine, 2026-12-02, seed 4242032, after fleet111's fix; on main too), replayed as the
    machine drew it (shortened; a sequence, no file). t2 (2 GPUs guaranteed, burst 4) runs its normal 2-GPU A100 j1
    beside t1's normal j3 on the a100 pool's one a2-highgpu-4g (max 1), and its low 1-GPU A10G j2; t1's critical 4-GPU
    j4 waits for that pool (j1 is inside t2's guarantee). t2 adds a critical 1-GPU A10G j5: the plan places it beside
    j1 (t2 borrows 1 GPU: keeping j1 inside the guarantee ranks first). Right after the apply, t2's guarantee was
    filled again highest class first (j5, then j2: j1 no longer fits), so j1 was borrowed and the next plan evicted it
    and j3 for j4: the fleet did not converge. The guarantee holds the longest-running first across classes now, as
    under preemption: Never (problem.tenants._fill): the plan that placed j5 kept j1 inside it, and so does the next."""
    import tests.test_lifecycle_machine as life

    monkeypatch.setattr(life, "note", lambda text: None)  # (hypothesis's, outside a hypothesis test)

    def job(kind, shape, tenant, priority):
        return [kind, shape, tenant, priority, "eligible", 2, "zone"]

    t2 = {"gpus": 2, "cpu": 16, "burst": {"gpus": 4, "cpu": 32}}
    start = [None, t2, None, "either", 3, "either", 1, "on-demand", 3, "spot", 2, 0.5, 0, "WhenUnderutilized", "LowerPriority", 3,
             *job("a100nv", 0, "t2", "normal"), *job("a10g", 0, "t2", "low"), *job("a100nv", 0, "t1", "normal")]
    machine = life.FleetLifeSlow()
    try:
        machine.start(_Draws(start))
        machine.edit(_Draws(job("a100nv", 1, "t1", "critical")), "add_job")
        machine.apply_it(saved=False, allow=True)
        machine.edit(_Draws(job("a10g", 0, "t2", "critical")), "add_job")
        machine.plan_it()
        assert {j.job: j.action for j in machine.plan.jobs}["j5"] == "place"
        machine.apply_it(saved=True, allow=True)  # (checks the plan after it is a no-op)
    finally:
        machine.teardown()


def _judged(docs: list[dict], running: dict[str, str], idle: list[tuple[str, str]], stopped: set[str], bought: set[str], deleted: set[str]) -> dict[str, str]:
    """The re-check's verdict (plancheck.unlawful_evictions) on a plan edited from greedy's for `docs` (instances by
    (id, pool), g5.xlarge in a10g or m6i.4xlarge in cpu; `running`: job -> its instance): the `stopped` jobs evicted,
    the `bought` ones placed on new instances (those greedy buys for them on an empty fleet), `deleted` deleted."""
    import tempfile
    from dataclasses import replace

    from reconciler.load import load
    from reconciler.plan import make_plan
    from reconciler.plan.types import DeleteAction
    from reconciler.plancheck import unlawful_evictions
    from reconciler.problem import build_problem
    from reconciler.site import Site
    from reconciler.solve import solve
    from tests.fleetkit import catalog_observed, instance, write_config

    types = {"a10g": "g5.xlarge", "cpu": "m6i.4xlarge"}
    insts = [instance(i, p, "aws", "us-east-1", "us-east-1a", types[p]) for i, p in [(i, "a10g") for i in running.values()] + idle]
    with tempfile.TemporaryDirectory() as d:
        desired = load(write_config(Path(d), docs))

    def planned(observed):
        problem = build_problem(desired, observed)
        return problem, make_plan(desired, observed, problem, solve(problem, time_limit=0))

    observed = catalog_observed(desired, insts, {j: (i,) for j, i in running.items()})
    problem, plan = planned(observed)
    fresh = planned(catalog_observed(desired))[1]  # (greedy's on an empty fleet: the new instances it buys for each job)
    new = {j.job: j for j in fresh.jobs}
    refs = {r for j in bought for r in new[j].instances}
    edited = replace(plan, creates=tuple(c for c in fresh.creates if c.ref in refs),
                     jobs=tuple(replace(j, action="evict", instances=(), gpus=()) if j.job in stopped else
                                replace(new[j.job], previous=()) if j.job in bought else
                                replace(j, action="pending", instances=(), gpus=()) if j.action == "place" else j for j in plan.jobs),
                     deletes=tuple(DeleteAction(i.id, Site.of(i), 1.0, "edited") for i in insts if i.id in deleted))
    return unlawful_evictions(edited, observed, problem)


def _a10g_docs(max_instances: int, *jobs: tuple[str, str, str]) -> list[dict]:
    """Tenants t1 and t2 (no quota: all they run is guaranteed), pool a10g (g5.xlarge, at most `max_instances`), pool
    cpu (m6i.4xlarge, at most 1), LowerPriority, and 1-GPU A10G jobs (name, tenant, priority)."""
    from tests.fleetkit import doc, job, pool, tenant, topology

    return [topology(), tenant("t1"), tenant("t2"), pool("a10g", "aws", "us-east-1", ["us-east-1a"], ["g5.xlarge"], hi=max_instances),
            pool("cpu", "aws", "us-east-1", ["us-east-1a"], ["m6i.4xlarge"], hi=1),
            doc("PlacementPolicy", "pp", {"consolidation": "WhenEmpty", "preemption": "LowerPriority"}),
            *(job(n, t, 1, "A10G", cpu=2, mem=8, priority=p) for n, t, p in jobs)]


def test_a_higher_class_job_bought_beside_a_deleted_instance_below_its_pools_max_is_not_in_its_room_fleet113():
    """fleet113 (this session, reading plancheck's two readings of a slot bought again): t1 runs its low j1 on i0 (pool
    a10g, max 3) and adds a high j2; pool cpu runs two idle m6i.4xlarge over its max 1 (a fleet-wide rule broken now,
    so the re-check weighs each stop with the job kept instead: KeptInstead). A plan that deletes i0, stops j1 and buys
    a g5.xlarge for j2 stops j1 for nothing: a10g has room for i0 beside it. own_higher_class_room read a new instance
    as i0's room only in a pool ending at max_instances (slots_bought_again), KeptInstead any new instance of the pool,
    so j2 there was work "that cannot go back" and the stop passed. KeptInstead reads the slots bought again now."""
    docs = _a10g_docs(3, ("j1", "t1", "low"), ("j2", "t1", "high"))
    wrong = _judged(docs, {"j1": "i0"}, [("c0", "cpu"), ("c1", "cpu")], stopped={"j1"}, bought={"j2"}, deleted={"i0", "c0", "c1"})
    assert set(wrong) == {"j1"} and "breaks no rule the plan keeps" in wrong["j1"], wrong
    # (at max_instances 1 the new g5.xlarge is bought in i0's slot: j2 takes j1's room)
    docs = _a10g_docs(1, ("j1", "t1", "low"), ("j2", "t1", "high"))
    assert _judged(docs, {"j1": "i0"}, [("c0", "cpu"), ("c1", "cpu")], stopped={"j1"}, bought={"j2"}, deleted={"i0", "c0", "c1"}) == {}


def test_a_higher_class_job_bought_in_a_pool_observed_over_its_max_takes_the_room_of_a_deleted_instance_fleet113():
    """fleet113, a pool observed over its max_instances: a10g (max 2) runs t1's low j1 on i0 and two idle instances; t1
    adds a high j2, t2 a normal j3. A plan that deletes all three and buys two, j2 and j3 on them, is the lawful plan
    that gives i2 up for the pool's max, puts j2 in j1's room on i0 and j3 on i1, but for the instances' names: j2 is in
    i0's slot bought again (slots_bought_again counts pools over their max that end at it). The plan that keeps i0
    and i1 for j1 and j3 and stops nothing is lawful too; the one stopping j1 for j3 alone is not."""
    docs = _a10g_docs(2, ("j1", "t1", "low"), ("j2", "t1", "high"), ("j3", "t2", "normal"))
    idle = [("i1", "a10g"), ("i2", "a10g")]
    assert _judged(docs, {"j1": "i0"}, idle, stopped={"j1"}, bought={"j2", "j3"}, deleted={"i0", "i1", "i2"}) == {}
    assert set(_judged(docs, {"j1": "i0"}, idle, stopped={"j1"}, bought={"j3"}, deleted={"i0", "i1", "i2"})) == {"j1"}


def test_one_higher_class_job_in_a_slot_bought_again_stands_in_for_one_deleted_instances_job_fleet114():
    """fleet114 (a session reading plancheck's two readings of a slot bought again, 2026-12-03): a10g (max 2) runs t1's
    low j1 on i0 and low j5 on i1; t1 adds a high j2, t2 a normal j3. A plan that deletes both, buys two, and puts j2
    and j3 on them stops j1 and j5: one gives way to j2, the other to t2's new j3, which no rule allows (the guarantee
    gives way only to its own tenant's higher class). The re-check passed it: own_higher_class_room excused each stop
    whose room (i0's or i1's slot bought again: both new instances) held any of t1's higher work, counting j2 once per
    stop. It counts units now, as the model does (objective.stand_in_room): j2's 7 stand in for one of the 14 lost."""
    docs = _a10g_docs(2, ("j1", "t1", "low"), ("j5", "t1", "low"), ("j2", "t1", "high"), ("j3", "t2", "normal"))
    wrong = _judged(docs, {"j1": "i0", "j5": "i1"}, [], stopped={"j1", "j5"}, bought={"j2", "j3"}, deleted={"i0", "i1"})
    assert len(wrong) == 1 and "inside tenant t1's guarantee" in next(iter(wrong.values())), wrong
    # (with j3 t1's high job too, both stops are its own tenant's higher class taking their room)
    docs = _a10g_docs(2, ("j1", "t1", "low"), ("j5", "t1", "low"), ("j2", "t1", "high"), ("j3", "t1", "high"))
    assert _judged(docs, {"j1": "i0", "j5": "i1"}, [], stopped={"j1", "j5"}, bought={"j2", "j3"}, deleted={"i0", "i1"}) == {}


def test_one_higher_class_gpu_stands_in_for_one_of_two_stopped_jobs_on_one_instance_fleet114():
    """fleet114 on one instance: a g5.12xlarge (4 A10G) runs t1's low 1-GPU j1 and j5 on GPUs 0 and 1; t1 adds a high
    1-GPU j2, t2 a normal 3-GPU j3. A plan that stops j1 and j5 and places j2 on GPU 0 and j3 on GPUs 1-3 gives one of
    t1's guaranteed jobs to t2's j3. Both stops passed (j2 in the instance both ran on); one GPU of higher work stands
    in for one GPU of stopped work now. (With a 2-GPU j3 on GPUs 2 and 3, j5 stopped for nothing: refused too.)"""
    import tempfile
    from dataclasses import replace

    from reconciler.load import load
    from reconciler.plan import make_plan
    from reconciler.plancheck import unlawful_evictions
    from reconciler.problem import build_problem
    from reconciler.solve import solve
    from tests.fleetkit import catalog_observed, doc, instance, job, pool, tenant, topology, write_config

    def judged(j3_gpus: int) -> dict[str, str]:
        docs = [topology(), tenant("t1"), tenant("t2"), pool("a10g", "aws", "us-east-1", ["us-east-1a"], ["g5.12xlarge"], hi=1),
                doc("PlacementPolicy", "pp", {"consolidation": "WhenEmpty", "preemption": "LowerPriority"}),
                job("j1", "t1", 1, "A10G", cpu=2, mem=8, priority="low"), job("j5", "t1", 1, "A10G", cpu=2, mem=8, priority="low"),
                job("j2", "t1", 1, "A10G", cpu=2, mem=8, priority="high"), job("j3", "t2", j3_gpus, "A10G", cpu=2, mem=8, priority="normal")]
        with tempfile.TemporaryDirectory() as d:
            desired = load(write_config(Path(d), docs))
        observed = replace(catalog_observed(desired, [instance("i0", "a10g", "aws", "us-east-1", "us-east-1a", "g5.12xlarge")],
                                            {"j1": ("i0",), "j5": ("i0",)}), gpu_indices={"j1": ((0,),), "j5": ((1,),)})
        problem = build_problem(desired, observed)
        plan = make_plan(desired, observed, problem, solve(problem, time_limit=0))
        gpus = {"j2": ((0,),), "j3": (tuple(range(4 - j3_gpus, 4)),)}
        edited = replace(plan, creates=(), deletes=(), jobs=tuple(
            replace(j, action="evict", instances=(), gpus=()) if j.job in ("j1", "j5") else
            replace(j, action="place", instances=("i0",), gpus=gpus[j.job], previous=()) for j in plan.jobs))
        return unlawful_evictions(edited, observed, problem)

    for j3_gpus in (3, 2):
        wrong = judged(j3_gpus)
        assert len(wrong) == 1 and "inside tenant t1's guarantee" in next(iter(wrong.values())), (j3_gpus, wrong)


def test_greedy_buys_on_demand_ballast_for_a_spot_required_job_the_spot_share_refused_on_fleet111():
    """fleet111's greedy plan (the h5 hunt, 2026-12-03; on main): no on-demand buffer or spot diversity is asked, so
    greedy buys spot as it places work, the spot share asked per instance. t1's spot-required 4-GPU j5 would make the fleet
    8 of 12 GPUs spot, over max_spot_fraction 0.5, and waited ("spot share"), where CP-SAT places it: on-demand
    capacity bought to stand idle beside its spot instance mends the share (`_place_with_ballast`), which greedy tried only
    where its own restraint on spot (a buffer) had kept the job off spot. It is tried where the spot share refused the job
    too: greedy buys a spot and an on-demand g5.12xlarge (a10g, max 3) and places j5."""
    desired, observed, (solution, plan), (gsol, gplan) = solve_both(fleet("fleet111"), time_limit=5)
    actions = {j.job: (j.action, j.instances) for j in gplan.jobs}
    new = {c.ref: (c.site.instance_type, c.site.market) for c in gplan.creates}
    assert actions["j5"][0] == "place" and new[actions["j5"][1][0]] == ("g5.12xlarge", "spot"), (actions, new)
    assert actions["j4"] == ("place", ("i1",)), actions
    check_fleet(fleet("fleet111"), time_limit=5, solved=(desired, observed, (solution, plan), (gsol, gplan)))


def test_the_guaranteed_one_of_two_identical_jobs_keeps_running_on_fleet116():
    """fleet116 (the h5 hunt, 2026-12-03, made by hand for the spot share + budget chain; on main too): three 1-GPU A10G
    jobs run on three spot g5.xlarge, t1's j0 and j2 (t1 guarantees 1 GPU, its ceiling too: one of them must stop; j0,
    by name, is the one inside the guarantee) and t2's j1; t2 adds a critical on-demand-only p0. max_spot_fraction 0.5
    and a $1.50/h budget leave room for p0 on an on-demand g5.xlarge and one spot host. The model counts a kept identical
    job for a protected one (objective.protected_tier), so CP-SAT kept i2 and the plan ran j2 there and stopped the
    guaranteed j0 on its twin i0: the plan claimed its "guarantees kept" tier at 14 (its bound), where the plan it emitted
    keeps 7 (plan/quality.guarantee_kept), and it ranked below greedy's, which keeps j0. Where the host the protected
    job runs on is a twin of the one kept (pool, offer, price; each runs one job of the class, nothing else placed there),
    the plan keeps the protected job's host instead (plan/stability.keep_protected_twins). (Since fleet136 its 14 is
    true of the plan: the first answer placed p0 on a new on-demand host and counted it as standing in for t2's
    guaranteed j1 there, not in j1's room (spot i1, given up for the spot share), so it kept 7; searched again with
    stand-ins in their rooms, j1 moves to the on-demand host and p0 waits: 14 kept, which the README ranks first.)"""
    from reconciler.plan.quality import guarantee_kept
    from reconciler.problem import build_problem

    desired, observed, (solution, plan), (gsol, gplan) = solve_both(fleet("fleet116"), time_limit=5)
    actions = {j.job: (j.action, j.instances) for j in plan.jobs}
    assert actions["j0"] == ("keep", ("i0",)) and actions["j2"][0] == "evict" and actions["j1"][0] == "move", actions
    claimed = next((t["value"] for t in plan.solver.tiers if t["name"] == "guarantees kept"), None)
    assert guarantee_kept(build_problem(desired, observed), plan, observed) == claimed == 14
    check_fleet(fleet("fleet116"), time_limit=5, solved=(desired, observed, (solution, plan), (gsol, gplan)))


def test_a_tenant_over_its_ceiling_stops_the_job_its_guarantee_does_not_hold_on_fleet117():
    """fleet117 (the h5 hunt, 2026-12-03, a sweep of identical jobs on mixed hosts; on main too; 8 of 60 such fleets):
    t1 guarantees 2 GPUs (its ceiling too) and runs three identical 1-GPU A10G jobs, j0 alone on a spot g5.xlarge i0,
    j1 and j2 on an on-demand g5.12xlarge i1 beside t2's j3 (WhenEmpty, preemption Never, a $7/h budget the fleet
    keeps). One of t1's jobs must stop; its guarantee holds j0 and j1 (the README: the longest-running, then the highest
    class, the largest, then by name), so j2 is the one. CP-SAT's plan stopped j0 and deleted i0 ($5.67/h), claiming
    its "guarantees kept" tier at its bound where the plan keeps one protected job of two (plan/quality.guarantee_kept):
    the model counted j2 kept as j0 kept, one class of identical jobs. The net after the solve (quality.
    guarantees_kept_short, api.emitted) gave greedy's plan ($6.16/h: i0 kept). The model counts a protected job kept
    only where its class's stay on its host is its or the kept job moves (objective.protected_kept), and the plan
    gives a host's stay and the moves to protected jobs first (assign.choose_jobs): CP-SAT's plan moves j0 into j2's
    room on i1 (t1 over its ceiling licenses the move), stops j2 and deletes i0, $5.67/h, its tier true of it."""
    from reconciler.plan.quality import guarantee_kept
    from reconciler.problem import build_problem

    desired, observed, (solution, plan), (gsol, gplan) = solve_both(fleet("fleet117"), time_limit=5)
    actions = {j.job: (j.action, j.instances) for j in plan.jobs}
    claimed = next((t["value"] for t in plan.solver.tiers if t["name"] == "guarantees kept"), None)
    assert claimed == guarantee_kept(build_problem(desired, observed), plan, observed) == 21, (claimed, actions)
    assert actions["j0"] == ("move", ("i1",)) and actions["j1"] == ("keep", ("i1",)) and actions["j2"][0] == "evict", actions
    assert plan.solver.optimal and {d.instance_id for d in plan.deletes} == {"i0"}, (plan.solver, plan.deletes)
    check_fleet(fleet("fleet117"), time_limit=5, solved=(desired, observed, (solution, plan), (gsol, gplan)))


def test_another_tenants_work_takes_a_borrowed_job_not_its_guaranteed_twin_on_fleet122():
    """fleet122 (the h5 guarantee sweep, 2026-12-03, seed 73; on main too): t1 guarantees 2 GPUs (burst 4) and runs
    three identical 1-GPU A10G jobs, j0 on the spot g5.xlarge i0, j1 and j2 on on-demand ones; its guarantee holds j0 and
    j1, j2 is borrowed. t2 asks for a critical and a normal job of that shape (max_spot_fraction 0.5, a $7/h budget,
    WhenEmpty). CP-SAT's answer gave t2's critical j5 the spot host of t1's guaranteed j0 and kept the borrowed j2:
    another tenant's work took a guarantee, the tier claiming 14 where the plan keeps 7 (the net after the solve fell
    back to greedy's plan, which leaves j5 pending). Counted per host (objective.protected_kept), j5 reclaims the
    borrowed j2's host: j0 and j1 kept, j2 stopped, j5 placed, the tier proven and true of the plan."""
    from reconciler.plan.quality import guarantee_kept
    from reconciler.problem import build_problem

    desired, observed, (solution, plan), (gsol, gplan) = solve_both(fleet("fleet122"), time_limit=5)
    actions = {j.job: (j.action, j.instances) for j in plan.jobs}
    claimed = next((t["value"] for t in plan.solver.tiers if t["name"] == "guarantees kept"), None)
    assert claimed == guarantee_kept(build_problem(desired, observed), plan, observed) == 14, (claimed, actions)
    assert actions["j0"] == ("keep", ("i0",)) and actions["j1"] == ("keep", ("i2",)) and actions["j2"][0] == "evict", actions
    assert actions["j5"] == ("place", ("i1",)) and plan.solver.optimal, (actions, plan.solver)
    check_fleet(fleet("fleet122"), time_limit=5, solved=(desired, observed, (solution, plan), (gsol, gplan)))


def test_no_plan_stops_a_guaranteed_job_to_keep_its_borrowed_twin_on_fleet123():
    """fleet123 (the h5 guarantee sweep, 2026-12-03, seed 111; on main too): t1 guarantees 1 GPU (its ceiling) and runs
    five identical 1-GPU A10G jobs, j2 alone on the on-demand g5.xlarge i0, the others on the g5.12xlarge i2; its
    guarantee holds j0 (on i2). The fleet breaks the $7/h budget, so i2 goes. Both plans stopped the guaranteed j0 and
    kept j2 on i0: CP-SAT's claimed its tier at 14 and the net found 7 (FEASIBLE, emitted: greedy's was no better),
    greedy's counts the class alike (the answer keeps one job of it). Now CP-SAT's moves j0 (objective.protected_kept)
    and greedy's plan moves j0 into j2's room on i0 (plan/stability.protected_take_twin_stays): each stops j2."""
    from reconciler.plan.quality import guarantee_kept
    from reconciler.problem import build_problem

    desired, observed, (solution, plan), (gsol, gplan) = solve_both(fleet("fleet123"), time_limit=5)
    problem = build_problem(desired, observed)
    for p in (plan, gplan):
        actions = {j.job: (j.action, j.instances) for j in p.jobs}
        assert actions["j0"][0] == "move" and actions["j2"][0] == "evict", actions
        assert guarantee_kept(problem, p, observed) == 14, actions
    assert {j.job: j.instances for j in gplan.jobs}["j0"] == ("i0",)
    claimed = next((t["value"] for t in plan.solver.tiers if t["name"] == "guarantees kept"), None)
    assert claimed == 14 and plan.solver.optimal, plan.solver
    check_fleet(fleet("fleet123"), time_limit=5, solved=(desired, observed, (solution, plan), (gsol, gplan)))


def test_greedy_keeps_the_idle_on_demand_host_that_alone_mends_the_spot_share_on_fleet118():
    """fleet118 (the slow property tier, 2026-12-03, seed 3333; on main too): aws-a10g (max 2) runs six instances; t1
    (no quota: all it runs is guaranteed) runs its spot-required j2 on the spot g5.12xlarge i0, and seven pending low
    jobs wait (max_spot_fraction 0.5; no spot can be bought under max_price_fraction 0.3). Greedy's settle_spot kept the
    idle on-demand host cheapest per GPU for the share, the g5.xlarge i4: 4 of 5 GPUs spot mended nothing, the pool's
    max refused the on-demand g5.12xlarge i5 after it, and i0 was given up: j2 evicted inside t1's guarantee (apply's
    re-check refuses the plan) and two jobs pending. It keeps the cheapest host that mends the share alone first now,
    as `_ballast_buys` buys: i0 and i5 kept, all eight jobs run, as in CP-SAT's plan."""
    desired, observed, (solution, plan), (gsol, gplan) = solve_both(fleet("fleet118"), time_limit=5)
    actions = {j.job: (j.action, j.instances) for j in gplan.jobs}
    assert actions["j2"] == ("keep", ("i0",)) and all(a in ("keep", "place") for a, _ in actions.values()), actions
    check_fleet(fleet("fleet118"), time_limit=5, solved=(desired, observed, (solution, plan), (gsol, gplan)))


def test_greedy_moves_spot_eligible_work_to_on_demand_room_rather_than_buy_idle_ballast_on_fleet120():
    """fleet120 (h2, 2026-12-03, made by hand: trace33's shape at three jobs): t1's on-demand-only od0 runs on an
    on-demand g5.12xlarge i0 (3 GPUs free); t1's s0 and t2's s1, spot-eligible, run on spot g5.xlarge i1 and i2. The
    SpotPolicy's max_spot_fraction, lowered to 0.15, makes 2 of 6 GPUs on spot too many. Greedy's settle_spot kept every
    spot host and bought on-demand capacity to stand idle beside them (2 spot GPUs need 14 in all: a g5.12xlarge and
    four g5.xlarge, $16.35/h), where the broken share licenses moving the two spot-eligible jobs into i0's free GPUs and
    giving up both spot hosts ($5.67/h; CP-SAT's plan moves all three onto g5.xlarge, $3.02/h). Greedy's own plan (the
    fallback, `--time-limit 0`) now also plans moving spot-eligible work off the spot hosts before buying idle ballast,
    and keeps that answer where it places every job the other places for less (CP-SAT's warm start does not:
    strategy.greedy_plan)."""
    desired, observed, (solution, plan), (gsol, gplan) = solve_both(fleet("fleet120"), time_limit=5)
    actions = {j.job: (j.action, j.instances) for j in gplan.jobs}
    assert actions["od0"] == ("keep", ("i0",)) and actions["s0"] == ("move", ("i0",)) and actions["s1"] == ("move", ("i0",)), actions
    assert not gplan.creates and {d.instance_id for d in gplan.deletes} == {"i1", "i2"}, (gplan.creates, gplan.deletes)
    assert gplan.cost_after == pytest.approx(5.672), gplan.cost_after
    check_fleet(fleet("fleet120"), time_limit=5, solved=(desired, observed, (solution, plan), (gsol, gplan)))


def test_greedy_buys_the_cheapest_set_of_idle_ballast_on_fleet121():
    """fleet121 (h2, 2026-12-03, made by hand): two on-demand-only jobs on on-demand g5.xlarge, two spot-required ones
    on spot g5.xlarge (they cannot move to on-demand), max_spot_fraction 0.34: 2 of 4 GPUs on spot needs 2 more
    on-demand GPUs to stand idle. `_ballast_buys` bought the cheapest single offer that mends the share alone, a
    g5.12xlarge ($5.67/h, 4 GPUs), where two g5.xlarge ($2.01/h) mend it too (CP-SAT's plan). It buys the cheapest of
    those and of the cheapest-per-GPU instances with one closing offer now."""
    desired, observed, (solution, plan), (gsol, gplan) = solve_both(fleet("fleet121"), time_limit=5)
    new = sorted((c.site.instance_type, c.site.market) for c in gplan.creates)
    assert new == [("g5.xlarge", "on-demand")] * 2, new
    assert all(j.action == "keep" for j in gplan.jobs), gplan.jobs
    assert gplan.cost_after == pytest.approx(4 * 1.006 + 2 * 0.4886), gplan.cost_after  # (four on-demand g5.xlarge, two spot)
    check_fleet(fleet("fleet121"), time_limit=5, solved=(desired, observed, (solution, plan), (gsol, gplan)))


def _the_part_of(tenant: str, monkeypatch) -> None:
    """The independent part holding `tenant`'s work falls back to greedy best-fit, as a part does where CP-SAT cannot
    complete greedy's answer within its work limit (a large part's share: strategy.solve_pass); the other parts' are
    CP-SAT's."""
    from reconciler.solve import strategy

    complete = strategy.Search.complete
    monkeypatch.setattr(strategy.Search, "complete", lambda search, work, fixed=True: None if any(
        d.tenant == tenant for d in search.problem.demands) else complete(search, work, fixed))


def test_a_part_that_fell_back_leaves_the_other_parts_cp_sat_answer_checked_on_fleet119(monkeypatch):
    """fleet119 (the h10 session, 2026-12-03; on main too): fleet117's A10G pool and tenants without its budget, and
    t3's pending A100 job on an Azure pool: two independent parts (problem.components). Where t3's part fell back to
    greedy best-fit, the whole answer was called GREEDY_FALLBACK, so api.emitted skipped its checks of CP-SAT's answers:
    the plan stopped t1's guaranteed j0 (fleet117's stop) while claiming its "guarantees kept" tier proven at its bound,
    and ranked below greedy's whole plan, which keeps j0. A plan with a part of CP-SAT's is checked as CP-SAT's now,
    and claims no tier a part did not measure."""
    from reconciler.plan import outcome_rank
    from reconciler.plan.quality import guarantee_kept
    from reconciler.problem import build_problem, components

    _the_part_of("t3", monkeypatch)
    desired, observed, (solution, plan), (gsol, gplan) = solve_both(fleet("fleet119"), time_limit=5)
    problem = build_problem(desired, observed)
    assert len(components(problem)) == 2
    actions = {j.job: j.action for j in plan.jobs}
    claimed = next((t["value"] for t in plan.solver.tiers if t["name"] == "guarantees kept"), None)
    assert claimed in (None, guarantee_kept(problem, plan, observed)), (actions, plan.solver)
    assert outcome_rank(problem, plan, observed) >= outcome_rank(problem, gplan, observed), actions
    assert actions["j0"] != "evict" and actions["j1"] != "evict" and actions["k0"] == "place", actions
    check_fleet(fleet("fleet119"), time_limit=5, solved=(desired, observed, (solution, plan), (gsol, gplan)))


def test_a_plan_with_a_part_of_greedys_claims_no_tiers_and_says_so_on_fleet119(monkeypatch):
    """fleet119 with t1's part the one that fell back: t3's part is CP-SAT's, greedy's whole plan ranks no higher, and
    the plan emitted is that mix. It is no greedy plan (GREEDY_FALLBACK would say more --time-limit helps a plan that
    is CP-SAT's in part) and no proven one: FEASIBLE, no tiers (t1's part measured none), no gap, its line says why,
    and the saved plan reads back the same."""
    from reconciler.plan.types import Plan
    from reconciler.render import _solver_line

    _the_part_of("t1", monkeypatch)
    desired, observed, (solution, plan), (gsol, gplan) = solve_both(fleet("fleet119"), time_limit=5)
    s = plan.solver
    assert (s.status, s.optimal, s.tiers, s.greedy_parts) == ("FEASIBLE", False, (), 1), s
    assert "answered 1 of its independent parts with greedy best-fit's" in _solver_line(plan), _solver_line(plan)
    assert "every tier proven best" not in _solver_line(plan) and "cost within" not in _solver_line(plan), _solver_line(plan)
    assert Plan.from_json(plan.to_json()).solver.greedy_parts == 1
    check_fleet(fleet("fleet119"), time_limit=5, solved=(desired, observed, (solution, plan), (gsol, gplan)))


def _borrowing_fleet119():
    """fleet119 with t1 free to borrow (2 GPUs guaranteed, 4 its ceiling) and a new 1-GPU A10G job j4 of t1's: its
    guarantee holds the running j0 and j1 (the longest-running, then by name), j2 and the new j4 borrow."""
    from dataclasses import replace

    f = fleet("fleet119")
    docs = [{**d, "spec": {"quota": {"gpus": 2, "burst": {"gpus": 4}}}} if d["kind"] == "Tenant" and d["metadata"]["name"] == "t1"
            else d for d in f.docs]
    j4 = next(d for d in docs if d["kind"] == "Job" and d["metadata"]["name"] == "j1")
    return replace(f, docs=docs + [{**j4, "metadata": {"name": "j4"}}])


def _guarantee_said(desired, observed, problem, plan) -> dict[str, str]:
    """What explain says of each placed t1 job's guarantee ("-": nothing)."""
    from reconciler.explain import explain_job

    out = {}
    for j in plan.jobs:
        if j.tenant == "t1" and j.instances:
            e = explain_job(j.job, desired, observed, problem, plan, lambda d: plan)
            out[j.job] = next((d for d in e.details if "guarantee" in d), "-")
    return out


@pytest.mark.parametrize("fell_back", ["t1", "whole"])
def test_explain_says_which_jobs_the_guarantee_holds_in_a_plan_of_greedys_on_fleet119(monkeypatch, fell_back):
    """fleet119, t1 borrowing (`_borrowing_fleet119`): explain read which jobs are inside their tenant's guarantee from
    the solver's count (Solution.guaranteed), which a part answered by greedy best-fit, or greedy's whole plan
    (GREEDY_FALLBACK: --time-limit 0, or greedy's plan emitted over CP-SAT's), does not have: it said nothing of j0, j1,
    j2 or j4 there. It reads the emitted plan's placements now, as the plan after the apply fills the guarantee."""
    from reconciler import api
    from reconciler.problem import build_problem
    from tests.test_properties import catalog_observed, write_config
    import tempfile
    from dataclasses import replace

    f = _borrowing_fleet119()
    if fell_back == "t1":
        _the_part_of("t1", monkeypatch)
    with tempfile.TemporaryDirectory() as d:
        desired = api.load(write_config(Path(d), f.docs))
    observed = replace(catalog_observed(desired, f.instances, f.placements), gpu_indices=f.gpu_indices)
    problem = build_problem(desired, observed)
    plan, solution = api.emitted(desired, observed, problem, 0 if fell_back == "whole" else 5)
    assert (solution.greedy_parts, solution.status) == ((1, "FEASIBLE") if fell_back == "t1" else (0, "GREEDY_FALLBACK"))
    said = _guarantee_said(desired, observed, problem, plan)
    assert said == {"j0": "inside its tenant's guarantee", "j1": "inside its tenant's guarantee",
                    "j2": said["j2"], "j4": said["j4"]} and all(said[j].startswith("on borrowed capacity") for j in ("j2", "j4")), said


def _stopping(plan, *jobs: str):
    """`plan` with `jobs` stopped: an answer's stop that no rule requires, as _lawful is asked of it."""
    from dataclasses import replace

    return replace(plan, jobs=tuple(replace(j, action="evict", instances=(), gpus=()) if j.job in jobs else j for j in plan.jobs))


def _greedys(fleet_name: str):
    """(desired, observed, problem, greedy's answer and plan) of a finding."""
    import tempfile

    from dataclasses import replace

    from reconciler import api
    from reconciler.plan import make_plan
    from reconciler.problem import build_problem
    from reconciler.solve import solve
    from tests.test_properties import catalog_observed, write_config

    f = fleet(fleet_name)
    with tempfile.TemporaryDirectory() as d:
        desired = api.load(write_config(Path(d), f.docs))
    observed = replace(catalog_observed(desired, f.instances, f.placements), gpu_indices=f.gpu_indices)
    problem = build_problem(desired, observed)
    gsol = solve(problem, time_limit=0)
    return desired, observed, problem, (gsol, make_plan(desired, observed, problem, gsol))


def test_an_unlawful_stop_in_a_cp_sat_part_gives_way_to_greedys_plan_on_fleet119(monkeypatch):
    """fleet119, t3's part fallen back: an answer of t1's part that stopped t2's guaranteed j3 (no rule requires it)
    was refused with "internal error", as the whole answer was called greedy's and _lawful tried neither a search
    again nor greedy's plan, which is lawful. It is CP-SAT's in part: greedy's plan is emitted, saying why."""
    from reconciler import api
    from reconciler.plan import make_plan
    from reconciler.solve import solve

    _the_part_of("t3", monkeypatch)
    desired, observed, problem, greedy = _greedys("fleet119")
    solution = solve(problem, time_limit=5)
    plan, emitted = api._lawful(observed, problem, _stopping(make_plan(desired, observed, problem, solution), "j3"), solution,
                                lambda: greedy)
    assert emitted.status == plan.solver.status == "GREEDY_FALLBACK" and "j3 first: greedy best-fit" in plan.solver.note
    assert {j.job: j.action for j in plan.jobs}["j3"] == "keep"


def test_a_plan_searched_again_holding_running_jobs_claims_its_proofs_only_of_the_plans_that_keep_them_on_fleet117():
    """fleet117, where the first answer and the search again with stand-ins in their rooms each stop t2's j3 (as
    `_stopping` has them, no rule requiring it): the next search holds j3's group (Problem.held), and its answer's tiers
    and cost bound are of the plans that keep those jobs (strategy.finish: not optimal). Its plan's line said "every
    tier proven best; cost within 0.00% of a lower bound" and explain "the plan is feasible (cost gap 0.0%)", claims of
    every plan; both say now of which plans, and the saved plan reads back the same."""
    from dataclasses import replace

    from reconciler import api
    from reconciler.explain import explain_job
    from reconciler.plan import make_plan
    from reconciler.plan.types import Plan
    from reconciler.render import _solver_line
    from reconciler.solve import solve

    desired, observed, problem, greedy = _greedys("fleet117")
    solution = solve(problem, time_limit=5)
    first = make_plan(desired, observed, problem, solution)
    searched = []

    def again(held):
        searched.append(held)
        answer = solve(replace(problem, held=held, stand_in_rooms=True), time_limit=5)
        plan = make_plan(desired, observed, problem, answer)
        return answer, (plan if held else _stopping(plan, "j3"))

    plan, emitted = api._lawful(observed, problem, _stopping(first, "j3"), solution, lambda: greedy, again)
    assert searched == [{}, {"d1:j3": 1}] and emitted.status == "FEASIBLE", (searched, emitted.status)
    assert {j.job: j.action for j in plan.jobs}["j3"] == "keep"
    line = _solver_line(plan)
    assert "of the plans that keep the 1 running job(s) its search held" in line and "of a lower bound" not in line, line
    said = next(d for d in explain_job("j3", desired, observed, problem, plan, lambda d: plan).details if d.startswith("the plan is"))
    assert "of the plans that keep the 1 running job(s) its search held" in said, said
    assert Plan.from_json(plan.to_json()).solver.held == 1


def test_the_refusal_names_greedys_unlawful_stops_beside_the_first_plans_on_fleet111():
    """Where greedy's plan stops running work no rule requires stopping too, nothing is emitted: the error named only
    the first plan's stops (t1's j1 here), not greedy's (t2's j3), which is the plan the planner could not fall back to."""
    from reconciler import api
    from reconciler.errors import SolverError

    desired, observed, problem, (gsol, gplan) = _greedys("fleet111")
    with pytest.raises(SolverError) as e:
        api._lawful(observed, problem, _stopping(gplan, "j1"), gsol, lambda: (gsol, _stopping(gplan, "j3")))
    assert "job j1: evicted" in str(e.value) and "greedy best-fit's plan would stop:\n  - job j3: evicted" in str(e.value), str(e.value)


def test_items_packed_past_a_pools_max_go_to_another_pool_on_fleet124():
    """fleet124 (s34-repair, 2026-12-03, made by hand: trace33's repair step at 60 CPU jobs): 24 12-vCPU, 24 40-GiB
    and 12 4-vCPU jobs fill pool p's 24 m6i.4xlarge (its max) to the last vCPU in sum, but an instance holding a
    12-vCPU and a 40-GiB job has 2 vCPU left, so the packer needs 27; pool q's m6i.xlarge hold a 4-vCPU job each. The
    repair stage found no answer on 27 (`repack`: the pool's max) nor a packing on 24 (`fewer_instances`), and its
    search again (`within_limits`) left the 12 small jobs pending: greedy's plan was emitted. Now the items packed past
    the count go elsewhere with every tier held (`strategy.placed_elsewhere`): CP-SAT's plan places all 60, 24
    m6i.4xlarge and 12 m6i.xlarge, and claims what it reaches."""
    desired, observed, (solution, plan), (gsol, gplan) = solve_both(fleet("fleet124"), time_limit=5)
    assert plan.solver.status != "GREEDY_FALLBACK" and not solution.below_floors, plan.solver.note
    assert all(j.action == "place" for j in plan.jobs) and len(plan.jobs) == 60 and not plan.solver.unpacked
    assert sorted(Counter(c.instance_type for c in plan.creates).items()) == [("m6i.4xlarge", 24), ("m6i.xlarge", 12)]
    assert plan.cost_after <= gplan.cost_after + 1e-6
    check_fleet(fleet("fleet124"), time_limit=5, solved=(desired, observed, (solution, plan), (gsol, gplan)))


def test_running_jobs_packed_past_a_pools_max_move_to_another_pool_on_fleet125():
    """fleet125 (s34-repair, 2026-12-03, made by hand): fleet124 with its 12 small jobs running, two on each of 6
    m6i.2xlarge of pool q, a type q no longer allows (they must leave). The answer moved them onto pool p's count, whose
    packing needs 3 instances past p's max, so the items past it were running jobs, as on trace33: the repair stage's
    search again gave up part of the work claimed (tiers 600 -> 560) and greedy's plan was emitted. Now they move to
    new m6i.xlarge of q at the tiers claimed: CP-SAT's plan runs all 60, every running job moved, none stopped."""
    desired, observed, (solution, plan), (gsol, gplan) = solve_both(fleet("fleet125"), time_limit=5)
    assert plan.solver.status != "GREEDY_FALLBACK" and not solution.below_floors, plan.solver.note
    actions = Counter(j.action for j in plan.jobs)
    assert actions == {"place": 48, "move": 12} and not plan.solver.unpacked, actions
    assert {i for j in plan.jobs if j.job.startswith("e") for i in j.instances} <= {c.ref for c in plan.creates if c.instance_type == "m6i.xlarge"}
    check_fleet(fleet("fleet125"), time_limit=5, solved=(desired, observed, (solution, plan), (gsol, gplan)))


def test_pool_minimums_the_budget_holds_only_on_spot_past_the_spot_share_are_refused_at_load_on_fleet127(tmp_path):
    """fleet127 (the h7 hunt, 2026-12-03; on main too): Pool/az (an A100-80GB `either` pool, min_instances 1) runs one
    spot instance; max_hourly_budget $0.89/h holds its spot price ($0.44/h) but not its on-demand one ($3.67/h), and
    max_spot_fraction 0.25 refuses a fleet of spot alone. No fleet keeps all three, and validate said ok (the minimum's
    cheapest offer is under the budget; the pool is not spot-only). The model was infeasible, greedy's plan (emitted
    as "could not complete greedy's answer within its work limit") deleted i0, breaking the minimum the fleet meets
    now, and `apply --plan` refused it. Load refuses such a config now, naming the budget, the share and the least
    the minimums cost under it (one on-demand instance, $3.67/h)."""
    from typer.testing import CliRunner

    from reconciler.cli import app
    from reconciler.errors import ConfigError
    from tests.fleetkit import write_config

    with pytest.raises(ConfigError, match=r"max_hourly_budget.*min_instances.*max_spot_fraction 0.25.*at least \$3\.67/h"):
        solve_both(fleet("fleet127"), time_limit=2)
    out = CliRunner().invoke(app, ["validate", str(write_config(tmp_path / "cfg", fleet("fleet127").docs))])
    assert out.exit_code == 1 and "fleet.yaml:" in out.output and "spec.max_hourly_budget" in out.output, out.output


def test_a_pool_minimum_the_budget_holds_only_on_spot_spot_diversity_refuses_is_refused_at_load_on_fleet128():
    """fleet128 (the h7 hunt, 2026-12-03, reduced from a random fleet; on main too): Pool/aws-cpu (one zone, `either`,
    min_instances 1) runs a spot m6i.4xlarge ($0.29/h); max_hourly_budget $0.35/h holds it but not an on-demand one
    ($0.77/h), and the SpotPolicy's min_zones 2 refuses spot in one zone (two spot instances cost $0.58/h). As fleet127:
    the model was infeasible, greedy's plan deleted i0 under the minimum the fleet meets, and `apply --plan` refused
    it. Load's bound on the minimums' cost splits on spot diversity (no spot, or as many spot instances as it asks)."""
    from reconciler.errors import ConfigError

    with pytest.raises(ConfigError, match=r"min_zones 2.*at least \$0\.58/h.*max_hourly_budget \$0\.35/h"):
        solve_both(fleet("fleet128"), time_limit=2)


def test_greedy_buys_a_spot_only_pools_minimum_under_an_on_demand_buffer_on_fleet129():
    """fleet129 (the h7 hunt, 2026-12-03, reduced from a random fleet; on main too): Pool/aws-a10g is spot-only with
    min_instances 2 and no instance yet; Pool/az runs one idle on-demand A100 i0; the SpotPolicy asks a 25% on-demand
    buffer. CP-SAT's plan buys two spot g5.xlarge and keeps i0 idle for the buffer (0.5 of the 2 spot GPUs needed).
    Greedy's (the fallback, `--time-limit 0`) bought none and deleted i0: the pool ended at 0 of its minimum 2. Greedy
    opens no spot for a minimum while it restrains spot (an on-demand buffer or diversity asked); its spot-first pass
    met the minimum, and lost to the plain pass's answer on cost ((work, -cost)). Greedy's answers are compared by the
    pool minimums met first now (greedy.ranks_above; strategy.warm_start too): two spot g5.xlarge bought, i0 kept."""
    desired, observed, (solution, plan), (gsol, gplan) = solve_both(fleet("fleet129"), time_limit=5)
    for p in (plan, gplan):
        assert sorted((c.site.instance_type, c.site.market) for c in p.creates) == [("g5.xlarge", "spot")] * 2, p.creates
        assert not p.deletes, p.deletes
    check_fleet(fleet("fleet129"), time_limit=5, solved=(desired, observed, (solution, plan), (gsol, gplan)))


def test_greedy_meets_a_spot_only_pools_minimum_before_another_pool_takes_its_second_spot_zone_on_fleet130():
    """fleet130 (the h7 hunt, 2026-12-03, reduced from a random fleet): Pool/gcp-cpu is spot-only in us-central1-a with
    min_instances 1; Pool/gcp-a100 (`either`, us-central1-b, min 1 max 1) is the only spot in a second zone, which
    min_zones 2 asks for beside it; max_spot_fraction 0.5 asks 8 on-demand GPUs beside its spot a2-highgpu-8g. CP-SAT
    buys the two spot instances and eight on-demand A100s ($44.06/h). Greedy met gcp-a100's minimum first (the pools in
    name order) on an on-demand a2-highgpu-8g, the pool's one slot, and gcp-cpu ended at 0 of its minimum 1 in every
    plan it made (`--time-limit 0`, the fallback). It meets the spot-only pools' minimums first now."""
    desired, observed, (solution, plan), (gsol, gplan) = solve_both(fleet("fleet130"), time_limit=5)
    for p in (plan, gplan):
        pools = Counter((c.pool, c.site.market) for c in p.creates)
        assert pools[("gcp-cpu", "spot")] == 1 and pools[("gcp-a100", "spot")] == 1, pools
    check_fleet(fleet("fleet130"), time_limit=5, solved=(desired, observed, (solution, plan), (gsol, gplan)))


def test_greedy_owes_a_pool_minimum_its_spot_price_under_a_budget_on_fleet131():
    """fleet131 (the h7 hunt, 2026-12-03, reduced from a random fleet): Pool/aws-a100 (p4d.24xlarge) and Pool/az-mig
    (an A100 each), both `either` in one zone, must keep 2 instances each under max_hourly_budget $40/h and a 50%
    on-demand buffer. CP-SAT buys an on-demand and a spot p4d and two spot A100s ($35.35/h: the on-demand p4d's 8 idle
    GPUs hold the buffer for the 10 spot ones). Greedy owed each unmet minimum its cheapest on-demand instance (it
    opens no spot but with its ballast for a minimum): $51.25/h, over the budget before anything was bought, so it
    bought nothing and both pools ended at 0 of 2 (`--time-limit 0`, the fallback). A minimum is owed its cheapest
    instance, spot too, now: greedy buys an on-demand and a spot p4d, and an on-demand and a spot A100 ($38.57/h)."""
    desired, observed, (solution, plan), (gsol, gplan) = solve_both(fleet("fleet131"), time_limit=5)
    for p in (plan, gplan):
        assert Counter(c.pool for c in p.creates) == {"aws-a100": 2, "az-mig": 2}, p.creates
        assert p.cost_after <= 40.0
    check_fleet(fleet("fleet131"), time_limit=5, solved=(desired, observed, (solution, plan), (gsol, gplan)))


def test_a_job_its_tenants_spot_share_stops_once_its_ceiling_stops_another_is_lawful_on_fleet132():
    """fleet132 (s35's stable-run hunt, 2026-12-03: a fleet applied on the sim, then t3's quota lowered to 0 GPUs; reduced):
    t3 runs j4 (1 A100, on-demand) and j1 (2 x MIG 1g.10gb x 2, spot), tenant_max_spot_fraction 0.5. Over its
    ceiling, j4 must stop; j1, left alone on spot, then breaks t3's spot share, so both plans stop it too (no plan keeps
    it and every rule). But j1 is inside t3's guarantee (MIG counts no GPUs of the ceiling) and t3's spot share holds
    now, so the re-check found no rule requiring its stop: `plan` failed with "internal error: the plan would stop
    running work that no rule requires stopping" for CP-SAT and greedy alike, and so would every plan after. A tenant's
    own rule broken now weighs its jobs' stops as a fleet-wide one does (plancheck.KeptInstead): kept, j1 breaks t3's
    spot share, so its stop is lawful."""
    desired, observed, (solution, plan), (gsol, gplan) = solve_both(fleet("fleet132"), time_limit=5)
    for p in (plan, gplan):
        assert {j.job: j.action for j in p.jobs} == {"j1": "evict", "j4": "evict"}, p.jobs
    check_fleet(fleet("fleet132"), time_limit=5, solved=(desired, observed, (solution, plan), (gsol, gplan)))


def test_greedy_launches_no_reserved_instance_past_the_reservations_count_on_fleet133():
    """fleet133 (s35's stable-run hunt, 2026-12-03, not reduced; on main too): after an apply, an owned idle on-demand
    p4d the state did not know (a crashed apply's launch) puts Pool/aws-a100 at 3 of its max 2; sim-aws-00003 runs on
    Reservation/p4d (count 1, us-east-1b) beside spot sim-aws-00004, j10's 2 x 8-GPU gang over both. CP-SAT deletes the
    idle p4d ($20.07/h). Greedy's plan (`--time-limit 0`) deletes j10's spot p4d for the pool's max and buys a p4d into
    the reservation for its replica: 2 reserved instances after the plan, over the count 1; it also moved j0 off its
    two spot MIG hosts ($7.35/h after). It had bought the new p4d into the Reservation before opening the reserved host
    for the gang; a Reservation's hosts not opened yet now hold its room (greedy._reservation_held): greedy deletes the
    idle p4d, as CP-SAT does."""
    check_fleet(fleet("fleet133"), time_limit=5)


def test_greedy_splits_borrowed_room_by_fair_share_on_fleet134():
    """fleet134 (s36's second public trace, 2026-12-03: bench.dlrm, Alibaba's GPU-disaggregated DLRM serving trace,
    reduced by hand): pool p, 4 g5.8xlarge (1 A10G each) at most; t1 to t4 guarantee no GPUs (burst 4 for t1, 1 for
    each other), t1 asks four 16-vCPU jobs, t2 to t4 one 8-vCPU job each. The model's fair-share tier splits the 4
    borrowed GPUs one per tenant (CP-SAT's plan); greedy placed each demand's jobs whole in its order, largest first,
    and gave t1 all four while t2 to t4 waited. Greedy's is the plan wherever CP-SAT's answer does not pack or ranks
    lower (on the converted trace at --time-limit 20 and 60: 75 borrowed GPUs to 20 services, 13 to one, while 80
    services under their caps borrowed none). Greedy now places borrowed work one job at a time to the tenant
    borrowing the least share over its weight (greedy._place_borrowed)."""
    desired, observed, (solution, plan), (gsol, gplan) = solve_both(fleet("fleet134"), time_limit=5)
    for p in (plan, gplan):
        assert Counter(j.tenant for j in p.jobs if j.action == "place") == {"t1": 1, "t2": 1, "t3": 1, "t4": 1}, p.jobs
    check_fleet(fleet("fleet134"), time_limit=5, solved=(desired, observed, (solution, plan), (gsol, gplan)))


def test_greedy_keeps_a_guaranteed_job_no_rule_requires_stopping_on_fleet126():
    """fleet126 (s36's slow property tier, larger fleets, 2026-12-03; not reduced; failed at bd2abb7 too): the fleet
    breaks pool:gcp-cpu and the spot share as it runs; greedy's plan evicted j5 (t3, inside its guarantee, on spot
    i5) and placed j4; `apply --plan`'s re-check refused it: "no rule requires stopping it ... the plan with it kept
    where it runs, and whatever took its room where it was, breaks no rule the plan keeps". CP-SAT's plan (OPTIMAL)
    keeps j5. settle_spot gave up i5 (the spot share); greedy._place_protected placed protected jobs before new work,
    but skipped a tenant's while its own higher class waited, so t3's waiting critical j6 (an A10G, which fits no A100
    host, and t3's 4-GPU guarantee holds both) held j5 back, and t2's critical j4 took the pool's one A100 slot first.
    A tenant's higher class holds its protected work back now only where it could take that work's room (README,
    Tenants; `greedy._may_take_place`): greedy keeps j5 on i5 as CP-SAT does."""
    desired, observed, (solution, plan), (gsol, gplan) = solve_both(fleet("fleet126"), time_limit=5)
    for p in (plan, gplan):
        actions = {j.job: (j.action, j.instances) for j in p.jobs}
        assert actions["j5"] == ("keep", ("i5",)) and actions["j4"][0] == "pending", (p.solver.status, actions)
    check_fleet(fleet("fleet126"), time_limit=5, solved=(desired, observed, (solution, plan), (gsol, gplan)))


def test_a_pool_at_its_max_counts_what_packs_on_fleet135():
    """fleet135 (s36, the DLRM trace's plans reduced, 2026-12-03): pool p4, 17 g5.12xlarge (4 A10G, 48 vCPU, 192 GiB)
    at most, p1 4 g5.4xlarge (1 A10G, 64 GiB); 6 jobs of 12 vCPU / 120 GiB, 70 of 8 / 40. p4's count, 17 instances,
    was modelled in sum (past slots.SLOTS_MOST): 6 x 120 + 62 x 40 = 3,200 of 3,264 GiB passes, but an instance that
    holds a 120-GiB job holds one 40-GiB job beside it, so the answer did not pack; the pool at its max, the repair
    searched again and the plan was FEASIBLE, $102.92/h. p4's max is below what its work fills (Offer.fills_pool), so
    it is counted instance by instance now, as a fixed pool's is (slots.pool_capped): the optimum, proven, 68 of the
    40-GiB jobs on the 17 instances and 2 on g5.4xlarge, $99.67/h. (At the trace's size, 52 g5.12xlarge and 20
    g5.48xlarge, the search again fell below greedy's fair-share tier and every plan was greedy's, $1,552.55/h; now
    CP-SAT's, $1,420.30/h: bench/README.md, DLRM section.)"""
    desired, observed, (solution, plan), (gsol, gplan) = solve_both(fleet("fleet135"), time_limit=5)
    assert plan.solver.status == "OPTIMAL", plan.solver
    assert (plan.solver.unpacked, plan.solver.repairs) == (0, 0)
    assert plan.cost_after == pytest.approx(17 * 5.672 + 2 * 1.624)
    assert Counter((j.action, j.job in {f"j{i}" for i in range(6)}) for j in plan.jobs) == {("place", False): 70, ("pending", True): 6}
    check_fleet(fleet("fleet135"), time_limit=5, solved=(desired, observed, (solution, plan), (gsol, gplan)))


def test_a_stand_in_elsewhere_keeps_no_guarantee_whose_room_another_tenant_takes_on_fleet140():
    """fleet140 (s36's slow property tier, larger fleets, 2026-12-03; not reduced): every instance runs spot, over the
    fleet's max_spot_fraction 0.25 (a fleet-wide rule broken as it runs, so anyone's work may go). t3 (4 GPUs
    guaranteed) runs its low j5 on spot i5, the only Standard_NC24ads_A100_v4 az-a100-80 allows (max 1); t1 (no quota)
    runs its low j0 on i1, and asks for its normal j3, which needs that A100 too. CP-SAT (OPTIMAL) keeps j5, moves j0,
    and places t3's critical j6 on a new A10G host. Greedy deletes i5 and i1 and gives the A100 slot to t1's j3:
    lawful (the spot rule), but t3's guarantee is lost to another tenant's work. The oracle's ranking
    (tests/invariants._guarantee_kept) counted j6 as standing in for j5 and j3 for j0 wherever they landed, so
    greedy's plan ranked (14, 14, .., 70, 0, 0, 4, -3360) above CP-SAT's (14, 14, .., 0, 14, 0, 32, 0): the oracle, not
    the model, was off the README's order (Tenants: guaranteed work gives way only to a higher class of its own tenant
    that takes its room, not where that work lands on other capacity while another tenant's work would take the room).
    A stand-in now counts only where it takes the lost job's room (`_room_taken`, check_stability's own test): greedy's
    guarantees tier was 0, CP-SAT's 14, and CP-SAT's OPTIMAL holds. Greedy now places j5 and j0 before t1's j3 (which
    fits no room of j0's: fleet126's fix), and j0's new g5.xlarge, the pool's one instance, kept t3's critical j6 out
    until greedy swapped it for a g5.12xlarge that holds both (`greedy._place_upgrading`): its plan ranks as CP-SAT's
    on guarantees and critical work, (14, 14, 0, 0, 7000), where it ranked (0, 0, 0, 0, 7000) and, with fleet126's fix
    alone, (14, 14, 0, 0, 0)."""
    from tests.invariants import ranking
    desired, observed, (solution, plan), (gsol, gplan) = solve_both(fleet("fleet140"), time_limit=5)
    assert {j.job: j.action for j in plan.jobs if j.job in ("j3", "j5")} == {"j3": "pending", "j5": "keep"}, plan.jobs
    assert plan.solver.optimal, plan.solver
    assert ranking(desired, observed, plan)[0] == 14
    assert ranking(desired, observed, gplan)[:5] == ranking(desired, observed, plan)[:5], gplan.jobs
    assert {j.job: j.action for j in gplan.jobs if j.job in ("j0", "j6")} == {"j0": "move", "j6": "place"}, gplan.jobs
    check_fleet(fleet("fleet140"), time_limit=5, solved=(desired, observed, (solution, plan), (gsol, gplan)))


def test_a_stand_in_on_other_capacity_keeps_no_guarantee_and_cp_sat_places_the_critical_job_on_fleet136():
    """fleet136 (s36-f140's probe of 120 larger random fleets, 2026-12-03; not reduced): pool aws-a100 (max 2) runs three
    p4d, so one must go (a fleet-wide rule broken as it runs): i0, with t1's low A100 jobs j2, j5, j7, j9, j10 (t1 has no
    quota: all it runs is guaranteed). The only other capacity is az-a100-80 (A100-80GB, max 2): i2 with t1's low j8,
    and one new slot, which t3's critical j4 asks for. CP-SAT claimed its guarantees tier OPTIMAL at 126 units, placed
    t1's normal j11 on the new slot and left j4 pending: its model (objective.protected_tier, first search) and the
    finished plan's count (plan.quality.guarantee_kept, which api.emitted ranks plans by) counted j11 as standing in
    for 7 units of i0's lost jobs wherever it landed; the README (Tenants) counts a stand-in only in the lost job's
    room (plancheck.own_higher_class_room), so the plan kept 119, as greedy's does, which places j4 (7000 critical
    against 0). Searched with stand-ins in their rooms the model still counted 126: j11 on i2 in the room j8 left by
    moving to the new slot, as if it were lost (objective.stand_in_room counted the items leaving a host, moved or
    stopped). Now guarantee_kept counts by plancheck's rule, the room counts only stopped items
    (objective._stopped_items), and a first answer whose claim the plan does not keep is searched again so: CP-SAT's
    plan claims 119, proven, and places j4."""
    from reconciler.plan.quality import guarantee_kept
    from reconciler.problem import build_problem
    from tests.invariants import ranking

    desired, observed, (solution, plan), (gsol, gplan) = solve_both(fleet("fleet136"), time_limit=5)
    problem = build_problem(desired, observed)
    actions = {j.job: j.action for j in plan.jobs}
    assert actions["j4"] == "place" and plan.solver.status != "GREEDY_FALLBACK", (actions, plan.solver)
    claimed = next(t["value"] for t in plan.solver.tiers if t["name"] == "guarantees kept")
    assert claimed == guarantee_kept(problem, plan, observed) == ranking(desired, observed, plan)[0] == 119, plan.solver.tiers
    assert plan.solver.optimal, plan.solver
    assert ranking(desired, observed, plan) >= ranking(desired, observed, gplan)
    check_fleet(fleet("fleet136"), time_limit=5, solved=(desired, observed, (solution, plan), (gsol, gplan)))


def test_cp_sat_places_t2s_high_job_no_stand_in_needs_the_room_of_on_fleet137():
    """fleet137 (s37-f126's slow property tier, larger fleets, 2026-12-03; not reduced; on main too): gcp-a100 allows one
    instance (a2-highgpu-1g/4g/8g); t1 ($5/h budget) runs only its low CPU j9 on i0, which must go (its data's 40 ms
    latency: no pool in reach); t2 ($5/h, tenant_max_spot_fraction 0.5) asks for its high 1-GPU j5. CP-SAT (FEASIBLE)
    left j5 pending and placed t1's normal 2-GPU j1 on a spot a2-highgpu-4g; greedy placed j5 on an on-demand A100, and
    the oracle ranked greedy's plan higher (high work 700 against 0). The model's first tier, 'guaranteed running work
    kept', read 1 (bound 1) though both plans evict j9: j1 counted as standing in for j9, a job that must move
    (TenantRules.moving_jobs) and so counted as its own unit in that tier; j1 fits t1's budget only on spot, where t2's
    spot share keeps j5 off the pool's one instance, so that tier held at 1 shut j5 out. The first search counts a
    stand-in wherever it lands (Problem.stand_in_rooms); the finished plan's count (plan.quality.guarantee_kept, the
    re-check's room rule) is 0, as the README counts it (Tenants: running work gives way to its tenant's higher class
    that takes its room, and j1 does not take j9's, a CPU job on aws-cpu), but api.emitted's net checked only the
    first guarantees tier against the plan (fleet136). It checks the next one too now: CP-SAT searches again with
    stand-ins in their rooms, its tier is 0 of 0, and its plan, OPTIMAL, places j5 (and t1's low j2) as greedy's does."""
    from reconciler.plan.quality import guarantee_kept
    from reconciler.problem import build_problem
    from reconciler.problem.types import GUARANTEES_TIER, RUNNING_GUARANTEES_TIER

    desired, observed, (solution, plan), (gsol, gplan) = solve_both(fleet("fleet137"), time_limit=5)
    assert [j.action for j in plan.jobs if j.job == "j5"] == ["place"], plan.jobs
    problem = build_problem(desired, observed)
    claims = {t["name"]: t["value"] for t in plan.solver.tiers}
    assert claims[RUNNING_GUARANTEES_TIER] == guarantee_kept(problem, plan, observed, moving=True) == 0, plan.solver.tiers
    assert claims.get(GUARANTEES_TIER, 0) == guarantee_kept(problem, plan, observed) == 0
    check_fleet(fleet("fleet137"), time_limit=5, solved=(desired, observed, (solution, plan), (gsol, gplan)))


def test_a_tenants_higher_job_in_the_slot_its_job_that_must_move_leaves_keeps_that_guarantee():
    """fleet137's companion, the stand-in the README counts for a job that must move (Tenants: running work gives way to
    its tenant's higher class that takes its room; the tiers: the next tier is the same count, with the jobs that must
    move): t1 (2 GPUs guaranteed) runs its low j0 on a g5.xlarge and its identical low j1 on a g5.12xlarge its pool no
    longer allows (so j1 must move), and asks for its normal j2; the pool (max 2) has room for one new g5.xlarge, the
    slot of the one j1 leaves. j2 there stands in for j1 (plancheck's room: a slot bought again), so CP-SAT places j2
    and both guarantees tiers claim what the plan keeps (7 and 14 units). Counted only where it runs, j1 would have
    kept the slot and the tenant's normal job waited for its low one."""
    from reconciler.plan.quality import guarantee_kept
    from reconciler.problem import build_problem
    from reconciler.problem.types import GUARANTEES_TIER, RUNNING_GUARANTEES_TIER

    def job(name, priority):
        return {"apiVersion": "fleetops.io/v1alpha1", "kind": "Job", "metadata": {"name": name},
                "spec": {"tenant": "t1", "priority": priority, "replicas": 1, "resources": {"cpu": 4, "gpu_type": "A10G", "gpus": 1, "memory_gib": 16}}}

    def instance(name, itype):
        return Instance(id=name, provider="sim", cloud="aws", region="us-east-1", zone="us-east-1a", instance_type=itype, market="on-demand",
                        state="running", pool="a10g", tags={"fleetops.io/fleet": "test", "fleetops.io/pool": "a10g"}, launched_at="", placement_group="")

    docs = [{"apiVersion": "fleetops.io/v1alpha1", "kind": "Topology", "metadata": {"name": "test"},
             "spec": {"clouds": {"aws": {"regions": {"us-east-1": {"zones": ["us-east-1a"]}}}}}},
            {"apiVersion": "fleetops.io/v1alpha1", "kind": "Tenant", "metadata": {"name": "t1"}, "spec": {"quota": {"gpus": 2}}},
            {"apiVersion": "fleetops.io/v1alpha1", "kind": "Pool", "metadata": {"name": "a10g"},
             "spec": {"cloud": "aws", "region": "us-east-1", "zones": ["us-east-1a"], "instance_types": ["g5.xlarge"],
                      "market": "on-demand", "min_instances": 0, "max_instances": 2}},
            job("j0", "low"), job("j1", "low"), job("j2", "normal")]
    f = Fleet(docs=docs, instances=[instance("i0", "g5.xlarge"), instance("i1", "g5.12xlarge")],
              placements={"j0": ("i0",), "j1": ("i1",)}, gpu_indices={})
    desired, observed, (solution, plan), (gsol, gplan) = solve_both(f, time_limit=5)
    problem = build_problem(desired, observed)
    assert problem.tenants["t1"].moving_jobs == ("j1",)
    assert {j.job: j.action for j in plan.jobs} == {"j0": "keep", "j1": "evict", "j2": "place"}, plan.jobs
    claims = {t["name"]: t["value"] for t in plan.solver.tiers}
    assert claims[GUARANTEES_TIER] == guarantee_kept(problem, plan, observed) == 7, plan.solver.tiers
    assert claims[RUNNING_GUARANTEES_TIER] == guarantee_kept(problem, plan, observed, moving=True) == 14, plan.solver.tiers
    check_fleet(f, time_limit=5, solved=(desired, observed, (solution, plan), (gsol, gplan)))


def test_greedy_keeps_t3s_guaranteed_job_under_a_broken_spot_share_on_fleet141():
    """fleet141 (s37's slow property tier on main 1e8628b, larger fleets, 2026-12-03; on 0685441 too: greedy's plan
    there is the same, and refused): the fleet is all spot (i0 g5.xlarge, i1 A100), over max_spot_fraction 0.25, and no
    on-demand capacity can be bought beside it (aws-a10g and az-a100-80 at their max 1), so settle_spot gives up both
    hosts. t1's protected j6 goes first on a g5.xlarge (later swapped for a g5.12xlarge with t1's j0); t3's protected
    j5 was held back (greedy._may_take_place) for t3's waiting normal 4-GPU j1, which t3's 4-GPU guarantee cannot hold
    beside it. j1 found no room (aws-a10g at its max), yet j5 waited until its own turn, low, and t1's new normal j2
    took az-a100-80's one slot first: greedy's plan evicted j5 and `apply --plan`'s re-check refused it ("no rule
    requires stopping it ... the plan with it kept where it runs ... breaks no rule the plan keeps": kept on i1 beside
    the g5.12xlarge, 1 spot GPU of 5). Now j5 is placed before new work and gives way only while j1 is asked
    (greedy._Protected): j1 takes nothing of it, so j5 moves to the on-demand A100 in its slot and j2 waits."""
    desired, observed, (solution, plan), (gsol, gplan) = solved = solve_both(fleet("fleet141"), time_limit=5)
    jobs = {j.job: j for j in gplan.jobs}
    assert (jobs["j5"].action, jobs["j2"].action) == ("move", "pending"), {k: (v.action, v.reason) for k, v in jobs.items()}
    check_fleet(fleet("fleet141"), time_limit=5, solved=solved)


def test_greedy_keeps_t3s_guaranteed_job_when_a_pool_over_its_max_must_shrink_on_fleet142():
    """fleet142 (s38's slow property tier on s38-f141, larger fleets, 2026-12-03; on main a8d9436 too: not from the
    fleet141 change; not reduced): az-a100-80 (on-demand, max 1) runs two instances, t2's protected j2 on i1 and t3's
    (no quota) protected j3 on i2, so one must go; t2's new high 4-GPU A10G j8 needs t2's whole 4-GPU guarantee. Greedy
    keeps i1 (j2 kept first), so j3 has no room when the protected jobs are placed; then j8 stops j2 for t2's quota
    (lawful: its own higher class), and the room j2 leaves on i1 goes to t1's new normal j6, not to j3: greedy's plan
    evicts j3 and `apply --plan`'s re-check refuses it. CP-SAT keeps i2 with j3 and deletes i1. Now a protected job
    that found no room is asked again as soon as a stop frees some (greedy._Protected.retry): j3 moves to i1 and j6
    waits."""
    desired, observed, (solution, plan), (gsol, gplan) = solved = solve_both(fleet("fleet142"), time_limit=5)
    jobs = {j.job: j for j in gplan.jobs}
    assert (jobs["j3"].action, jobs["j2"].action, jobs["j6"].action) == ("move", "evict", "pending"), \
        {k: (v.action, v.reason) for k, v in jobs.items()}
    check_fleet(fleet("fleet142"), time_limit=5, solved=solved)


def test_the_guarantee_sweeps_claim_check_reads_the_emitted_plan_and_the_search_with_stand_ins_in_their_rooms_on_fleet143():
    """fleet143 (s38's guarantee sweep past its 200 seeds, seed 691, 2026-12-03; on main too): t1 guarantees 3 GPUs
    (burst 4) and runs its three identical normal jobs j0, j1 (on the spot g5.12xlarge i1) and j2 (on the on-demand
    g5.xlarge i0); t2 (no quota: all it runs is guaranteed) runs its low j3 on i1 and asks for its high j4. The fleet is
    over its max_spot_fraction 0.5 and a $6/h budget holds one new g5.12xlarge. CP-SAT's first search moved all onto
    it with j4 in j3's place and claimed "guarantees kept" at 28 units (OPTIMAL) where its plan keeps 21: it counts a
    stand-in wherever it lands (Problem.stand_in_rooms), and j4 on a new host in a pool below its max takes none of
    j3's room (README, Tenants). The emitted plan is true: api.emitted searches again with stand-ins in their rooms and
    keeps j3 (28 of 28, OPTIMAL, the note says why). The sweep's check held CP-SAT's first answer to its claim, stricter
    than the design since fleet136, so its seed 691 failed; it checks the emitted plan and the search in rooms now. No
    damage: no plan emitted claimed what it did not keep, and every plan keeps every rule."""
    from dataclasses import replace

    from reconciler.plan import make_plan
    from reconciler.plan.quality import guarantee_kept
    from reconciler.problem import build_problem
    from reconciler.problem.types import GUARANTEES_TIER
    from reconciler.solve import solve
    from tests.test_guarantee_sweep import check_guarantees, identical_jobs_fleet

    assert fleet("fleet143") == identical_jobs_fleet(691)
    desired, observed, (solution, plan), (gsol, gplan) = solve_both(fleet("fleet143"), time_limit=5)
    problem = build_problem(desired, observed)

    def claim(p):
        return next(t["value"] for t in p.solver.tiers if t["name"] == GUARANTEES_TIER)

    first = make_plan(desired, observed, problem, solve(problem, time_limit=5))
    assert (claim(first), guarantee_kept(problem, first, observed)) == (28, 21), first.jobs
    assert {j.job: j.action for j in first.jobs if j.job in ("j3", "j4")} == {"j3": "evict", "j4": "place"}
    rooms = make_plan(desired, observed, problem, solve(replace(problem, stand_in_rooms=True), time_limit=5))
    assert claim(rooms) == guarantee_kept(problem, rooms, observed) == 28 and rooms.solver.optimal, rooms.solver.tiers
    assert claim(plan) == guarantee_kept(problem, plan, observed) == 28 and plan.solver.optimal, plan.solver
    assert {j.job: j.action for j in plan.jobs if j.job in ("j3", "j4")} == {"j3": "move", "j4": "pending"}, plan.jobs
    check_guarantees(691)


def test_greedy_reclaims_the_borrowed_twins_host_not_the_guaranteed_jobs_on_fleet144():
    """fleet144 (s38's guarantee sweep past its 200 seeds, seed 2114, 2026-12-03; on main too): t1 guarantees 1 GPU
    (burst 3) and runs its identical normal jobs j0 on the spot g5.xlarge i0 (its guarantee holds j0) and j1 on the
    twin i1 in the other zone (borrowed); t2 (2 GPUs guaranteed) asks for j4 and j5 of that shape; the pool is at its
    max 2, WhenEmpty. Greedy reclaimed borrowed room for t2's j4 host by host by name: i0 first, so it stopped the
    guaranteed j0 and kept its borrowed twin j1 (apply's re-check passes it, j1 standing in for j0's unit, so the stop
    would land: j0 restarts where j1 should have, t1 still at its 1 GPU). Greedy's fallback plan only: CP-SAT's keeps j0
    and buys a g5.12xlarge. `greedy._place_reclaiming` tries the hosts where the lenders run fewer protected jobs first:
    j4 takes i1, j1 stops, j0 keeps i0."""
    from reconciler.problem import build_problem
    from tests.test_guarantee_sweep import check_guarantees, identical_jobs_fleet, twin_stopped

    assert fleet("fleet144") == identical_jobs_fleet(2114)
    desired, observed, (solution, plan), (gsol, gplan) = solve_both(fleet("fleet144"), time_limit=5)
    actions = {j.job: (j.action, j.instances) for j in gplan.jobs}
    assert (actions["j0"], actions["j1"][0], actions["j4"]) == (("keep", ("i0",)), "evict", ("place", ("i1",))), actions
    problem = build_problem(desired, observed)
    assert twin_stopped(problem, gplan) == twin_stopped(problem, plan) == [], (gplan.jobs, plan.jobs)
    check_guarantees(2114)


def test_greedy_reclaims_the_lowest_borrowed_job_not_a_higher_one_it_then_moves_on_fleet145():
    """fleet145 (s38's hand attack on the quickstart: a tenant's quota lowered under what it runs, another's critical
    job added, the A100 pools at their max; reduced by hand, on main too): t1 guarantees 1 GPU (burst 3) and runs its
    normal j0 (guaranteed), normal j1 and low j2 (borrowed) on the three on-demand a2-highgpu-1g of a pool at its max 3;
    t2 (1 GPU guaranteed) asks for its critical j3. Greedy reclaimed host by host by name: it stopped j1 on i1 for j3,
    then placed j1 again by evicting its tenant's low j2, a move "makes room on i1 for t2's higher-priority work" that
    no rule needed (j1 restarts; CP-SAT's plan evicts j2 and puts j3 in its room). Greedy's fallback plan only, no rule
    broken. `greedy._place_reclaiming` tries the hosts whose lenders' lowest class is lowest first: j2's."""
    desired, observed, (solution, plan), (gsol, gplan) = solve_both(fleet("fleet145"), time_limit=5)
    for p in (plan, gplan):
        assert {j.job: (j.action, j.instances) for j in p.jobs if j.action != "keep"} == {"j2": ("evict", ()), "j3": ("place", ("i2",))}, p.jobs
    check_fleet(fleet("fleet145"), time_limit=5, solved=(desired, observed, (solution, plan), (gsol, gplan)))


def test_greedys_plan_right_after_an_apply_is_a_no_op_on_fleet146(monkeypatch):
    """fleet146 (s38's lifecycle machine, greedy alone: FLEETOPS_LIFE_TIME_LIMIT=0, 100 lives of 30 steps, seed 38303;
    on main too; not reduced, not diagnosed; the steps in tests/data/findings/fleet146.txt): after spot reclaims, a new
    t2 CPU job and a priority change, `apply` (planning itself) ran; the plan right after it, nothing changed, moved t3's
    critical CPU j3 from sim-gcp-00007 to sim-aws-00009 and deleted sim-gcp-00007, "leaves sim-gcp-00007: its instance is
    removed (the plan cannot name the rule or saving that moves it)". No damage (no rule broken, the reason says it
    knows none), but the fallback does not converge: each such plan restarts a running job for nothing. Replayed with
    the machine's own checks: the choices of hypothesis's reproduce_failure blob (the version pinned in the venv), and
    a stop after the last step (the blob ended on the failure; a passing run draws whether to go on), served as the one
    example a database holds (reproduce_failure demands a failure). Diagnosed (s38-f146): greedy's pass moving spot
    work (`_Greedy.move_spot_work`) ran because the kept fleet read the share and the buffer broken (the idle on-demand
    A10G is kept only after, by settle_spot), where the fleet as it ran broke no rule; it moved j3 off its spot n2 (a
    CPU host, 0 GPUs in the share: mending nothing) and the cheaper answer won on cost. The apply's plan had had no
    on-demand room to move it to yet. The pass runs only where a fleet-wide rule broken now licenses moves, as the
    model's (`movable_spot_hosts`; tests/test_greedy_spot_share.py)."""
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.core import decode_failure
    from hypothesis.database import ExampleDatabase, choices_to_bytes
    from hypothesis.stateful import run_state_machine_as_test

    import tests.test_lifecycle_machine as life

    monkeypatch.setattr(life, "TIME_LIMIT", 0.0)
    blob = b"AXicPU7BEcAwCIJo/12ig7hL95+hKtrLyaEgBuFx5TthgS42nmZCdi+uqWUR8SbkEpi8mJfq44A8UiDVKmE3XPeASSnPQTzLoSkXvcJ8flEX2P77T24n8QGAvRT0"
    applies = []

    class Recorded(ExampleDatabase):
        def fetch(self, key):
            yield choices_to_bytes((*decode_failure(blob), True))

        def save(self, key, value):
            pass

        def delete(self, key, value):
            pass

        def move(self, src, dst, value):
            pass

    class Fleet146(life.FleetLife):
        def _check_applied(self):
            applies.append(1)
            super()._check_applied()

    run_state_machine_as_test(Fleet146, settings=settings(max_examples=1, stateful_step_count=30, deadline=None, database=Recorded(),
                                                          phases=[Phase.reuse], suppress_health_check=list(HealthCheck)))
    assert len(applies) == 8, f"the recorded steps did not all run: {len(applies)} applies of 8"  # (a run cut short passes unasked)


@pytest.mark.xfail(strict=True, reason="open: greedy gives up the spot host of a guaranteed job to mend the on-demand buffer (fleet148)")
def test_greedy_gives_up_the_spot_host_outside_the_guarantee_to_mend_the_buffer_on_fleet148():
    """fleet148 (s38's slow property tier on integ e747360, larger fleets, 2026-12-03; on a8d9436, before the session's
    greedy changes, too; not reduced, not diagnosed): az-a100-80 (max 2) runs two spot A100s, i0 with t3's low j0 and
    i1 with t1's low j7 (inside t1's guarantee); the fleet is all spot and breaks its 25% on-demand buffer, so one spot
    host must give its pool slot to an on-demand A100. CP-SAT deletes i0 (evicts j0) and keeps j7; greedy deletes i1 and
    evicts j7, and `apply --plan`'s re-check refuses its plan ("runs inside tenant t1's guarantee and no rule requires
    stopping it ... the fleet breaks spot-buffer now, but the plan with it kept where it runs ... breaks no rule"). Safe
    as it stands (refused at apply; CP-SAT's plan is emitted where it answers); greedy is the fallback. fleet144's kind
    (a host chosen without regard to whose guarantee runs on it), in the spot settlement rather than the reclaim."""
    check_fleet(fleet("fleet148"), time_limit=5)


def test_greedys_plan_right_after_the_first_apply_is_a_no_op_on_fleet147(monkeypatch):
    """fleet147 (s38's lifecycle machine, greedy alone: FLEETOPS_LIFE_TIME_LIMIT=0, 100 lives of 30 steps, seed 38401;
    on main too; the draws in tests/data/findings/fleet147.txt): the life's first step, `start`, fails. Its apply's plan
    (greedy, an empty fleet, a100 pool at most 2 instances) placed t3's low a100nv j3 and t1's low j2 and left t3's
    normal 3-replica gang j4 (6 A100, within t3's burst) out; the plan right after it, nothing changed, evicted j3 for
    j4: "evicted: pools at max_instances (a100 2/2) (capacity goes to higher-priority work first: j4)" (preemption
    LowerPriority). No damage (the plan checks passed: no rule broken), but greedy did not converge. The first plan is
    the model's (CP-SAT's is the same: t3's guaranteed work first, and j4 borrows 2 GPUs past the 4 guaranteed); the
    second was wrong: `_place_displacing` stopped t3's protected low j3 for j4, which borrows even in j3's room, where
    the class tiers count a higher class taking a lower one's place inside the guarantee only (CP-SAT, on the same
    fleet, keeps j3). Fixed (s38-f147): no protected job is stopped for work that borrows beside it. Replayed as the
    machine runs `start` (its own checks), the draws served in order; about a second."""
    import ast

    import tests.test_lifecycle_machine as life

    draws = iter(ast.literal_eval((FINDINGS / "fleet147.txt").read_text()))
    notes = []
    monkeypatch.setattr(life, "TIME_LIMIT", 0.0)
    monkeypatch.setattr(life, "note", notes.append)

    class Recorded:
        def draw(self, strategy, label=None):
            return next(draws)

    m = life.FleetLife()
    try:
        try:
            life.FleetLife.start(m, Recorded())
        except AssertionError as e:
            if "not a no-op" not in str(e) or "('j3', 'evict'" not in str(e) or "('j4', 'place'" not in str(e):
                raise RuntimeError(f"fleet147 fails otherwise than recorded: {e}") from e  # (not the xfail: fails the run)
            raise
        assert next(draws, None) is None, "the recorded draws were not all used"
    finally:
        m.teardown()
