"""Logging for the daemon, the HTTP server process and the libraries they load.

One handler on the root logger, formatting through :class:`TextFormatter` or
:class:`JsonFormatter`; both pass every string through :func:`~hydrator.redact.redact`.
:class:`ProblemLog` says each problem once (and its recovery once) instead of at every round.
Any layer may use it (the Rucio adapter adopts rucio-clients' loggers; the HTTP server process sets
it up for itself); it imports nothing of the hydrator but :mod:`hydrator.redact`.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Collection, Hashable
from datetime import datetime
from typing import Any, Generic, TypeVar

from hydrator.redact import redact


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and a record's ``fields``.

    Every string in it has passed :func:`~hydrator.redact.redact` (JSON escapes the rest).
    """

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created).astimezone().isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            doc.update(fields)
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(_redacted(doc), default=str)


def _redacted(value: Any) -> Any:
    """``value`` with :func:`redact` applied to every string in it (dicts, lists, scalars)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact(str(k)): _redacted(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_redacted(v) for v in value]
    if isinstance(value, int | float | bool) or value is None:
        return value
    return redact(str(value))


class TextFormatter(logging.Formatter):
    """``time level logger: message``, one physical line per record, secrets redacted.

    The whole message (template and every interpolated value) goes through
    :func:`~hydrator.redact.redact`, which escapes control characters: an RSE name or a storage
    area id with a line break cannot forge a log line. A traceback follows on lines indented by
    four spaces, each redacted and escaped too, so no line of it can pass for a record.
    """

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        safe = logging.makeLogRecord(record.__dict__)  # other handlers keep the original
        safe.msg, safe.args = redact(record.getMessage()), None
        safe.exc_info, safe.exc_text, safe.stack_info = None, None, None
        text = super().format(safe)
        blocks = []
        if record.exc_info:
            blocks.append(self.formatException(record.exc_info))
        elif record.exc_text:
            blocks.append(record.exc_text)
        if record.stack_info:
            blocks.append(self.formatStack(record.stack_info))
        for block in blocks:
            text += "".join(f"\n    {redact(line)}" for line in block.splitlines())
        return text


Key = TypeVar("Key", bound=Hashable)
MAX_PROBLEMS = 10_000
"""Default bound on the problems a :class:`ProblemLog` remembers at once."""


class ProblemLog(Generic[Key]):
    """Logs a problem once per ``key``, and its recovery once, instead of at every round.

    :meth:`problem` logs a warning the first time its key fails (again only once its
    ``cause`` changes, when one is given); :meth:`recovered` logs once that the key works
    again and re-arms it, :meth:`forget` re-arms it silently. With ``once_per_process`` a key,
    once logged, stays remembered for the process's life (a bad record repeated in every
    answer): :meth:`recovered` and :meth:`forget` leave it as it is.

    Thread-safe. Memory is bounded: while ``limit`` keys are remembered, a new key's problem
    is not logged (the caller still counts it).
    """

    def __init__(
        self,
        logger: logging.Logger,
        *,
        limit: int = MAX_PROBLEMS,
        once_per_process: bool = False,
    ) -> None:
        self._logger = logger
        self._limit = limit
        self._once_per_process = once_per_process
        self._said: dict[Key, Hashable] = {}  # key -> the cause logged with it
        self._lock = threading.Lock()

    def problem(self, key: Key, message: str, *args: object, cause: Hashable = None) -> bool:
        """``logger.warning(message, *args)`` unless ``key`` was logged already with the same
        ``cause`` (or the limit is reached); True when it logged."""
        with self._lock:
            if key in self._said:
                if self._said[key] == cause or self._once_per_process:
                    return False
            elif len(self._said) >= self._limit:
                return False
            self._said[key] = cause
        self._logger.warning(message, *args)
        return True

    def recovered(self, key: Key, message: str, *args: object, cause: Hashable = None) -> bool:
        """``logger.info(message, *args)`` if ``key`` was logged as a problem (with ``cause``,
        when one is given: another cause's problem stays), and re-arm it; True when it
        logged."""
        with self._lock:
            if not self._forgot(key, cause):
                return False
        self._logger.info(message, *args)
        return True

    def forget(self, key: Key) -> None:
        """Re-arm ``key`` without a line: its next problem is logged again."""
        with self._lock:
            self._forgot(key, None)

    def forget_all_but(self, keys: Collection[Key]) -> None:
        """Re-arm, without a line, every key not in ``keys`` (the problems gone since)."""
        with self._lock:
            for key in [k for k in self._said if k not in keys]:
                self._forgot(key, None)

    def failing(self) -> frozenset[Key]:
        """The keys logged as problems and not re-armed since."""
        with self._lock:
            return frozenset(self._said)

    def _forgot(self, key: Key, cause: Hashable) -> bool:
        """Drop ``key`` (only if logged with ``cause``, when one is given); True if dropped.
        Called under the lock."""
        if self._once_per_process or key not in self._said:
            return False
        if cause is not None and self._said[key] != cause:
            return False
        del self._said[key]
        return True


def setup_logging(fmt: str, level: str) -> None:
    """Log to stderr (journald and kubectl logs pick it up) in ``text`` or ``json``.

    The one handler formats through :class:`TextFormatter` or :class:`JsonFormatter`, both of
    which redact secrets and escape control characters; libraries log through it too
    (propagation to the root logger), so none of their lines escapes redaction.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("apscheduler").setLevel(max(logging.WARNING, root.level))
    # The events listener states each broker failure in one line per cause; stomp-py's own
    # warnings repeat it every round ("could not connect to host") or report a socket both
    # of its threads closed at once (SHUT_RDWR on a closed descriptor).
    logging.getLogger("stomp.py").setLevel(max(logging.ERROR, root.level))
    adopt_library_loggers()


def adopt_library_loggers() -> None:
    """Remove the handlers a library gave its own loggers, so their records propagate to the
    root handler and its redacting formatter. rucio-clients adds a coloured stderr handler to
    its ``baseclient`` logger when imported: :mod:`hydrator.adapters.sources.rucio` calls this after
    importing it."""
    for logger in list(logging.root.manager.loggerDict.values()):
        if isinstance(logger, logging.Logger) and logger.handlers:
            logger.handlers.clear()
            logger.propagate = True
