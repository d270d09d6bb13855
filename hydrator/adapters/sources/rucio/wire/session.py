"""The Rucio wire's client and HTTP session: a rucio-clients ``Client`` built from the
configuration (:func:`make_client`), whose ``requests`` session carries the fetch's deadline
watchdog and the answer cap (:class:`WatchedClient`, :class:`RucioAdapter`,
:class:`CappedBody`), and the bounded reading of a streamed listing (:func:`bounded_blocks`).

Deadline: the shared watchdog (:mod:`hydrator.adapters.sources._deadline`) is mounted on
rucio-clients' session, also for its token request, and cuts a read still under way at the
fetch's deadline, so a server trickling its headers or body does not keep the fetch's thread.
Caps: every answer is read up to ``max_answer_bytes`` (after decompression), a listing's lines
up to ``max_line_bytes``, as they stream in; over a cap, :class:`TooLarge`.

Only rucio-clients' public interface is used: constructor arguments, the ``TOKEN_PATH_PREFIX``
class constant (a private token directory, not the shared ``/tmp/.rucio_<user>``), WLCG token
discovery (``BEARER_TOKEN_FILE``) for OIDC, and the ``session`` attribute (docs/dependencies.md).
The calls, retries and error translation that use this are :mod:`.calls`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import requests
from rucio.client import Client

from hydrator.adapters.sources._deadline import DeadlinePassed, Run, WatchedAdapter, current
from hydrator.config import RucioSourceConfig
from hydrator.errors import PermanentSourceError
from hydrator.redact import read_secret

READ_BYTES = 1 << 20  # read size of a streamed listing


class TooLarge(Exception):
    """An answer over ``max_answer_bytes``, or one of its lines over ``max_line_bytes``."""


def make_client(
    config: RucioSourceConfig,
    *,
    token_dir: Path,
    timeout_s: float,
    max_answer_bytes: Callable[[], int],
) -> Any:
    """A rucio ``Client`` from the config, or from ``$RUCIO_CONFIG`` without rucio_host; its
    tokens kept in ``token_dir``, its requests' timeout ``timeout_s`` (seconds), its answers
    read up to ``max_answer_bytes()`` bytes, its session watched by the fetch's deadline
    (:class:`WatchedClient`, from the token request on)."""
    kwargs: dict[str, Any] = {"timeout": timeout_s}
    for key in ("rucio_host", "auth_host", "account", "vo", "auth_type"):
        if getattr(config, key) is not None:
            kwargs[key] = getattr(config, key)
    if config.ca_cert is not None:
        kwargs["ca_cert"] = str(config.ca_cert)
    if config.auth_type is not None:
        kwargs["creds"] = _creds(config)
    client_class = type(
        "HydratorRucioClient",
        (WatchedClient,),
        {
            "TOKEN_PATH_PREFIX": f"{token_dir}/.rucio_",
            "MAX_ANSWER_BYTES": staticmethod(max_answer_bytes),
        },
    )
    if config.auth_type != "oidc":
        return client_class(**kwargs)
    token = read_rucio_secret(config.token_file, "token_file")
    with _bearer_token_file(token_dir, token):
        client = client_class(**kwargs)
    client.auth_token = token  # token_file wins over a BEARER_TOKEN in the environment
    return client


def _creds(config: RucioSourceConfig) -> dict[str, Any]:
    """rucio-clients' ``creds`` for the configured ``auth_type``."""
    if config.auth_type == "userpass":
        return {
            "username": config.username,
            "password": read_rucio_secret(config.password_file, "password_file"),
        }
    if config.auth_type == "x509":
        return {"client_cert": _path(config.client_cert), "client_key": _path(config.client_key)}
    if config.auth_type == "x509_proxy":
        return {"client_proxy": _path(config.client_proxy)}
    return {}


def bounded_blocks(
    response: requests.Response, what: str, line_most: int, run: Run
) -> Iterator[bytes]:
    """The streamed answer's bytes as they arrive, in blocks of at most ``READ_BYTES`` and
    of ``line_most`` (``max_line_bytes``); :class:`TooLarge` once a line passes it (the
    answer's cap is the adapter's: :class:`CappedBody`), :class:`DeadlinePassed` at the
    fetch's deadline.

    Exact and cheap: a block is asked no longer than the line cap, so a line over it spans
    blocks, and only the line running across a block's start or end is measured (one
    ``find`` and one ``rfind`` a block, in C); a longer block (urllib3 may hand on more
    once it decompressed) has its inner lines measured too."""
    running = 0  # the bytes of the answer's last, unfinished line
    for block in response.iter_content(min(READ_BYTES, line_most)):
        end = block.rfind(b"\n")
        if end < 0:
            running += len(block)
        else:
            first = block.find(b"\n")
            longest = running + first
            if len(block) > line_most:
                longest = max(longest, *map(len, block[first:end].split(b"\n")))
            running = len(block) - end - 1 if longest <= line_most else line_most + 1
        if running > line_most:
            raise TooLarge(f"{what}: a line longer than max_line_bytes = {line_most}")
        if run.passed():
            raise DeadlinePassed("the fetch's deadline passed while reading the answer")
        yield block


class RucioAdapter(WatchedAdapter):
    """The deadline's adapter (:mod:`hydrator.adapters.sources._deadline`) for rucio-clients'
    session: besides the wait for headers, the connection of each answer is watched while its
    body is read (until the call's end: :meth:`Run.let_go`), so that the deadline also cuts a
    trickling body; and every answer's body (token requests and rucio-clients' own calls too)
    is read up to ``max_bytes()`` bytes, after decompression (:class:`CappedBody`)."""

    def __init__(self, max_bytes: Callable[[], int]) -> None:
        super().__init__(pool_maxsize=2)  # one call at a time
        self._max_bytes = max_bytes

    def send(self, request: requests.PreparedRequest, *args: Any, **kwargs: Any) -> Any:
        response = super().send(request, *args, **kwargs)
        run, connection = current(), getattr(response.raw, "connection", None)
        if run is not None and connection is not None:
            run.hold(connection)
        response.raw = CappedBody(response.raw, self._max_bytes(), request.path_url)
        return response


class CappedBody:
    """urllib3's response as requests reads it (``stream``, which ``iter_content`` and
    ``content`` use), raising :class:`TooLarge` past ``most`` bytes; all else delegated."""

    def __init__(self, raw: Any, most: int, path: str) -> None:
        self._raw, self._most, self._path = raw, most, path

    def stream(self, amt: int, decode_content: bool | None = None) -> Iterator[bytes]:
        size = 0
        for chunk in self._raw.stream(amt, decode_content=decode_content):
            size += len(chunk)
            if size > self._most:
                path = self._path[:200]
                raise TooLarge(f"answer from {path} larger than max_answer_bytes = {self._most}")
            yield chunk

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


class WatchedClient(Client):  # type: ignore[misc]  # rucio-clients has no type hints
    """rucio-clients' ``Client`` whose ``session`` gets the deadline's adapter mounted
    (``requests.Session.mount``) whenever rucio-clients sets it: in its constructor, before
    the token request, and again when it replaces the session after an error.
    ``MAX_ANSWER_BYTES`` (set by the subclass :func:`make_client` makes) gives the
    answer cap's current value."""

    MAX_ANSWER_BYTES: Callable[[], int] = staticmethod(lambda: 1 << 62)

    @property
    def session(self) -> requests.Session:
        session: requests.Session = self._hydrator_session
        return session

    @session.setter
    def session(self, session: requests.Session) -> None:
        adapter = RucioAdapter(self.MAX_ANSWER_BYTES)
        session.mount("https://", adapter)
        session.mount("http://", adapter)
        self._hydrator_session = session


def read_rucio_secret(path: Path | None, key: str) -> str:
    """The stripped content of a secret file, checked (no whitespace or control characters
    inside) and remembered for redaction; the error names the key and file, never the content."""
    if path is None:
        raise PermanentSourceError(f"rucio: {key} is required for this auth_type")
    return read_secret(path, f"rucio {key.removesuffix('_file')}")


_ENV_LOCK = threading.Lock()


@contextmanager
def _bearer_token_file(directory: Path, token: str) -> Iterator[None]:
    """``$BEARER_TOKEN_FILE`` naming a private copy of ``token`` while a client is built.

    rucio-clients' public way to take a bearer token at construction is WLCG token discovery
    (``BEARER_TOKEN``, ``BEARER_TOKEN_FILE``); without one it would start its interactive flow.
    The copy is checked content (no race with an agent rewriting ``token_file``), mode 0600,
    and removed again at once; the lock keeps two sources from racing on the variable.
    """
    path = directory / "bearer-token"
    with _ENV_LOCK:
        old = os.environ.get("BEARER_TOKEN_FILE")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(token)
        os.environ["BEARER_TOKEN_FILE"] = str(path)
        try:
            yield
        finally:
            if old is None:
                os.environ.pop("BEARER_TOKEN_FILE", None)
            else:
                os.environ["BEARER_TOKEN_FILE"] = old
            path.unlink(missing_ok=True)


def _path(path: Path | None) -> str | None:
    return None if path is None else str(path)
