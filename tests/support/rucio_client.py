"""What the Rucio source's wire reads of a rucio-clients ``Client`` besides its calls: the base
of stand-in clients handed to ``RucioSource(client_factory=...)`` in unit tests (the calls a
test needs are its subclass's methods; ``session`` answers the listings the wire GETs)."""

from __future__ import annotations

from typing import Any


class ClientAttributes:
    """The public attributes of rucio-clients' ``Client`` that the wire reads or sets."""

    host = "http://rucio.invalid"
    auth_token = "token"
    vo = account = user_agent = script_id = None
    timeout = 5.0
    ca_cert = None
    session: Any
