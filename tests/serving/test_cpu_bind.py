"""--cpu-bind: which cores the engine thread runs on, checked against the kernel's view."""

import asyncio
import os

import pytest

from hybridkv import LLM
from hybridkv.models.presets import build_preset_model
from hybridkv.serving.async_engine import AsyncEngine
from hybridkv.serving.cpu_bind import auto_cores, parse_cpu_bind

ALLOWED = sorted(os.sched_getaffinity(0))


@pytest.mark.parametrize("allowed, threads, want", [
    ([0, 1], 1, {0}), ([0, 1], None, {0}), ([0], 1, None), ([0, 1], 2, None),
    ([2, 3, 5, 7], 2, {2, 3}), ([0, 1, 2, 3], 0, {0}),
])
def test_auto_leaves_one_core_for_the_rest(allowed, threads, want):
    got = auto_cores(allowed, threads)
    assert (None if got is None else set(got)) == want


def test_parse_names_and_checks_the_cores():
    assert parse_cpu_bind("none", 1) is None and parse_cpu_bind(" None ", None) is None
    assert parse_cpu_bind("auto", 1) == auto_cores(ALLOWED, 1)
    assert parse_cpu_bind(str(ALLOWED[0]), None) == {ALLOWED[0]}
    if len(ALLOWED) > 1:
        spec = f"{ALLOWED[0]},{ALLOWED[1]}"
        assert parse_cpu_bind(spec, None) == set(ALLOWED[:2])
    for bad in ("", "x", "1-0", "-1", "0,,1", "auto,0"):
        with pytest.raises(ValueError, match="--cpu-bind"):
            parse_cpu_bind(bad, 1)
    with pytest.raises(ValueError, match="not available"):
        parse_cpu_bind(str(max(ALLOWED) + 1), 1)


def test_the_engine_thread_alone_is_bound():
    llm = LLM(build_preset_model("gemma3-tiny", seed=0), num_blocks=64, block_size=16)
    core = frozenset({ALLOWED[-1]})
    engine = AsyncEngine(llm, cpu_cores=core)
    seen = {}

    async def run():
        engine.start()
        for _ in range(100):  # the thread binds itself before it waits for commands
            seen["engine"] = os.sched_getaffinity(engine._thread.native_id)
            if seen["engine"] == core:
                break
            await asyncio.sleep(0.05)
        await engine.stop()

    asyncio.run(run())
    assert seen["engine"] == core
    assert sorted(os.sched_getaffinity(0)) == ALLOWED  # the calling thread is untouched
