"""The serving engine: scheduler, executor, sampling and the LLM front end."""

from hybridkv.engine.llm import LLM, EngineStats
from hybridkv.engine.sampling import RequestOutput, SamplingParams

__all__ = ["LLM", "EngineStats", "RequestOutput", "SamplingParams"]
