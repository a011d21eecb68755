"""A store instances share is shared in fact: separate instance processes on one
real Redis load each other's documents, whether or not the instance that
computed them still holds them; each block is written once; a store that does
not take writes never holds a step up."""

import json
import os
import random
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from hybridkv import LLM, SamplingParams
from hybridkv.store import CpuStore

BLOCK = 4
PARAMS = SamplingParams(max_tokens=4, ignore_eos=True)
pytestmark = pytest.mark.filterwarnings("ignore:prefix caching:RuntimeWarning")


def documents(seed=0, num_docs=3, length=56):
    rng = random.Random(seed)
    docs = [[rng.randrange(3, 500) for _ in range(length)] for _ in range(num_docs)]
    first = [d + [rng.randrange(3, 500) for _ in range(3)] for d in docs]  # d + question
    again = [d + [rng.randrange(3, 500) for _ in range(5)] for d in docs]  # d + another
    return first, again


def pool_for_one(name):
    """About one request's blocks: each document evicts the one before."""
    probe = LLM(name, block_size=BLOCK, num_blocks=4)
    longest = max(len(p) for batch in documents() for p in batch) + PARAMS.max_tokens
    need = next(n for n in range(4, 1000)
                if probe.kv.coordinator.max_blocks_held(longest, 2048) <= n - 1)
    return need * 5 // 4


INSTANCE = textwrap.dedent("""
    import json, sys
    from hybridkv import LLM, SamplingParams
    from hybridkv.kv_cache.request import Request
    name, url, num_blocks, prompts = sys.argv[1], sys.argv[2], int(sys.argv[3]), \\
        json.loads(sys.argv[4])
    llm = LLM(name, block_size=4, num_blocks=num_blocks, kv_store=url)
    outs = [llm.generate([p], SamplingParams(max_tokens=4, ignore_eos=True))[0]
            for p in prompts]
    llm.flush_kv_store()
    held = [llm.kv.get_computed_blocks(Request(f"probe{i}", p))[1]
            for i, p in enumerate(prompts)]
    stats = llm.kv_store_stats()
    print(json.dumps({"tokens": [o.output_token_ids for o in outs],
                      "external": [o.num_external_cached_tokens for o in outs],
                      "held": held, "written": stats.written_blocks,
                      "dropped": stats.dropped_blocks}), flush=True)
    sys.stdin.readline()  # stay up (holding the pool) until told to go
""")


class Instance:
    """An engine in its own process: serves `prompts` one by one, reports, waits."""

    def __init__(self, name, url, num_blocks, prompts):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", INSTANCE, name, url, str(num_blocks), json.dumps(prompts)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})

    def report(self):
        line = self.proc.stdout.readline()
        assert line, f"instance exited with {self.proc.wait(60)}"
        return json.loads(line)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.mark.parametrize("name", ["gemma3-tiny", "jamba-tiny"])
def test_instances_in_separate_processes_reuse_each_others_documents(name, redis_url):
    """The first instance runs in a process of its own and stays up holding its
    pool; the second is this process."""
    first, again = documents()
    num_blocks = pool_for_one(name)
    a = Instance(name, redis_url, num_blocks, first)
    try:
        seen_a = a.report()
        # the last document is still in the first instance's pool, the first is not
        assert seen_a["held"][-1] > 0 and seen_a["held"][0] == 0, seen_a["held"]
        b = LLM(name, block_size=BLOCK, num_blocks=num_blocks, kv_store=redis_url)
        outs = [b.generate([p], PARAMS)[0] for p in again[::-1]]  # the held one first
    finally:
        a.stop()
    ref = LLM(name, enable_prefix_caching=False, block_size=BLOCK, num_blocks=512)
    assert seen_a["tokens"] == [o.output_token_ids for o in ref.generate(first, PARAMS)]
    assert [o.output_token_ids for o in outs] == \
        [o.output_token_ids for o in ref.generate(again[::-1], PARAMS)]
    align = ref.kv.coordinator.alignment
    for prompt, out in zip(again[::-1], outs):
        document = len(prompt) - 5
        assert out.num_external_cached_tokens >= document // align * align, \
            ([o.num_external_cached_tokens for o in outs], align)
    assert seen_a["dropped"] == 0 and seen_a["written"] > 0


def test_each_block_is_written_once(redis_url, redis_server):
    first, again = documents(seed=1, num_docs=2)
    a = LLM("gemma3-tiny", block_size=BLOCK, num_blocks=512, kv_store=redis_url)
    a.generate(first, PARAMS)
    a.flush_kv_store()
    written = a.kv_store_stats().written_blocks
    a.generate(first, PARAMS)  # pool hits: nothing new to write
    a.flush_kv_store()
    assert a.kv_store_stats().written_blocks == written
    c = LLM("gemma3-tiny", block_size=BLOCK, num_blocks=512, kv_store=redis_url)
    outs = c.generate(again, PARAMS)  # the documents come from the store
    c.flush_kv_store()
    assert all(o.num_external_cached_tokens > 0 for o in outs)
    client = redis_server.client()
    # every key in the server was put by exactly one write of one instance
    assert client.dbsize() == written + c.kv_store_stats().written_blocks
    client.close()
    assert c.kv_store_stats().skipped_blocks > 0


def test_a_key_another_instance_stored_is_not_put_again(redis_url, redis_server):
    first, _ = documents(seed=2, num_docs=1)
    a = LLM("gemma3-tiny", block_size=BLOCK, num_blocks=512, kv_store=redis_url)
    b = LLM("gemma3-tiny", block_size=BLOCK, num_blocks=512, kv_store=redis_url)
    a.generate(first, PARAMS)
    a.flush_kv_store()
    b.generate(first, PARAMS)  # loads what it can; what it computes, a stored already
    b.flush_kv_store()
    client = redis_server.client()
    assert client.dbsize() == a.kv_store_stats().written_blocks + \
        b.kv_store_stats().written_blocks
    client.close()


class GatedStore(CpuStore):
    """A store whose puts wait until the test opens the gate (a server that hangs)."""

    inline_writes = False
    shared = True

    def __init__(self):
        super().__init__(64 << 20)
        self.gate = threading.Event()

    def put(self, keys, values):
        self.gate.wait(60)
        return super().put(keys, values)

    def put_blocks(self, layout, key_prefix, hashes, data):
        self.gate.wait(60)
        return super().put_blocks(layout, key_prefix, hashes, data)


@pytest.mark.filterwarnings("ignore:kv store.*backlog is full:RuntimeWarning")
def test_a_store_that_takes_no_writes_never_holds_a_step_up():
    first, _ = documents(seed=3)
    store = GatedStore()
    llm = LLM("gemma3-tiny", block_size=BLOCK, num_blocks=512, kv_store=store)
    llm.tier.writer.max_pending_bytes = 24 * llm.tier.layouts[0].data_bytes
    done = threading.Event()
    outs = []

    def run():
        outs.extend(llm.generate(first, PARAMS))
        done.set()

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    finished = done.wait(120)  # while every put hangs
    store.gate.set()
    worker.join(60)
    assert finished, "a step waited for the store"
    llm.flush_kv_store(30)
    stats = llm.kv_store_stats()
    assert stats.shared_writes and stats.dropped_blocks > 0 and stats.written_blocks > 0
    ref = LLM("gemma3-tiny", enable_prefix_caching=False, block_size=BLOCK, num_blocks=512)
    assert [o.output_token_ids for o in outs] == \
        [o.output_token_ids for o in ref.generate(first, PARAMS)]
    llm.close()


def test_shared_writes_follow_the_store_and_the_url():
    from hybridkv.store.url import open_store

    assert LLM("gemma3-tiny", block_size=BLOCK, num_blocks=64,
               kv_store="cpu://").tier.shared is None  # write on evict only
    assert open_store("redis://127.0.0.1:1/0").shared
    assert not open_store("redis://127.0.0.1:1/0?shared=0").shared
    with pytest.raises(ValueError, match="shared"):
        open_store("redis://127.0.0.1:1/0?shared=maybe")


def test_a_shared_directory_serves_blocks_another_store_wrote_after_it_opened(tmp_path):
    from hybridkv.store.file import RESCAN_SECONDS, FileStore

    a = FileStore(str(tmp_path), 1 << 20, shared=True)
    b = FileStore(str(tmp_path), 1 << 20, shared=True)
    a.put([b"k1", b"k2"], [b"v1", b"v2"])  # written as an object at once (shared)
    time.sleep(RESCAN_SECONDS * 1.2)
    assert b.contains([b"k1", b"k2", b"k3"]) == [True, True, False]
    assert b.get([b"k1", b"k2"]) == [b"v1", b"v2"]
    lone = FileStore(str(tmp_path / "lone"), 1 << 20)
    lone.put([b"k"], [b"v"])
    assert not os.listdir(tmp_path / "lone"), "unshared: blocks wait for a full object"


def test_engines_on_a_shared_directory_reuse_what_the_other_holds(tmp_path):
    first, again = documents(seed=5, num_docs=1)
    url = f"file://{tmp_path}/kv?size=64MiB&shared=1"
    a = LLM("gemma3-tiny", block_size=BLOCK, num_blocks=512, kv_store=url)
    b = LLM("gemma3-tiny", block_size=BLOCK, num_blocks=512, kv_store=url)
    a.generate(first, PARAMS)
    a.flush_kv_store()
    time.sleep(0.6)  # b reads the directory again when a key is missing
    out = b.generate(again, PARAMS)[0]
    ref = LLM("gemma3-tiny", enable_prefix_caching=False, block_size=BLOCK, num_blocks=512)
    assert out.output_token_ids == ref.generate(again, PARAMS)[0].output_token_ids
    align = ref.kv.coordinator.alignment
    assert out.num_external_cached_tokens >= (len(again[0]) - 5) // align * align
