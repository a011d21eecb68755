"""Pieces of the server without HTTP: prompts without a tokenizer, error params,
incremental text, the layout, and the engine front driven directly."""

import asyncio
import random

import pytest

from hybridkv import LLM, SamplingParams
from hybridkv.models.presets import build_preset_model
from hybridkv.serving.async_engine import AsyncEngine, EngineDead, EngineRequest
from hybridkv.serving.detokenizer import IncrementalText, final_text
from hybridkv.serving.errors import APIError, param_of
from hybridkv.serving.layout import kv_cache_layout
from hybridkv.serving.metrics import ServerMetrics
from hybridkv.serving.prompts import PromptBuilder
from hybridkv.serving.protocol import ChatMessage


@pytest.fixture(scope="module")
def llm():
    return LLM("gemma3-tiny", num_blocks=256, block_size=16)


def test_without_a_tokenizer_text_and_chat_are_refused_naming_the_field():
    prompts = PromptBuilder(None, vocab_size=512, max_model_len=128)
    assert prompts.completion_prompts([1, 2, 3]) == [[1, 2, 3]]
    with pytest.raises(APIError) as err:
        prompts.completion_prompts("hello")
    assert err.value.status == 400 and err.value.param == "prompt"
    with pytest.raises(APIError) as err:
        prompts.completion_prompts([[1, 2], "x"])
    assert err.value.param == "prompt[1]"
    with pytest.raises(APIError) as err:
        prompts.chat_prompt([ChatMessage(role="user", content="hi")])
    assert err.value.param == "messages"
    with pytest.raises(APIError) as err:
        prompts.check_stop("###")
    assert err.value.param == "stop"


def test_output_limits():
    prompts = PromptBuilder(None, vocab_size=512, max_model_len=100)
    assert prompts.max_tokens(None, 90, prompt_param="prompt", limit_param="max_tokens",
                              default=16) == 10
    with pytest.raises(APIError, match="at most 10") as err:
        prompts.max_tokens(11, 90, prompt_param="prompt", limit_param="max_tokens", default=16)
    assert err.value.param == "max_tokens"
    with pytest.raises(APIError) as err:
        prompts.max_tokens(None, 100, prompt_param="messages", limit_param="max_tokens",
                           default=16)
    assert err.value.param == "messages"


@pytest.mark.parametrize("loc, param", [
    (("body", "messages", 2, "role"), "messages[2].role"),
    (("prompt", "list[int]", 3), "prompt[3]"),
    (("stream_options", "include_usage"), "stream_options.include_usage"),
    ((), None),
])
def test_param_names(loc, param):
    assert param_of(loc) == param


def test_streamed_pieces_join_to_the_final_text(llm):
    tokenizer = llm.tokenizer
    rng = random.Random(1)
    ids = [rng.randrange(3, 512) for _ in range(40)]
    full = tokenizer.decode(ids, skip_special_tokens=True)
    stop = full[len(full) // 2:len(full) // 2 + 3]
    # the engine stops at the first token whose text completes the stop string
    end = next(n for n in range(1, 41)
               if stop in tokenizer.decode(ids[:n], skip_special_tokens=True))
    ids = ids[:end]
    expected = final_text(tokenizer, ids, stop)
    assert expected == full[:full.find(stop)]
    inc = IncrementalText(tokenizer, [stop])
    pieces = [inc.push(ids[i:i + 2]) for i in range(0, end - 1, 2)]
    pieces.append(inc.push(ids[len(inc.token_ids):], finished=True, stop_reason=stop))
    assert "".join(pieces) == expected
    assert sum(map(bool, pieces)) > 1, "text arrives in several pieces"


def test_layout_lists_every_group(llm):
    layout = kv_cache_layout(llm, "m", "host:1")
    assert [g["group_id"] for g in layout["groups"]] == list(range(4))
    assert layout["hash_block_size"] == llm.kv.hash_block_size
    assert {g["type"] for g in layout["groups"]} == {"sliding_window", "full_attention"}


def test_engine_front_streams_the_generate_tokens_and_aborts(llm):
    reference = LLM("gemma3-tiny", num_blocks=256, block_size=16)
    prompts = [[random.Random(s).randrange(3, 512) for _ in range(30)] for s in range(4)]
    params = SamplingParams(max_tokens=6)
    want = [o.output_token_ids for o in reference.generate(prompts, params)]
    metrics = ServerMetrics("gemma3-tiny", llm)
    engine = AsyncEngine(llm, metrics=metrics)

    async def run():
        engine.start()
        got = [[] for _ in prompts]
        deltas = engine.generate([EngineRequest(f"r{i}", p, params)
                                  for i, p in enumerate(prompts)])
        async for delta in deltas:
            got[delta.index].extend(delta.token_ids)
        long = engine.generate([EngineRequest("long", prompts[0],
                                              SamplingParams(max_tokens=200, ignore_eos=True))])
        async for delta in long:
            if delta.token_ids:
                break
        await long.aclose()  # the reader leaves: the request is aborted
        for _ in range(200):
            await asyncio.sleep(0.01)
            if not llm.has_unfinished_requests():
                break
        await engine.stop()
        return got

    assert asyncio.run(run()) == want
    assert engine.num_live == 0
    assert llm.kv.num_free_blocks == llm.config.num_blocks - 1 - llm.kv.pool.num_pinned
    llm.kv.check_integrity()


def test_engine_front_delivers_each_step_as_one_batch_without_an_event_loop(llm):
    # the engine process's mode: no event loop, every step's deltas in one call of `deliver`
    import threading

    reference = LLM("gemma3-tiny", num_blocks=256, block_size=16)
    prompts = [[random.Random(s).randrange(3, 512) for _ in range(30)] for s in range(3)]
    params = SamplingParams(max_tokens=5, ignore_eos=True)
    want = [o.output_token_ids for o in reference.generate(prompts, params)]
    batches, done = [], threading.Event()

    def deliver(replies):
        batches.append(replies)
        if sum(d.finish_reason is not None for b in batches for _, d in b) == len(prompts):
            done.set()

    engine = AsyncEngine(llm, deliver=deliver)
    engine.start()
    engine.submit([EngineRequest(f"d{i}", p, params) for i, p in enumerate(prompts)], "job")
    assert done.wait(60)
    engine.close()
    got = [[] for _ in prompts]
    for batch in batches:
        assert len({d.index for _, d in batch}) == len(batch)  # one delta per sequence
        for key, delta in batch:
            assert key == "job"
            got[delta.index].extend(delta.token_ids)
    assert got == want
    assert not llm.has_unfinished_requests()
    llm.kv.check_integrity()


def test_engine_front_refuses_what_the_pool_cannot_hold():
    small = LLM(build_preset_model("gemma3-tiny", seed=0), num_blocks=8, block_size=16)
    engine = AsyncEngine(small)

    async def run():
        engine.start()
        deltas = engine.generate([EngineRequest("big", list(range(3, 400)),
                                                SamplingParams(max_tokens=2))])
        first = await anext(deltas)
        await deltas.aclose()
        await engine.stop()
        return first

    first = asyncio.run(run())
    assert first.error is not None and "pool" in first.error and first.status == 400
    assert engine.num_live == 0


def test_an_engine_failure_reaches_every_reader_and_later_requests(monkeypatch):
    broken = LLM(build_preset_model("gemma3-tiny", seed=0), num_blocks=64, block_size=16)
    monkeypatch.setattr(broken, "step", lambda: (_ for _ in ()).throw(RuntimeError("boom")))
    engine = AsyncEngine(broken)

    async def run():
        engine.start()
        deltas = engine.generate([EngineRequest("a", [5, 6, 7], SamplingParams(), stream=False)])
        failed = await anext(deltas)
        await deltas.aclose()
        with pytest.raises(EngineDead):
            async for _ in engine.generate([EngineRequest("b", [5], SamplingParams())]):
                pass
        await engine.stop()
        return failed

    failed = asyncio.run(run())
    assert failed.status == 500 and "boom" in failed.error
    assert not engine.is_running and engine.num_live == 0


def test_a_chat_stream_sends_its_role_chunk_with_the_first_token():
    from hybridkv.engine.sampling import SamplingParams as Params
    from hybridkv.serving.async_engine import Delta
    from hybridkv.serving.choices import Job, ResponseBuilder
    from hybridkv.serving.completions import CompletionService, TextWorkers
    from hybridkv.serving.protocol import ChatCompletionRequest

    service = CompletionService.__new__(CompletionService)
    service.builder, service.workers = ResponseBuilder(None, "m"), TextWorkers(1)
    body = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}])
    job = Job(chat=True, body=body, prompts=[[1, 2]], prompt_texts=[None], id="c",
              requests=[EngineRequest("r", [1, 2], Params(max_tokens=2))])
    produced = []

    async def deltas():  # the engine: the first token comes after the prefill
        produced.append(5)
        yield Delta(0, [5])
        yield Delta(0, [6], finish_reason="length")

    async def run():
        events = []
        async for event in service._stream(job, deltas()):
            events.append((event, list(produced)))
        return events

    events = asyncio.run(run())
    service.workers.close()
    first, seen = events[0]
    assert '"role":"assistant"' in first and seen == [5]  # not before the first token
    later = [e for e, _ in events[1:]]
    assert len(later) == 3 and all('"role":"assistant"' not in e for e in later)
    assert '"finish_reason":"length"' in later[1] and later[-1] == "data: [DONE]\n\n"
