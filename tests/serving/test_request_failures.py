"""The engine front with a scripted engine: one request failing alone
(`SeqState.error`) ends that request with a 500 while the others finish; an
engine loop that dies turns `/health` to 503 at once and reports its death."""

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace

import httpx

from hybridkv import SamplingParams
from hybridkv.serving.app import ServerState, build_app
from hybridkv.serving.async_engine import AsyncEngine, EngineDead, EngineRequest
from hybridkv.serving.completions import CompletionService, TextWorkers
from hybridkv.serving.prompts import PromptBuilder
from hybridkv.serving.protocol import CompletionRequest


@dataclass
class _Request:
    all_token_ids: list[int]
    num_prompt_tokens: int

    @property
    def output_token_ids(self):
        return self.all_token_ids[self.num_prompt_tokens:]


@dataclass
class _Seq:
    request: _Request
    params: SamplingParams
    arrival_time: float = 0.0
    finish_reason: str | None = None
    stop_reason: int | None = None
    num_cached_tokens: int = 0
    error: str | None = None
    logprobs: list = field(default_factory=list)

    @property
    def num_output_tokens(self):
        return len(self.request.output_token_ids)


class ScriptedLLM:
    """Each step adds token 7 to every request; the request with max_tokens 13
    fails alone at its second step; with `die`, step raises instead."""

    def __init__(self, die=False):
        self.seqs, self.die = {}, die

    def add_request(self, prompt, params, request_id, arrival_time):
        ids = list(prompt["prompt_token_ids"])
        self.seqs[request_id] = _Seq(_Request(ids, len(ids)), params)
        return self.seqs[request_id]

    def abort_request(self, request_id):
        return self.seqs.pop(request_id, None) is not None

    def has_unfinished_requests(self):
        return bool(self.seqs)

    def step(self):
        if self.die:
            raise RuntimeError("scripted engine fault")
        for rid, seq in list(self.seqs.items()):
            seq.request.all_token_ids.append(7)
            if seq.params.max_tokens == 13 and seq.num_output_tokens == 2:
                seq.finish_reason, seq.error = "error", "ValueError('bad logits')"
            elif seq.num_output_tokens == seq.params.max_tokens:
                seq.finish_reason = "length"
            if seq.finish_reason is not None:
                del self.seqs[rid]
        return 0


async def _collect(engine, requests):
    return [d async for d in engine.generate(requests)]


def test_a_request_failing_alone_gets_an_error_and_the_others_finish():
    async def run():
        engine = AsyncEngine(ScriptedLLM())
        engine.start()
        ok = [EngineRequest("ok", [1, 2], SamplingParams(max_tokens=4), stream=False)]
        bad = [EngineRequest("bad", [1, 2], SamplingParams(max_tokens=13), stream=False)]
        got = await asyncio.gather(_collect(engine, ok), _collect(engine, bad))
        await engine.stop()
        return got

    ok, bad = asyncio.run(run())
    assert ok[-1].finish_reason == "length" and ok[-1].token_ids == [7] * 4
    assert bad[-1].status == 500 and "bad logits" in bad[-1].error


def test_engine_death_turns_health_to_503_and_reports_it():
    async def run():
        deaths = []
        engine = AsyncEngine(ScriptedLLM(die=True), on_death=deaths.append)
        service = SimpleNamespace(workers=TextWorkers(1))
        state = ServerState(engine=engine, service=service, prompts=None, metrics=None,
                            model_name="m", layout={})
        app = build_app(state)
        engine.start()
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            assert (await client.get("/health")).status_code == 200
            try:  # the reader gets a 500 delta, or EngineDead if the loop died first
                deltas = await _collect(engine, [EngineRequest("a", [1], SamplingParams())])
                failure = (deltas[-1].status, deltas[-1].error)
            except EngineDead as err:
                failure = (500, str(err))
            health = await client.get("/health")
        await asyncio.sleep(0.05)
        return failure, health, deaths

    failure, health, deaths = asyncio.run(run())
    assert failure[0] == 500 and "scripted engine fault" in failure[1]
    assert health.status_code == 503
    assert "scripted engine fault" in health.json()["error"]["message"]
    assert len(deaths) == 1 and isinstance(deaths[0], RuntimeError)


class _BrokenTokenizer:
    def decode(self, ids, skip_special_tokens=True):
        raise RuntimeError("decode exploded")


def test_a_detokenizer_failure_ends_that_stream_alone():
    async def run():
        engine = AsyncEngine(ScriptedLLM())
        engine.start()
        service = CompletionService(engine, PromptBuilder(_BrokenTokenizer(), 100, 64), "m",
                                    max_live=8)
        body = CompletionRequest(prompt=[1, 2], max_tokens=3, stream=True)
        job = service._job(False, body, [[1, 2]], [None], [3], 0.0, "cmpl")
        deltas = engine.generate(job.requests)
        await service._accepted(deltas, 1, False)
        events = [e async for e in service._stream(job, deltas)]
        other = await _collect(engine, [EngineRequest("x", [1], SamplingParams(max_tokens=2),
                                                      stream=False)])
        await engine.stop()
        service.workers.close()
        return events, other

    events, other = asyncio.run(run())
    assert "decode exploded" in events[-1] and '"type": "server_error"' in events[-1]
    assert other[-1].finish_reason == "length"  # the engine goes on
