"""The rankings: which replica state holds more and which transfer is more urgent (pure).

Every place that compares two states or two transfers reads them from here:

* :data:`STATE_RANK` decides which of two reports of a pair holds more
  (:func:`~hydrator.core.presence.combine`), orders the demanded entries of a site's ad and
  the order in which its other entries are budgeted (:mod:`hydrator.core.advertise`);
* :data:`TRANSFER_RANK` decides which of several rules towards a site wins
  (:func:`~hydrator.core.presence.merge_transfers`) and which of two reports' transfers a
  pair keeps (:func:`~hydrator.core.presence.combine`).

Changing an order here changes it everywhere; ``tests/unit/core/test_presence.py`` and
``tests/unit/core/test_advertise.py`` hold the tables.
"""

from __future__ import annotations

from collections.abc import Mapping

from hydrator.domain import ReplicaState, Transfer

STATE_RANK: Mapping[ReplicaState, int] = {
    ReplicaState.AVAILABLE: 3,
    ReplicaState.PARTIAL: 2,
    ReplicaState.REPLICATING: 1,
    ReplicaState.STUCK: 0,
}
"""Higher is better: how much of a dataset a state holds."""

TRANSFER_RANK: Mapping[Transfer, int] = {
    Transfer.NONE: 0,
    Transfer.REPLICATING: 1,
    Transfer.STUCK: 2,
}
"""Higher is more urgent: STUCK (needs an operator) > REPLICATING > NONE."""
