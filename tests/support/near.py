"""What the near-site tests share: a static inventory of three sites, one dataset each, and
the near expressions over the default attribute names."""

from __future__ import annotations

from hydrator.config import ClassAdConfig, CollectorConfig, JobsConfig
from hydrator.core.expr import NearExpressions, near_expressions

INVENTORY = """
[storage.A]
site = "SITE_A"
available = ["ska:x"]
[storage.B]
site = "SITE_B"
available = ["ska:y"]
[storage.C]
site = "SITE_C"
available = ["ska:z"]
"""


def default_near_expressions() -> NearExpressions:
    """``hydrator expr --near``'s form: the near expressions over the configuration's default
    attribute names."""
    return near_expressions(
        ClassAdConfig(),
        sites_attribute=JobsConfig().sites_attribute,
        slot_site_attribute=CollectorConfig().slot_site_attribute,
    )
