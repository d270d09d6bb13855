"""``hydrator drain`` / ``hydrator undrain``: take a site, or one storage element of it, out of
advertising without touching the catalogue and without a restart.

The drain is saved in the state file (:func:`hydrator.adapters.state.drains.set_drain`), which
the daemon reads at the start of every cycle: it takes effect within one cycle, survives
restarts, and shows in ``hydrator show``, ``/v1/sites`` (the reason and until when) and
``hydrator_drains``. A drained storage element counts as unavailable (what only it holds
leaves its site's lists, its ``DataLocalityUnavailable`` says why); a drained site lists no
dataset at all. ``--until`` ends it by itself.

A drain either does what it says or is refused in one line (exit status 2) and nothing is
saved: a site no source has reported and ``[sites]`` does not name, a storage element no
source states at that site (a drain of it would never apply), an ``--until`` that is not a
time in the next :data:`~hydrator.core.storage.MAX_DRAIN` (docs/security.md).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from hydrator.config import Config
from hydrator.core.storage import MAX_DRAIN, Drain, clean_text, drain_refusal, stamp
from hydrator.domain import Site, check_site
from hydrator.errors import ConfigError
from hydrator.names import STORAGE_PATTERN, InvalidNameError, shown

_DURATION = re.compile(r"(\d+)([mhd])")
_UNITS = {"m": timedelta(minutes=1), "h": timedelta(hours=1), "d": timedelta(days=1)}
_HINT = "use 90m, 12h, 3d or 2026-11-27T08:00Z"


def parse_until(text: str, now: datetime) -> datetime:
    """``--until``: a duration from now (``90m``, ``12h``, ``3d``) or an ISO 8601 time with
    its offset (``2026-11-27T08:00Z``, ``2026-11-27T09:00+01:00``); returned in UTC. Raises
    :class:`ConfigError` for anything else, a time without offset, one not in the future, or
    one more than :data:`~hydrator.core.storage.MAX_DRAIN` ahead."""
    found = _DURATION.fullmatch(text.strip())
    if found:
        digits, limit = found[1].lstrip("0") or "0", MAX_DRAIN // _UNITS[found[2]]
        if len(digits) > len(str(limit)) or int(digits) > limit:  # never a huge int()
            raise ConfigError("--until", f"{shown(text)} is {_TOO_FAR}")
        when = now + int(digits) * _UNITS[found[2]]
    else:
        try:
            when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        except ValueError as exc:
            raise ConfigError("--until", f"{shown(text)}: {_HINT}") from exc
        if when.tzinfo is None:
            raise ConfigError("--until", f"{shown(text)}: give the offset (Z for UTC)")
    try:
        ahead = when - now
        when = when.astimezone(UTC)
    except OverflowError as exc:  # within a day of year 1 or 9999
        raise ConfigError("--until", f"{shown(text)} is {_TOO_FAR}") from exc
    if ahead <= timedelta(0):
        raise ConfigError("--until", f"{shown(text)} is not in the future")
    if ahead > MAX_DRAIN:
        raise ConfigError("--until", f"{shown(text)} is {_TOO_FAR}")
    return when


_TOO_FAR = (
    f"more than {MAX_DRAIN.days} days ahead: drain without --until and run `hydrator undrain` "
    "when it is over"
)


def checked_target(site: str, storage: str | None) -> tuple[Site, str | None]:
    """The site and storage element named on the command line, or :class:`ConfigError`."""
    try:
        checked = check_site(site)
    except InvalidNameError as exc:
        raise ConfigError("SITE", str(exc)) from exc
    if storage is not None and not STORAGE_PATTERN.fullmatch(storage):
        raise ConfigError("--storage", f"invalid storage element name {shown(storage)}")
    return checked, storage


def known_targets(config: Config) -> tuple[set[str], set[tuple[str, str]]]:
    """The sites and (site, storage element) a drain can apply to: those the saved state's
    answers report, and ``[sites]``: its sites, and its elements where a source that states
    every mapped element is configured (``states_mapped_elements``: DMAPI's)."""
    from hydrator.runtime.wiring import reported_targets  # noqa: PLC0415  (CLI only)

    sites, stated = reported_targets(config.daemon.state_path)
    sites.update(config.sites.values())
    if any(s.states_mapped_elements for s in config.sources):
        stated.update((site, element) for element, site in config.sites.items())
    return sites, stated


def drain(config: Config, site: str, storage: str | None, until: str | None, reason: str) -> str:
    """Save the drain; return the line to print. Raises :class:`ConfigError` (nothing saved)
    for a drain that could not do what it says: an unknown site or storage element
    (:func:`~hydrator.core.storage.drain_refusal`), an invalid or out-of-range ``until``."""
    from hydrator.runtime.wiring import set_drain  # noqa: PLC0415  (CLI only)

    now = datetime.now(UTC)
    target, element = checked_target(site, storage)
    if not clean_text(reason):
        raise ConfigError("--reason", "say why (it goes into the site's ad)")
    ends = parse_until(until, now) if until else None
    refusal = drain_refusal(target, element, *known_targets(config))
    if refusal is not None:
        raise ConfigError("--storage" if element else "SITE", refusal)
    made = Drain(target, element, clean_text(reason), now, ends)
    set_drain(config.daemon.state_path, made)
    what = f"storage element {element} of site {target}" if element else f"site {target}"
    lasts = f" until {stamp(ends)}" if ends else " until `hydrator undrain`"
    return f"drained {what}{lasts}: {made.reason} (the daemon applies it at its next cycle)"


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
