"""The hydrator's one exception tree.

::

    HydratorError
    ├── ConfigError               bad configuration; the message names the key (exit 2)
    ├── SourceError               a catalogue did not give a usable answer this cycle
    │   ├── TransientSourceError  worth retrying: connection, timeout, HTTP 5xx/429
    │   └── PermanentSourceError  retrying will not help: authentication, 4xx, bad schema
    ├── PublishError              a publisher (collector, ...) could not deliver
    ├── PoolError                 the pool could not be read or asked (schedds, slots, a request)
    ├── StateError                the state database cannot be read or written
    └── FileRefused               a file named by the configuration cannot be read safely

Adapters translate their libraries' exceptions into these with ``raise X(...) from exc``;
nothing in the hydrator classifies errors by their message text.
"""

from __future__ import annotations


class HydratorError(Exception):
    """Base of every error the hydrator raises on purpose."""


class ConfigError(HydratorError):
    """The configuration is invalid. ``key`` is the dotted path of the offending key."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}" if key else problem)
        self.key = key
        self.problem = problem


class SourceError(HydratorError):
    """A source could not produce a snapshot this cycle; its last good one is kept."""


class TransientSourceError(SourceError):
    """A failure that may go away by itself (connection refused, timeout, 5xx, 429).

    ``retry_after_s`` is the server's hint, when it gave one (``Retry-After``).
    """

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class PermanentSourceError(SourceError):
    """A failure that retrying will not fix (bad credentials, forbidden, malformed answer)."""


class PublishError(HydratorError):
    """A publisher could not deliver this cycle; it is retried on the next cycle."""


class PoolError(HydratorError):
    """The pool could not be read or asked: the collector could not list the schedds or the
    slots, a schedd could not be read, or it refused or failed a request (a job edit, a
    negotiation cycle). Whoever asked tries again on its next round."""


class StateError(HydratorError):
    """The state database is unreadable, of an unknown schema version, or not writable."""


class FileRefused(HydratorError):
    """The path is missing, unreadable, not a regular file or over its size cap; the message
    says which without the file's content. ``missing`` is true when there is no such file."""

    def __init__(self, problem: str, *, missing: bool = False) -> None:
        super().__init__(problem)
        self.missing = missing
