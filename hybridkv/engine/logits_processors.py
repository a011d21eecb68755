"""vLLM's logits extras for one request: min_tokens, logit_bias and the
repetition / frequency / presence penalties.

They run on a copy of the request's logits row before temperature, top-k and
top-p (greedy included), in vLLM's order:

1. `min_tokens`: while fewer output tokens exist, every stop token (EOS and
   `stop_token_ids`) is set to -inf;
2. `logit_bias`: each listed token's bias is added;
3. `repetition_penalty` r over tokens of the prompt AND the output:
   a positive logit becomes logit / r, a negative one logit * r;
4. OpenAI's penalties over the output tokens only:
   logit -= frequency_penalty * count + presence_penalty * (count > 0).

Example (vocab 4, prompt [1], output [2, 2], r = 2, frequency 0.5,
presence 1): logits [1, 2, -1, 3] -> [1, 1, -2 - 1 - 1, 3] = [1, 1, -4, 3].
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch

from hybridkv.engine.sampling import SamplingParams


def process_logits(logits: torch.Tensor, params: SamplingParams,
                   prompt_token_ids: Sequence[int], output_token_ids: Sequence[int],
                   stop_token_ids: Collection[int]) -> torch.Tensor:
    """A new float32 row [vocab]: `logits` [vocab] with the extras of `params`
    applied (the input is not changed). `stop_token_ids`: the tokens
    `min_tokens` holds back (EOS and the request's stop tokens)."""
    out = logits.float().clone()
    if len(output_token_ids) < params.min_tokens and stop_token_ids:
        out[torch.tensor(sorted(stop_token_ids), dtype=torch.long)] = -torch.inf
    if params.logit_bias:
        ids = torch.tensor(list(params.logit_bias.keys()), dtype=torch.long)
        out[ids] += torch.tensor(list(params.logit_bias.values()), dtype=out.dtype)
    if params.repetition_penalty != 1:
        _repetition_penalty(out, params.repetition_penalty,
                            [*prompt_token_ids, *output_token_ids])
    if (params.frequency_penalty or params.presence_penalty) and output_token_ids:
        counts = torch.bincount(torch.tensor(output_token_ids, dtype=torch.long),
                                minlength=out.numel())[:out.numel()].to(out.dtype)
        out -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0)
    return out


def _repetition_penalty(logits: torch.Tensor, penalty: float, seen: list[int]) -> None:
    """In place on `logits` [vocab]: divide the positive logits of `seen` tokens
    by `penalty`, multiply the negative ones."""
    ids = torch.unique(torch.tensor(seen, dtype=torch.long))
    values = logits[ids]
    logits[ids] = torch.where(values > 0, values / penalty, values * penalty)
