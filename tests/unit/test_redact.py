"""hydrator.redact and the log formatters: secrets out, control characters escaped."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from hydrator.errors import PermanentSourceError
from hydrator.logs import JsonFormatter, TextFormatter, setup_logging
from hydrator.redact import checked_secret, escape_controls, read_secret, redact

TIMESTAMPED = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ [\w.]+: ")


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        # requests' message for a refused header value, which quotes the value (a token)
        (
            "InvalidHeader: Invalid leading whitespace, reserved character(s), or return "
            "character(s) in header value: 'Bearer eyAbc123\\nsecond-half'",
            "eyAbc123",
        ),
        ("cannot reach https://alice:pa55w0rd@rucio.example.org:443", "pa55w0rd"),
        ("Authorization: Bearer abcdef.ghijk", "abcdef"),
        ("Authorization: Basic YWxpY2U6cGFzcw==", "YWxpY2U6cGFzcw"),
        ('{"access_token": "at-12345", "expires_in": 300}', "at-12345"),
        ("grant_type=client_credentials&client_secret=cs-98765&scope=x", "cs-98765"),
        ("{'X-Rucio-Auth-Token': 'root-aaaaaa-bbbb', 'Accept': '*/*'}", "root-aaaaaa"),
        ("password=hunter22 for alice", "hunter22"),
        ("got eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJl back", "c2lnbmF0dXJl"),
    ],
)
def test_redact_removes_credentials(text: str, secret: str) -> None:
    out = redact(text)
    assert secret not in out
    assert "[REDACTED]" in out


@pytest.mark.parametrize(
    "text",
    [
        "locate ska:obs_1: HTTP 503 (attempt 3/3)",
        "token for audience 'data-management-api': token endpoint answered HTTP 401 invalid_client",
        "cannot read the rucio token file /run/credentials/token: No such file or directory",
        "no site for RSE 'CH_DISK' (storage area 2a73d212-8793-4011-a687-cad99841c269)",
        "davs://storage.example.org:443/data/ska/obs_1",
    ],
)
def test_redact_leaves_ordinary_messages_alone(text: str) -> None:
    assert redact(text) == text


def test_a_secret_read_once_is_redacted_everywhere_later(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("opaque-Token-4711\n")
    assert read_secret(path, "test token") == "opaque-Token-4711"
    said = redact("server said: opaque-Token-4711 is unknown")
    assert said == "server said: [REDACTED] is unknown"


@pytest.mark.parametrize("content", ["first-half\nsecond-half\n", "tok en-1234", "tok\x00en-1234"])
def test_secret_with_whitespace_or_controls_is_refused_naming_the_file(
    tmp_path: Path, content: str
) -> None:
    path = tmp_path / "token"
    path.write_text(content)
    with pytest.raises(PermanentSourceError) as caught:
        read_secret(path, "DMAPI token")
    message = str(caught.value)
    assert f"the DMAPI token file {path} holds whitespace or control characters" in message
    assert "half" not in message and "en-1234" not in message
    # and should it ever be quoted elsewhere, its pieces are redacted
    assert "second-half" not in redact(f"header value: {content!r}")


def test_empty_or_unreadable_secret_files_are_named(tmp_path: Path) -> None:
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(PermanentSourceError, match=r"the client id file .*empty is empty"):
        read_secret(tmp_path / "empty", "client id")
    with pytest.raises(PermanentSourceError, match=r"cannot read the client id file .*missing"):
        read_secret(tmp_path / "missing", "client id")
    with pytest.raises(PermanentSourceError, match="the token endpoint x holds whitespace"):
        checked_secret("a\r\nb", "the token endpoint x")


def test_a_client_id_is_checked_but_never_redacted(tmp_path: Path) -> None:
    """A client id is no secret: redacting ``client_id = hydrator`` would mangle every path
    holding the word."""
    (tmp_path / "client-id").write_text("hydrator\n")
    (tmp_path / "client-secret").write_text("cs-Secret-8812\n")
    assert read_secret(tmp_path / "client-id", "client id") == "hydrator"
    read_secret(tmp_path / "client-secret", "client secret")
    reason = "cannot read /var/lib/hydrator/inv.toml; sent cs-Secret-8812"
    assert redact(reason) == "cannot read /var/lib/hydrator/inv.toml; sent [REDACTED]"
    (tmp_path / "bad-id").write_text("hydra\ntor")
    with pytest.raises(PermanentSourceError, match=r"the client id file .*bad-id holds whitespace"):
        read_secret(tmp_path / "bad-id", "client id")


def test_a_url_keeps_its_user_name_and_loses_its_password() -> None:
    said = redact("cannot reach https://alice:pa55w0rd@rucio.example.org and https://tok3n@x.org")
    assert said == (
        "cannot reach https://alice:[REDACTED]@rucio.example.org and https://[REDACTED]@x.org"
    )


def test_escape_controls_writes_every_line_breaking_character_as_an_escape() -> None:
    text = "a\nb\rc\td\x1b[31me\u2028f\u202eg\x85h"
    assert escape_controls(text) == "a\\nb\\rc\\td\\x1b[31me\\u2028f\\u202eg\\x85h"
    assert escape_controls("plain ska:obs_1 ünïcode") == "plain ska:obs_1 ünïcode"


@pytest.fixture
def root_stream() -> Iterator[io.StringIO]:
    """The root logger's handler as setup_logging builds it, writing into a buffer."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    stream = io.StringIO()
    yield stream
    root.handlers[:], root.level = saved[0], saved[1]
    stream.close()


def _log_through(fmt: str, stream: io.StringIO) -> None:
    setup_logging(fmt, "INFO")
    handler = logging.getLogger().handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(stream)


def test_text_log_cannot_be_forged_by_an_interpolated_value(root_stream: io.StringIO) -> None:
    _log_through("text", root_stream)
    evil = "AREA\n2026-01-01 00:00:00,000 ERROR hydrator: forged\r\x1b[2K"
    log = logging.getLogger("hydrator.test")
    log.warning("no site for storage area %s", evil)
    try:
        raise ValueError(f"bad {evil} Authorization: Bearer tok-secret-1")
    except ValueError:
        log.exception("failed with %s", "password=pw-secret-2")
    lines = root_stream.getvalue().splitlines()
    assert all(TIMESTAMPED.match(line) or line.startswith("    ") for line in lines), lines
    assert sum(1 for line in lines if TIMESTAMPED.match(line)) == 2
    escaped = "AREA\\n2026-01-01 00:00:00,000 ERROR hydrator: forged\\r\\x1b[2K"
    assert f"storage area {escaped}" in lines[0]
    assert "tok-secret-1" not in root_stream.getvalue()
    assert "pw-secret-2" not in root_stream.getvalue()


def test_json_log_redacts_message_fields_and_exception(root_stream: io.StringIO) -> None:
    _log_through("json", root_stream)
    log = logging.getLogger("hydrator.test")
    try:
        raise RuntimeError("https://bob:pw-secret-3@host/x")
    except RuntimeError:
        log.exception(
            "Bearer tok-secret-4", extra={"fields": {"error": "client_secret=cs-secret-5"}}
        )
    text = root_stream.getvalue()
    assert text.count("\n") == 1
    doc = json.loads(text)
    assert doc["message"] == "Bearer [REDACTED]"
    assert doc["error"] == "client_secret=[REDACTED]"
    for secret in ("pw-secret-3", "tok-secret-4", "cs-secret-5"):
        assert secret not in text


def test_formatters_are_the_ones_setup_logging_installs(root_stream: io.StringIO) -> None:
    for fmt, kind in (("text", TextFormatter), ("json", JsonFormatter)):
        setup_logging(fmt, "INFO")
        (handler,) = logging.getLogger().handlers
        assert isinstance(handler.formatter, kind)


def test_library_loggers_with_their_own_handlers_go_through_the_root_handler(
    root_stream: io.StringIO,
) -> None:
    import hydrator.adapters.sources.rucio  # noqa: F401  (rucio-clients adds its handler on import)

    _log_through("text", root_stream)
    library = logging.getLogger("baseclient")
    assert library.handlers == []
    library.error("token=tok-secret-6 refused")
    assert "tok-secret-6" not in root_stream.getvalue()
    assert "token=[REDACTED] refused" in root_stream.getvalue()


def test_the_broker_librarys_routine_warnings_stay_out_of_the_log(
    root_stream: io.StringIO,
) -> None:
    """The events listener says each broker failure once; stomp-py would repeat it per round."""
    _log_through("text", root_stream)
    stomp_log = logging.getLogger("stomp.py")
    stomp_log.warning("could not connect to host %s, port %s: %s", "127.0.0.1", 61613, "refused")
    stomp_log.error("error sending frame")
    lines = root_stream.getvalue().splitlines()
    assert len(lines) == 1 and "error sending frame" in lines[0], lines
