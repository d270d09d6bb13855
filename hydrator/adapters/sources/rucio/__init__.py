"""The Rucio source (``type = "rucio"``): which datasets each site holds, from a Rucio server.

The package's modules, each for one job (the overview of a fetch is in :mod:`.rucio_source`):

* :mod:`.rucio_source`: :class:`RucioSource` and :func:`build`; one fetch assembled step by step;
* :mod:`.summaries`: each RSE's summary table read against its last answer, its rows put in the
  book (the next RSE's read while this one is parsed: :func:`~.summaries.read_ahead`);
* :mod:`.settling`: each dirty (site, dataset) pair settled from its rows and rules, or left
  to the deep checks;
* :mod:`.wire`: the only package of this source importing ``rucio`` and ``requests``: each API
  call with bounded retries, errors translated (:mod:`.wire.calls`); the client, its session
  watched by the fetch's deadline, answers capped and read in bounded blocks
  (:mod:`.wire.session`);
  tests inject a client through ``client_factory``;
* :mod:`.sites`: the RSEs of the expression and their sites (:class:`~.sites.Rse`,
  :class:`~.sites.RseTable`);
* :mod:`.listing`: listings kept as lines, diffed against the last answer, parsed in batches;
* :mod:`.book`: what the source keeps between fetches, and how rows added and gone move it;
* :mod:`.rules`: the replicating and stuck rules, as each dataset's transfer towards sites;
* :mod:`.deep`: exact per-dataset checks where the summary cannot settle a pair;
* :mod:`.answer`: the answer set built from the last one by delta, objects reused;
* :mod:`.badlist`: the bad and temporarily unavailable file replicas, whose datasets are
  checked exactly at their sites;
* :mod:`.targeted`: the targeted reads of event cycles (a few named datasets, exactly);
* :mod:`.distances`: the distances between RSEs, for the near sites (one export request).

The presence and transfer decisions themselves are pure, in :mod:`hydrator.core.presence`.
"""

from hydrator.adapters.sources.rucio.rucio_source import RucioSource, build

__all__ = ["RucioSource", "build"]
