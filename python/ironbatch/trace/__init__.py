"""ironbatch-trace/1: recorded scheduling decisions, replayed for parity
(``docs/trace-format.md``)."""

from ironbatch.trace.replay import ReplayResult, replay

__all__ = ["ReplayResult", "replay"]
