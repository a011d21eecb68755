"""The pressure workloads, the replay driver and the clairvoyant yardstick of the policy grid."""

import warnings
from dataclasses import dataclass

import pytest

from hybridkv import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheManager,
    MambaSpec,
    SlidingWindowSpec,
)
from hybridkv.tools.ideal import ClairvoyantCache, PrefixIndex, reusable_blocks, reuse_ceiling
from hybridkv.tools.pressure_workloads import WORKLOADS, Draws, make_trace
from hybridkv.tools.replay import ManagerAdapter, replay


@dataclass(frozen=True)
class Req:
    request_id: str
    prompt: tuple
    output: tuple


def config(kind, num_blocks, block_size=4, window=8):
    groups = [KVCacheGroupSpec(["f"], FullAttentionSpec(block_size=block_size))]
    if kind == "swa":
        groups.append(KVCacheGroupSpec(["s"], SlidingWindowSpec(block_size=block_size,
                                                                sliding_window=window)))
    elif kind == "mamba":
        groups.append(KVCacheGroupSpec(["m"], MambaSpec(block_size=block_size)))
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_groups=groups)


def small_trace():
    """Three documents of 24 tokens, each asked twice (question of 3 tokens, 2 outputs)."""
    docs = [tuple(range(100 * d, 100 * d + 24)) for d in range(3)]
    order = [0, 1, 2, 0, 1, 2]
    return [Req(f"d{d}-q{i}", docs[d] + (900 + i, 901, 902), (7, 8)) for i, d in enumerate(order)]


# ---- workloads ---------------------------------------------------------------------

@pytest.mark.parametrize("shape", sorted(WORKLOADS))
def test_a_seed_gives_the_same_trace_and_another_seed_another(shape):
    a, b, c = make_trace(shape, 3), make_trace(shape, 3), make_trace(shape, 4)
    assert a.fingerprint() == b.fingerprint() != c.fingerprint()
    assert len({r.request_id for r in a.requests}) == len(a.requests)
    assert all(len(r.prompt) > 0 and len(r.output) > 0 for r in a.requests)


def test_multi_turn_turns_extend_the_whole_previous_turn():
    trace = make_trace("multi_turn", 0)
    by_id = {r.request_id: r for r in trace.requests}
    for r in trace.requests:
        s, t = r.request_id[1:].split("-t")
        if t != "0":
            prev = by_id[f"s{s}-t{int(t) - 1}"]
            assert r.prompt[:len(prev.prompt) + len(prev.output)] == prev.prompt + prev.output
    # round robin: every session's turn t comes before any session's turn t + 1
    turns = [int(r.request_id.split("-t")[1]) for r in trace.requests]
    assert turns == sorted(turns)


def test_agent_loop_steps_extend_the_agent_and_finished_agents_never_return():
    trace = make_trace("agent_loop", 1)
    last: dict = {}
    for r in trace.requests:
        agent = r.request_id.split("-")[0]
        if agent in last:
            prev = last[agent]
            assert r.prompt[:len(prev.prompt) + len(prev.output)] == prev.prompt + prev.output
        last[agent] = r
    agents = [r.request_id.split("-")[0] for r in trace.requests]
    for agent in set(agents):  # an agent's steps are contiguous in its slot's turns
        first, final = agents.index(agent), len(agents) - 1 - agents[::-1].index(agent)
        assert agents[first:final + 1].count(agent) == agents.count(agent)


def test_hot_cold_has_hot_documents_asked_often_and_cold_ones_rarely():
    trace = make_trace("hot_cold", 2)
    counts: dict[str, int] = {}
    for r in trace.requests:
        doc = r.request_id.split("-")[0]
        counts[doc] = counts.get(doc, 0) + 1
    hot = [n for d, n in counts.items() if d.startswith("h")]
    cold = [n for d, n in counts.items() if d.startswith("c")]
    assert min(hot) > max(cold) / 2 and sum(hot) > 50 and len(cold) > 40


def test_draws_are_in_range_and_repeatable():
    a, b = Draws("x", 1), Draws("x", 1)
    values = [a.int(3, 9) for _ in range(200)]
    assert values == [b.int(3, 9) for _ in range(200)] and set(values) == set(range(3, 10))
    assert a.tokens("t", 5) == b.tokens("t", 5) != a.tokens("u", 5)
    with pytest.raises(ValueError, match="nope"):
        make_trace("nope", 0)


# ---- prefix index ------------------------------------------------------------------

def test_prefix_index_targets_and_ceiling_by_hand():
    ix = PrefixIndex(small_trace(), 4)
    # a document is 6 blocks; the second question on it reuses them (27-token prompt:
    # capped at (27 - 1) // 4 = 6 blocks), the first reuses nothing
    assert ix.target == [0, 0, 0, 6, 6, 6]
    assert reusable_blocks(ix) == 18
    assert reuse_ceiling(ix) == pytest.approx(3 * 24 / (6 * 27))
    assert ix.junctions[3] == []  # nothing branches below block 6 of a document


def test_junctions_where_prompts_diverge():
    shared = tuple(range(12))
    reqs = [Req("a", shared + (50, 51, 52, 53, 54), (1,)),
            Req("b", shared + (60, 61, 62, 63, 64), (1,)),
            Req("c", shared + (50, 51, 52, 53, 70, 71), (1,))]
    ix = PrefixIndex(reqs, 4)
    assert ix.target == [0, 3, 4]
    assert ix.junctions[2] == [3]  # a and b part after block 3


# ---- replay and the clairvoyant cache ------------------------------------------------

@pytest.mark.parametrize("kind", ["full", "swa", "mamba"])
def test_ideal_with_an_ample_pool_reaches_the_ceiling(kind):
    reqs = small_trace()
    ix = PrefixIndex(reqs, 4)
    cache = ClairvoyantCache(reqs, kind, 400, 4, 8, index=ix)
    stats = replay(reqs, cache, max_running=2)
    assert stats.hit_rate == pytest.approx(reuse_ceiling(ix))
    assert cache.num_free_blocks == 399 and stats.finished == len(reqs)


@pytest.mark.parametrize("kind", ["full", "swa", "mamba"])
def test_the_real_manager_with_an_ample_pool_reaches_the_ceiling(kind):
    reqs = small_trace()
    manager = KVCacheManager(config(kind, 400))
    stats = replay(reqs, ManagerAdapter(manager), max_running=2)
    assert stats.hit_rate == pytest.approx(reuse_ceiling(PrefixIndex(reqs, 4)))
    assert manager.num_free_blocks == 399
    manager.check_integrity()


def test_ideal_keeps_what_is_needed_next_where_lru_loses_it():
    # 14 usable blocks; a request holds 8 (7 full + 1 partial), a document is 6. The
    # third request must evict one of the two cached documents: LRU drops d0, asked
    # next, and every later request then evicts the document asked right after it;
    # the ideal drops d1 (asked furthest ahead) and keeps d0 and then d2
    reqs = small_trace()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        lru = replay(reqs, ManagerAdapter(KVCacheManager(config("full", 15),
                                                         eviction_policy="lru")), max_running=1)
    ideal = replay(reqs, ClairvoyantCache(reqs, "full", 15, 4), max_running=1)
    assert lru.hit_tokens == 0
    assert ideal.hit_tokens == 48  # d0 and d2 asked again, d1 recomputed


@pytest.mark.parametrize("kind", ["full", "swa", "mamba"])
@pytest.mark.parametrize("num_blocks", [40, 60, 90])
def test_ideal_is_at_least_every_policy_on_a_small_trace(kind, num_blocks):
    trace = make_trace("long_doc", 0)
    reqs = [Req(r.request_id, r.prompt[:600] + r.prompt[-20:], r.output)
            for r in trace.requests[:30]]
    ideal = replay(reqs, ClairvoyantCache(reqs, kind, num_blocks * 2, 16, 128), max_running=2)
    for policy in ("lru", "hybrid"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            manager = KVCacheManager(config(kind, num_blocks * 2, 16, 128),
                                     eviction_policy=policy)
            real = replay(reqs, ManagerAdapter(manager), max_running=2)
        assert real.hit_rate <= ideal.hit_rate + 1e-9, policy
        assert manager.num_free_blocks == num_blocks * 2 - 1


def test_a_request_larger_than_the_pool_is_reported():
    reqs = [Req("big", tuple(range(100)), (1,))]
    with pytest.raises(ValueError, match="big"):  # the manager says so itself
        replay(reqs, ManagerAdapter(KVCacheManager(config("full", 10))), max_running=1)
    with pytest.raises(ValueError, match="big.*even alone"):  # the driver, for a cache
        # that only refuses
        replay(reqs, ClairvoyantCache(reqs, "full", 10, 4), max_running=1)
    with pytest.raises(ValueError, match="kind"):
        ClairvoyantCache(reqs, "nope", 10, 4)
