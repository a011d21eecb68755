"""Shared pieces of the engine tests."""

from hybridkv import LLM


def smallest_pool(model, num_tokens, chunk, block_size=8, **kwargs):
    """An engine whose pool barely fits one request of `num_tokens` tokens."""
    for num_blocks in range(4, 400):
        llm = LLM(model, block_size=block_size, num_blocks=num_blocks,
                  max_num_batched_tokens=chunk, **kwargs)
        if llm.kv.can_fit(num_tokens, chunk):
            return llm
    raise AssertionError("no pool size fits")
