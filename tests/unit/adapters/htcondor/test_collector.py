"""How the collector publisher builds the ads it sends: its merges in batches of reused ads."""

from __future__ import annotations

import classad2

from hydrator.adapters.htcondor.collector import named_batches


def test_named_batches_reuse_at_most_size_ads_and_each_batch_is_complete() -> None:
    template = [("AvailableDatasets", classad2.ExprTree('{"ska:a","ska:b"}')), ("N", 1)]
    names = [f"slot{i}@h" for i in range(7)]
    seen: list[dict[str, object]] = []
    objects: set[int] = set()
    for batch in named_batches(template, names, 3):
        assert len(batch) <= 3
        objects.update(id(ad) for ad in batch)
        seen += [{k: ad.eval(k) for k in ad} for ad in batch]  # read before the next batch
    assert len(objects) == 3
    assert [ad["Name"] for ad in seen] == names
    for ad in seen:
        assert ad == {"AvailableDatasets": ["ska:a", "ska:b"], "N": 1, "Name": ad["Name"]}
