"""The pure core: what to publish, decided from :mod:`hydrator.domain` values.

No I/O here: no network, files, sockets, subprocesses or daemons (``lint-imports`` checks it).
``plan`` diffs the sources' answers against the saved state, ``advertise`` chooses what each
site's ad carries, ``render`` writes ClassAds, ``locality`` and ``jobs`` decide from the pool's
jobs and slots, ``expr`` writes a job's submit lines.
"""
