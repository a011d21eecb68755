"""The cpu:// store: prefix queries, the byte bound and LRU order against a reference model.

Every test runs on both maps the store can have: the C table (`_codec.LruTable`) and
its Python reference (`lru.LruDict`, used when the C module is not built).
"""

import random
from collections import OrderedDict

import pytest

from hybridkv.store import CpuStore, codec
from hybridkv.store.cpu import ENTRY_OVERHEAD
from hybridkv.store.lru import LruDict


@pytest.fixture(autouse=True, params=["C", "python"])
def table(request, monkeypatch):
    """Which map CpuStore uses in the test."""
    if request.param == "C":
        if codec.EXTENSION_ERROR is not None:
            pytest.skip(f"hybridkv._native._codec not built: {codec.EXTENSION_ERROR}")
    else:
        monkeypatch.setattr("hybridkv.store.cpu.lru_table_class", lambda: LruDict)
    return request.param


def k(i):
    return b"key-%04d" % i


def v(i, n=10):
    return bytes([i % 251]) * n


def cost(i, n=10):
    return len(k(i)) + n + ENTRY_OVERHEAD


def test_prefix_get_contains_delete(table):
    s = CpuStore(1 << 20)
    assert isinstance(s._table, LruDict) == (table == "python")
    assert s.put([k(0), k(1), k(2)], [v(0), v(1), v(2)]) == 3
    assert s.get([k(0), k(1), k(2)]) == [v(0), v(1), v(2)]
    assert s.get([k(0), k(9), k(2)]) == [v(0)]  # stops at the first missing key
    assert s.get([k(9), k(0)]) == []
    assert s.contains([k(2), k(9), k(0)]) == [True, False, True]
    assert s.prefix_length([k(0), k(1), k(9), k(2)]) == 2
    assert s.delete([k(1), k(9)]) == 1
    assert s.prefix_length([k(0), k(1), k(2)]) == 1
    st = s.stats()
    assert st.keys == 2 and st.used_bytes == cost(0) + cost(2) and st.capacity_bytes == 1 << 20


def test_replacing_a_value_keeps_the_byte_count_exact():
    s = CpuStore(1 << 20)
    s.put([k(0)], [v(0, 10)])
    s.put([k(0)], [v(0, 30)])
    assert s.get([k(0)]) == [v(0, 30)]
    assert s.stats().used_bytes == cost(0, 30)


def test_bound_evicts_least_recent_and_a_run_loses_its_tail_first():
    s = CpuStore(4 * cost(0))
    s.put([k(0), k(1), k(2), k(3)], [v(i) for i in range(4)])
    s.put([k(4), k(5)], [v(4), v(5)])  # two more: the oldest run's tail goes (3, then 2)
    assert s.contains([k(i) for i in range(6)]) == [True, True, False, False, True, True]
    assert s.stats().used_bytes <= 4 * cost(0) and s.stats().evicted_keys == 2


def test_get_refreshes_contains_does_not():
    s = CpuStore(3 * cost(0))
    s.put([k(0)], [v(0)])
    s.put([k(1)], [v(1)])
    s.put([k(2)], [v(2)])
    assert s.contains([k(0)]) == [True]  # a query: 0 stays the oldest
    s.put([k(3)], [v(3)])
    assert s.contains([k(0), k(1)]) == [False, True]
    assert s.get([k(1)]) == [v(1)]  # a read: 1 becomes the newest
    s.put([k(4)], [v(4)])
    assert s.contains([k(1), k(2), k(3), k(4)]) == [True, False, True, True]


def test_value_larger_than_the_store_is_skipped():
    s = CpuStore(cost(1, 1) + 10)
    assert s.put([k(0), k(1)], [v(0, 1000), v(1, 1)]) == 1
    assert s.contains([k(0), k(1)]) == [False, True]


@pytest.mark.parametrize("bad", [0, -5, 1.5, True, "4GiB"])
def test_bad_capacity_is_named(bad):
    with pytest.raises(ValueError, match="size"):
        CpuStore(bad)


def test_put_needs_one_value_per_key():
    with pytest.raises(ValueError, match="2 keys but 1 values"):
        CpuStore(1000).put([k(0), k(1)], [v(0)])


def test_random_operations_match_a_reference_lru():
    """Brute-force oracle: an OrderedDict LRU with the same costs and run order."""
    rng = random.Random(7)
    capacity = 12 * cost(0, 20)
    s, ref = CpuStore(capacity), OrderedDict()

    def ref_evict():
        while sum(len(a) + len(b) + ENTRY_OVERHEAD for a, b in ref.items()) > capacity:
            ref.popitem(last=False)

    for _ in range(2000):
        op = rng.random()
        ids = [rng.randrange(40) for _ in range(rng.randrange(1, 6))]
        keys = [k(i) for i in ids]
        if op < 0.45:
            vals = [v(i, rng.randrange(1, 40)) for i in ids]
            s.put(keys, vals)
            for key, val in zip(reversed(keys), reversed(vals)):
                ref.pop(key, None)
                ref[key] = val
            ref_evict()
        elif op < 0.8:
            got = s.get(keys)
            want = []
            for key in keys:
                if key not in ref:
                    break
                want.append(ref[key])
            for key in reversed(keys[:len(want)]):
                ref.move_to_end(key)
            assert got == want
        elif op < 0.95:
            assert s.contains(keys) == [key in ref for key in keys]
        else:
            assert s.delete(keys) == len({key for key in keys if key in ref})
            for key in keys:
                ref.pop(key, None)
        assert s.keys() == list(ref)
        assert s.stats().used_bytes <= capacity
