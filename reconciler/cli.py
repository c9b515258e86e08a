"""`reconcile`: the command line, a thin typer layer over reconciler.api.

Exit codes: 0 success (and, with --detailed-exitcode, no changes), 2 changes
present (--detailed-exitcode), 1 any error. Errors print one actionable message."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from typer.core import TyperGroup

from reconciler.errors import ApplyError, ConfigError, LockError, ReconcileError, json_printed, printable
from providers.redact import redact

if TYPE_CHECKING:  # the CLI imports what a command needs when it runs
    from reconciler.api import ApplyResult
    from reconciler.plan import Plan
    from reconciler.progress import StopOnInterrupt

# click's UsageError, wherever this typer takes click from (typer 0.29 vendors its own copy as typer._click).
_UsageError = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
_ClickException = next(c for c in _UsageError.__mro__ if c.__name__ == "ClickException")
DEBUG_ENV = "FLEETOPS_DEBUG"
DEBUG_META = "fleetops.debug"


def _debug_env() -> bool:
    """FLEETOPS_DEBUG as settings.flag reads it; a bad value (refused before any command: settings.check_all) is no
    reason to hide the traceback of the error being printed."""
    from providers.settings import SettingError, flag

    try:
        return flag(DEBUG_ENV)
    except SettingError:
        return True


def last_resort_message(e: BaseException, debug: bool) -> str:
    """What an exception no code path expected prints: its type and message in one paragraph (with --debug or
    FLEETOPS_DEBUG=1, the traceback first), credentials in URLs redacted like every other error."""
    import traceback

    what = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    text = (f"Error: unexpected {what}. This is a bug in reconcile (or in a provider plugin), not in your input: please "
            f"report it with the output of the same command run as `reconcile --debug ...` (or with {DEBUG_ENV}=1), which "
            "adds the traceback. Run `reconcile plan` to see the fleet as it is now.")
    if debug:
        text = "".join(traceback.format_exception(type(e), e, e.__traceback__)) + text
    return _said(text)


def _plain_flags(params: list) -> list:
    """typer 0.29 shows `<bool>` after every flag (`--auto-approve <bool>`), as if it took a value: show none."""
    for p in params:
        if getattr(p, "is_flag", False) and p.metavar is None:
            p.metavar = ""
    return params


def _unwrapped(text: str | None) -> str | None:
    """A docstring's paragraphs each as one line: typer's command list (`reconcile --help`) keeps a docstring's line
    breaks under rich markup, so a description broke mid-sentence where its source line ended."""
    if not text:
        return text
    return "\n\n".join(" ".join(p.split()) for p in text.split("\n\n"))


class _Group(TyperGroup):
    """Usage errors (`--bogus`, `--format xml`, a missing argument) exit 1 as every other error does, not click's 2:
    2 is `--detailed-exitcode`'s "changes present", and a scheduled workflow ran its heal step on a typo."""

    def make_context(self, *args, **kwargs):
        try:
            return super().make_context(*args, **kwargs)
        except _UsageError as e:
            e.exit_code = 1
            raise

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except _UsageError as e:
            e.exit_code = 1
            raise
        except KeyboardInterrupt:  # Ctrl-C where no command says more: 128 + SIGINT, as a shell reports it (click: 1)
            typer.echo("Interrupted.", err=True)
            raise typer.Exit(130)
        except (typer.Exit, typer.Abort, _ClickException):
            raise
        except ReconcileError as e:  # typed and actionable, though no command caught it (`sim ls`): not a bug
            _fail(e, fmt=ctx.meta.get(FORMAT_META, "human"))
        except Exception as e:  # the last resort: one paragraph, never a bare traceback
            typer.echo(last_resort_message(e, ctx.meta.get(DEBUG_META, False) or _debug_env()), err=True)
            raise typer.Exit(1)

    def get_command(self, ctx, cmd_name):
        cmd = super().get_command(ctx, cmd_name)
        if cmd is not None:
            _plain_flags(cmd.get_params(ctx))
            cmd.help = _unwrapped(cmd.help)
        return cmd

    def get_params(self, ctx):
        return _plain_flags(super().get_params(ctx))


app = typer.Typer(cls=_Group, add_completion=False, no_args_is_help=True,
                  help="Declarative GitOps reconciler for multi-cloud ML compute fleets.")
def _print_version(value: bool) -> None:
    if value:
        from reconciler import __version__

        typer.echo(f"reconcile {__version__}")
        raise typer.Exit()


@app.callback()
def _root(ctx: typer.Context,
          show_version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                            help="Print the version and exit."),
          debug: bool = typer.Option(False, "--debug", help=f"On an unexpected error, print the traceback (also: {DEBUG_ENV}=1).")) -> None:
    ctx.meta[DEBUG_META] = debug
    if ctx.invoked_subcommand is not None:  # (a bad FLEETOPS_* setting stops a command before it calls a cloud)
        from reconciler.settings import check_all

        check_all()


sim_app = typer.Typer(cls=_Group, no_args_is_help=True, help="Drive the simulated cloud: inject faults, list instances.")
app.add_typer(sim_app, name="sim")

def _time_limit_ok(value: float) -> float:
    """A work limit of 0 (greedy only) up to a day: NaN fell through to greedy, inf made the wall cap infinite."""
    if value is not None and not 0 <= value <= MAX_TIME_LIMIT:
        raise typer.BadParameter(f"{value:g} is not a number of seconds from 0 (greedy best-fit only) to {MAX_TIME_LIMIT:g}")
    return value


def _gap_ok(value: float) -> float:
    """The gap is a fraction of the LP bound: 0 (search to the time limit) up to, not including, 1."""
    if value is not None and not 0 <= value < 1:
        raise typer.BadParameter(f"{value:g} is not a fraction from 0 up to 1 (0.03: within 3% of the LP bound)")
    return value


def _seconds(value: float | None, zero: bool = False) -> float | None:
    """The FLEETOPS_* settings' rule for seconds given on the command line (runtime.bus.seconds_problem)."""
    from reconciler.runtime.bus import seconds_problem

    problem = seconds_problem(value, zero) if value is not None else None
    if problem:
        raise typer.BadParameter(f"{value:g} {problem}")
    return value


def _seconds_ok(value: float | None) -> float | None:
    """A period (--poll, --heartbeat, --resync): finite, above 0, at most a week."""
    return _seconds(value)


def _state_ok(value: str | None) -> str | None:
    """An empty --state (`--state "$STATE"` with STATE unset) meant the local state, and an apply meant for a bucket's
    fleet acted on whatever .reconcile/ the runner had. Left out, the state is local; given, it is named."""
    if value is not None and not value.strip():
        raise typer.BadParameter("is empty: give 'local', s3://bucket/prefix, gs://bucket/prefix or "
                                 "azblob://account/container/prefix, or leave --state out for the local state")
    return value


def _port_ok(value: int | None) -> int | None:
    if value is not None and not 0 <= value <= 65535:
        raise typer.BadParameter(f"{value} is not a TCP port from 0 (a free one) to 65535")
    return value


def _grace_ok(value: float | None) -> float | None:
    """A grace period that may be 0 (none): --notice-seconds."""
    return _seconds(value, zero=True)


MAX_TIME_LIMIT = 86400.0  # a day of solver work; the wall cap is 10x this + 30 s
ConfigDir = typer.Argument(Path("."), help="The config directory (YAML documents).", show_default=True)
ProviderOpt = typer.Option("sim", "--provider", envvar="FLEETOPS_PROVIDER", help="Provider for pools that name none.")
TIME_LIMIT_HELP = ("CP-SAT work limit, about seconds on an idle core; counted in the solver's deterministic work, so a busy machine "
                   "gives the same plan (0: greedy best-fit only). The wall clock is capped at 10x this + 30 s: past it, the plan is "
                   "greedy's and says so.")
TimeLimitOpt = typer.Option(20.0, "--time-limit", callback=_time_limit_ok, help=TIME_LIMIT_HELP)
OptionOpt = typer.Option(None, "--provider-option", "-o", help="KEY=VALUE passed to providers (e.g. endpoint_url=...).")
StateOpt = typer.Option(None, "--state", envvar="FLEETOPS_STATE", callback=_state_ok, help="State backend: local (default), s3://bucket/prefix, gs://bucket/prefix or azblob://account/container/prefix.")
GapOpt = typer.Option(0.03, "--gap", callback=_gap_ok, help="Stop once the plan's cost is provably within this fraction of the LP bound (0: search to the time limit).")


def _options(pairs: Optional[list[str]]) -> dict:
    out = {}
    for p in pairs or []:
        k, sep, v = p.partition("=")
        if not sep:
            raise typer.BadParameter(f"--provider-option {p!r} is not KEY=VALUE")
        out[k] = v
    return out


FORMAT_META = "fleetops.format"  # click's ctx.meta key (shared by the command's context and its group's): the --format
# the running command was asked for, so an error no command caught is printed in it too; "human" until one says


def _output_format(ctx: typer.Context, fmt: str, allowed: tuple[str, ...]) -> str:
    """A command's --format, checked, and kept for the errors it may end with (_fail)."""
    if fmt not in allowed:
        raise typer.BadParameter(f"--format must be {', '.join(allowed[:-1])} or {allowed[-1]}")
    ctx.meta[FORMAT_META] = fmt
    return fmt


def _fail(e: ReconcileError, config_dir: Optional[Path] = None, state: Optional[str] = None, fmt: str = "human") -> None:
    """Print an error a user can act on (every diagnostic, for a bad config) and exit. With --format json or markdown
    the error is also printed on stdout in that format: a PR's plan comment is built from stdout (it was empty), and a
    JSON consumer gets a document to read."""
    if fmt in ("json", "markdown"):
        typer.echo(_error_document(e, config_dir, fmt), nl=False)
    if isinstance(e, ConfigError):
        for diag in e.diagnostics:
            typer.echo(redact(str(_as_typed(diag, config_dir))), err=True)
        typer.echo(f"{len(e.diagnostics)} error(s) in the desired state; nothing was changed", err=True)
    elif isinstance(e, LockError) and config_dir is not None:
        typer.echo(_said(f"Error: {_unlock_hint(str(e), config_dir, state)}"), err=True)
    else:
        typer.echo(_said(f"Error: {e}"), err=True)
    raise typer.Exit(e.exit_code)


def _said(message: str) -> str:
    """An error's message as it is printed: credentials redacted, and each line's controls and CI workflow commands
    escaped (errors.printable): a message quotes input (a link's target a PR chose, a provider's words)."""
    return "\n".join(map(printable, redact(message).split("\n")))


def _error_document(e: ReconcileError, config_dir: Optional[Path], fmt: str) -> str:
    """The error as --format asks for it: JSON `{"error": {type, message, diagnostics}}`, or a markdown section (its
    text as an indented code block: nothing in it can close a fence)."""
    diags = [_as_typed(d, config_dir) for d in e.diagnostics] if isinstance(e, ConfigError) else []
    if fmt == "json":
        # The message as ConfigError words it, over the files as the diagnostics (and stderr) name them.
        message = str(ConfigError(diags)) if isinstance(e, ConfigError) else str(e)
        doc = {"error": {"type": type(e).__name__, "message": _said(message),
                         "diagnostics": [{"file": d.file, "line": d.line, "kind": d.kind, "name": d.name, "field": d.field,
                                          "message": _said(d.message)} for d in diags]}}
        return json_printed(json.dumps(doc, indent=2)) + "\n"
    from reconciler.render import MARKDOWN_MAX_CHARS

    body = [redact(str(d)) for d in diags] if diags else _said(str(e)).split("\n")
    head = (f"the config does not validate ({len(diags)} error(s)); nothing was planned" if diags else "the plan failed")
    text = f"### fleetops: {head}\n\n"
    for kept, line in enumerate(body):  # (as many as a comment holds: a PR's 1,500 bad jobs made one GitHub refused)
        if len(text) + len(line) + 5 > MARKDOWN_MAX_CHARS:
            left = (f"{len(body) - kept} more error(s) left out; `reconcile validate` lists every one" if diags
                    else f"{len(body) - kept} more line(s) left out; the command's standard error has them all")
            return text + f"\n_... {left}_\n"
        text += f"    {line}\n"
    return text


def _as_typed(diag, config_dir: Optional[Path]):
    """A diagnostic's file (relative to the config dir) as a path from where the command ran: DIR as the user
    typed it joined with the file, so `reconcile validate ../fleet` names `../fleet/jobs/a.yaml:4`."""
    from dataclasses import replace

    if config_dir is None or diag.file.startswith("<") or Path(diag.file).is_absolute() or diag.file == str(config_dir):
        return diag
    return replace(diag, file=str(config_dir / diag.file))


def _unlock_hint(message: str, config_dir: Path, state: Optional[str]) -> str:
    """The lock error's `reconcile unlock ID`, completed into the exact command for this config and backend."""
    import re
    import shlex

    extra = f" --dir {shlex.quote(str(config_dir))}" + (f" --state {shlex.quote(state)}" if state else "")
    return re.sub(r"`reconcile unlock ([^`\s]+)`", lambda m: f"`reconcile unlock {m.group(1)}{extra}`", message)


@app.command()
def validate(config_dir: Path = ConfigDir) -> None:
    """Validate the desired state; report every error as file:line: kind/name: field: message."""
    from providers.catalog import catalog_for, pin_catalog
    from reconciler.load import load  # not api: validating imports no solver (ortools, pandas: ~1 s)

    try:
        pin_catalog(catalog_for(Path(config_dir)))  # the prices plan uses: a pinned catalog.json, else the shipped one
        d = load(config_dir)
    except ReconcileError as e:
        _fail(e, config_dir)
    typer.echo(f"ok: fleet {d.fleet}: {len(d.tenants)} tenants, {len(d.pools)} pools, {len(d.jobs)} jobs")


@app.command()
def schema() -> None:
    """Print one JSON Schema (draft 2020-12) that validates any single config document, by kind."""
    from reconciler.schema import document_schema

    typer.echo(json.dumps(document_schema(), indent=2))


@app.command()
def plan(
    ctx: typer.Context,
    config_dir: Path = ConfigDir,
    fmt: str = typer.Option("human", "--format", help="human | markdown | json"),
    out: Optional[Path] = typer.Option(None, "--out", help="Also save the plan as JSON here (for apply --plan)."),
    detailed_exitcode: bool = typer.Option(False, "--detailed-exitcode", help="Exit 2 when the plan has changes."),
    provider: str = ProviderOpt,
    time_limit: float = TimeLimitOpt,
    gap: float = GapOpt,
    allow_destroy: Optional[int] = typer.Option(None, "--allow-destroy", min=0, help="Allow this apply to delete up to N instances in all, above max_destroy_per_apply."),
    provider_option: Optional[list[str]] = OptionOpt,
    state: Optional[str] = StateOpt,
    adopt_fleet: bool = typer.Option(False, "--adopt-fleet", help="Take this Topology's name, and the instances carrying it, as this fleet's (after a rename, or a state lost where status/fleet.yaml does not say it was kept; see the identity error)."),
    no_memo: bool = typer.Option(False, "--no-memo", help="Solve again even when .reconcile/cache/plan-memo.json holds the plan for these exact inputs."),
) -> None:
    """Observe the fleet, solve placement and provisioning, print the plan."""
    if _EXIT["main"]:
        _collector_off()
    from reconciler import api

    _output_format(ctx, fmt, ("human", "markdown", "json"))
    if out is not None:
        _writable(out, "--out")
    try:
        if no_memo:
            res = api.plan(config_dir, provider=provider, time_limit=time_limit, allow_destroy=allow_destroy,
                           options=_options(provider_option), state=state, gap=gap, adopt_fleet=adopt_fleet)
        else:
            res = api.plan_with_memo(config_dir, provider=provider, time_limit=time_limit, allow_destroy=allow_destroy,
                                     options=_options(provider_option), state=state, gap=gap, adopt_fleet=adopt_fleet)
            if res.reused and fmt == "human":  # (json and markdown stay the plan alone, also with 2>&1)
                typer.echo(f"(the plan made for these exact inputs, read back from .reconcile/cache/plan-memo.json: making "
                           f"it took {res.seconds:.2f}s; --no-memo solves again)", err=True)
    except ReconcileError as e:
        _fail(e, config_dir, state, fmt)
    if out is not None:
        _write(out, api.few_collections(res.plan.to_json)())  # (see _render)
    from reconciler.words import use_color

    color = use_color(sys.stdout)
    text = None
    variant = json.dumps([fmt, color, str(out) if out else None])
    if getattr(res, "reused", False) and res.key is not None:  # a memo hit: printed as it was last time, if it was
        from reconciler import memo

        text = memo.read_render(config_dir, res.key, variant)
        if text is None:
            text = _render(res.plan, fmt, out, color)
            memo.keep_render(config_dir, res.key, variant, text)
    if text is None:
        text = _render(res.plan, fmt, out, color)
        if getattr(res, "key", None) is not None:  # made and kept: the next plan of these inputs reads it back
            _keep_hit_render(config_dir, res, fmt, out, color, variant)
    typer.echo(text, nl=False)
    if getattr(res, "reused", False) or _alone():
        _exit_without_teardown()
    if detailed_exitcode and (res.has_changes if isinstance(res, api.MemoPlan) else res.plan.has_changes):
        raise typer.Exit(2)


def _writable(path: Path, flag: str) -> None:
    """Refuse, before any work, a file that cannot be written: a directory, or one in a directory that is not there."""
    if path.is_dir():
        raise typer.BadParameter(f"{path} is a directory; give a file name", param_hint=flag)
    if not path.parent.is_dir():
        raise typer.BadParameter(f"directory {path.parent} does not exist", param_hint=flag)


def _write(path: Path, text: str) -> None:
    """--out's file (plan, report), replaced whole as `metrics --out` is (reconciler.atomicfile): a link at its name, as
    a pull request can commit `plan.json` for the gitops plan workflow's `--out plan.json`, is replaced, never written
    through (it overwrote the file it led to, anywhere the runner could write). A device or a pipe (/dev/stdout) is
    written as it is."""
    from reconciler.atomicfile import write_atomic

    try:
        if path.exists() and not path.is_file():
            path.write_text(text)
        else:
            write_atomic(path, text.encode())
    except OSError as e:
        _fail(ReconcileError(f"cannot write {path}: {e.strerror or e}"))


def _keep_hit_render(config_dir: Path, res, fmt: str, out: Path | None, color: bool, variant: str) -> None:
    """Render now what the next plan of the same inputs prints: the plan as the memo gives it back (without this
    run's solve time), so a PR's second plan does not render 5,000 jobs with rich (0.2 s of CPU; this costs as much
    once, after a solve of seconds)."""
    from reconciler import memo

    memo.keep_render(config_dir, res.key, variant, _render(res.plan.read_back(), fmt, out, color))


def _render(plan: Plan, fmt: str, out: Path | None, color: bool) -> str:
    from reconciler.api import few_collections
    from reconciler.render import render  # rich: 0.015 s of CPU to import, not needed when the memo kept the text

    # (as the plan itself: rendering a 10k-job plan allocates ~1M objects beside the plan's heap, and at the default
    # thresholds the collector traced that heap again: 0.97 s of CPU for the JSON where 0.57 s is the encoding)
    return few_collections(render)(plan, fmt, str(out) if out else None, color=color)


_EXIT = {"now": False, "main": False, "gc": False}


def _collector_off() -> None:
    """In a `reconcile plan` process (`main`), the cyclic collector is off from the command's start to the process's
    end. A plan makes almost no cyclic garbage (10k jobs: 89k objects, the packer's bins in one cycle through its
    repair buyer; the peak RSS the same, 468-470 MiB), yet the collector cost 0.35-0.55 s of CPU of a 10k-job plan:
    at few_collections' thresholds it traced the young heap ~80 times, and turned back on after the plan, its first
    collections traced every object the plan had made (0.24 + 0.13 s). `main` turns it on again when the process
    goes on (the teardown); in-process callers (tests, CliRunner) do not go through `main` and are left alone."""
    import gc

    if gc.isenabled():
        gc.disable()
        _EXIT["gc"] = True


def _alone() -> bool:
    """No other thread and no child process is left (a solve's worker pool is shut down when its parts are
    solved): ending without the teardown then leaves nothing unfinished. After a solve the teardown freed the
    config, problem and plan one by one: 0.3 s of CPU at 10k jobs, measured (`reconcile plan --no-memo`)."""
    import threading

    mp = sys.modules.get("multiprocessing")
    return threading.active_count() == 1 and not (mp is not None and mp.active_children())


def _exit_without_teardown() -> None:
    """The command has written all it prints: `main` may end the process without the interpreter's teardown,
    which frees every object one by one (the config, the fleet and the plan of a 5k-job fleet: 0.07-0.1 s of
    CPU, measured, of a 1 s plan read back from the memo). As mypy does; only where nothing is left to clean up:
    a plan read back from the memo (no solve, so no worker process, thread or semaphore; no lock held), or a
    plan made when no other thread or child process is left (`_alone`; plan holds no lock)."""
    _EXIT["now"] = True


@app.command()
def apply(
    config_dir: Path = ConfigDir,
    plan_file: Optional[Path] = typer.Option(None, "--plan", help="Apply this saved plan (refused if stale)."),
    auto_approve: bool = typer.Option(False, "--auto-approve", help="Do not ask before applying."),
    provider: str = ProviderOpt,
    time_limit: float = TimeLimitOpt,
    gap: float = GapOpt,
    allow_destroy: Optional[int] = typer.Option(None, "--allow-destroy", min=0, help="Allow this apply to delete up to N instances in all, above max_destroy_per_apply."),
    provider_option: Optional[list[str]] = OptionOpt,
    state: Optional[str] = StateOpt,
    commit: bool = typer.Option(False, "--commit", help="Commit the status/ changes (and nothing else) to git."),
    status_branch: Optional[str] = typer.Option(None, "--status-branch", help="With --commit: commit status to this branch instead of the current one."),
    adopt_fleet: bool = typer.Option(False, "--adopt-fleet", help="Take this Topology's name, and the instances carrying it, as this fleet's (after a rename, or a state lost where status/fleet.yaml does not say it was kept; see the identity error)."),
) -> None:
    """Apply a plan through the providers, then write status/ back into the config dir."""
    from reconciler.progress import StopOnInterrupt, use_color

    if status_branch is not None and not commit:  # (ignored, the status was left uncommitted and the run said nothing)
        raise typer.BadParameter("it names the branch --commit commits status/ to; add --commit, or leave it out",
                                 param_hint="'--status-branch'")
    if commit and config_dir.is_dir():  # (a missing config dir: load's error says so)
        from reconciler.gitops import check_commit

        try:
            check_commit(config_dir, status_branch)  # before any provider call: not after creating the fleet
        except ReconcileError as e:
            _fail(e)
    planning = dict(provider=provider, time_limit=time_limit, allow_destroy=allow_destroy, options=_options(provider_option),
                    state=state, gap=gap, adopt_fleet=adopt_fleet)
    color = use_color(sys.stdout)
    stop = StopOnInterrupt()
    try:
        saved = None
        if plan_file is not None:
            saved = _read_plan(plan_file)
        elif not auto_approve:
            saved = _preview_and_confirm(config_dir, color, planning)
            if saved is None:
                return
        res = _apply_with_progress(config_dir, saved, plan_file is not None or auto_approve, color, stop, planning,
                                   from_file=plan_file is not None)
    except KeyboardInterrupt:
        if stop.applying:
            typer.echo("Aborted in the middle of an action: the state was not saved and the lock was released; run "
                       "`reconcile apply` again to carry on (a create retried with the same plan makes no second instance).", err=True)
        else:
            typer.echo("Interrupted before any action: nothing was changed.", err=True)
        raise typer.Exit(stop.exit_code)
    except ApplyError as e:
        _report_partly_applied(e, config_dir, commit, status_branch, stop)
    except ReconcileError as e:
        _fail(e, config_dir, state)
    _report_applied(res, config_dir, commit, status_branch, stop)


def _read_plan(plan_file: Path) -> Plan:
    """A saved plan (--plan); one that cannot be read is a ReconcileError naming the file. Read as the state is: a
    regular file only (a fifo hung apply for ever, /dev/zero was read until memory ran out), of at most MAX_PLAN_BYTES,
    and only if no one beside its owner could have rewritten it (apply acts on it)."""
    from providers.files import others_may_write, read_regular
    from reconciler.plan import Plan
    from reconciler.plan.file import MAX_PLAN_BYTES

    try:
        text = read_regular(plan_file, MAX_PLAN_BYTES)
        if len(text) > MAX_PLAN_BYTES:
            raise ValueError(f"it is larger than {MAX_PLAN_BYTES >> 20} MiB, which no plan is (a 50k-job plan is ~26 MiB)")
        loose = others_may_write(plan_file)
        if loose:
            raise ValueError(f"{loose}: anyone who can write it chooses what this apply does. Make it writable by its "
                             "owner only, check that it is the plan you reviewed, and apply it again")
        return Plan.from_json(text.decode())
    except OSError as e:
        raise ReconcileError(f"cannot read plan {plan_file}: {e.strerror or e}") from e
    except (ValueError, KeyError, TypeError) as e:  # (a UnicodeDecodeError is a ValueError)
        raise ReconcileError(f"cannot read plan {plan_file}: {e}") from e


def _preview_and_confirm(config_dir: Path, color: bool, planning: dict) -> Plan | None:
    """Plan, show it and ask before applying it: the plan to apply, or None when it changes nothing.
    Not on a terminal, or declined: exit 1."""
    from reconciler import api
    from reconciler.render import render_human

    preview = api.plan(config_dir, **planning)
    typer.echo(render_human(preview.plan, color=color), nl=False)
    if not preview.plan.has_changes:
        return None
    if not sys.stdin.isatty():
        typer.echo("Error: not a terminal; re-run with --auto-approve or apply a saved --plan", err=True)
        raise typer.Exit(1)
    if not typer.confirm("Apply this plan?"):
        typer.echo("Apply cancelled.")
        raise typer.Exit(1)
    return preview.plan


def _apply_with_progress(config_dir: Path, saved: Plan | None, show: bool, color: bool, stop: StopOnInterrupt,
                         planning: dict, from_file: bool = False) -> ApplyResult:
    """Apply `saved` (None: plan afresh), showing each action as it runs; Ctrl-C asks `stop` to start no more
    actions once applying began. `show`: print the plan first (the interactive path already showed it); `from_file`:
    `saved` was read from a file, whose claims are printed as its words (render_human)."""
    from reconciler import api
    from reconciler.progress import ApplyProgress
    from reconciler.render import render_human

    progress: list[ApplyProgress] = []

    def show_plan(p: Plan) -> None:
        if show:
            typer.echo(render_human(p, color=color, from_file=from_file), nl=False)
        progress.append(ApplyProgress(p, sys.stdout, color=color).__enter__())
        stop.applying = True

    def on_event(e) -> None:
        progress[0](e)

    with stop:
        try:
            return api.apply(config_dir, saved_plan=saved, **planning, on_plan=show_plan, on_event=on_event, should_stop=stop)
        finally:
            for p in progress:
                p.__exit__(None, None, None)


def _report_partly_applied(e: ApplyError, config_dir: Path, commit: bool, status_branch: Optional[str], stop: StopOnInterrupt) -> None:
    """Some actions failed: say what was done, commit status if asked, and exit with the error."""
    res = e.result  # type: ignore[attr-defined]
    typer.echo(f"Applied plan {res.plan.id} partly: {res.report.counts}.")
    if commit:
        _commit_status(config_dir, res, status_branch)
    if res.report.stopped:
        _say_stopped(res, stop)
    _fail(e)


def _report_applied(res: ApplyResult, config_dir: Path, commit: bool, status_branch: Optional[str], stop: StopOnInterrupt) -> None:
    """Commit status if asked and say what was done; stopped by Ctrl-C or SIGTERM: exit 130 or 143."""
    from reconciler.render import summary_line

    if commit:
        _commit_status(config_dir, res, status_branch)
    r = res.report
    if not r.stopped:
        typer.echo(f"Applied plan {res.plan.id}: {summary_line(res.plan)}")
    typer.echo(f"{r.counts}; status written to {res.status_dir}")
    for iid, why in r.skipped_deletes.items():
        typer.echo(_said(f"kept {iid}: {why}"))
    for n in [*res.plan.notes, *r.notes]:
        typer.echo(_said(f"note: {n}"))
    if r.stopped:
        _say_stopped(res, stop)
        raise typer.Exit(stop.exit_code)


def _say_stopped(res, stop: StopOnInterrupt) -> None:
    r = res.report
    typer.echo(_said(f"Stopped plan {res.plan.id} by {stop.how}: {r.counts}, {len(r.not_started)} action(s) not "
                     f"started ({', '.join(r.not_started[:5])}{' ...' if len(r.not_started) > 5 else ''}); status written, lock "
                     "released. Run `reconcile apply` again to finish."), err=True)


def _commit_status(config_dir: Path, res, branch: Optional[str]) -> None:
    from reconciler.gitops import commit_status
    from reconciler.render import summary_line

    r = res.report
    head = f"fleetops: apply {res.plan.id}: {r.counts}" + ("" if r.ok else f", {len(r.failures)} failed")
    body = [summary_line(res.plan), ""] + [f"failed: {f}" for f in r.failures]
    try:
        sha = commit_status(config_dir, "\n".join([head, "", *body]).rstrip() + "\n", branch)
    except ReconcileError as e:
        _fail(e)
    typer.echo(f"status committed: {sha[:12]}" if sha else "status unchanged: nothing to commit")


@app.command()
def diff(
    ctx: typer.Context,
    config_dir: Path = ConfigDir,
    base: str = typer.Option(..., "--base", help="The git ref to compare with (e.g. origin/main)."),
    fmt: str = typer.Option("markdown", "--format", help="markdown | json"),
    detailed_exitcode: bool = typer.Option(False, "--detailed-exitcode", help="Exit 2 when the change alters the fleet."),
    provider: str = ProviderOpt,
    time_limit: float = TimeLimitOpt,
    gap: float = GapOpt,
    provider_option: Optional[list[str]] = OptionOpt,
    state: Optional[str] = StateOpt,
) -> None:
    """Plan the change a PR makes: this config vs the one at --base, against the same fleet."""
    from reconciler import api
    from reconciler.render import render_diff_json, render_diff_markdown

    _output_format(ctx, fmt, ("markdown", "json"))
    try:
        d = api.diff(config_dir, base, provider=provider, time_limit=time_limit, options=_options(provider_option), state=state, gap=gap)
    except ReconcileError as e:
        _fail(e, config_dir, state, fmt)
    typer.echo(render_diff_json(d) if fmt == "json" else render_diff_markdown(d), nl=False)
    if detailed_exitcode and d.has_changes:
        raise typer.Exit(2)


@app.command()
def explain(
    ctx: typer.Context,
    config_dir: Path = ConfigDir,
    job: str = typer.Argument(..., help="The Job to explain."),
    fmt: str = typer.Option("human", "--format", help="human | json"),
    provider: str = ProviderOpt,
    time_limit: float = TimeLimitOpt,
    gap: float = GapOpt,
    provider_option: Optional[list[str]] = OptionOpt,
    state: Optional[str] = StateOpt,
) -> None:
    """Why JOB runs where it does, or why it is pending and which single change would place it."""
    from reconciler import api
    from reconciler.render import render_explanation, render_explanation_json

    _output_format(ctx, fmt, ("human", "json"))
    try:
        e = api.explain(config_dir, job, provider=provider, time_limit=time_limit, options=_options(provider_option), state=state, gap=gap)
    except ReconcileError as err:
        _fail(err, config_dir, state, fmt)
    typer.echo(render_explanation_json(e) if fmt == "json" else render_explanation(e), nl=False)


@app.command()
def status(ctx: typer.Context, config_dir: Path = ConfigDir, fmt: str = typer.Option("human", "--format", help="human | json"),
           state: Optional[str] = StateOpt) -> None:
    """Show the fleet, jobs, conditions and cost per tenant from the status files, with the phases
    the node agents report now for jobs that run something."""
    from reconciler import api

    _output_format(ctx, fmt, ("human", "json"))
    from reconciler.render import render_status

    try:
        st = api.read_status(config_dir, live=True, state=state)
    except ReconcileError as e:
        _fail(e, config_dir, state, fmt)
    if fmt == "json":
        typer.echo(json_printed(json.dumps(st, indent=2, default=str)))
        return
    if st["fleet"] is None:
        typer.echo("No status yet: run `reconcile apply` first.")
        raise typer.Exit(1)
    typer.echo(render_status(st), nl=False)


def _fleet_view(config_dir: Path, provider: str, time_limit: float, gap: float, provider_option, state):
    """The fleet now, with the plan's reasons for what does not run (observes and plans; changes nothing)."""
    from reconciler import api

    try:
        res = api.plan(config_dir, provider=provider, time_limit=time_limit, options=_options(provider_option), state=state, gap=gap)
    except ReconcileError as e:
        _fail(e, config_dir, state)
    return api.fleet_view(res)


@app.command()
def metrics(
    config_dir: Path = ConfigDir,
    out: Optional[Path] = typer.Option(None, "--out", help="Write here, atomically (node_exporter's textfile collector directory)."),
    openmetrics: bool = typer.Option(False, "--openmetrics", help="OpenMetrics text instead of the Prometheus text format."),
    provider: str = ProviderOpt,
    time_limit: float = TimeLimitOpt,
    gap: float = GapOpt,
    provider_option: Optional[list[str]] = OptionOpt,
    state: Optional[str] = StateOpt,
) -> None:
    """The fleet's metrics (GPUs, cost, jobs, pending reasons, queue wait, solver) for Prometheus."""
    from reconciler.metrics import exposition, write_textfile

    if out is not None and out.is_dir():  # (before the plan, which takes a while)
        _fail(ReconcileError(f"{out} is a directory: --out names the file to write (e.g. {out / 'fleetops.prom'})"))
    view = _fleet_view(config_dir, provider, time_limit, gap, provider_option, state)
    if out is None:
        typer.echo(exposition(view, openmetrics), nl=False)
    else:
        try:
            write_textfile(out, view)
        except ReconcileError as e:
            _fail(e)
        typer.echo(f"metrics written to {out}")


@app.command()
def report(
    config_dir: Path = ConfigDir,
    out: Path = typer.Option(Path("report.html"), "--out", help="The HTML file to write."),
    provider: str = ProviderOpt,
    time_limit: float = TimeLimitOpt,
    gap: float = GapOpt,
    provider_option: Optional[list[str]] = OptionOpt,
    state: Optional[str] = StateOpt,
) -> None:
    """One self-contained HTML page of plots: GPUs per pool, $/h per tenant, instances, pending reasons, GPU map."""
    try:
        from reconciler.report import render_report
    except ImportError as e:
        typer.echo(f"Error: reconcile report needs plotly: pip install 'fleetops-reconciler[report]' ({e})", err=True)
        raise typer.Exit(1)
    from reconciler.state import utcnow

    _writable(out, "--out")
    _write(out, render_report(_fleet_view(config_dir, provider, time_limit, gap, provider_option, state), utcnow()))
    typer.echo(f"report written to {out}")


catalog_app = typer.Typer(cls=_Group, no_args_is_help=True, help="The price catalog plans are made with.")
app.add_typer(catalog_app, name="catalog")


@catalog_app.command("update")
def catalog_update(
    config_dir: Path = typer.Option(Path("."), "--dir", help="The config directory: its catalog.json is written (and pinned)."),
    cloud: list[str] = typer.Option(["aws", "gcp", "azure"], "--cloud", help="Refresh this cloud's prices (repeatable)."),
    region: list[str] = typer.Option([], "--region", help="cloud/region to read (repeatable; default: the catalog's regions)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write here instead of DIR/catalog.json."),
) -> None:
    """Refresh prices from the clouds' public price sources into a dated catalog (DIR/catalog.json, which plans
    in DIR then use). Starts from the catalog DIR pins, else the shipped one; every price names its source and date."""
    import json

    from providers.catalog import CATALOG_FILE, catalog_for, load_catalog, pin_catalog, read_catalog_file, shipped_catalog_text
    from providers.pricesources import update_catalog
    from reconciler.atomicfile import write_atomic

    target = out or config_dir / CATALOG_FILE
    try:
        bad = [c for c in cloud if c not in ("aws", "gcp", "azure")]
        if bad:
            raise ReconcileError(f"--cloud {bad[0]!r}: use aws, gcp or azure")
        regions: dict[str, list[str]] = {}
        for r in region:
            c, sep, name = r.partition("/")
            if not sep or c not in cloud or not name:
                raise ReconcileError(f"--region {r!r}: use cloud/region with a cloud given by --cloud (e.g. aws/us-east-1)")
            regions.setdefault(c, []).append(name)
        pinned = catalog_for(config_dir)
        pin_catalog(pinned)
        catalog = load_catalog()
        raw = json.loads(read_catalog_file(pinned) if pinned else shipped_catalog_text())
        new, lines = update_catalog(raw, catalog, cloud, regions)
        write_atomic(target, (json.dumps(new, indent=1) + "\n").encode())
    except ReconcileError as e:
        _fail(e)
    except OSError as e:
        _fail(ReconcileError(f"cannot write {target}: {e.strerror}"))
    for line in lines:
        typer.echo(_said(line))  # (a price source's words)
    typer.echo(f"catalog written to {target} (dated {new['date']})")


@app.command()
def unlock(lock_id: str, config_dir: Path = typer.Option(Path("."), "--dir", help="The config directory."), state: Optional[str] = StateOpt) -> None:
    """Break a stale apply lock held by LOCK_ID."""
    from reconciler.backend import backend_for

    try:
        backend_for(config_dir, state).unlock(lock_id)
    except ReconcileError as e:
        _fail(e)
    typer.echo(f"lock {lock_id} broken")


@app.command("providers")
def list_providers() -> None:
    """List the providers the CLI can find (built-in and entry points)."""
    from providers.registry import available

    for name, target in sorted(available().items()):
        typer.echo(f"{name}\t{target}")


SimDir = typer.Argument(None, help="The config directory (default: --dir, else .).", show_default=False)
SimDirOpt = typer.Option(None, "--dir", help="The config directory (the same as DIR).")


def _sim(config_dir: Optional[Path], dir_opt: Optional[Path] = None):
    """The simulated cloud of DIR; `--dir DIR` is kept for scripts written before sim took DIR as the others do."""
    from providers.sim import SimCloud
    from reconciler.state import state_dir

    if config_dir is not None and dir_opt is not None and config_dir != dir_opt:
        typer.echo(f"Error: DIR {config_dir} and --dir {dir_opt} differ; give one", err=True)
        raise typer.Exit(1)
    return SimCloud(state_dir(config_dir or dir_opt or Path(".")))


@sim_app.command("interrupt")
def sim_interrupt(instance_id: str, config_dir: Optional[Path] = SimDir, dir_opt: Optional[Path] = SimDirOpt,
                  reason: str = typer.Option("spot-interruption", "--reason", help="The reason recorded."),
                  notice_seconds: Optional[float] = typer.Option(None, "--notice-seconds", callback=_grace_ok, help="How long its agent gets to checkpoint (default 120).")) -> None:
    """Reclaim an instance, as a spot interruption or a lost host would (its agent gets a notice first)."""
    sim = _sim(config_dir, dir_opt)
    try:
        inst = sim.interrupt(instance_id, reason, notice_seconds)
    except ReconcileError as e:
        _fail(e)
    if inst.get("terminated_during_notice"):
        typer.echo(_said(f"{instance_id} was terminated during its notice ({inst.get('terminated_reason')}): nothing left to reclaim"))
        return
    if inst.get("checkpointed") is False and inst.get("notice") == "agent died":
        typer.echo(f"warning: {instance_id}'s agent died during the notice before it reported its replicas checkpointed and "
                   "stopped: they were killed with the instance, maybe mid-checkpoint", err=True)
    elif inst.get("checkpointed") is False:
        typer.echo(f"warning: {instance_id}'s agent had not reported its replicas checkpointed and stopped when the notice "
                   "ran out: they were killed with the instance, maybe mid-checkpoint", err=True)
    if inst.get("not_ended"):
        typer.echo(_said(f"warning: not every process of {instance_id} could be ended with it: {'; '.join(inst['not_ended'])}"), err=True)
    _mark_reclaimed(sim, instance_id, reason, config_dir or dir_opt)
    typer.echo(f"interrupted {instance_id}")


def _mark_reclaimed(sim, instance_id: str, reason: str, config_dir: Optional[Path]) -> None:
    """The sim is the cloud: it knows the instance is gone, so its agent's last report (fresh for up to 60 s, listing
    replicas running) is marked lost on the bus the agent used, and status shows them lost at once, not Running."""
    from reconciler.backend import backend_for
    from reconciler.runtime.publish import mark_lost

    target = sim.agent_target(instance_id)
    where, url = target if target is not None else (config_dir or Path("."), None)
    try:
        mark_lost(backend_for(Path(where), url), instance_id, f"{reason}: the sim reclaimed it")
    except ReconcileError as e:
        typer.echo(_said(f"warning: could not mark {instance_id}'s agent report lost ({e}); status shows its replicas "
                         "unreachable once its heartbeat is stale"), err=True)


@sim_app.command("stop-agents")
def sim_stop_agents(config_dir: Optional[Path] = SimDir, dir_opt: Optional[Path] = SimDirOpt) -> None:
    """Kill every node agent of the simulated fleet and the replicas they started."""
    try:
        _sim(config_dir, dir_opt).stop_all_agents()
    except ReconcileError as e:
        _fail(e)
    typer.echo("agents stopped")


def _sim_zones(config_dir: Path) -> set[str]:
    """The zones DIR's Topology names (the sim launches where its pools say), beside the catalog's, which DIR may pin."""
    from providers.catalog import catalog_for, pin_catalog
    from reconciler.load import load

    try:
        pin_catalog(catalog_for(config_dir))
        topology = load(config_dir).topology
    except ReconcileError:  # a config that does not load: the catalog's zones alone
        return set()
    return {z for c in topology.spec.clouds.values() for r in c.regions.values() for z in r.zones}


@sim_app.command("exhaust")
def sim_exhaust(zone: str, config_dir: Optional[Path] = SimDir, dir_opt: Optional[Path] = SimDirOpt, instance_type: Optional[str] = typer.Option(None, "--type"),
                market: Optional[str] = typer.Option(None, "--market"), restore: bool = typer.Option(False, "--restore")) -> None:
    """Mark a zone (optionally one type/market) out of capacity, or --restore it."""
    try:
        _sim(config_dir, dir_opt).exhaust(zone, instance_type, market, restore=restore, zones=_sim_zones(config_dir or dir_opt or Path(".")))
    except ReconcileError as e:
        _fail(e)
    typer.echo(f"{'restored' if restore else 'exhausted'} {zone} {instance_type or '*'} {market or '*'}")


@sim_app.command("quota")
def sim_quota(name: str, config_dir: Optional[Path] = SimDir, dir_opt: Optional[Path] = SimDirOpt,
              cloud: str = typer.Option(..., "--cloud"), region: str = typer.Option("", "--region", help="Empty: every region of the cloud."),
              unit: str = typer.Option("vCPUs", "--unit", help="vCPUs, GPUs or instances."),
              limit: float = typer.Option(0.0, "--limit"), market: Optional[str] = typer.Option(None, "--market"),
              gpu_type: Optional[str] = typer.Option(None, "--gpu-type"),
              instance_type: Optional[list[str]] = typer.Option(None, "--type", help="Only these types count (repeatable)."),
              remove: bool = typer.Option(False, "--remove")) -> None:
    """Set (or --remove) an account quota in the simulated cloud: plans stay within it, launches past it fail."""
    try:
        _sim(config_dir, dir_opt).set_quota(name, cloud, region, unit, limit, market, gpu_type, instance_type, remove=remove)
    except ReconcileError as e:
        _fail(e)
    typer.echo(f"quota {name} ({cloud} {region or 'all regions'}): " + ("removed" if remove else f"{limit:g} {unit}"))


@sim_app.command("fault")
def sim_fault(config_dir: Optional[Path] = SimDir, dir_opt: Optional[Path] = SimDirOpt,
              throttle: Optional[int] = typer.Option(None, "--throttle", help="Throttle the next N calls (retried with backoff)."),
              fail_after: Optional[int] = typer.Option(None, "--fail-after", help="Time out every call after the next N; -1 clears."),
              reject_every: Optional[int] = typer.Option(None, "--reject-every", help="Refuse every N-th launch (a partial batch failure); 0 clears."),
              latency_ms: Optional[int] = typer.Option(None, "--latency-ms", help="Delay every call.")) -> None:
    """Inject faults into the simulated cloud; they persist in its state file until changed."""
    faults = {k: v for k, v in dict(throttle=throttle, reject_every=reject_every, latency_ms=latency_ms).items() if v is not None}
    if fail_after is not None:
        faults["fail_after"] = None if fail_after < 0 else fail_after
    try:
        _sim(config_dir, dir_opt).set_fault(**faults)
    except ReconcileError as e:
        _fail(e)
    typer.echo("faults: " + (", ".join(f"{k}={v}" for k, v in faults.items()) or "unchanged"))


@sim_app.command("ls")
def sim_ls(config_dir: Optional[Path] = SimDir, dir_opt: Optional[Path] = SimDirOpt, all_: bool = typer.Option(False, "--all", help="Include terminated.")) -> None:
    """List the simulated cloud's instances, with the job replicas each hosts (its placement tags)."""
    from providers.placements import PlacementTagError, read_placements

    for i in _sim(config_dir, dir_opt).instances():
        if all_ or i["state"] != "terminated":
            try:
                rec = read_placements(i["tags"])
            except PlacementTagError:
                rec = None
            hosted = "-" if rec is None else ",".join(f"{p.job}/{p.replica}" for p in rec.placements) if rec.complete else "(too many)"
            fields = (i["id"], i["state"], f"{i['cloud']}/{i['zone']}", i["instance_type"], i["market"],
                      i["tags"].get("fleetops.io/pool", "-"), hosted or "-")
            typer.echo("\t".join(map(printable, fields)))  # (the sim's state is a file: an id in it is any text)


@app.command()
def agent(
    instance: Optional[str] = typer.Argument(None, help="This instance's id (or --instance-from-metadata)."),
    config_dir: Path = typer.Option(Path("."), "--dir", help="The config directory (local bus: its .reconcile/)."),
    state: Optional[str] = StateOpt,
    runtime: str = typer.Option("docker", "--runtime", help="process | docker"),
    notice: str = typer.Option("none", "--notice", help="Interruption notices from: none | sim | aws | gcp | azure."),
    from_metadata: Optional[str] = typer.Option(None, "--instance-from-metadata", help="Read the instance id from this cloud's metadata: aws | gcp | azure."),
    address: Optional[str] = typer.Option(None, "--address", help="The address gang peers reach this instance on (default: the default route's)."),
    workdir: Path = typer.Option(Path("/var/lib/fleetops"), "--workdir", help="Logs and the agent's own files."),
    cwd: Optional[Path] = typer.Option(None, "--cwd", help="Working directory of `process` commands."),
    checkpoint_root: Optional[Path] = typer.Option(None, "--checkpoint-root", help="Host directory under which each job's checkpoint dir lives."),
    poll: Optional[float] = typer.Option(None, "--poll", callback=_seconds_ok, help="Seconds between reads of the assignment (FLEETOPS_AGENT_POLL_SECONDS, 2)."),
    heartbeat: Optional[float] = typer.Option(None, "--heartbeat", callback=_seconds_ok, help="Seconds between heartbeats (FLEETOPS_AGENT_HEARTBEAT_SECONDS, 5)."),
) -> None:
    """The node agent: run what the bus assigns to this instance, report phases and heartbeats."""
    import signal as signals

    from reconciler.backend import backend_for
    from reconciler.runtime.agent import Agent, hold_workdir
    from reconciler.runtime.bus import Bus, stale_seconds
    from reconciler.runtime.metadata import instance_id_from_metadata
    from reconciler.runtime.notices import notice_source
    from reconciler.runtime.runtimes import RUNTIMES

    if runtime not in RUNTIMES:
        raise typer.BadParameter(f"--runtime must be one of {', '.join(RUNTIMES)}")
    if notice not in ("none", "sim", "aws", "gcp", "azure"):
        raise typer.BadParameter("--notice must be none, sim, aws, gcp or azure")
    try:
        if instance is None:
            if from_metadata is None:
                raise typer.BadParameter("give INSTANCE or --instance-from-metadata")
            instance = instance_id_from_metadata(from_metadata)
        bus = Bus(backend_for(config_dir, state))
    except ReconcileError as e:
        _fail(e)
    stop = {"now": False}

    def on_term(signum, frame):
        stop["now"] = True

    signals.signal(signals.SIGTERM, on_term)
    signals.signal(signals.SIGINT, on_term)
    try:  # (its FLEETOPS_AGENT_* settings are read here: one out of range was an "unexpected" bug report)
        ag = Agent(instance, bus, RUNTIMES[runtime](), workdir, notice=notice_source(notice, instance, workdir / "notice.json"),
                   address=address, checkpoint_root=checkpoint_root, poll=poll, heartbeat=heartbeat, command_cwd=cwd)
        stale_seconds()  # read while running (gang peers): checked now
        held = hold_workdir(workdir)  # noqa: F841 (held open while the agent runs: one agent an instance)
    except ReconcileError as e:
        _fail(e)
    # A sim instance lives in its agent directory under the sim's store: once that is deleted (the
    # instance or the whole sim store removed) the agent stands for nothing and ends with it. Without
    # this, agents of a deleted quickstart copy ran forever (hundreds after a day of test runs).
    sim_home = workdir.resolve() if notice == "sim" else None
    ag.run(lambda: stop["now"], instance_gone=lambda: sim_home is not None and not sim_home.is_dir())


@app.command()
def controller(
    config_dir: Path = ConfigDir,
    provider: str = ProviderOpt,
    state: Optional[str] = StateOpt,
    provider_option: Optional[list[str]] = OptionOpt,
    time_limit: float = typer.Option(10.0, "--time-limit", callback=_time_limit_ok, help=TIME_LIMIT_HELP),  # per plan
    poll: float = typer.Option(2.0, "--poll", callback=_seconds_ok, help="Seconds between looks at the config and the bus."),
    resync: float = typer.Option(60.0, "--resync", callback=_seconds_ok, help="Plan at least this often (drift: vanished instances)."),
    pull: bool = typer.Option(False, "--pull", help="git pull --ff-only the config dir before each look; a force-push taking pulled commits back is followed."),
    metrics_port: Optional[int] = typer.Option(None, "--metrics-port", callback=_port_ok, help="Serve Prometheus /metrics on this port (0: a free one) "
                                               "from the last plan or apply."),
    metrics_addr: str = typer.Option("127.0.0.1", "--metrics-addr", help="The address --metrics-port listens on."),
) -> None:
    """Plan and apply whenever the desired state changes, a job finishes or fails, or an instance is
    interrupted or lost; hold the apply lock only while applying; exit cleanly on SIGTERM. With --metrics-port,
    serve the fleet's metrics (as `reconcile metrics` prints them) for Prometheus to scrape."""
    import signal as signals

    from reconciler.runtime.controller import Controller
    from reconciler.state import utcnow

    stop = {"now": False}

    def on_term(signum, frame):
        stop["now"] = True

    signals.signal(signals.SIGTERM, on_term)
    signals.signal(signals.SIGINT, on_term)
    ctl = Controller(config_dir, provider=provider, state=state, options=_options(provider_option), time_limit=time_limit,
                     poll=poll, resync=resync, pull=pull, log=lambda m: typer.echo(_said(f"{utcnow().isoformat()} controller: {m}")))
    server = None
    if metrics_port is not None:
        from reconciler.metrics import serve

        try:
            server = serve(metrics_port, lambda: ctl.view, metrics_addr)
        except OSError as e:
            typer.echo(f"Error: cannot serve /metrics on {metrics_addr}:{metrics_port}: {e.strerror or e}", err=True)
            raise typer.Exit(1)
        ctl.log(f"serving /metrics on http://{metrics_addr}:{server.server_port}/metrics")
    try:
        ctl.run(lambda: stop["now"])
    finally:
        if server is not None:
            server.shutdown()


@app.command()
def logs(
    config_dir: Path = ConfigDir,
    job: str = typer.Argument(..., help="The Job whose output to show."),
    replica: int = typer.Option(0, "--replica", min=0, help="Which replica."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing until the replica ends."),
    state: Optional[str] = StateOpt,
) -> None:
    """A replica's output: the whole log where it is on this machine (the sim), else the tail its agent reported."""
    import time

    from reconciler.backend import backend_for
    from reconciler.runtime.bus import Bus, poll_seconds

    try:
        bus = Bus(backend_for(config_dir, state))
        rec = bus.run(job, replica)
        wait = min(1.0, poll_seconds()) if follow else 1.0  # (FLEETOPS_AGENT_POLL_SECONDS out of range: an error here)
    except ReconcileError as e:
        _fail(e)
    if rec is None:
        try:
            why = _no_run(config_dir, job, replica)
        except ReconcileError:  # (the config does not load: the run records are all there is to ask)
            why = ReconcileError(f"no run of {job}/{replica} has been reported yet (the config in {config_dir} could "
                                 "not be read to check that it has this job)")
        _fail(why)
    path = _sim_log(config_dir, job, replica, rec)
    earlier = _earlier_sim_logs(config_dir, job, replica, path)
    for instance, log in earlier:
        typer.echo(_said(f"--- {job}/{replica} on {instance} (placed there before)"), err=True)
        sys.stdout.write(log.read_bytes().decode(errors="replace"))
        sys.stdout.flush()
    if earlier:
        typer.echo(_said(f"--- {job}/{replica} on {rec.get('instance')} (now)"), err=True)
    offset = 0
    shown_tail: list[str] = []
    noted = None  # the stop last said (--follow)
    scan: dict = {}  # the last look through every assignment (--follow, while the replica is Stopped)
    while True:
        if path is not None and path.is_file():
            with open(path, "rb") as f:
                f.seek(offset)
                chunk = f.read()
                offset += len(chunk)
            if chunk:
                sys.stdout.write(chunk.decode(errors="replace"))
                sys.stdout.flush()
        else:
            tail = rec.get("log_tail", [])
            new = tail[len(shown_tail):] if tail[:len(shown_tail)] == shown_tail else tail
            for line in new:
                typer.echo(line)
            shown_tail = tail
        if not follow or rec.get("terminal"):
            break
        if rec.get("phase") == "Stopped":
            # Stopped is no end while an assignment still names it (moved, restarted by an edit, or waiting for the
            # apply after a reclaim): --follow went on only to the first stop, so it ended at every spot interruption.
            if not _still_assigned(bus, job, replica, rec.get("instance"), scan):
                break
            if (stop := (rec.get("instance"), rec.get("spec_hash"), rec.get("epoch"), rec.get("attempt"))) != noted:
                noted = stop
                typer.echo(_said(f"--- {job}/{replica}: {rec.get('phase')} on {rec.get('instance')} ({rec.get('reason')}: "
                                 f"{rec.get('message')}); the plan still places it: following it"), err=True)
        time.sleep(wait)
        try:
            rec = bus.run(job, replica) or rec
        except ReconcileError:
            pass
        if (moved := _sim_log(config_dir, job, replica, rec)) is not None and moved != path:
            path, offset = moved, 0  # placed again elsewhere: the new attempt's log
            typer.echo(_said(f"--- {job}/{replica} on {rec.get('instance')} (now)"), err=True)
    if rec.get("terminal") or rec.get("phase") == "Stopped":
        typer.echo(_said(f"--- {job}/{replica}: {rec.get('phase')} ({rec.get('reason')}: {rec.get('message')})"), err=True)


def _no_run(config_dir: Path, job: str, replica: int) -> ReconcileError:
    """Why `logs` has no run record to show: the config has no such job or replica, the job runs nothing (it reserves
    capacity), or its agents have not reported it yet. (A misspelt job read "no run ... reported yet", as if to wait.)"""
    from reconciler.api import no_such_job
    from reconciler.load import load

    jobs = load(config_dir).jobs
    if job not in jobs:
        return no_such_job(job, config_dir, jobs)
    spec = jobs[job].spec
    if replica >= spec.replicas:
        last = f" to {spec.replicas - 1}" if spec.replicas > 1 else ""
        return ReconcileError(f"job {job} has {spec.replicas} replica(s), numbered 0{last}: there is no --replica {replica}")
    if spec.run is None:
        return ReconcileError(f"job {job} has no `run`: it reserves capacity and runs nothing, so there is no output")
    return ReconcileError(f"no run of {job}/{replica} has been reported yet (its agent reports it once an apply places it: "
                          "see `reconcile status`)")


def _still_assigned(bus, job: str, replica: int, instance: str | None, scan: dict) -> bool:
    """Whether some instance's published assignment names the replica: the one it stopped on first (one read), else
    every one, at most every 10 s (a fleet's worth of reads a second, on S3, while a moved copy's instance boots). A bus
    that cannot be read says yes: a blip does not end --follow."""
    import time

    def names(doc) -> bool:
        return any(isinstance(e, dict) and e.get("job") == job and e.get("replica") == replica for e in (doc or {}).get("replicas", []))

    try:
        if instance and names(bus.assignment(instance)):
            return True
        if time.monotonic() - scan.get("at", float("-inf")) >= 10:
            scan.update(at=time.monotonic(), found=any(names(d) for d in bus.assignments().values()))
        return scan["found"]
    except ReconcileError:
        return True


def _sim_log(config_dir: Path, job: str, replica: int, rec: dict) -> Path | None:
    """The replica's log file, where the run record names the one the sim's agent of its instance writes, else None (its
    reported tail is shown). A run record is an agent's, and on a shared bus any instance's agent may write runs/*: a
    log_path opened as it was written had `logs` print whatever local file it named (credentials, the cache seal's key)."""
    from reconciler.runtime.agent import replica_log
    from reconciler.state import state_dir

    instance, named = rec.get("instance"), rec.get("log_path")
    if not instance or not named or Path(instance).name != instance or instance in (".", ".."):
        return None
    own = replica_log((state_dir(config_dir) / "sim" / "agents" / instance).resolve(), job, replica)
    return own if Path(named) == own else None


def _earlier_sim_logs(config_dir: Path, job: str, replica: int, current: Path | None) -> list[tuple[str, Path]]:
    """The replica's logs on the sim's other instances, the oldest first: where it ran before a move (a spot reclaim,
    a consolidation), whose output (its checkpoint, say) is part of its whole log; `logs` printed only the last one.
    (Each is the sim's own agent's file, as `_sim_log`; none where the replica has no log on this machine.)"""
    import glob

    if current is None:
        return []
    root = current.parent.parent.parent  # (.reconcile/sim/agents)
    out = []
    for p in root.glob(f"*/logs/{glob.escape(job)}-{replica}.log"):
        if p != current and p.is_file() and not p.is_symlink():
            out.append((p.stat().st_mtime, p.parent.parent.name, p))
    return [(instance, p) for _, instance, p in sorted(out)]


class _ReaderMayLeave:
    """stdout whose reader may leave before the end (`reconcile plan | head`, a CI log viewer closed): the first write
    that finds the pipe closed points fd 1 at /dev/null, and the command goes on to its end and its own exit code.
    Before, Python's BrokenPipeError reached the last resort ("unexpected ... a bug in reconcile") and exited 1, and an
    apply would have stopped between two of its actions because nobody read its log."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._reader_left()
            return len(text)

    def writelines(self, lines) -> None:  # (delegated as it is, it would write past the guard above)
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._reader_left()
            self._stream.flush()  # what was buffered goes to /dev/null now

    def _reader_left(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self._stream.fileno())
        finally:
            os.close(devnull)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def main() -> None:
    _EXIT.update(now=False, main=True, gc=False)
    if sys.stdout is not None and not isinstance(sys.stdout, _ReaderMayLeave):
        sys.stdout = _ReaderMayLeave(sys.stdout)
    try:
        app()
    except SystemExit as e:
        code = 0 if e.code is None else e.code
        if not (_EXIT["now"] and isinstance(code, int)):
            raise
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError):  # a closed pipe: let the interpreter report it as it would
            raise e from None
        os._exit(code)
    finally:
        if _EXIT["gc"]:  # (not reached when the process ended above)
            import gc

            gc.enable()
        _EXIT.update(main=False, gc=False)


if __name__ == "__main__":
    main()
