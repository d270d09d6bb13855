"""The Rucio source's wire: the only package of the hydrator that imports ``rucio``
(rucio-clients), and the only part of the Rucio source that imports ``requests`` (the DMAPI
client and the sources' shared fetch deadline import it too). Import-linter contracts in
``pyproject.toml`` keep both libraries out of the rest of the Rucio source and out of the
core and the runtime.

* :mod:`.calls`: :class:`RucioWire`, each API call a fetch makes, with bounded retries and
  every library error translated into the hydrator's own (:class:`InvalidExpression` when
  ``list_rses`` refuses an expression);
* :mod:`.session`: the rucio-clients client built from the configuration, its ``requests``
  session carrying the fetch's deadline watchdog and the answer cap, and the bounded reading
  of a streamed listing.

Tests make it hermetic through ``client_factory`` (a callable returning an object with the
rucio-clients ``Client`` attributes and methods used here, :data:`ClientFactory`), never by
setting private attributes.

rucio-clients reads a ``rucio.cfg`` once per process (``$RUCIO_CONFIG``, else
``$RUCIO_HOME/etc``, ``$VIRTUAL_ENV/etc``, ``/opt/rucio/etc``): all Rucio sources of one daemon
share it, and even with ``rucio_host`` set it takes options such as ``auth_token_file_path``
from it when one exists. For OIDC the token in ``token_file`` is the one sent, also when
``BEARER_TOKEN`` is set in the environment.
"""

from hydrator.adapters.sources.rucio.wire.calls import ClientFactory, InvalidExpression, RucioWire

__all__ = ["ClientFactory", "InvalidExpression", "RucioWire"]
