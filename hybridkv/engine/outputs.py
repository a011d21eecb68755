"""What happens to each request after the model step: its next token (with
vLLM's logits extras and logprobs), whether it stops, and its RequestOutput.

Everything here concerns one request at a time, so the engine can fail a
request alone when any of it raises.
"""

from __future__ import annotations

from typing import Any

import torch

from hybridkv.engine.logits_processors import process_logits
from hybridkv.engine.logprobs import token_logprobs
from hybridkv.engine.sampling import (
    RequestMetrics,
    RequestOutput,
    Sampler,
    find_stop_string,
)
from hybridkv.engine.scheduler import SeqState


class OutputProcessor:
    """Picks tokens and ends requests for an engine.

    Args:
        sampler: the engine's sampler (one generator per request).
        tokenizer: decodes output for stop strings and `text` (None: no text).
        runner: the model runner (its `eos_token_ids` and `max_model_len`, the
            context a request stops at, are read at each use).
    """

    def __init__(self, sampler: Sampler, tokenizer: Any, runner: Any) -> None:
        self.sampler = sampler
        self.tokenizer = tokenizer
        self.runner = runner

    def next_token(self, seq: SeqState, logits: torch.Tensor) -> int:
        """Sample from the row `logits` [vocab] (with the request's extras) and
        append the token, with its logprobs when asked."""
        params, req = seq.params, seq.request
        processed = logits
        if params.has_logits_processing:
            stop_ids = {*self.runner.eos_token_ids, *params.stop_token_ids}
            processed = process_logits(logits, params, req.prompt_token_ids,
                                       req.output_token_ids, stop_ids)
        token = self.sampler.sample(processed, seq.request_id, params, seq.index)
        if params.logprobs is None:
            req.append_output_token_ids(token)
            return token
        entry = token_logprobs(logits, token, params.logprobs)  # of the raw logits
        req.append_output_token_ids(token)
        seq.logprobs.append(entry)
        return token

    def stop_reason(self, seq: SeqState, token: int) -> str | None:
        params = seq.params
        if seq.num_output_tokens >= params.min_tokens:  # nothing stops it before min_tokens
            if not params.ignore_eos and token in self.runner.eos_token_ids:
                return "stop"
            if token in params.stop_token_ids:
                seq.stop_reason = token
                return "stop"
            if params.stop and self.tokenizer is not None:
                found = self.find_stop_string(seq)
                if found is not None:
                    seq.stop_reason = found[1]
                    return "stop"
        if seq.num_output_tokens >= params.max_tokens:
            return "length"
        if seq.request.num_tokens >= self.runner.max_model_len:
            return "length"
        return None

    def find_stop_string(self, seq: SeqState) -> tuple[int, str] | None:
        """(position in the output text, string) of the first stop string that
        starts after the text of the first `min_tokens` tokens, or None."""
        assert self.tokenizer is not None
        params, output = seq.params, seq.request.output_token_ids
        skip = params.skip_special_tokens
        text = self.tokenizer.decode(output, skip_special_tokens=skip)
        start = 0
        if params.min_tokens:
            start = len(self.tokenizer.decode(output[:params.min_tokens],
                                              skip_special_tokens=skip))
        found = find_stop_string(text[start:], params.stop)
        return None if found is None else (start + found[0], found[1])

    def request_output(self, seq: SeqState) -> RequestOutput:
        req = seq.request
        out = RequestOutput(req.request_id, req.prompt_token_ids, req.output_token_ids,
                            max(seq.num_cached_tokens, 0), seq.finish_reason,
                            stop_reason=seq.stop_reason,
                            num_external_cached_tokens=seq.num_external_cached_tokens,
                            error=seq.error)
        if seq.params.logprobs is not None:
            out.logprobs = list(seq.logprobs)
        if seq.prompt_logprobs is not None:
            out.prompt_logprobs = list(seq.prompt_logprobs)
        if seq.first_token_time is not None and seq.finished_time is not None:
            out.metrics = RequestMetrics(seq.arrival_time, seq.first_token_time,
                                         seq.finished_time)
        if self.tokenizer is not None:
            try:
                out.text = self._output_text(seq)
            except Exception as error:
                out.finish_reason, out.text = "error", None
                out.error = f"detokenizing failed: {type(error).__name__}: {error}"
        return out

    def _output_text(self, seq: SeqState) -> str:
        assert self.tokenizer is not None
        text = self.tokenizer.decode(seq.request.output_token_ids,
                                     skip_special_tokens=seq.params.skip_special_tokens)
        if isinstance(seq.stop_reason, str):  # the text ends before the stop string
            found = self.find_stop_string(seq)
            if found is not None:
                text = text[:found[0]]
        return text
