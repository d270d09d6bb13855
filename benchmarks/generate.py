"""A deterministic synthetic federation for the benchmarks.

At full scale: 50 sites, 200 storage elements (RSEs, 4 per site), 100k datasets, 1M dataset
replicas (one per (site, dataset)), 20k glidein slots, and 1 % churn per cycle. Smaller scales
keep the sites, RSEs and slots and shrink the datasets with the replicas (10 replicas per
dataset on average). The model is compact (:class:`CompactHoldings`: 10M replicas in ~150 MB);
:meth:`Federation.snapshot` builds the domain objects afresh, as a source does each fetch.

Mix of replica states (initial): 80 % available, 10 % partial, ~9.9 % replicating, 0.1 % stuck.
Churn per cycle (of the current replica count): 40 % removals, 40 % additions (half new
datasets arriving at a site, half existing datasets replicating to one more site), 20 % state
changes (replicating progresses or completes, partial completes, available loses files, a few
rules get stuck). The count of replicas stays about constant.

Everything derives from ``seed``: two federations built with the same arguments, churned the
same number of times, are equal.

Run ``python benchmarks/generate.py --replicas 10000`` for a summary of a federation.
"""

from __future__ import annotations

import argparse
import random
from array import array
from collections import Counter
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from itertools import compress

from hydrator.core.index import merged_snapshot
from hydrator.domain import DatasetId, Detail, Replica, ReplicaState, Site, Snapshot, Transfer

STATES = tuple(ReplicaState)  # best first: indexed by the codes below
AVAILABLE, PARTIAL, REPLICATING, STUCK = range(4)
TRANSFERS = {REPLICATING: Transfer.REPLICATING, STUCK: Transfer.STUCK}
SCOPES = ("ska", "ska_low", "ska_mid", "ska_user")
SOURCE = "bench"


@dataclass(frozen=True)
class Scale:
    """Sizes of a federation; ``datasets`` defaults to a tenth of ``replicas``."""

    replicas: int
    sites: int = 50
    rses: int = 200
    slots: int = 20_000
    datasets: int = 0
    churn_fraction: float = 0.01

    @property
    def dataset_count(self) -> int:
        return self.datasets or max(1, self.replicas // 10)


@dataclass(frozen=True)
class Churn:
    """What one call of :meth:`Federation.churn` did (counts of replicas)."""

    added: int
    removed: int
    changed: int


def encode(state: int, percent: int) -> int:
    return state | (percent << 2)


def decode(code: int) -> tuple[int, int]:
    return code & 3, code >> 2


class Federation:
    """The synthetic catalogue: which site holds which dataset, in which state."""

    def __init__(self, scale: Scale, seed: int = 2026) -> None:
        self.scale = scale
        self.rng = random.Random(seed)
        n_sites = scale.sites
        self.sites = [f"SRCNET_S{i:02d}" for i in range(n_sites)]
        # skewed site sizes: a few big sites hold most data, as in real federations
        self.site_weights = [1.0 / (i + 1) ** 0.6 for i in range(n_sites)]
        per_site = max(1, scale.rses // n_sites)
        self.rses = [(f"{site}_DISK{j}", site) for site in self.sites for j in range(per_site)]
        self.next_dataset = scale.dataset_count
        # dataset * sites + site -> encode(state, percent), in insertion order
        self.holdings = CompactHoldings(n_sites)
        self._place_initial()
        self.slots = self._slots()

    # -- identifiers --------------------------------------------------------------------
    def key(self, dataset: int, site: int) -> int:
        return dataset * self.scale.sites + site

    @staticmethod
    def dataset_text(index: int) -> tuple[str, str]:
        """(scope, name) of dataset ``index``, e.g. ``("ska_low", "obs_0000001")``."""
        return SCOPES[index % len(SCOPES)], f"obs_{index:07d}"

    # -- initial placement --------------------------------------------------------------
    def _place_initial(self) -> None:
        n, d_count, n_sites = self.scale.replicas, self.scale.dataset_count, self.scale.sites
        if n > d_count * n_sites:
            raise ValueError(f"{n} replicas do not fit {d_count} datasets x {n_sites} sites")
        mean = n / d_count
        counts = [
            min(n_sites, max(1, round(self.rng.uniform(1, 2 * mean - 1)))) for _ in range(d_count)
        ]
        diff = n - sum(counts)
        while diff:
            i = self.rng.randrange(d_count)
            step = 1 if diff > 0 else -1
            if 1 <= counts[i] + step <= n_sites:
                counts[i] += step
                diff -= step
        site_ids = range(n_sites)
        for dataset, k in enumerate(counts):
            chosen: set[int] = set()
            while len(chosen) < k:
                chosen.update(self.rng.choices(site_ids, self.site_weights, k=k - len(chosen)))
            for site in sorted(chosen):
                self.holdings[self.key(dataset, site)] = self._initial_code()

    def _initial_code(self) -> int:
        roll = self.rng.random()
        if roll < 0.80:
            return encode(AVAILABLE, 100)
        if roll < 0.90:
            return encode(PARTIAL, self.rng.randint(5, 95))
        if roll < 0.999:
            return encode(REPLICATING, self.rng.randint(0, 95))
        return encode(STUCK, self.rng.randint(0, 50))

    def _slots(self) -> list[tuple[str, str]]:
        """(slot name, site) for every slot; slots follow the site sizes."""
        picks = self.rng.choices(range(self.scale.sites), self.site_weights, k=self.scale.slots)
        return [
            (f"slot1_{i}@glidein-{i:05d}.{self.sites[s].lower()}", self.sites[s])
            for i, s in enumerate(picks)
        ]

    # -- churn --------------------------------------------------------------------------
    def churn(self) -> Churn:
        """Apply one cycle of churn (``churn_fraction`` of the replicas) and say what it did."""
        total = max(1, round(len(self.holdings) * self.scale.churn_fraction))
        n_remove, n_add = int(total * 0.4), int(total * 0.4)
        n_change = total - n_remove - n_add
        keys = self.holdings.ordered()
        # sampling positions picks what sampling the keys themselves would (same draws)
        picked = [keys[j] for j in self.rng.sample(range(len(keys)), n_remove + n_change)]
        del keys
        for key in picked[:n_remove]:
            del self.holdings[key]
        changed = sum(self._change(key) for key in picked[n_remove:])
        added = self._add(n_add - n_add // 2, new_datasets=True)
        added += self._add(n_add // 2, new_datasets=False)
        return Churn(added=added, removed=n_remove, changed=changed)

    def _change(self, key: int) -> bool:
        state, percent = decode(self.holdings[key])
        roll = self.rng.random()
        if roll < 0.02 and state != STUCK:
            new = encode(STUCK, min(percent, 99))
        elif state == REPLICATING:
            grown = percent + self.rng.randint(10, 60)
            new = encode(AVAILABLE, 100) if grown >= 100 else encode(REPLICATING, grown)
        elif state == PARTIAL:
            new = encode(AVAILABLE, 100)
        elif state == STUCK:
            new = encode(REPLICATING, percent)
        else:  # available loses a few files
            new = encode(PARTIAL, self.rng.randint(50, 99))
        self.holdings[key] = new
        return True

    def _add(self, count: int, new_datasets: bool) -> int:
        added = 0
        site_ids = range(self.scale.sites)
        while added < count:
            site = self.rng.choices(site_ids, self.site_weights)[0]
            if new_datasets:
                dataset = self.next_dataset
                self.next_dataset += 1
                code = encode(AVAILABLE, 100)  # a new data product lands complete at its site
            else:
                dataset = self.rng.randrange(self.next_dataset)
                code = encode(REPLICATING, 0)  # a new rule starts copying
            key = self.key(dataset, site)
            if key not in self.holdings:
                self.holdings[key] = code
                added += 1
        return added

    # -- what a source would answer -----------------------------------------------------
    def replicas(self, intern: bool = False) -> Iterator[Replica]:
        """Fresh domain objects for every replica, as a source builds them each fetch.

        ``intern`` reuses one :class:`DatasetId` per dataset within the call (as a source may
        when one dataset appears at many sites); otherwise each row gets its own object.
        """
        n_sites = self.scale.sites
        sites = [Site(s) for s in self.sites]
        ids: dict[int, DatasetId] = {}
        for key, code in self.holdings.items():
            dataset, site = divmod(key, n_sites)
            state, percent = code & 3, code >> 2
            if intern:
                did = ids.get(dataset)
                if did is None:
                    did = ids[dataset] = DatasetId(*self.dataset_text(dataset))
            else:
                did = DatasetId(*self.dataset_text(dataset))
            fraction = percent / 100
            if state >= REPLICATING:  # absent, with a transfer whose progress is the percent
                detail = Detail(TRANSFERS[state], fraction, 0.0)
                yield Replica(did, sites[site], STATES[state], 0.0, detail)
            else:  # as holding() builds them: no detail when nothing moves
                yield Replica(did, sites[site], STATES[state], fraction)

    def snapshot(self, intern: bool = False) -> Snapshot:
        """The :class:`Snapshot` a source covering every site would return this cycle."""
        return merged_snapshot(SOURCE, self.replicas(intern), sites=[Site(s) for s in self.sites])

    def summary(self) -> dict[str, object]:
        states = Counter(STATES[c & 3].value for c in self.holdings.values())
        datasets = {k // self.scale.sites for k in self.holdings}
        return {
            "sites": self.scale.sites,
            "rses": len(self.rses),
            "datasets": len(datasets),
            "replicas": len(self.holdings),
            "slots": len(self.slots),
            "states": dict(sorted(states.items())),
        }


class CompactHoldings(MutableMapping[int, int]):
    """The ``holdings`` of a :class:`Federation`: a mapping as a ``dict`` of them would be, in
    flat arrays (~150 MB at 10M replicas instead of ~1 GB).

    Per possible key (``dataset * sites + site``, dense up to the highest dataset) one byte of
    state (0: absent, else ``state + 1``) and one of percent; the present keys in insertion
    order in an ``array('i')``, as a ``dict`` keeps them (what :meth:`Federation.churn` samples
    from). Once :meth:`take_touched` was called, :attr:`touched` collects
    every key written or deleted since, with its state before (for a cache of answers).
    """

    def __init__(self, sites: int) -> None:
        self.sites = sites
        self.states = bytearray()
        self.percents = bytearray()
        self.order = array("i")
        self.touched: dict[int, int] | None = None  # key -> state + 1 before (0: absent)
        self._dead = 0  # deleted keys still in ``order``

    def ordered(self) -> array[int]:
        """The present keys in insertion order (no copy: do not keep it across writes)."""
        if self._dead:
            self.order = array("i", compress(self.order, map(self.states.__getitem__, self.order)))
            self._dead = 0
        return self.order

    def state_at(self, key: int) -> int:
        """``state + 1`` at ``key``, 0 when absent."""
        return self.states[key] if key < len(self.states) else 0

    def __len__(self) -> int:
        return len(self.ordered())

    def __iter__(self) -> Iterator[int]:
        return iter(self.ordered())

    def __contains__(self, key: object) -> bool:
        return isinstance(key, int) and self.state_at(key) != 0

    def __getitem__(self, key: int) -> int:
        state = self.state_at(key)
        if not state:
            raise KeyError(key)
        return encode(state - 1, self.percents[key])

    def __setitem__(self, key: int, code: int) -> None:
        if key >= len(self.states):
            grow = (key // self.sites + 1024) * self.sites - len(self.states)
            self.states.extend(bytes(grow))
            self.percents.extend(bytes(grow))
        was = self.states[key]
        if self.touched is not None:
            self.touched.setdefault(key, was)
        if not was:
            self.ordered().append(key)  # compacted first: a key deleted and re-added moves last
        self.states[key] = (code & 3) + 1
        self.percents[key] = code >> 2

    def __delitem__(self, key: int) -> None:
        was = self.state_at(key)
        if not was:
            raise KeyError(key)
        if self.touched is not None:
            self.touched.setdefault(key, was)
        self.states[key] = 0
        self._dead += 1

    def take_touched(self) -> dict[int, int]:
        """The keys touched since the last call (none before the first) and their state
        before; recording starts with the first call."""
        touched, self.touched = self.touched or {}, {}
        return touched


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--replicas", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--cycles", type=int, default=1, help="churn cycles to apply")
    args = parser.parse_args()
    fed = Federation(Scale(args.replicas), args.seed)
    print(fed.summary())
    for i in range(args.cycles):
        print(f"churn {i + 1}: {fed.churn()}")
    print(fed.summary())


if __name__ == "__main__":
    main()
