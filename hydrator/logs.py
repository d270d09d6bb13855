"""Logging for the daemon, the HTTP server process and the libraries they load.

One handler on the root logger, formatting through :class:`TextFormatter` or
:class:`JsonFormatter`; both pass every string through :func:`~hydrator.redact.redact`. Any
layer may use it (the Rucio adapter adopts rucio-clients' loggers; the HTTP server process sets
it up for itself); it imports nothing of the hydrator but :mod:`hydrator.redact`.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime
from typing import Any

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
