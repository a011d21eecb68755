"""A cluster in simulated time: real managers and schedulers, a real router.

Every instance runs the engine's scheduler (continuous batching, chunked
prefill, preemption) over a real KVCacheManager; its block events feed the
router's index (`hybridkv.serving.router.Router`, the code `hybridkv route`
runs), which routes each arrival. A step takes the time the cost model gives
for its tokens; tokens are drawn from a seeded stream instead of a model.

The cost model is calibrated from `bench_engine` (benchmarks/RESULTS.md,
"Gemma 3 1B dimensions" on this 2-core CPU): a 2,080-token prompt's first
token after about 24 s and a 32-token one's after about 0.8 s give a step cost
of 0.44 s plus 11.3 ms per scheduled token. Times are that machine's.
"""

from __future__ import annotations

import heapq
import random
import statistics
import time
from dataclasses import dataclass, field

from hybridkv.engine.sampling import SamplingParams
from hybridkv.engine.scheduler import ScheduledSeq, Scheduler, SeqState
from hybridkv.kv_cache.kv_cache_config import KVCacheConfig, KVCacheGroupSpec
from hybridkv.kv_cache.kv_cache_manager import KVCacheManager
from hybridkv.kv_cache.request import Request
from hybridkv.kv_cache.specs import FullAttentionSpec, KVCacheSpec, MambaSpec, SlidingWindowSpec
from hybridkv.serving.router.layout import CacheLayout
from hybridkv.serving.router.policy import DEFAULT_BALANCE
from hybridkv.serving.router.routing import Decision, Router
from hybridkv.tools.cluster_workload import Arrival, ClusterWorkload

BLOCK_SIZE = 16
WINDOW = 1024
# the configs of the pressure benchmark: block size 16, window 1,024
CONFIGS: dict[str, tuple[KVCacheSpec, ...]] = {
    "full": (FullAttentionSpec(BLOCK_SIZE),),
    "swa": (FullAttentionSpec(BLOCK_SIZE), SlidingWindowSpec(BLOCK_SIZE, sliding_window=WINDOW)),
    "mamba": (FullAttentionSpec(BLOCK_SIZE), MambaSpec(BLOCK_SIZE)),
}


@dataclass(frozen=True)
class CostModel:
    """Seconds a step takes: `step_s` plus `token_s` per scheduled token."""

    step_s: float = 0.44
    token_s: float = 0.0113
    source: str = ("bench_engine, Gemma 3 1B dimensions on a 2-core CPU (RESULTS.md): "
                   "0.44 s per step + 11.3 ms per token")

    def step_time(self, num_tokens: int) -> float:
        return self.step_s + self.token_s * num_tokens

    def prefill_time(self, num_tokens: int, budget: int) -> float:
        """Seconds to the first token of a prompt with `num_tokens` to compute,
        alone on an instance scheduling `budget` tokens per step."""
        steps, last = divmod(max(num_tokens, 1), budget)
        return steps * self.step_time(budget) + (self.step_time(last) if last else 0.0)

    def faster(self, factor: float) -> CostModel:
        return CostModel(self.step_s / factor, self.token_s / factor, self.source)


@dataclass
class InstanceShape:
    blocks_per_group: int = 1000  # a config with G groups gets G x this many blocks
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 2048
    eviction_policy: str = "hybrid"


@dataclass
class RequestRecord:
    kind: str
    arrival: float
    instance: str
    num_prompt_tokens: int
    first_token: float = -1.0
    num_cached_tokens: int = 0
    floor: float = 0.0  # its TTFT alone on an idle instance, with the tokens it reused


class SimInstance:
    """One serving instance: a scheduler over a real manager, busy one step at a time."""

    def __init__(self, name: str, config: KVCacheConfig, shape: InstanceShape,
                 cost: CostModel, router: Router) -> None:
        self.name = name
        self.kv = KVCacheManager(config, eviction_policy=shape.eviction_policy)
        self.scheduler = Scheduler(self.kv, max_num_seqs=shape.max_num_seqs,
                                   max_num_batched_tokens=shape.max_num_batched_tokens)
        self.cost = cost
        self.router = router
        self.events: list = []
        self.kv.pool.subscribe(self.events.append)
        router.add_backend(name, CacheLayout.from_config(config))
        self.batch: list[ScheduledSeq] | None = None
        self.busy_s = 0.0
        self.budget = shape.max_num_batched_tokens

    def start_step(self, now: float) -> float | None:
        """Schedule a step if there is work; returns when it ends."""
        if self.batch is not None or not self.scheduler.has_work():
            return None
        batch = self.scheduler.schedule()
        self.publish()
        if not batch:
            return None
        self.batch = batch
        dt = self.cost.step_time(sum(item.num_new for item in batch))
        self.busy_s += dt
        return now + dt

    def end_step(self) -> list[SeqState]:
        """The step's sequences that sampled a token."""
        batch, self.batch = self.batch, None
        assert batch is not None
        self.scheduler.finish_step(batch)
        return [item.seq for item in batch if item.samples]

    def publish(self) -> None:
        if self.events:
            self.router.apply_events(self.name, self.events)
            self.events.clear()


@dataclass
class RunResult:
    policy: str
    num_instances: int
    records: list[RequestRecord]
    busy_s: list[float]
    preemptions: int
    route_us: list[float] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def hit_rate(self) -> float:
        prompt = sum(r.num_prompt_tokens for r in self.records)
        return sum(r.num_cached_tokens for r in self.records) / prompt if prompt else 0.0

    @property
    def imbalance(self) -> float:
        mean = statistics.mean(self.busy_s)
        return max(self.busy_s) / mean if mean else 1.0

    def ttft(self, q: float) -> float:
        return _quantile([r.first_token - r.arrival for r in self.records], q)

    def ttft_floor(self, q: float) -> float:
        """The q-quantile of the requests' TTFT had each run alone on an idle
        instance (with the tokens it reused): no routing gets its p99 lower."""
        return _quantile([r.floor for r in self.records], q)


def _quantile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


class ClusterSim:
    """Runs one workload through N instances under one routing policy."""

    def __init__(self, config_name: str, workload: ClusterWorkload, policy: str, *,
                 shape: InstanceShape | None = None, cost: CostModel | None = None,
                 balance: float = DEFAULT_BALANCE, num_instances: int | None = None,
                 scale: int = 1, seed: int = 0) -> None:
        if config_name not in CONFIGS:
            raise ValueError(f"cluster config {config_name!r} is unknown; use one of "
                             f"{', '.join(CONFIGS)}")
        specs = CONFIGS[config_name]
        self.shape = shape or InstanceShape()
        self.cost = (cost or CostModel()).faster(scale)
        self.workload = workload
        self.policy = policy
        self.router = Router(policy, balance)
        n = workload.num_instances if num_instances is None else num_instances
        blocks = self.shape.blocks_per_group * len(specs) * scale + 1
        config = KVCacheConfig(blocks, [KVCacheGroupSpec([f"g{i}"], s)
                                        for i, s in enumerate(specs)])
        inst_shape = InstanceShape(self.shape.blocks_per_group, self.shape.max_num_seqs * scale,
                                   self.shape.max_num_batched_tokens * scale,
                                   self.shape.eviction_policy)
        self.instances = {f"i{k}": SimInstance(f"i{k}", config, inst_shape, self.cost,
                                               self.router) for k in range(n)}
        first = next(iter(self.instances.values()))
        if not first.kv.can_fit(workload.max_prompt_tokens(), inst_shape.max_num_batched_tokens):
            raise ValueError(f"{blocks} blocks per instance cannot hold the longest request "
                             f"({workload.max_prompt_tokens()} tokens)")
        self.rng = random.Random(seed)
        self._queue: list[tuple[float, int, str, object]] = []
        self._order = 0
        self._live: dict[str, tuple[Arrival, Decision, RequestRecord, SeqState]] = {}
        self.records: list[RequestRecord] = []
        self.route_us: list[float] = []

    def _push(self, when: float, kind: str, item: object) -> None:
        self._order += 1
        heapq.heappush(self._queue, (when, self._order, kind, item))

    def run(self) -> RunResult:
        t0 = time.perf_counter()
        for arrival in self.workload.open_arrivals():
            self._push(arrival.time, "arrive", arrival)
        while self._queue:
            now, _, kind, item = heapq.heappop(self._queue)
            if kind == "arrive":
                self._arrive(now, item)  # type: ignore[arg-type]
            else:
                self._step_done(now, item)  # type: ignore[arg-type]
        preemptions = sum(i.scheduler.stats.preemptions for i in self.instances.values())
        return RunResult(self.policy, len(self.instances), self.records,
                         [i.busy_s for i in self.instances.values()], preemptions,
                         self.route_us, time.perf_counter() - t0)

    def _arrive(self, now: float, arrival: Arrival) -> None:
        t0 = time.perf_counter()
        decision = self.router.route(arrival.prompt)
        self.route_us.append((time.perf_counter() - t0) * 1e6)
        inst = self.instances[decision.instance_id]
        self._order += 1
        request = Request(f"r{self._order}", arrival.prompt)
        seq = SeqState(request, SamplingParams(max_tokens=arrival.max_tokens), 0)
        record = RequestRecord(arrival.kind, now, inst.name, len(arrival.prompt))
        self._live[request.request_id] = (arrival, decision, record, seq)
        inst.scheduler.add(seq)
        self._start(inst, now)

    def _start(self, inst: SimInstance, now: float) -> None:
        end = inst.start_step(now)
        if end is not None:
            self._push(end, "step", inst)

    def _step_done(self, now: float, inst: SimInstance) -> None:
        for seq in inst.end_step():
            arrival, decision, record, _ = self._live[seq.request_id]
            if record.first_token < 0:
                record.first_token = now
                record.num_cached_tokens = seq.num_cached_tokens
                record.floor = self.cost.prefill_time(
                    record.num_prompt_tokens - seq.num_cached_tokens, inst.budget)
                self.router.first_token(decision)
            seq.request.append_output_token_ids(self.rng.randrange(3, 32000))
            if seq.num_output_tokens >= seq.params.max_tokens:
                inst.scheduler.finish(seq, "length")
                self._finish(now, seq)
        self._start(inst, now)

    def _finish(self, now: float, seq: SeqState) -> None:
        arrival, decision, record, _ = self._live.pop(seq.request_id)
        self.router.finished(decision)
        self.records.append(record)
        follow = self.workload.next_turn(arrival, seq.request.output_token_ids, now)
        if follow is not None:
            self._push(follow.time, "arrive", follow)
