"""ironbatch-trace/1: recorded scheduling decisions, replayed for parity
(``docs/trace-format.md``)."""

from ironbatch.trace.reading import TraceError
from ironbatch.trace.replay import ReplayResult, replay

__all__ = ["ReplayResult", "TraceError", "replay"]
