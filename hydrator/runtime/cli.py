"""The ``hydrator`` command: ``run``, ``once``, ``check-config``, ``show``, ``drain``,
``undrain``, ``expr``.

Exit codes: 0 success; 1 a cycle failed or there is no state to show; 2 the process could not
start: bad configuration or arguments, a state file that is locked by another writer, damaged or
not writable (one line on stderr naming the key or the file, never a traceback).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from hydrator import __version__
from hydrator.config import (
    ClassAdConfig,
    CollectorConfig,
    Config,
    JobsConfig,
    check_files,
    default_config_path,
    load_config,
)
from hydrator.domain import DatasetId, Replica, Site, SiteView, State, StorageStatus, Transfer
from hydrator.errors import ConfigError, HydratorError, StateError
from hydrator.logs import setup_logging
from hydrator.names import InvalidNameError
from hydrator.runtime.outcome import cycle_fields

if TYPE_CHECKING:
    from hydrator.core.storage import Drain
    from hydrator.runtime.outcome import CycleReport

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
STRAGGLER_WAIT_S = 2.0  # for the threads a command started to end, before exiting without them


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hydrator", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"hydrator {__version__}")
    p.add_argument("--log-format", choices=["text", "json"], help="overrides [daemon] log_format")
    p.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = p.add_subparsers(dest="command", required=True)

    def with_config(name: str, help_: str) -> argparse.ArgumentParser:
        cmd = sub.add_parser(name, help=help_)
        cmd.add_argument(
            "--config",
            type=Path,
            default=None,
            help="TOML file (default: $HYDRATOR_CONFIG, else /etc/hydrator/hydrator.toml)",
        )
        return cmd

    run = with_config("run", "run the daemon until SIGTERM/SIGINT; SIGHUP reloads the config")
    once = with_config("once", "run one cycle and print what changed")
    once.add_argument(
        "--dry-run", action="store_true", help="neither save nor publish; reads the state only"
    )
    for writer in (run, once):
        writer.add_argument(
            "--reset-state",
            action="store_true",
            help="move the state file aside (to <state>.reset-<time>) and start empty; "
            "the operator's drains (hydrator drain) are kept",
        )
    once.add_argument("--json", action="store_true", help="print a machine-readable report")
    with_config("check-config", "validate the configuration; exit 2 naming the bad key")
    show = with_config("show", "print the saved state as the published site ClassAds")
    show.add_argument("site", nargs="?", help="only this site")
    _drain_parsers(with_config)
    expr = sub.add_parser("expr", help="requirements and rank for a job needing DATASETs")
    expr.add_argument("datasets", nargs="+", metavar="DATASET", help="scope:name")
    expr.add_argument(
        "--partial-ok", action="store_true", help="also match sites holding part of a dataset"
    )
    expr.add_argument(
        "--generic",
        action="store_true",
        help="requirements driven by the job's RequiredDatasets attribute",
    )
    expr.add_argument(
        "--toil",
        action="store_true",
        help="print a TOIL_HTCONDOR_PARAMS line for Toil's HTCondor batch system",
    )
    expr.add_argument(
        "--fallback-after",
        type=int,
        metavar="SECONDS",
        help="prefer the data's sites, but run anywhere once queued longer than SECONDS",
    )
    expr.add_argument(
        "--rank-only",
        action="store_true",
        help="no requirements: run anywhere, preferring the data's sites",
    )
    defaults = ClassAdConfig()  # the names an ad is written with unless [classad] says otherwise
    expr.add_argument("--available-attribute", default=defaults.available_attribute)
    expr.add_argument(
        "--partial-attribute", help=f"default {defaults.partial_attribute}; not with --near"
    )
    expr.add_argument(
        "--near",
        action="store_true",
        help="run where the data is or at a near site, within the remote-read budget"
        " (needs [jobs] annotate and [distances]; docs/near.md)",
    )
    return p


def _drain_parsers(with_config: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """``drain`` and ``undrain`` (:mod:`hydrator.runtime.drain_command`)."""
    slot_site = CollectorConfig().slot_site_attribute  # the slot attribute naming the site
    drain = with_config("drain", "stop advertising a site or one storage element of it")
    drain.add_argument("site", help=f"the site ({slot_site})")
    drain.add_argument("--storage", help="only this storage element (RSE, storage area name)")
    drain.add_argument("--until", help="end by itself: 90m, 12h, 3d or 2026-11-27T08:00Z")
    drain.add_argument("--reason", required=True, help="why (goes into the site's ad)")
    undrain = with_config("undrain", "advertise a drained site or storage element again")
    undrain.add_argument("site", help=f"the site ({slot_site})")
    undrain.add_argument("--storage", help="the storage element drained (as given to drain)")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _dispatch(args)
    except ConfigError as exc:
        print(f"hydrator: configuration error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except StateError as exc:  # raised at start-up only: a cycle reports its own failures
        print(f"hydrator: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except HydratorError as exc:
        print(f"hydrator: {exc}", file=sys.stderr)
        return EXIT_FAILED


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "expr":
        return _expr(args)
    config = load_config(args.config or default_config_path())
    setup_logging(
        args.log_format or config.daemon.log_format, args.log_level or config.daemon.log_level
    )
    if args.command == "check-config":
        check_files(config, inventories=True)  # also: every static inventory exists and fits
        print(f"ok: {len(config.sources)} source(s), state at {config.daemon.state_path}")
        return EXIT_OK
    if args.command == "show":
        return _show(config, args.site)
    if args.command in ("drain", "undrain"):
        return _drain(config, args)
    if args.command == "run":
        return _run(config, args.config or default_config_path(), args.reset_state)
    return _once(config, args.dry_run, args.json, args.reset_state)


def _run(config: Config, path: Path, reset: bool) -> int:
    """The daemon; SIGHUP reads ``path`` again (validated first, see
    :class:`~hydrator.runtime.scheduler.Daemon`)."""
    from hydrator.runtime.scheduler import catch_reloads, run_daemon  # noqa: PLC0415  (apscheduler)
    from hydrator.runtime.wiring import build_assembly  # noqa: PLC0415

    reloads = catch_reloads()  # before the (long) start: a reload asked meanwhile is kept
    before = set(threading.enumerate())
    code = run_daemon(
        config,
        build_assembly(config, reset=reset),
        load=lambda: load_config(path),
        build=build_assembly,
        reloads=reloads,
    )
    return _without_stragglers(code, before)


def _without_stragglers(code: int, before: set[threading.Thread]) -> int:
    """``code``, once the threads this command started have ended, or at most
    ``STRAGGLER_WAIT_S`` later: then the process exits at once with ``code``.

    A fetch abandoned at its deadline may sit in a read that never ends (a server sending a
    byte a second), in a thread Python cannot stop; the interpreter would wait for it at exit
    (rucio-clients' and concurrent.futures' worker threads are not daemon threads), so SIGTERM
    or the end of ``once`` would not end the process. Everything worth
    keeping is done by then: the state is saved and closed, the output printed.
    """
    until = time.monotonic() + STRAGGLER_WAIT_S
    for thread in set(threading.enumerate()) - before:
        if not thread.daemon:
            thread.join(max(0.0, until - time.monotonic()))
    left = sorted(t.name for t in set(threading.enumerate()) - before if not t.daemon)
    if not left:
        return code
    logging.getLogger(__name__).warning(
        "exiting without waiting for %d thread(s) still in an abandoned fetch (%s)",
        len(left),
        ", ".join(left[:5]),
    )
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _once(config: Config, dry_run: bool, as_json: bool, reset: bool) -> int:
    from hydrator.runtime.json_views import cycle_json  # noqa: PLC0415
    from hydrator.runtime.wiring import build_assembly  # noqa: PLC0415

    if dry_run and reset:
        raise ConfigError("--reset-state", "writes the state; not with --dry-run")
    before = set(threading.enumerate())
    assembly = build_assembly(config, read_only=dry_run, reset=reset)
    service, near_sites = assembly.service, assembly.pool.near
    try:
        report = service.run_dry_cycle() if dry_run else service.run_cycle()
    finally:
        service.close()
    near = near_sites.table.near if near_sites is not None else None
    if as_json:
        print(json.dumps(cycle_json(report, near), indent=1))
    else:
        _print_changes(report)
    return _without_stragglers(EXIT_FAILED if report.outcome == "failed" else EXIT_OK, before)


def _print_changes(report: CycleReport) -> None:
    plan = report.plan
    for change in plan.changes if plan else ():
        old = _described(change.old)
        new = _described(change.new)
        sign = {"added": "+", "removed": "-", "changed": "~"}[change.kind.value]
        arrow = f"{old} -> {new}" if old and new else (new or old)
        print(f"{sign} {change.site} {change.dataset} {arrow}")
    fields = cycle_fields(report)
    print(" ".join(f"{k}={v}" for k, v in fields.items()))


def _described(replica: Replica | None) -> str:
    """``partial``, or ``partial+stuck`` when a transfer goes with a present dataset."""
    if replica is None:
        return ""
    if replica.present and replica.transfer is not Transfer.NONE:
        return f"{replica.state.value}+{replica.transfer.value}"
    return replica.state.value


def _show(config: Config, site: str | None) -> int:
    from hydrator.core.near import with_near  # noqa: PLC0415
    from hydrator.runtime.near_sites import offline_near  # noqa: PLC0415
    from hydrator.runtime.outcome import render_ads  # noqa: PLC0415
    from hydrator.runtime.repair import shown_coverage  # noqa: PLC0415
    from hydrator.runtime.wiring import state_store  # noqa: PLC0415

    path = config.daemon.state_path
    if not path.exists():
        print(f"hydrator: no state at {path} yet: run `hydrator once` first", file=sys.stderr)
        return EXIT_FAILED
    store = state_store(path, read_only=True)
    try:
        state, drained = store.load(), store.drains()
    finally:
        store.close()
    views, notes = _with_storage(state, drained)
    near, near_notes = offline_near(config.distances, views)
    views = {name: with_near(view, near.get(name)) for name, view in views.items()}
    if site is not None:
        if Site(site) not in views:
            print(
                f"hydrator: unknown site {site!r}; known: {', '.join(views) or 'none'}",
                file=sys.stderr,
            )
            return EXIT_FAILED
        views = {Site(site): views[Site(site)]}
    ads = render_ads(views, config.classad)
    coverage, stray = shown_coverage(config, views)
    texts = []
    for name, ad in ads.items():
        text = ad.body.decode()
        if views[name].stuck and not config.classad.advertise_stuck:
            stuck = ", ".join(str(d) for d in views[name].stuck)
            text += f"# stuck transfers (not advertised): {stuck}\n"
        text += "".join(map(_storage_line, views[name].storages))
        texts.append(text + coverage.get(name, ""))
    print("\n".join(texts), end="")
    print(stray, end="")
    print("".join([*notes, *near_notes]), end="")
    return EXIT_OK


def _with_storage(state: State, drained: list[Drain]) -> tuple[dict[Site, SiteView], list[str]]:
    """The saved views as the daemon publishes them now (storage statuses of the last good
    answers, the drains in effect), and a comment line per drain."""
    from hydrator.core.startup import saved_views  # noqa: PLC0415
    from hydrator.runtime.drain_command import drain_lines  # noqa: PLC0415

    now = datetime.now(UTC)
    views = saved_views(state, drained, now)
    return views, drain_lines(drained, now)


def _storage_line(status: StorageStatus) -> str:
    """``# RSE X_DISK: unavailable (availability_read false)`` under its site's ad, for a
    storage element that cannot serve or has a downtime coming ("" for the others)."""
    if status.available and not status.upcoming:
        return ""
    said = "available" if status.available else f"unavailable ({status.reason})"
    later = f"; upcoming {status.upcoming}" if status.upcoming else ""
    return f"# {status.label}: {said}{later}\n"


def _drain(config: Config, args: argparse.Namespace) -> int:
    from hydrator.runtime import drain_command  # noqa: PLC0415

    if args.command == "drain":
        print(drain_command.drain(config, args.site, args.storage, args.until, args.reason))
        return EXIT_OK
    removed, line = drain_command.undrain(config, args.site, args.storage)
    print(line, file=sys.stdout if removed else sys.stderr)
    return EXIT_OK if removed else EXIT_FAILED


def _expr(args: argparse.Namespace) -> int:
    from hydrator.core.expr import job_expressions, submit_lines, toil_params  # noqa: PLC0415

    try:
        datasets = [DatasetId.parse(d) for d in args.datasets]
        partial = args.partial_attribute  # None: not given (a near job reads no partial list)
        named = {} if partial is None else {"partial_attribute": partial}
        attrs = ClassAdConfig(available_attribute=args.available_attribute, **named)
        expressions = job_expressions(
            datasets, attrs, partial_ok=args.partial_ok, fallback_after_s=args.fallback_after
        )
        if args.rank_only and (args.fallback_after is not None or args.generic):
            raise ValueError("--rank-only has no requirements for --fallback-after or --generic")
        others = (args.rank_only, args.generic, args.toil, args.partial_ok, args.fallback_after)
        if args.near and any(o not in (None, False) for o in (*others, partial)):
            raise ValueError("--near takes no other option but --available-attribute")
    except (InvalidNameError, ValueError) as exc:
        print(f"hydrator: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.near:
        from hydrator.core.expr import near_expressions, near_submit_lines  # noqa: PLC0415

        print(f"My.RequiredDatasets = {expressions.required}")
        near = near_expressions(
            attrs,
            sites_attribute=JobsConfig().sites_attribute,
            slot_site_attribute=CollectorConfig().slot_site_attribute,
        )
        print(near_submit_lines(near), end="")
        return EXIT_OK
    render = toil_params if args.toil else submit_lines
    print(render(expressions, generic=args.generic, rank_only=args.rank_only), end="")
    return EXIT_OK
