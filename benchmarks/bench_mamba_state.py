"""State memory of a Mamba request during a long decode, per retention policy.

A full + Mamba manager runs one request: a 1,024-token prompt, then 4,096
decoded tokens. Per step it records the blocks the request lists in the
Mamba group (its live state plus the checkpoints being written), the prompt
states it keeps held off the list until it ends (`get_retained_block_ids`)
and, at the end, how many boundary states stay cached for later hits, for checkpoint
intervals 1 (every boundary), 4 and 16.

    python benchmarks/bench_mamba_state.py [--out DIR] [--quick]
"""

from __future__ import annotations

import argparse

from common import add_common_args, prepare_out, write_result

from hybridkv import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheManager,
    MambaSpec,
    Request,
)


def run(interval: int, prompt_len: int, decode_len: int, block: int) -> dict:
    groups = [KVCacheGroupSpec(["attn"], FullAttentionSpec(block)),
              KVCacheGroupSpec(["mamba"], MambaSpec(block, checkpoint_interval=interval))]
    mgr = KVCacheManager(KVCacheConfig(4096, groups))
    req = Request("r", [3 + i % 500 for i in range(prompt_len)])
    assert mgr.allocate_slots(req, prompt_len) is not None
    req.num_computed_tokens = prompt_len
    held, retained = [], []
    for t in range(decode_len):
        req.append_output_token_ids(3 + t % 500)
        assert mgr.allocate_slots(req, 1) is not None
        req.num_computed_tokens += 1
        held.append(sum(1 for b in mgr.get_block_ids("r")[1] if b != mgr.null_block_id))
        retained.append(len(mgr.get_retained_block_ids("r")[1]))
    mgr.free(req)
    return {"max_mamba_blocks_held": max(held), "mean_mamba_blocks_held": sum(held) / len(held),
            "max_mamba_states_retained": max(retained),
            "states_cached_after": len(mgr.pool.cached[1]),
            "tokens": prompt_len + decode_len}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--decode-len", type=int, default=4096)
    ap.add_argument("--block-size", type=int, default=16)
    add_common_args(ap)
    args = ap.parse_args(argv)
    prepare_out(args.out)
    if args.quick:
        args.prompt_len, args.decode_len = 256, 256
    result = {}
    for interval in (1, 4, 16):
        result[str(interval)] = run(interval, args.prompt_len, args.decode_len, args.block_size)
        print(f"checkpoint every {interval:2d} boundaries: {result[str(interval)]}")
    print("wrote", write_result("mamba_state", {"by_checkpoint_interval": result,
                                                "args": vars(args)}, args.out))
    return result


if __name__ == "__main__":
    main()
