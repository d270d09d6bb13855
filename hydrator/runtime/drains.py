"""``hydrator drain`` / ``hydrator undrain``: take a site, or one storage element of it, out of
advertising without touching the catalogue and without a restart.

The drain is saved in the state file (:func:`hydrator.adapters.state.sqlite.set_drain`), which
the daemon reads at the start of every cycle: it takes effect within one cycle, survives
restarts, and shows in ``hydrator show``, ``/v1/sites`` (the reason and until when) and
``hydrator_drains``. A drained storage element counts as unavailable (what only it holds
leaves its site's lists, its ``DataLocalityUnavailable`` says why); a drained site lists no
dataset at all. ``--until`` ends it by itself.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from hydrator.config import Config
from hydrator.core.storage import Drain, clean_text, stamp
from hydrator.domain import Site, check_site
from hydrator.errors import ConfigError
from hydrator.names import STORAGE_PATTERN, InvalidNameError

_DURATION = re.compile(r"(\d+)([mhd])")
_UNITS = {"m": timedelta(minutes=1), "h": timedelta(hours=1), "d": timedelta(days=1)}


def parse_until(text: str, now: datetime) -> datetime:
    """``--until``: a duration from now (``90m``, ``12h``, ``3d``) or an ISO 8601 time with
    its offset (``2026-11-27T08:00Z``, ``2026-11-27T09:00+01:00``); returned in UTC. Raises
    :class:`ConfigError` for anything else, a time without offset, or one not in the future."""
    found = _DURATION.fullmatch(text.strip())
    if found:
        when = now + int(found[1]) * _UNITS[found[2]]
    else:
        try:
            when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        except ValueError as exc:
            hint = f"{text!r}: use 90m, 12h, 3d or 2026-11-27T08:00Z"
            raise ConfigError("--until", hint) from exc
        if when.tzinfo is None:
            raise ConfigError("--until", f"{text!r}: give the offset (Z for UTC)")
    if when <= now:
        raise ConfigError("--until", f"{text!r} is not in the future")
    return when.astimezone(UTC)


def checked_target(site: str, storage: str | None) -> tuple[Site, str | None]:
    """The site and storage element named on the command line, or :class:`ConfigError`."""
    try:
        checked = check_site(site)
    except InvalidNameError as exc:
        raise ConfigError("SITE", str(exc)) from exc
    if storage is not None and not STORAGE_PATTERN.fullmatch(storage):
        raise ConfigError("--storage", f"invalid storage element name {storage!r}")
    return checked, storage


def drain(config: Config, site: str, storage: str | None, until: str | None, reason: str) -> str:
    """Save the drain; return the line to print."""
    from hydrator.runtime.wiring import set_drain, stated_storages  # noqa: PLC0415  (CLI only)

    now = datetime.now(UTC)
    target, element = checked_target(site, storage)
    if not clean_text(reason):
        raise ConfigError("--reason", "say why (it goes into the site's ad)")
    ends = parse_until(until, now) if until else None
    made = Drain(target, element, clean_text(reason), now, ends)
    set_drain(config.daemon.state_path, made)
    what = f"storage element {element} of site {target}" if element else f"site {target}"
    lasts = f" until {stamp(ends)}" if ends else " until `hydrator undrain`"
    line = f"drained {what}{lasts}: {made.reason} (the daemon applies it at its next cycle)"
    known = stated_storages(config.daemon.state_path)
    if element and (target, element) not in known:
        line += (
            f"\nwarning: no source has stated a storage element {element} at site {target} "
            "yet; the drain applies once one does (check the name with `hydrator show`)"
        )
    return line


def undrain(config: Config, site: str, storage: str | None) -> tuple[bool, str]:
    """Remove the drain; ``(removed, line to print)``."""
    from hydrator.runtime.wiring import remove_drain  # noqa: PLC0415  (CLI only)

    target, element = checked_target(site, storage)
    removed = remove_drain(config.daemon.state_path, target, element)
    what = f"storage element {element} of site {target}" if element else f"site {target}"
    if not removed:
        return False, f"no drain of {what}"
    return True, f"undrained {what} (the daemon applies it at its next cycle)"


def drain_lines(drains: list[Drain], now: datetime) -> list[str]:
    """``hydrator show``'s comment lines for the drains (expired ones said so)."""
    lines = []
    for d in drains:
        what = f"storage element {d.storage} of site {d.site}" if d.storage else f"site {d.site}"
        state = "" if d.active(now) else " (expired)"
        lines.append(f"# drain{state}: {what} since {stamp(d.since)}: {d.text}\n")
    return lines
