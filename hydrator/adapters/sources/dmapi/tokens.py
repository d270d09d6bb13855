"""The DMAPI source's bearer tokens: a token file kept by someone else (:class:`StaticToken`), or
OAuth2 client-credentials grants refreshed before they expire (:class:`ClientCredentials`);
:func:`token_provider` picks one from the configuration.

Services get their tokens by an OAuth2 ``client_credentials`` grant at SKA IAM
(``https://ska-iam.stfc.ac.uk/token``) with form fields ``audience`` and ``scope``; the
datalink service asks for audience ``data-management-api``. The Site Capabilities API wants
audience ``site-capabilities-api`` and scope ``site-capabilities-api-service`` (its README),
so it gets its own token. Client authentication is HTTP Basic (RFC 6749 §2.3.1; what
authlib, used by the datalink service, sends by default). Users instead exchange a login
token at the Auth API (``/token/exchange/{service}``); a token obtained that way can be
given to this adapter as a static ``token_file``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from hydrator.adapters.sources.dmapi.client import HttpClient, Run
from hydrator.config import DmapiSourceConfig
from hydrator.errors import PermanentSourceError
from hydrator.redact import checked_secret, read_secret

log = logging.getLogger("hydrator.adapters.sources.dmapi")

Clock = Callable[[], float]
"""Monotonic seconds."""
# RFC 6749 §5.1 makes expires_in only RECOMMENDED; without it, assume this lifetime.
DEFAULT_TOKEN_LIFETIME_S = 300.0


class TokenProvider(Protocol):
    """Gives a bearer token; ``invalidate`` drops one the server refused (HTTP 401)."""

    def token(self, run: Run) -> str: ...

    def invalidate(self, token: str) -> None: ...


class StaticToken:
    """A bearer token kept in a file by someone else (re-read each cycle and after a 401)."""

    def __init__(self, path: Path, what: str) -> None:
        self._path = path
        self._what = what
        self._lock = threading.Lock()
        self._token: str | None = None

    def token(self, run: Run) -> str:
        with self._lock:
            if self._token is None:
                self._token = read_secret(self._path, self._what)
            return self._token

    def invalidate(self, token: str) -> None:
        with self._lock:
            if self._token == token:
                self._token = None

    def reset(self) -> None:
        """Forget the cached token so the next use re-reads the file (once per cycle)."""
        with self._lock:
            self._token = None


class ClientCredentials:
    """OAuth2 client-credentials tokens for one audience, refreshed before they expire.

    The grant itself (request, client authentication, answer) is authlib's, through
    :meth:`HttpClient.client_credentials`; the expiry is judged on ``clock`` (authlib's own
    check reads the wall clock). A new token is fetched when
    ``clock() >= expires_at - margin_s`` (monotonic seconds). Concurrent callers share one
    refresh (the lock is held while fetching). The margin is at most half the token's
    lifetime: a token whose ``expires_in`` is at or below ``margin_s`` would otherwise be
    fetched anew for every request.
    """

    def __init__(
        self,
        http: HttpClient,
        *,
        token_url: str,
        id_file: Path,
        secret_file: Path,
        audience: str,
        scope: str,
        margin_s: float,
        clock: Clock = time.monotonic,
    ) -> None:
        self._http, self._url = http, token_url
        self._id_file, self._secret_file = id_file, secret_file
        self._audience, self._scope = audience, scope
        self._margin_s, self._clock = margin_s, clock
        self._lock = threading.Lock()
        self._token: str | None = None
        self._refresh_at = 0.0

    def token(self, run: Run) -> str:
        with self._lock:
            if self._token is None or self._clock() >= self._refresh_at:
                self._token, lifetime_s = self._fetch(run)
                margin_s = min(self._margin_s, lifetime_s / 2)
                self._refresh_at = self._clock() + lifetime_s - margin_s
            return self._token

    def invalidate(self, token: str) -> None:
        with self._lock:
            if self._token == token:
                self._token = None

    def _fetch(self, run: Run) -> tuple[str, float]:
        """A new token and its lifetime (seconds), by authlib's client-credentials grant.

        The client id and secret are re-read from their files at every grant (rotation needs
        no restart); the token is checked (:func:`checked_secret`) before it is used.
        """
        label = f"token for audience {self._audience!r}"
        client_id = read_secret(self._id_file, "client id")
        client = (client_id, read_secret(self._secret_file, "client secret"))
        form = {"audience": self._audience}
        if self._scope:
            form["scope"] = self._scope
        body = self._http.client_credentials(self._url, run, label=label, client=client, form=form)
        token = body.get("access_token")
        if not isinstance(token, str) or not token:
            raise PermanentSourceError(f"{label}: token endpoint answer has no access_token")
        checked_secret(token, f"{label}: the access_token from the token endpoint {self._url}")
        expires_in = body.get("expires_in")
        if not isinstance(expires_in, int | float) or isinstance(expires_in, bool):
            expires_in = DEFAULT_TOKEN_LIFETIME_S
        log.info("obtained a %s valid for %.0f s", label, expires_in)
        return token, float(expires_in)


def token_provider(
    config: DmapiSourceConfig,
    http: HttpClient,
    audience: str,
    scope: str,
    token_file: Path | None,
    *,
    clock: Clock,
) -> TokenProvider:
    """Client-credentials grants for ``audience`` when the configuration names a token
    endpoint and client files, else the static ``token_file``."""
    if config.token_url and config.client_id_file and config.client_secret_file:
        return ClientCredentials(
            http,
            token_url=config.token_url,
            id_file=config.client_id_file,
            secret_file=config.client_secret_file,
            audience=audience,
            scope=scope,
            margin_s=config.token_refresh_margin_s,
            clock=clock,
        )
    if token_file is None:  # excluded by DmapiSourceConfig's validator
        raise PermanentSourceError(f"no token file configured for audience {audience!r}")
    return StaticToken(token_file, f"{audience} token")
