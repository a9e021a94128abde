"""The engine: ``LLMEngine`` (add / step / abort) and ``LLM`` (generate)."""

from ironbatch.engine.llm import LLM
from ironbatch.engine.llm_engine import EngineArgs, LLMEngine
from ironbatch.engine.speculative_config import SpeculativeConfig

__all__ = ["LLM", "EngineArgs", "LLMEngine", "SpeculativeConfig"]
