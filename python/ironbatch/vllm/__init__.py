"""vLLM integration: ``--scheduler-cls ironbatch.vllm.Scheduler``.

The only part of ironbatch that imports vLLM (install it with
``pip install ironbatch[vllm]``); ``import ironbatch`` never does."""

from ironbatch.vllm.scheduler import Scheduler

__all__ = ["Scheduler"]
