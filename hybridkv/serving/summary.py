"""The startup summary `hybridkv serve` logs once the engine is built.

Example (gemma3-tiny, default pool)::

    model gemma3-tiny: 4 layers (sliding_window x3, full_attention x1)
    KV cache groups: 0 sliding_window (1 layer, window 32), 1 sliding_window (1 layer,
      window 32), 2 sliding_window (1 layer, window 32), 3 full_attention (1 layer)
    pool: 16384 blocks of 16 tokens, 64.0 MiB; one request of up to 255840 tokens fits
    max model length 4096; prefix caching on; eviction policy hybrid
    fast paths: block hashing C extension (...); KV cache fast path C extension
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from hybridkv.serving.layout import group_type

MAX_TOKENS_PROBED = 1 << 24


def startup_summary(llm: Any, model_name: str, max_model_len: int, eviction_policy: str) -> str:
    """Lines describing the model, its KV cache and the engine's options."""
    from hybridkv.kv_cache.fastpath import fastpath_backend
    from hybridkv.kv_cache.hashing import hashing_backend

    groups = llm.config.kv_cache_groups
    layers: Counter[str] = Counter()
    for group in groups:
        layers[group_type(group.kv_cache_spec)] += len(group.layer_names)
    kinds = ", ".join(f"{kind} x{count}" for kind, count in layers.items())
    caching = "on" if llm.kv.enable_caching else "off"
    return "\n".join([
        f"model {model_name}: {sum(layers.values())} layers ({kinds})",
        "KV cache groups: " + ", ".join(_group(gid, g) for gid, g in enumerate(groups)),
        f"pool: {llm.config.num_blocks} blocks of {llm.kv.hash_block_size} tokens, "
        f"{_mib(llm.config.total_bytes)}; one request of up to "
        f"{tokens_that_fit(llm)} tokens fits",
        f"max model length {max_model_len}; prefix caching {caching}; eviction policy "
        f"{eviction_policy}",
        f"fast paths: block hashing {hashing_backend().describe()}; KV cache fast path "
        f"{fastpath_backend().describe()}"])


def tokens_that_fit(llm: Any) -> int:
    """The longest request (prompt + output tokens) the whole pool can hold."""
    chunk = llm.scheduler.max_num_batched_tokens
    low, high = 0, MAX_TOKENS_PROBED
    while low < high:  # the largest n with can_fit(n)
        mid = (low + high + 1) // 2
        if llm.kv.can_fit(mid, chunk):
            low = mid
        else:
            high = mid - 1
    return low


def _group(gid: int, group: Any) -> str:
    spec = group.kv_cache_spec
    n = len(group.layer_names)
    extra = f", window {spec.sliding_window}" if hasattr(spec, "sliding_window") else ""
    return f"{gid} {group_type(spec)} ({n} layer{'s' if n != 1 else ''}{extra})"


def _mib(num_bytes: int) -> str:
    return f"{num_bytes / (1 << 20):.1f} MiB"
