""":mod:`hydrator.core.slot_coverage` under its former name, for the two modules that still
import :class:`~hydrator.core.slot_coverage.RepairReport` and
:class:`~hydrator.core.slot_coverage.SiteCoverage` from here (:mod:`hydrator.runtime.observe`,
:mod:`hydrator.runtime.report`). Nothing else imports it; once those two import
:mod:`hydrator.core.slot_coverage`, this module goes.
"""

from __future__ import annotations

from hydrator.core.slot_coverage import RepairReport, SiteCoverage

__all__ = ["RepairReport", "SiteCoverage"]
