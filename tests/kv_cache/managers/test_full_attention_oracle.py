"""Full-attention hits against a brute-force LRU model of the prefix cache.

The model knows only the documented rules: a full block is cached under its
whole prefix; a hit is the longest run of cached leading blocks, capped at
num_tokens - 1; a request takes the cached blocks of the data it is about
to compute that follow what it holds, up to the first one not cached, and
new blocks for the rest; new blocks take uncached free blocks first, then
evict the least recently released cached block; a request releases its
blocks tail first. It shares no code with the implementation.
"""

import random

import pytest

from hybridkv import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheManager, Request

pytestmark = pytest.mark.both_backends  # each test runs on the C and the Python backend


class LRUModel:
    def __init__(self, num_blocks, block_size):
        self.B = block_size
        self.num_uncached_free = num_blocks - 1
        self.cached = {}  # prefix tuple -> [holders, release stamp]
        self.held = {}  # rid -> list of prefix keys (None: block holds no cached data)
        self.clock = 0

    def num_free(self):
        return self.num_uncached_free + sum(1 for h, _ in self.cached.values() if h == 0)

    def hit(self, tokens):
        n, limit = 0, (len(tokens) - 1) // self.B
        while n < limit and tuple(tokens[:(n + 1) * self.B]) in self.cached:
            n += 1
        return n

    def allocate(self, rid, tokens, num_hit_blocks, num_tokens):
        held = self.held.get(rid, [])
        hit_keys = [tuple(tokens[:(i + 1) * self.B]) for i in range(num_hit_blocks)]
        shared = []  # cached blocks of what is about to be computed, in a row
        for i in range(len(held) + len(hit_keys), min(-(-num_tokens // self.B),
                                                      len(tokens) // self.B)):
            key = tuple(tokens[:(i + 1) * self.B])
            if key not in self.cached:
                break
            shared.append(key)
        taken = hit_keys + shared
        new = -(-num_tokens // self.B) - len(held) - len(taken)
        evictable = sum(1 for k in taken if self.cached[k][0] == 0)
        if max(new, 0) + evictable > self.num_free():
            return False
        for k in taken:
            self.cached[k][0] += 1
        held = self.held[rid] = held + taken
        for _ in range(max(new, 0)):
            self._take_block()
            held.append("pending")
        for i in range(num_tokens // self.B):
            if held[i] == "pending":
                key = tuple(tokens[:(i + 1) * self.B])
                if key in self.cached:
                    held[i] = None  # another block caches it already
                else:
                    self.cached[key] = [1, None]
                    held[i] = key
        return True

    def _take_block(self):
        if self.num_uncached_free:
            self.num_uncached_free -= 1
            return
        victim = min((s, k) for k, (h, s) in self.cached.items() if h == 0)[1]
        del self.cached[victim]

    def free(self, rid):
        for key in reversed(self.held.pop(rid, [])):
            if key is None or key == "pending":
                self.num_uncached_free += 1
                continue
            entry = self.cached[key]
            entry[0] -= 1
            if entry[0] == 0:
                entry[1] = self.clock
                self.clock += 1


def allocate(mgr, running, req, *args):
    """Whether allocate_slots succeeded; it raises (never fits) only when no other
    request holds blocks."""
    try:
        return mgr.allocate_slots(req, *args) is not None
    except ValueError:
        assert set(running) <= {req.request_id}
        return False


def run_workload(seed, block_size=4, num_blocks=40):
    rng = random.Random(seed)
    docs = [[rng.randrange(50) for _ in range(40)] for _ in range(3)]
    spec = FullAttentionSpec(block_size)
    mgr = KVCacheManager(KVCacheConfig(num_blocks, [KVCacheGroupSpec(["l"], spec)]),
                         eviction_policy="lru", warn_repeated_misses=False)
    model = LRUModel(num_blocks, block_size)
    running = {}
    for step in range(80):
        if running and rng.random() < 0.4:
            rid = rng.choice(sorted(running))
            req = running.pop(rid)
            mgr.free(req)
            model.free(rid)
        else:
            doc = rng.choice(docs)
            tail = [rng.randrange(50) for _ in range(rng.randrange(6))]
            tokens = doc[:rng.randrange(1, 40)] + tail
            req = Request(f"r{step}", tokens)
            blocks, n = mgr.get_computed_blocks(req)
            assert n == model.hit(tokens) * block_size, (seed, step)
            ok = allocate(mgr, running, req, len(tokens) - n, n, blocks)
            assert ok == model.allocate(req.request_id, tokens, n // block_size, len(tokens))
            if ok:
                req.num_computed_tokens = len(tokens)
                running[req.request_id] = req
                for _ in range(rng.randrange(6)):  # a few decode steps
                    req.append_output_token_ids([rng.randrange(50)])
                    if not allocate(mgr, running, req, 1):
                        assert not model.allocate(req.request_id, req.all_token_ids, 0,
                                                  req.num_tokens)
                        req.all_token_ids.pop()
                        break
                    assert model.allocate(req.request_id, req.all_token_ids, 0, req.num_tokens)
                    req.num_computed_tokens += 1
        assert mgr.num_free_blocks == model.num_free(), (seed, step)
        mgr.check_integrity()
    for req in running.values():
        mgr.free(req)
    assert mgr.num_free_blocks == num_blocks - 1


@pytest.mark.parametrize("seed", range(40))
def test_full_attention_hits_match_the_lru_model(seed):
    run_workload(seed, block_size=[1, 2, 4, 8][seed % 4], num_blocks=[12, 25, 40][seed % 3])
