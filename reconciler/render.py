"""Render a plan for people: a terminal table (rich), a PR comment (markdown), or JSON."""

from __future__ import annotations

import io
import json
import re

from rich.console import Console
from rich.table import Table
from rich.text import Text

from reconciler.errors import json_printed, printable, shown
from reconciler.ledger import money
from reconciler.plan import Plan
from reconciler.plan.quality import KEPT_SHORT, greedy_advice, proofs_of
from reconciler.words import amount, gpu_span

MARKDOWN_MAX_ROWS = 60  # per section
# RestartedJob.change, as the plan's table says it and as its summary line counts it
RUN_CHANGES = {"restarts": "restarts (run changed)", "starts": "starts (run added)", "stops": "stops (run removed; it keeps its place)"}
RUN_CHANGED = {"restarts": "restarted", "starts": "started", "stops": "stopped"}
MARKDOWN_MAX_CHARS = 60_000  # GitHub caps a comment at 65,536 characters


def summary_line(plan: Plan) -> str:
    c = plan.counts()
    return (
        f"{c['create']} to create, {c['delete']} to delete; jobs: {c['place']} placed, {c['move']} moved, "
        f"{c['evict']} evicted, {c['pending']} pending, {c['unchanged']} unchanged"
        + f"{f', {n} removed' if (n := c['remove']) else ''}"
        + "".join(f", {n} {word}" for change, word in RUN_CHANGED.items() if (n := c[change]))  # a run added or taken out is no restart
        + "; "
        + f"${plan.cost_before:,.2f}/h -> ${plan.cost_after:,.2f}/h"
    )


def no_changes_line(plan: Plan) -> str:
    """A plan that changes nothing. It matches the desired state only if nothing waits: a job the plan cannot place
    is desired and not running (before: "The fleet matches the desired state" above a table of pending jobs)."""
    waiting = sum(j.action == "pending" for j in plan.jobs)
    if waiting:
        return f"No changes. {waiting} job(s) stay pending (reasons below): the fleet does not yet match the desired state."
    return "No changes. The fleet matches the desired state."


def _unproven_words(s) -> str:
    """The tiers not proven best, and what is known of each: at least greedy's answer there (the warm start is their
    floor), or below it where the repair stage's answer gave it up for a tier ranked above (status BELOW_GREEDY)."""
    below = [t["name"] for t in s.tiers if t.get("status") == "BELOW_GREEDY"]
    short = [t["name"] for t in s.tiers if t.get("status") == KEPT_SHORT]
    rest = [n for n in s.unproven if n not in below and n not in short]
    return "; ".join(([f"{', '.join(rest)}; each at least greedy's"] if rest else []) +
                     ([f"{', '.join(short)}: the plan's value, at least greedy's"] if short else []) +
                     ([f"{', '.join(below)}: below greedy's, for a tier ranked above"] if below else []))


def _solver_line(plan: Plan) -> str:
    s = plan.solver
    took = f" in {s.seconds:.2f}s" if s.seconds else ""  # (a saved plan has no wall clock: its JSON is the same every run)
    if s.status == "GREEDY_FALLBACK":
        why = s.note or f"CP-SAT found no solution{took}"
        advice = greedy_advice(why)  # (what a longer search would do depends on why the plan is greedy's)
        if advice is None:
            return f"{why}; plan {plan.id}"
        return f"{why}: this plan is greedy best-fit; {advice}; plan {plan.id}"
    unproven = s.unproven
    words = _unproven_words(s)
    # (a tier below greedy's comes from the repair stage's answer, searched again instance by instance, not a limit)
    how = {t.get("status") for t in s.tiers if t["name"] in unproven}
    limit = ("was searched again where its counts did not pack" if "BELOW_GREEDY" in how
             else "counted more than the plan keeps" if how == {KEPT_SHORT} else "stopped at its work limit")
    if s.optimal:
        quality = "optimal"
    elif s.greedy_parts:  # (solve.parts: those parts measured no tiers, so the plan claims none)
        quality = (f"answered {s.greedy_parts} of its independent parts with greedy best-fit's ({s.note}), "
                   "so no tier or optimality gap is claimed")
    elif s.unpacked:
        # The bound is for plans that place what the solver placed; this one places less. Unproven tiers are still
        # named: the plan says which tiers were proven whatever else it says.
        stopped = (f" and {limit.removeprefix('was ')} with {len(unproven)} tier(s) not proven best ({words})") if unproven else ""
        quality = (f"counts left {s.unpacked} job(s) it placed unpacked on the plan's instances (pending){stopped}, "
                   "so no optimality gap is claimed")
    elif s.backfilled:
        # The plan places more than the solver's answer did, so the tiers that answer reached were not the best.
        stopped = (f" ({limit.removeprefix('was ')} with {len(unproven)} tier(s) not proven best: {words})"
                   if unproven else "")
        quality = f"answer left room for pending work{stopped}, so no optimality gap is claimed"
    elif unproven:
        # The gap speaks of cost at the tiers reached; with a work tier not proven it would read as a promise it is not.
        quality = f"{limit} with {len(unproven)} tier(s) not proven best ({words}), so no optimality gap is claimed"
    elif plan.cost_after <= 0:  # nothing left to pay for: no cheaper plan exists, whatever the gap's arithmetic says
        quality = "at the least possible cost ($0.00/h)"
    elif s.narrowed or s.held:
        quality = f"every tier proven best {proofs_of(s)}; cost within {s.gap:.2%} of their lower bound"
    else:
        quality = f"every tier proven best; cost within {s.gap:.2%} of a lower bound"
    scope = f"; {s.scope[0]} of {amount(s.scope[0] + s.scope[1], 'instances')} re-optimised, the rest unchanged" if s.scope[1] else ""
    if s.narrowed:  # (solve.model: the bounds above are of the choices the model offered)
        scope += f"; {s.narrowed:,} (job group, instance) choices not offered to the solver (too many to offer every one)"
    repairs = f"; {s.repairs} instance(s) added where counts did not pack" if s.repairs else ""
    backfill = f"; {s.backfilled} pending job(s) placed in room its packing left (backfill)" if s.backfilled else ""
    return f"CP-SAT {quality}{took}{scope}{repairs}{backfill}; plan {plan.id}"


def where(j) -> str:
    """Instances of a job, with each replica's GPU indices: "i-1[0-3], +2[4-7]"."""
    out = []
    for i, ref in enumerate(j.instances):
        g = j.gpus[i] if i < len(j.gpus) else ()
        out.append(f"{ref}[{gpu_span(g)}]" if g else ref)
    return ", ".join(out)


def prices_line(plan) -> str:
    """Where the prices of the instances to create come from, and as of when: a price the planner weighed
    is only as good as its source (a catalog's date, or a live API)."""
    by: dict[str, int] = {}
    for c in plan.creates:
        by[c.price_source or "unknown source"] = by.get(c.price_source or "unknown source", 0) + 1
    return "Prices: " + "; ".join(f"{src} for {n}" for src, n in sorted(by.items()))


def consolidation_line(plan: Plan) -> str | None:
    c = plan.consolidation
    if c is None:
        return None
    moves = f"Consolidation: {c.moved_replicas} replica(s) move and {len(c.instances_removed)} instance(s) go"
    if c.saving_per_hour is None:
        return f"{moves}, for a one-time {money(c.move_cost)} of restarts (the saving was not measured)"
    # (a fraction of a cent either way is $0.00 saved, not "$0.00/h more")
    gain = f"saving {money(c.saving_per_hour)}/h" if round(c.saving_per_hour, 2) >= 0 else f"at {money(-c.saving_per_hour)}/h more"
    if c.room_jobs:  # (the plan it is measured against runs less: no payback on a like-for-like saving to name)
        return (f"{moves}, and the room they free runs {c.room_jobs} job{'s' if c.room_jobs > 1 else ''} that the best plan "
                f"found that moves them not leaves pending, {gain} against it (instances, egress and latency), for a "
                f"one-time {money(c.move_cost)} of restarts")
    payback = f", paid back in {c.move_cost / c.saving_per_hour:.1f} h" if c.saving_per_hour > 0 else ""
    return (f"{moves}, {gain} against the best plan found that moves them not (instances, egress and latency), for a "
            f"one-time {money(c.move_cost)} of restarts{payback}")


def ballast_line(plan: Plan) -> str | None:
    b = plan.ballast
    if b is None:
        return None
    where = ", ".join(b.instances[:5]) + (f" and {len(b.instances) - 5} more" if len(b.instances) > 5 else "")
    return (f"Spot ballast: {b.idle:g} idle on-demand {b.unit} ({where}) cost {money(b.cost_per_hour)}/h and hold {b.rule} "
            f"for the plan's spot capacity (spot is {b.spot_share:.0%} of the fleet with them, {b.spot_share_without:.0%} without)")


def rules_lines(plan: Plan) -> list[str]:
    """The scheduling rules' figures of a plan (licenses, reservations, deadlines), one line each."""
    out = []
    for name, lic in plan.rules.get("licenses", {}).items():
        tenants = ", ".join(f"{t} {n}" for t, n in lic["tenants"].items())
        cost = f", {money(lic['cost_per_hour'])}/h charged to their tenants" if lic["cost_per_hour"] else ""
        out.append(f"License {name}: {lic['held']}/{lic['count']} held" + (f" ({tenants})" if tenants else "") + cost)
    for name, r in plan.rules.get("reservations", {}).items():
        waste = (f"; {r['count'] - r['used']} unused waste {money(r['wasted_per_hour'])}/h" if r["used"] < r["count"] else "")
        out.append(f"Reservation {name}: {r['used']}/{r['count']} {r['instance_type']} in {r['zone']} used ({r['utilisation']:.0%}), "
                   f"{money(r['committed_per_hour'])}/h committed (not in the $/h above){waste}")
    for scope, q in plan.rules.get("cloud_quotas", {}).items():
        out.append(f"Cloud quota {scope}: {q['used']:g} of {q['limit']:g} {q['unit']} used when read, the plan's new instances "
                   f"take {q['plan_takes']:g}" + (" (none left)" if q["left"] <= 0 else f" ({q['left']:g} left)"))
    out += list(plan.rules.get("cloud_quota_floors", {}).values())
    for job, dl in plan.rules.get("deadlines", {}).items():
        if dl["condition"] != "OnTrack":
            out.append(f"{dl['condition']}: job {job} {dl['message']}")
    return out


def _market(c) -> str:
    """A create's market, and the reservation it launches into."""
    return f"{c.site.market} (reserved: {c.reservation})" if getattr(c, "reservation", None) else c.site.market


QUOTED = "The plan file says: "  # a line of a saved plan's claims, which apply's re-check does not recompute


def render_human(plan: Plan, width: int = 120, color: bool = False, from_file: bool = False) -> str:
    """color (a terminal without NO_COLOR): creates green, deletes and evictions red, moves yellow, pending reasons dim.
    from_file (`apply --plan`): the re-check recomputes a saved plan's actions, prices and notes, not what only a solve
    could (its solver line, reasons, consolidation, ballast and rules lines): those are marked as the file's words."""
    buf = io.StringIO()
    con = Console(file=buf, width=width, force_terminal=color, color_system="standard" if color else None,
                  no_color=not color, highlight=False)
    style = {"place": "green", "move": "yellow", "evict": "red"}

    def say(line: str) -> None:
        con.print(_text(line))

    def claim(line: str) -> str:
        return QUOTED + line if from_file else line

    def why(column: str) -> str:
        return f"{column} (the plan file's)" if from_file else column

    if not plan.has_changes:
        say(no_changes_line(plan))
    if plan.creates:
        _table(con, "Instances to create", ("ref", "pool", "cloud/zone", "type", "market", "$/h"),
               [(c.ref, c.site.pool, f"{c.site.cloud}/{c.site.zone}", c.site.instance_type, _market(c), f"{c.price:.3f}") for c in plan.creates],
               ["green"] * len(plan.creates))
        say(prices_line(plan))
    if plan.deletes:
        _table(con, "Instances to delete", ("instance", "pool", "cloud/zone", "type", "market", "$/h", why("why")),
               [(d.instance_id, d.site.pool, f"{d.site.cloud}/{d.site.zone}", d.site.instance_type, d.site.market, f"{d.price:.3f}", d.reason)
                for d in plan.deletes], ["red"] * len(plan.deletes))
    moving = [j for j in plan.jobs if j.action in ("place", "move", "evict")]
    if moving:
        _table(con, "Job placements", ("job", "tenant", "action", "instances", "from", why("note")),
               [(j.job, j.tenant, j.action, where(j) or "-", ", ".join(j.previous) or "-", j.reason if j.action != "evict" else "")
                for j in moving], [style[j.action] for j in moving])
    if plan.removed:
        _table(con, "Jobs removed from the config (they stop)", ("job", "from"),
               [(r.job, ", ".join(r.previous)) for r in plan.removed], ["red"] * len(plan.removed))
    if plan.restarted:
        _table(con, "Jobs whose run spec changed (they restart in place, or start or stop there)", ("job", "on", "change"),
               [(r.job, ", ".join(r.instances), RUN_CHANGES[r.change]) for r in plan.restarted], ["yellow"] * len(plan.restarted))
    if consolidation_line(plan):
        say(claim(consolidation_line(plan)))
    if ballast_line(plan):
        say(claim(ballast_line(plan)))
    for line in rules_lines(plan):
        say(claim(line))
    pending = [j for j in plan.jobs if j.action in ("pending", "evict")]
    if pending:  # the summary counts evicted and pending apart; the table says which each row is
        evicted = any(j.action == "evict" for j in pending)
        _table(con, "Pending and evicted jobs" if evicted else "Pending jobs", ("job", "tenant", "state", why("reason")),
               [(j.job, j.tenant, "evicted" if j.action == "evict" else "pending", j.reason) for j in pending], [None] * len(pending),
               last_style="dim")
    for v in plan.violations:
        say(f"GUARDRAIL: {v}")
    for n in plan.notes:
        say(f"Note: {n}")
    say(f"Plan: {summary_line(plan)}")
    con.print(_text(claim(_solver_line(plan))), soft_wrap=True)  # (one line, however long: the terminal wraps it, grep finds it)
    return buf.getvalue()


# Rows above which a table is printed as plain aligned columns: rich's Table lays out, measures and wraps every
# cell, 5.1 s of CPU for a 10k-job plan's 15.8k rows (the whole plan then took 15.3 s to print where JSON took 10.3).
PLAIN_TABLE_ROWS = 300


def _text(text: str, style: str = "") -> Text:
    """`text` as rich prints it literally: not read as rich's markup (a job named `x[/y]` read from the state raised
    MarkupError, "a bug in reconcile", and `[c]` vanished), its controls escaped (reconciler.errors.printable)."""
    return Text(printable(text), style=style)


def _table(con: Console, title: str, cols: tuple[str, ...], rows: list[tuple[str, ...]], styles: list[str | None],
           last_style: str | None = None) -> None:
    """One table of the human plan: rich's, or above PLAIN_TABLE_ROWS the same columns aligned in plain text, a row a
    line, the last column unpadded (a long reason runs on: the terminal wraps it, grep finds it), each row its style."""
    rows = [tuple(map(printable, r)) for r in rows]
    if len(rows) <= PLAIN_TABLE_ROWS:
        t = Table(title=title, title_justify="left")
        for col in cols:
            t.add_column(col)
        for r, st in zip(rows, styles):
            t.add_row(*map(Text, r[:-1]), Text(r[-1], style=last_style or ""), style=st)
        con.print(t)
        return
    widths = [max(len(col), max(len(r[i]) for r in rows)) for i, col in enumerate(cols[:-1])]
    text = Text(f"{title} ({len(rows)})\n")
    text.append("  ".join(c.ljust(w) for c, w in zip(cols, widths)) + "  " + cols[-1] + "\n", style="bold")
    for r, st in zip(rows, styles):
        text.append("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  ", style=st)
        text.append(r[-1] + "\n", style=last_style or st)
    con.print(text, soft_wrap=True, end="")


def md_code(text: str) -> str:
    """`text` as one markdown code span, whatever it holds: fenced by one backtick more than its longest run of them
    (a ref's backtick closed the span), padded where it starts or ends with one, its controls escaped (a newline ended
    the heading)."""
    text = shown(text, 4096)
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


# What markdown reads as its own syntax in a line of text: `\\` an escape, a backtick code, `|` a table cell, `<` HTML
# (<details>, <img>), `[` `]` a link or an image, and an @mention at the start of a word (GitHub notifies whom it names).
_MD_SYNTAX = re.compile(r"[\\`|<\[\]]")
_MENTION = re.compile(r"(?<![\w`])@(?=\w)")


def md_text(text: str) -> str:
    """Text the plan did not write itself (a job's name as the state or a saved plan has it, a reason, a provider's
    note) as literal text on one line of the PR comment: its controls escaped (a newline ended the table row, `\\x1b`
    and a right-to-left override reordered it), markdown's syntax backslash-escaped, an @mention broken by a zero-width
    space. A name the config validated has none of these, and reads as it did."""
    text = _MD_SYNTAX.sub(r"\\\g<0>", printable(text))
    return _MENTION.sub("@\u200b", text) if "@" in text else text


def _md_table(header: list[str], rows: list[list[str]], truncated_note: str) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows[:MARKDOWN_MAX_ROWS]:
        out.append("| " + " | ".join(map(md_text, r)) + " |")
    if len(rows) > MARKDOWN_MAX_ROWS:
        out.append(f"\n_... {len(rows) - MARKDOWN_MAX_ROWS} more rows truncated; {truncated_note}_")
    return out


def markdown_truncates(plan: Plan) -> bool:
    per_cloud = {}
    for a in (*plan.creates, *plan.deletes):
        per_cloud[a.site.cloud] = per_cloud.get(a.site.cloud, 0) + 1
    moving = sum(j.action in ("place", "move") for j in plan.jobs)
    pending = sum(j.action in ("pending", "evict") for j in plan.jobs)
    return max([moving, pending, *per_cloud.values()], default=0) > MARKDOWN_MAX_ROWS


def _tiers_differ(plan: Plan) -> str | None:
    """Why the tiers table's values are not this plan's, if they are not: the tiers are the solver's counts, and
    packing left some of its jobs pending (`unpacked`) or backfill placed pending work in room its packing left.
    (Before, the table read "value 20,720, best possible 20,720, proven yes" above a plan that placed more or less.)"""
    s = plan.solver
    what = [f"packing left {s.unpacked} job(s) it placed pending"] if s.unpacked else []
    what += [f"backfill placed {s.backfilled} more pending job(s)"] if s.backfilled else []
    if not what:
        return None
    return (f"_These are the solver's counts, not this plan's: {' and '.join(what)}, so this plan's own values differ "
            "and none is claimed best for it._")


def render_markdown(plan: Plan, full_plan_path: str | None = None) -> str:
    note = f"the full plan is in {md_code(str(full_plan_path))}" if full_plan_path else "run `reconcile plan --format json` for the full plan"
    lines = [f"### fleetops plan for {md_code(plan.fleet)}", "", f"**{md_text(summary_line(plan))}**", ""]
    if not plan.has_changes:
        lines += [no_changes_line(plan), ""]
    for v in plan.violations:
        lines.append(f"> :no_entry: **Guardrail:** {md_text(v)}")
    if plan.violations:
        lines.append("")
    for n in plan.notes:
        lines.append(f"> **Note:** {md_text(n)}")
    if plan.notes:
        lines.append("")
    clouds = sorted({c.site.cloud for c in plan.creates} | {d.site.cloud for d in plan.deletes})
    for cloud in clouds:
        cr = [c for c in plan.creates if c.site.cloud == cloud]
        de = [d for d in plan.deletes if d.site.cloud == cloud]
        lines += [f"<details><summary>{md_text(cloud)}: {len(cr)} to create, {len(de)} to delete</summary>", ""]
        rows = [["+ create", c.ref, c.site.pool, c.site.zone, c.site.instance_type, _market(c), f"{c.price:.3f}"] for c in cr]
        rows += [["- delete", d.instance_id, d.site.pool, d.site.zone, d.site.instance_type, d.site.market, f"{d.price:.3f}"] for d in de]
        lines += _md_table(["action", "instance", "pool", "zone", "type", "market", "$/h"], rows, note)
        lines += ["", "</details>", ""]
    moving = [j for j in plan.jobs if j.action in ("place", "move")]
    if moving:
        lines += [f"<details><summary>Job placements ({len(moving)})</summary>", ""]
        lines += _md_table(["job", "tenant", "action", "instances", "note"], [[j.job, j.tenant, j.action, where(j), j.reason] for j in moving], note)
        lines += ["", "</details>", ""]
    if plan.removed:
        lines += [f"<details open><summary>Jobs removed from the config: they stop ({len(plan.removed)})</summary>", ""]
        lines += _md_table(["job", "from"], [[r.job, ", ".join(r.previous)] for r in plan.removed], note)
        lines += ["", "</details>", ""]
    if plan.restarted:
        lines += [f"<details open><summary>Jobs whose run spec changed: they restart in place, or start or stop there ({len(plan.restarted)})</summary>", ""]
        lines += _md_table(["job", "on", "change"], [[r.job, ", ".join(r.instances), RUN_CHANGES[r.change]] for r in plan.restarted], note)
        lines += ["", "</details>", ""]
    if consolidation_line(plan):
        lines += [f"**{md_text(consolidation_line(plan))}**", ""]
    if ballast_line(plan):
        lines += [f"**{md_text(ballast_line(plan))}**", ""]
    if rules_lines(plan):
        lines += [f"- {md_text(line)}" for line in rules_lines(plan)] + [""]
    pending = [j for j in plan.jobs if j.action in ("pending", "evict")]
    if pending:
        evicted = sum(j.action == "evict" for j in pending)
        lines += [f"**Pending jobs ({len(pending) - evicted}){f' and evicted jobs ({evicted})' if evicted else ''}**", ""]
        lines += _md_table(["job", "tenant", "state", "reason"], [[j.job, j.tenant, j.action, j.reason] for j in pending], note)
        lines.append("")
    if plan.solver.tiers:
        lines += ["<details><summary>Objective tiers (each held while the next was solved)</summary>", ""]
        unproven = set(plan.solver.unproven)
        lines += _md_table(["tier", "value", "best possible", "how", "proven"],
                           [[t["name"], f"{t['value']:,}", "-" if t["bound"] is None else f"{round(t['bound']) + 0:,}",
                             "as the plan keeps it" if t["status"] == KEPT_SHORT else t["status"].lower(),
                             ("no: below greedy's, for a tier above" if t["status"] == "BELOW_GREEDY" else "no: at least greedy's")
                             if t["name"] in unproven else "yes"] for t in plan.solver.tiers], note)
        if differs := _tiers_differ(plan):
            lines += ["", differs]
        elif plan.solver.narrowed or plan.solver.held:  # (as the plan's line says: its bounds are of those plans only)
            lines += ["", f"_Best possible and proven {proofs_of(plan.solver)}._"]
        lines += ["", "</details>", ""]
    lines.append(f"<sub>{md_text(_solver_line(plan))}</sub>")
    text = "\n".join(lines) + "\n"
    if len(text) > MARKDOWN_MAX_CHARS:
        text = text[:MARKDOWN_MAX_CHARS].rsplit("\n", 1)[0] + f"\n\n_... truncated at {MARKDOWN_MAX_CHARS} characters; {note}_\n"
    return text


def render(plan: Plan, fmt: str, full_plan_path: str | None = None, color: bool = False) -> str:
    if fmt == "json":
        return json_printed(plan.to_json()) + "\n"
    if fmt == "markdown":
        return render_markdown(plan, full_plan_path)
    return render_human(plan, color=color)


def render_diff_markdown(d) -> str:
    """A PR comment for `reconcile diff`: what merging this change does to the fleet."""
    delta = d.head.cost_after - d.base.cost_after
    lines = [f"### fleetops: what this change does (against {md_code(d.base_ref)})", ""]
    if not d.has_changes:
        return "\n".join(lines + ["No change to the fleet.", ""]) + "\n"
    elsewhere = f" ({len(d.elsewhere)} job(s) not running yet placed elsewhere, below)" if d.elsewhere else ""
    lines += [f"**{len(d.documents)} document(s) changed; {len(d.jobs)} job outcome(s) change{elsewhere}; "
              f"fleet ${d.base.cost_after:,.2f}/h -> ${d.head.cost_after:,.2f}/h ({delta:+,.2f})**", ""]
    if d.documents:  # (a section like the others: 60 rows, then a marker; the JSON lists every document)
        lines += ["```diff", *d.documents[:MARKDOWN_MAX_ROWS], "```", ""]
        if len(d.documents) > MARKDOWN_MAX_ROWS:
            lines += [f"_... {len(d.documents) - MARKDOWN_MAX_ROWS} more document(s) truncated; see `reconcile diff --format json`_", ""]
    if d.capacity:
        lines += _md_table(["pool type market", "before", "after"], [[k, str(b), str(h)] for k, b, h in d.capacity], "see the JSON plan")
        lines.append("")
    if d.jobs:
        lines += _md_table(["job", "before", "after"], [[j.job, j.base, j.head] for j in d.jobs], "see the JSON plan")
        lines.append("")
    if d.elsewhere:  # (api.DiffResult.elsewhere: not outcomes of the change, listed apart so none reads as one)
        lines += [f"<details><summary>Jobs not running yet that both plans start, on other instances in each "
                  f"({len(d.elsewhere)}): where each plan would start them, no change to anything running (equal-cost "
                  "choices may fall either way)</summary>", ""]
        lines += _md_table(["job", "before", "after"], [[j.job, j.base, j.head] for j in d.elsewhere], "see the JSON plan")
        lines += ["", "</details>", ""]
    for v in d.head.violations:
        lines.append(f"> :no_entry: **Guardrail:** {md_text(v)}")
    return "\n".join(lines) + "\n"


def render_explanation(e) -> str:
    """`reconcile explain JOB` for people."""
    lines = [f"Job {e.job}: {e.summary}"]
    lines += [f"  {d}" for d in e.details]
    if e.alternatives:
        lines.append("  Capacity it could use, cheapest first ($/h per replica: instance share + data egress + latency):")
        lines += [f"    {a.where}: ${a.per_replica:,.4f}" for a in e.alternatives]
    if e.would_change:
        lines.append("  What would change it (each checked by planning again against the same fleet):")
        lines += [f"    - {w}" for w in e.would_change]
    if e.tried:
        lines.append("  Not enough on its own:")
        lines += [f"    - {w}" for w in e.tried]
    if e.state in ("pending", "evicted") and not e.would_change:
        lines.append(f"  {e.unchanged or 'No single change tried places it.'}")
    return "".join(printable(line) + "\n" for line in lines)


def render_diff_json(d) -> str:
    """`reconcile diff --format json`: what differs between the plans at --base and of the working config."""
    from dataclasses import asdict

    return json_printed(json.dumps({"base": d.base_ref, "documents": list(d.documents), "jobs": [asdict(j) for j in d.jobs],
                                    "capacity": [list(c) for c in d.capacity], "placed_elsewhere": [asdict(j) for j in d.elsewhere],
                                    "cost_base": float(d.base.cost_after), "cost_head": float(d.head.cost_after)}, indent=2)) + "\n"


def render_status(st: dict) -> str:
    """`reconcile status` for people, from the status files (api.read_status)."""
    f = st["fleet"]["status"]
    lines = [f"fleet {st['fleet']['metadata']['name']}: {amount(f['instances'], 'instances')}, {money(f['hourlyCost'])}/h, "
             f"{amount(f['jobs']['running'], 'jobs')} running"
             + "".join(f", {f['jobs'][k]} {k}" for k in ("starting", "unknown", "reserved") if f["jobs"].get(k))
             + f", {f['jobs']['pending']} pending"
             + "".join(f", {f['jobs'][k]} {k}" for k in ("succeeded", "failed") if f["jobs"].get(k))
             + f" (last change: plan {f['lastChangedBy']})"]
    lines += [f"  tenant {t}: {money(c['hourlyCost'])}/h"
              + (f" + {money(c['licenseCostPerHour'])}/h of licenses" if c.get("licenseCostPerHour") else "") for t, c in f["tenants"].items()]
    for name, r in (f.get("reservations") or {}).items():
        lines.append(f"  reservation {name}: {r['used']}/{r['count']} used, {money(r['committedPerHour'])}/h committed"
                     + (f", {money(r['wastedPerHour'])}/h wasted on unused reserved instances" if r["wastedPerHour"] else ""))
    for name, lic in (f.get("licenses") or {}).items():
        lines.append(f"  license {name}: {lic['held']}/{lic['count']} held" + (f" ({', '.join(f'{t} {n}' for t, n in lic['tenants'].items())})" if lic["tenants"] else ""))
    for iid, fault in (st.get("agents") or {}).items():  # (lifecycle.agent_fault's words)
        lines.append(f"  agent on {iid}: {fault['reason']}: {fault['message']}")
    for name, j in st["jobs"].items():
        c = j["status"]["conditions"][0]
        run = j["status"].get("run")
        if run and run.get("reason") != "NotPlaced":  # a job that runs something: what its replicas do, as their agents report it
            restarts = f", {run['restarts']} restart(s)" if run.get("restarts") else ""
            lines.append(f"  job {name}: {j['status']['phase']} ({run['reason']}: {run['message']}{restarts})")
        else:  # (an unplaced job's agents have nothing to say: the plan's reason it waits, "quota exhausted: ...", does)
            lines.append(f"  job {name}: {j['status']['phase']} ({c['reason']}: {c['message']})")
        for x in j["status"]["conditions"][1:]:  # a deadline that is at risk or missed
            if x.get("type") in ("DeadlineAtRisk", "DeadlineMissed") and x.get("status") == "True":
                lines.append(f"    {x['type']}: {x['message']}")
    # (a replica's message ends with its last log lines: colours, a title rewrite, a `\r`, printed as text)
    return "".join(printable(line) + "\n" for line in lines)


def render_explanation_json(e) -> str:
    """`reconcile explain --format json`: would_change and tried as objects (change, outcome, $/h, other jobs)."""
    from dataclasses import asdict

    from reconciler.whatif import as_dict

    body = asdict(e)
    body["would_change"] = [as_dict(w) for w in e.would_change]
    body["tried"] = [as_dict(w) for w in e.tried]
    return json_printed(json.dumps(body, indent=2)) + "\n"
