"""What every executor that stands in for vLLM's workers in these tests
shares: there is no device, so health checks, shutdown, layout choice and
warm-up are no-ops, and any RPC EngineCore sends past the overridden
methods is news (it raises instead of passing silently)."""

from __future__ import annotations

from typing import Any

from vllm.v1.executor.abstract import Executor


class StandInExecutor(Executor):
    """The no-device part of an executor; subclasses say what the workers
    report (KV-cache specs, memory) and what a step returns."""

    @classmethod
    def supports_async_scheduling(cls) -> bool:
        return True

    def collective_rpc(self, method: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(method, "__name__", None) == "_measure_on_worker":
            # An encoder-cache producer measures its encoder's output width
            # at start-up: one worker's answer, the model's hidden size.
            hidden = self.vllm_config.model_config.get_hidden_size()
            return [{"image": hidden, "video": hidden}]
        raise NotImplementedError(f"{type(self).__name__}.collective_rpc({method!r})")

    def check_health(self) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def set_kv_cache_layout(self, layout_name: str, cp_kv_cache_interleave_size: int) -> None:
        pass

    def compile_or_warm_up_model(self) -> None:
        pass  # nothing to compile or capture on this "device"
