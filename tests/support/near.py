"""What the near-site tests share: a static inventory of three sites, one dataset each."""

from __future__ import annotations

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
