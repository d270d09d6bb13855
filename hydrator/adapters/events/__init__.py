"""Event streams: a listener hands each validated message (or why it was dropped) to a
port :class:`~hydrator.core.ports.EventSink` from its own thread, and reports its connection state
(:class:`~hydrator.core.ports.EventListener`).

``stomp_listener`` keeps the subscription to what Rucio's ``rucio-hermes`` sends over STOMP to
ActiveMQ (when to connect, what each message is); ``stomp_connection`` is one connection attempt
and the one module that imports stomp-py; ``hermes_messages`` checks what a message body says.
What a message means is decided in :mod:`hydrator.core.event_hints`.
"""
