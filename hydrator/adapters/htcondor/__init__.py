"""The HTCondor adapter: everything that talks to the pool through ``htcondor2``.

``collector.py`` publishes: it pushes the rendered site ads where the matchmaker sees them,
behind :class:`~hydrator.core.ports.Publisher` (the HTTP endpoint, pull for the execute-node
hook, is not a publisher: it serves the saved state); ``slot_repairs.py`` holds its repair
looks, which merge again into slot ads that lost their lists between cycles.
``condor_queue.py`` reads queued jobs and slots (demand, matchmaking metrics);
``schedd_jobs.py`` reads and edits idle jobs (job annotation);
``schedd_reschedule.py`` asks the schedds for a negotiation cycle after a cycle.
"""
