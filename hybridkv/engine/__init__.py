"""The serving engine: scheduler, executor, sampling and the LLM front end."""

from hybridkv.engine.chat import render_chat
from hybridkv.engine.llm import LLM, EngineStats
from hybridkv.engine.sampling import (
    RequestMetrics,
    RequestOutput,
    SamplingParams,
    TokenLogprobs,
)

__all__ = ["LLM", "EngineStats", "RequestMetrics", "RequestOutput", "SamplingParams",
           "TokenLogprobs", "render_chat"]
