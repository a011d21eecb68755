"""The KV tier on the manager's C fast path (hybridkv._native._fastpath, which calls the
pool's eviction listeners itself) and on its Python reference (HYBRIDKV_DISABLE_FASTPATH=1):
the same hits, the same blocks written in the same order, the same store contents."""

import json
import os
import random
import subprocess
import sys

import pytest

from hybridkv import FullAttentionSpec, MambaSpec, SlidingWindowSpec
from hybridkv.kv_cache import fastpath
from hybridkv.store import CpuStore
from tests.store.sim import SimEngine

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = {
    "full": [FullAttentionSpec(4)],
    "full+swa": [FullAttentionSpec(4), SlidingWindowSpec(4, sliding_window=10)],
    "full+mamba": [FullAttentionSpec(4), MambaSpec(4)],
}


def digest() -> dict:
    """Per config: every admission's (hit, from the store), the written and loaded
    blocks per group, and the store's keys (least recent first)."""
    out = {}
    for name, specs in CONFIGS.items():
        rng = random.Random(11)
        docs = [[rng.randrange(60) for _ in range(rng.randrange(20, 70))] for _ in range(5)]
        eng = SimEngine(specs, num_blocks=24 * len(specs), store=CpuStore(1 << 22))
        hits = [eng.run(rng.choice(docs) + [rng.randrange(60)]) for _ in range(40)]
        eng.tier.flush()
        stats = eng.tier.stats()
        out[name] = {"hits": hits, "written": [g.written_blocks for g in stats.groups],
                     "loaded": [g.loaded_blocks for g in stats.groups],
                     "keys": [k.hex() for k in eng.tier.store.keys()]}
    return out


@pytest.mark.filterwarnings("ignore:prefix caching:RuntimeWarning")
def test_the_tier_gives_the_same_on_the_fast_path_and_the_python_reference():
    if fastpath.native is None:
        pytest.skip(f"C fast path not in use: {fastpath.NATIVE_ERROR}")
    with_c = json.loads(json.dumps(digest()))
    env = {**os.environ, fastpath.DISABLE_ENV: "1", "PYTHONPATH": ROOT,
           "PYTHONWARNINGS": "ignore"}
    run = subprocess.run([sys.executable, "-c", "import json; from tests.store."
                          "test_tier_fastpath import digest; print(json.dumps(digest()))"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    reference = json.loads(run.stdout)
    assert with_c == reference
    assert all(sum(d["loaded"]) > 0 and sum(d["written"]) > 0 for d in with_c.values())
