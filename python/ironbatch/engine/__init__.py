"""The engine: ``LLMEngine`` (add / step / abort) and ``LLM`` (generate)."""

from ironbatch.engine.llm import LLM
from ironbatch.engine.llm_engine import EngineArgs, LLMEngine

__all__ = ["LLM", "EngineArgs", "LLMEngine"]
