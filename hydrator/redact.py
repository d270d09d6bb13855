"""Secrets out of every text the daemon emits, and secret material checked where it is read.

:func:`redact` is the one point every error text passes through before it can reach a log line,
the state database, ``hydrator once --json`` or an HTTP answer (``/v1/sites`` serves source
error reasons without authentication). It replaces with ``[REDACTED]``:

* every secret this process has read or been given (:func:`remember_secret`: token files,
  passwords, client secrets, access tokens from a token endpoint), wherever it appears; never
  an identifier (a client id, an account or user name: :data:`IDENTIFIER_KINDS`), which is no
  secret and as a word would mangle every text holding it (``client_id = hydrator`` made
  ``/var/lib/hydrator/...`` read ``/var/lib/[REDACTED]/...``);
* ``Authorization``-style credentials: ``Bearer X``, ``Basic X`` (requests puts a header value
  it refuses into its error message: ``... in header value: 'Bearer <token>'``);
* credentials in URLs: the password of ``https://user:password@host`` (the user name is
  kept), the whole user part when it has no password (``https://TOKEN@host``);
* ``key=value`` / ``"key": "value"`` pairs whose key names a secret (``access_token``,
  ``client_secret``, ``password``, ``X-Rucio-Auth-Token`` ...), and JSON Web Tokens;

and escapes control characters (``\\n`` ``\\r`` ``\\x1b`` ..., Unicode line separators and
bidi overrides), so that a reason or log message is always one line that cannot forge another.

Secret material is checked where it is read (:func:`checked_secret`, :func:`read_secret`): a
value with whitespace or control characters inside is refused with a message naming the file or
the endpoint, never the content, before it can go into a header.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from pathlib import Path

from hydrator.errors import PermanentSourceError
from hydrator.files import FileRefused, read_capped

REDACTED = "[REDACTED]"
MIN_REMEMBERED_LENGTH = 6  # shorter values would blank out ordinary words
MAX_SECRET_BYTES = 64 * 1024  # a JWT with many claims is a few kB; a token file is never more
MAX_REMEMBERED = 256  # secrets remembered per process (tokens rotate; the oldest are dropped)

# C0 and C1 controls, DEL, Unicode line/paragraph separators, bidi marks and overrides
# ("Trojan Source", CVE-2021-42574): anything that can break or visually reorder a log line.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_URL_USERINFO = re.compile(
    r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?:(?P<user>[^/\s@'\"<>:]+):)?[^/\s@'\"<>]+@"
)
_AUTH_SCHEME = re.compile(
    r"(?i)\b(?P<scheme>bearer|basic|negotiate|digest)\s+(?!\[REDACTED\])[^\s'\",;)\]}]+"
)
_SENSITIVE_KEYS = (
    r"access[_-]?token|refresh[_-]?token|id[_-]?token|client[_-]?secret|password|passwd|"
    r"secret|api[_-]?key|apikey|token|authorization|x-rucio-auth-token|x-rucio-password|"
    r"proxy-authorization"
)
_HEADERS = r"authorization|proxy-authorization|x-rucio-auth-token|x-rucio-password"
# key=value anywhere; "key": value only with a quoted key (JSON, a dict's repr) or a header
# name, so that prose such as "token file /x: No such file" stays as it is
_KEY_VALUE = re.compile(
    rf"(?i)(?P<key>(?:[\"'](?:{_SENSITIVE_KEYS})[\"']\s*[:=]|\b(?:{_SENSITIVE_KEYS})\s*=|"
    rf"\b(?:{_HEADERS})\s*:)\s*)(?P<quote>[\"']?)"
    rf"(?!\[REDACTED\])(?:(?:bearer|basic)\s+)?[^\s\"',;&)\]}}]+"
)
_JWT = re.compile(r"\beyJ[A-Za-z0-9_\-]{4,}\.[A-Za-z0-9_\-]{4,}\.[A-Za-z0-9_\-]*")

_remembered: OrderedDict[str, None] = OrderedDict()
_remembered_lock = threading.Lock()


def remember_secret(value: str) -> None:
    """Redact ``value`` from every later text of this process (ignored if very short)."""
    if len(value) < MIN_REMEMBERED_LENGTH:
        return
    with _remembered_lock:
        _remembered[value] = None
        _remembered.move_to_end(value)
        while len(_remembered) > MAX_REMEMBERED:
            _remembered.popitem(last=False)


def escape_controls(text: str) -> str:
    """``text`` with every control character written as an escape (``\\n``, ``\\x1b``, ...)."""
    if not _CONTROL.search(text):
        return text
    return _CONTROL.sub(_escape_one, text)


def _escape_one(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def redact(text: str) -> str:
    """``text`` without secrets and on one line: safe to log, store and serve (see module doc)."""
    with _remembered_lock:
        known = [s for s in _remembered if s in text]
    for secret in sorted(known, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    text = escape_controls(text)
    text = _URL_USERINFO.sub(_userinfo, text)
    text = _KEY_VALUE.sub(rf"\g<key>\g<quote>{REDACTED}", text)
    text = _AUTH_SCHEME.sub(rf"\g<scheme> {REDACTED}", text)
    return _JWT.sub(REDACTED, text)


def _userinfo(match: re.Match[str]) -> str:
    """A URL's user part without its password (the user name kept), or redacted whole when it
    has no password (then it may be a token)."""
    user = match.group("user")
    kept = f"{user}:" if user is not None and user != REDACTED else ""
    return f"{match.group('scheme')}{kept}{REDACTED}@"


def unsafe_secret(value: str) -> bool:
    """Whether ``value`` holds whitespace or control characters (never valid in a header)."""
    return any(c.isspace() or not c.isprintable() for c in value)


def checked_secret(value: str, where: str, *, remember: bool = True) -> str:
    """``value`` if it is usable as a credential, remembered for :func:`redact` (unless
    ``remember`` is false: an identifier, not a secret).

    Raise PermanentSourceError naming ``where`` (a file, an endpoint), never the value.
    """
    if not value:
        raise PermanentSourceError(f"{where} is empty")
    if unsafe_secret(value):
        if remember:
            remember_secret(value)
            for part in re.split(r"[\s\x00-\x1f\x7f-\x9f]+", value):
                remember_secret(part)
        raise PermanentSourceError(
            f"{where} holds whitespace or control characters inside the value "
            "(a line break in the middle?); refusing to send it"
        )
    if remember:
        remember_secret(value)
    return value


IDENTIFIER_KINDS = frozenset({"client id", "account", "user name", "username"})
"""Kinds of credential file (:func:`read_secret`'s ``what``) that name who the client is:
checked like a secret (they go into a header or a form too), never remembered for
:func:`redact` (only secret values are redacted)."""


def read_secret(path: Path, what: str) -> str:
    """The content of a credential file without surrounding whitespace, checked, and
    remembered for :func:`redact` unless ``what`` is one of :data:`IDENTIFIER_KINDS`.

    Errors name ``what`` and the file, never the content. Only a regular file of at most
    ``MAX_SECRET_BYTES`` is read (a FIFO would block, a huge file would be sent as a header).
    """
    try:
        value = read_capped(path, MAX_SECRET_BYTES).decode("utf-8").strip()
    except (FileRefused, UnicodeDecodeError) as exc:
        reason = str(exc) if isinstance(exc, FileRefused) else "not UTF-8 text"
        raise PermanentSourceError(f"cannot read the {what} file {path}: {reason}") from exc
    where = f"the {what} file {path}"
    return checked_secret(value, where, remember=what not in IDENTIFIER_KINDS)
