"""The persisted state: one SQLite file (stdlib ``sqlite3``).

* :mod:`.sqlite`: :class:`~.sqlite.SqliteStateStore`, the state store behind the
  :class:`~hydrator.core.ports.StateStore` port (one transaction per cycle, one writer);
* :mod:`.schema`: the schema, its versions and their upgrades;
* :mod:`.writer`: what a save writes, every row of it;
* :mod:`.loader`: what a load reads back, each row checked;
* :mod:`.drains`: the operator's drains, written by ``hydrator drain`` beside the running
  daemon, and ``--reset-state``, which keeps them.
"""
