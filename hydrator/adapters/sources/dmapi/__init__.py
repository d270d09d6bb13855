"""The SKA SRCNet Data Management API (DMAPI) as a catalogue source (``type = "dmapi"``).

What this adapter relies on, and where it comes from (no public DMAPI server or OpenAPI
document exists; the shapes below are those its public callers use):

- ``GET {base_url}/data/locate/{namespace}/{name}`` with ``Authorization: Bearer <token>``
  answers a JSON list, one entry per storage element holding replicas::

      [{"identifier": "<RSE name>", "associated_storage_area_id": "<uuid>",
        "replicas": ["davs://host:port/path", ...], "is_dataset": false}]

  (ska-telescope/ska-src-clients ``api/data.py``; astroquery ``srcnet/core.py``; the SRCNet
  path-finder models, which also show ``is_dataset``; the datalink service also sees
  ``colocated_services``). Optional query parameters ``sort`` and ``ip_address`` only order
  the answer, so none are sent. The namespace is the Rucio scope.
- ``GET {site_capabilities_url}/nodes`` answers ``[{"name", "sites": [{"id", "name",
  "storages": [{"id", "areas": [{"id", "name", "type", ...}]}]}]}]`` (path-finder models,
  ska-src-site-capabilities-api). A storage area ``id`` is what a locate entry's
  ``associated_storage_area_id`` names; the SRCNet site ``name`` becomes our site.
- Tokens: OAuth2 client credentials at SKA IAM, one audience per API (:mod:`.tokens`).

The package's modules, each for one job:

* :mod:`.dmapi_source`: :class:`DmapiSource` and :func:`build`; which datasets to locate this fetch,
  the locates in parallel within the deadline, the answers turned into a snapshot;
* :mod:`.tokens`: the bearer tokens (a token file, or client-credentials grants);
* :mod:`.checks`: the answers checked (locate entries, the ``/nodes`` map, which storage
  areas can serve, when all answers together are no answer).

Their HTTP (retries, deadline, size cap) is :mod:`hydrator.adapters.sources.dmapi.client`, the Site
Capabilities API's downtimes :mod:`hydrator.adapters.sources.dmapi.site_capabilities`.
"""

from hydrator.adapters.sources.dmapi.dmapi_source import DmapiSource, build

__all__ = ["DmapiSource", "build"]
