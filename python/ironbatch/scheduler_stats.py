"""SchedulerStats: what make_stats() reports. One definition for both
backends: the twin's (``ironbatch.reference.scheduler``), since the twin may
import nothing from the API."""

from __future__ import annotations

from ironbatch.reference.scheduler import SchedulerStats

__all__ = ["SchedulerStats"]
