"""The persisted state: one SQLite file (:mod:`hydrator.adapters.state.sqlite`)."""
