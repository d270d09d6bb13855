"""The pure core: what to publish, decided from :mod:`hydrator.domain` values.

No I/O here: no network, files, sockets, subprocesses or daemons (``lint-imports`` checks it).
docs/architecture.md maps each module to the runtime and adapter modules of its feature. The
modules, by what they decide:

* a full read: ``plan`` diffs the sources' answers against the saved state into a plan;
  ``guards`` holds back an answer or a site that shrank suspiciously; ``changes`` is a plan's
  changes and each source's rows to write; ``model`` (with ``model_patch``) is the memo the
  runtime carries between cycles, which holds the incremental tricks (every other fast path:
  docs/performance.md); ``startup`` is what the saved state serves before the first cycle;
* replicas and views: ``presence`` decides presence and transfer from a catalogue's counts and
  rules; ``ranking`` orders states and transfers; ``index`` indexes and merges reports;
  ``views`` builds a site's lists and digest; ``storage`` says which storage elements can serve
  (and the drains); ``near`` the near sites from network distances; ``check_order`` which
  datasets a source's bounded budget checks first;
* a site's ad: ``advertise`` chooses what each ad carries, ``adsize`` how big it is,
  ``advertise_memory`` keeps each site's last answer while its inputs are unchanged, ``render``
  writes the ClassAd;
* the collector: ``slot_coverage`` finds slot ads that lost their lists, ``collector_merges``
  which ads a cycle or repair merges into, ``merge_budget`` the bytes of merges allowed;
* jobs and the pool: ``queue`` and ``queue_reuse`` the schedds' queues and when to read them
  again, ``jobs`` job annotation, ``locality`` matchmaking quality, ``expr`` a job's submit
  lines, ``reschedule_policy`` when to ask for a negotiation cycle;
* between full reads: ``event_hints`` what Rucio's events say to re-read, ``between_reads``
  what an event or refresh cycle answers for each source;
* the daemon: ``restart_backoff`` when to restart a dead thread; ``ports`` declares every port
  the runtime calls and the adapters implement.
"""
