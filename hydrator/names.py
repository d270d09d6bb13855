"""The name rules: which dataset, site and storage element names the hydrator accepts, and how
a rejected one is shown.

Names are checked against strict patterns so that nothing a catalogue returns can break a
ClassAd or a string list: quotes, backslashes, whitespace, commas and control characters are
rejected; ``/ # + @ =`` (used in real catalogues, e.g. CMS block names) are allowed. The
values that apply them are in :mod:`hydrator.domain` (:class:`~hydrator.domain.DatasetId`,
:func:`~hydrator.domain.check_site`, :class:`~hydrator.domain.StorageStatus`); the
configuration checks its names with them too.
"""

from __future__ import annotations

import re

# Rucio's generic schema allows scopes of [A-Za-z0-9_.-]; 30 characters is Rucio's column size.
SCOPE_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,29}")
# Names: Rucio's generic DID character set plus what experiments' schemas add (/, #, +, @, =).
# No quote, backslash, whitespace, comma, colon, `$` or control character; 250 is Rucio's limit.
# `$` never: HTCondor expands $(...) and $ENV(...) in the configuration the glidein hook writes
# these names into, so a name holding one is an invalid record, counted and skipped.
NAME_PATTERN = re.compile(r"[A-Za-z0-9/_][A-Za-z0-9/_.\-+#@=]{0,249}")
# GLIDEIN_Site values seen in production: SRCNET_CH, T2_US_Nebraska, UKI-NORTHGRID-MAN-HEP.
SITE_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}")
STORAGE_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-:]{0,127}")
"""Storage element names: RSE names (``[A-Z0-9_-]``), storage-area names and ids (uuids)."""


class InvalidNameError(ValueError):
    """A dataset or site name outside the allowed character set (the message quotes it safely,
    at most :data:`SHOWN_NAME_CHARS` of it: :func:`shown`)."""


SHOWN_NAME_CHARS = 64  # of a rejected name, in messages and logs (a whole name can be kilobytes)


def shown(name: object) -> str:
    """``name`` quoted for a message, bounded: whole up to :data:`SHOWN_NAME_CHARS`
    characters, else its first ones and its length (``'xxxx'... (10000 characters)``)."""
    if isinstance(name, str) and len(name) > SHOWN_NAME_CHARS:
        return f"{name[:SHOWN_NAME_CHARS]!r}... ({len(name)} characters)"
    text = repr(name)
    return text if len(text) <= 2 * SHOWN_NAME_CHARS else f"{text[:SHOWN_NAME_CHARS]}..."
