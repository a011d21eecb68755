"""A hypothesis state machine driving KVCacheManager over hybrid configs.

Rules: add a request (sharing prefixes with earlier ones), look it up, admit
it (adopting the hit), prefill in chunks, decode (append + allocate), free,
preempt (free and restart from 0), evict chosen blocks, reset the cache.
After every step: `check_integrity()`, ref counts equal holders, the free
count equals blocks not held, and a lookup never returns more than
num_tokens - 1 or a length that is not a multiple of every block size.
"""

import math

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from hybridkv import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheManager,
    MambaSpec,
    Request,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
)

CONFIGS = {
    "full": [FullAttentionSpec(4)],
    "swa": [FullAttentionSpec(4), SlidingWindowSpec(4, sliding_window=6)],
    "swa_mixed": [FullAttentionSpec(8), SlidingWindowSpec(4, sliding_window=9)],
    "chunked": [FullAttentionSpec(4), ChunkedLocalAttentionSpec(4, attention_chunk_size=8)],
    "mamba": [FullAttentionSpec(4), MambaSpec(4)],
    "mamba_k2": [SlidingWindowSpec(4, sliding_window=5), MambaSpec(4, checkpoint_interval=2)],
    "three": [FullAttentionSpec(4), SlidingWindowSpec(8, sliding_window=12), MambaSpec(4)],
    "sinks": [SinkFullAttentionSpec(4, sink_len=4),
              SlidingWindowSpec(4, sliding_window=6, num_sink_tokens=3)],
}
PREFIXES = [[(7 * i + j) % 23 for j in range(48)] for i in range(3)]


class ManagerMachine(RuleBasedStateMachine):
    @initialize(config=st.sampled_from(sorted(CONFIGS)), num_blocks=st.integers(8, 40),
                policy=st.sampled_from(["lru", "hybrid"]))
    def setup(self, config, num_blocks, policy):
        specs = CONFIGS[config]
        groups = [KVCacheGroupSpec([f"g{i}"], s) for i, s in enumerate(specs)]
        self.mgr = KVCacheManager(KVCacheConfig(num_blocks, groups), eviction_policy=policy)
        self.align = math.lcm(*(s.block_size for s in specs))
        self.waiting, self.running, self.counter = [], [], 0

    @rule(prefix=st.integers(0, 2), cut=st.integers(1, 48), tail=st.lists(st.integers(0, 30),
                                                                          max_size=8))
    def add_request(self, prefix, cut, tail):
        self.counter += 1
        self.waiting.append(Request(f"r{self.counter}", PREFIXES[prefix][:cut] + tail))

    @precondition(lambda self: self.waiting)
    @rule(chunk=st.integers(1, 24))
    def admit(self, chunk):
        req = self.waiting[0]
        blocks, hit = self.mgr.get_computed_blocks(req)
        assert hit % self.align == 0 and hit <= req.num_tokens - 1
        n = min(chunk, req.num_tokens - hit)
        if self.mgr.allocate_slots(req, n, hit, blocks if hit else None) is not None:
            req.num_computed_tokens = hit + n
            self.running.append(self.waiting.pop(0))

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100), chunk=st.integers(1, 16), token=st.integers(0, 30))
    def step(self, i, chunk, token):
        req = self.running[i % len(self.running)]
        if req.num_computed_tokens == req.num_tokens:
            req.append_output_token_ids([token])
        n = min(chunk, req.num_tokens - req.num_computed_tokens)
        if self.mgr.allocate_slots(req, n) is not None:
            req.num_computed_tokens += n

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100))
    def finish(self, i):
        self.mgr.free(self.running.pop(i % len(self.running)))

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100))
    def preempt(self, i):
        req = self.running.pop(i % len(self.running))
        self.mgr.free(req)
        req.num_computed_tokens = 0
        self.waiting.insert(0, req)

    @rule(ids=st.lists(st.integers(0, 39), max_size=4))
    def evict(self, ids):
        self.mgr.evict_blocks([i for i in ids if i < self.mgr.pool.num_blocks])

    @rule()
    def reset(self):
        assert self.mgr.reset_prefix_cache() == (not self.running)

    @invariant()
    def consistent(self):
        if not hasattr(self, "mgr"):
            return
        self.mgr.check_integrity()
        held = {b.block_id for b in self.mgr.pool.blocks[1:] if b.ref_cnt > 0}
        assert self.mgr.num_free_blocks == self.mgr.pool.num_blocks - 1 - len(held)
        for req in self.running:
            ids = self.mgr.get_block_ids(req.request_id)
            for group_ids, m in zip(ids, self.mgr.coordinator.managers):
                assert len(group_ids) * m.block_size >= req.num_computed_tokens

    def teardown(self):
        if hasattr(self, "mgr"):
            for req in self.running:
                self.mgr.free(req)
            self.mgr.check_integrity()
            pinned = self.mgr.pool.num_pinned
            assert self.mgr.num_free_blocks == self.mgr.pool.num_blocks - 1 - pinned


TestManagerMachine = ManagerMachine.TestCase
TestManagerMachine.settings = __import__("hypothesis").settings(
    max_examples=150, stateful_step_count=40, deadline=None)


def test_closed_form_quiet_limits_equal_the_generic_search():
    """Each type's closed form equals the base class's search over num_skipped_blocks."""
    from hybridkv.kv_cache.managers.base import SingleTypeManager

    for name, specs in CONFIGS.items():
        groups = [KVCacheGroupSpec([f"g{i}"], s) for i, s in enumerate(specs)]
        mgr = KVCacheManager(KVCacheConfig(400, groups))
        req = Request("r", list(range(150)))
        for computed in range(0, 150, 7):
            assert mgr.allocate_slots(req, min(7, 150 - computed)) is not None
            req.num_computed_tokens = min(computed + 7, 150)
            for m in mgr.coordinator.managers:
                assert m.max_quiet_computed(req) == SingleTypeManager.max_quiet_computed(m, req), \
                    (name, type(m).__name__, computed)
