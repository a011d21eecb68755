"""The bad-input catalogue: every row is a call that must fail cleanly and change nothing.

Each row gives the call, the exception type, a regex the message must match,
naming the bad value, and is checked against a snapshot of every structure a
call could touch: a busy manager (full + sliding window + Mamba, one request running,
cached blocks, a pending hit), its requests, an engine that already served a
prompt, the global registries, the checkpoint folders and the working
directory. CLI rows must print exactly one line to stderr, no traceback, and
exit non-zero; two of them run as real processes.
"""

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass

import pytest
import torch

from hybridkv import (
    LLM,
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheManager,
    MambaSpec,
    Request,
    SamplingParams,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
    compute_block_hashes,
)
from hybridkv.kv_cache.eviction import EVICTION_POLICIES
from hybridkv.kv_cache.managers import SPEC_TO_MANAGER
from hybridkv.models.presets import PRESETS, build_preset_model
from hybridkv.models.registry import RUNNERS
from hybridkv.testing import state_snapshot
from hybridkv.tools.cli import main as cli_main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class CliError(Exception):
    """A CLI run exited non-zero; the message is its stderr."""


def _check_cli_output(code, err: str) -> None:
    if code in (0, None):
        return
    assert "Traceback" not in err and err.count("\n") == 1 and err.strip(), \
        f"not a one-line error: {err!r}"
    raise CliError(f"exit {code}: {err.strip()}")


def cli(*args: str) -> None:
    """`hybridkv ARGS` in this process."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = cli_main(list(args))
        except SystemExit as e:
            code = e.code
    _check_cli_output(code, err.getvalue())


def cli_process(*args: str) -> None:
    """`python -m hybridkv.tools.cli ARGS` as its own process."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    done = subprocess.run([sys.executable, "-m", "hybridkv.tools.cli", *args], capture_output=True,
                          text=True, env=env, timeout=300)
    _check_cli_output(done.returncode, done.stderr)


# ---- the world the rows act on ---------------------------------------------------


@dataclass
class World:
    kv: KVCacheManager
    running: Request  # holds blocks
    finished: Request  # freed; its blocks stay cached
    query: Request  # shares the finished prefix: a pending hit
    hit: object
    num_hit: int
    llm: LLM
    ckpt: str  # folder of checkpoint folders

    def requests(self):
        return [self.running, self.finished, self.query]


def busy_manager():
    groups = [KVCacheGroupSpec(["full"], FullAttentionSpec(4)),
              KVCacheGroupSpec(["swa"], SlidingWindowSpec(4, sliding_window=6)),
              KVCacheGroupSpec(["mamba"], MambaSpec(4))]
    kv = KVCacheManager(KVCacheConfig(40, groups))
    finished = Request("done", list(range(3, 23)))
    assert kv.allocate_slots(finished, 20) is not None
    finished.num_computed_tokens = 20
    kv.free(finished)
    running = Request("a", list(range(50, 64)))
    assert kv.allocate_slots(running, 10) is not None
    running.num_computed_tokens = 10
    query = Request("q", list(range(3, 23)) + [99, 98])
    hit, num_hit = kv.get_computed_blocks(query)
    assert num_hit == 20
    return kv, running, finished, query, hit, num_hit


@pytest.fixture(scope="module")
def engine():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    llm = LLM(build_preset_model("gemma3-tiny", seed=0), block_size=4, num_blocks=64)
    llm.generate([list(range(3, 30))], SamplingParams(max_tokens=2))
    yield llm
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    config = build_preset_model("gemma3-tiny", seed=0).config
    for name in ("no_config", "garbage_config", "list_config", "bert", "no_weights",
                 "garbage_weights"):
        (root / name).mkdir()
    (root / "garbage_config" / "config.json").write_text("{model_type: gemma3")
    (root / "list_config" / "config.json").write_text("[1, 2]")
    (root / "bert" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    config.to_json_file(str(root / "no_weights" / "config.json"))
    config.to_json_file(str(root / "garbage_weights" / "config.json"))
    (root / "garbage_weights" / "model.safetensors").write_bytes(b"\xff" * 64)
    (root / "traces").mkdir()
    (root / "traces" / "bad.jsonl").write_text('{"prompt": [1, 2]}\n{"prompt": [1, -5]}\n')
    return str(root)


@pytest.fixture
def world(engine, checkpoints, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # output folders a row might leave show up here
    return World(*busy_manager(), engine, checkpoints)


def world_snapshot(w: World) -> dict:
    llm = w.llm
    files = sorted((os.path.relpath(os.path.join(d, f), w.ckpt),
                    os.path.getsize(os.path.join(d, f)))
                   for d, _, names in os.walk(w.ckpt) for f in names)
    return {
        "manager": state_snapshot(w.kv),
        "requests": [(r.request_id, list(r.all_token_ids), r.num_computed_tokens)
                     for r in w.requests()],
        "hit": (w.hit.get_block_ids(), w.num_hit),
        "engine": (state_snapshot(llm.kv), len(llm.scheduler.waiting),
                   len(llm.scheduler.running), llm.stats, llm._counter),
        "registries": (dict(SPEC_TO_MANAGER), dict(EVICTION_POLICIES), dict(RUNNERS),
                       dict(PRESETS)),
        "checkpoints": files,
        "working directory": sorted(os.listdir(".")),
    }


# ---- the catalogue ---------------------------------------------------------------

G = [KVCacheGroupSpec(["x"], FullAttentionSpec(4))]
SIM = ("simulate", "--model", "gemma-3-27b", "--memory", "1GiB", "--trace", "few-shot")

ROWS = [
    # specs and configs
    ("spec block_size 0", lambda w: FullAttentionSpec(0), ValueError, r"block_size.* 0"),
    ("spec block_size float", lambda w: FullAttentionSpec(2.5), ValueError, r"block_size.*2\.5"),
    ("spec block_size str", lambda w: MambaSpec("4"), ValueError, r"block_size.*'4'"),
    ("negative window", lambda w: SlidingWindowSpec(4, sliding_window=-3), ValueError,
     r"sliding_window.*-3"),
    ("negative sinks", lambda w: SlidingWindowSpec(4, sliding_window=8, num_sink_tokens=-1),
     ValueError, r"num_sink_tokens.*-1"),
    ("chunk not a multiple of block", lambda w: ChunkedLocalAttentionSpec(
        4, attention_chunk_size=6), ValueError, r"attention_chunk_size \(6\).*block_size \(4\)"),
    ("sink_len not a multiple of block", lambda w: SinkFullAttentionSpec(4, sink_len=6),
     ValueError, r"sink_len \(6\)"),
    ("checkpoint interval 0", lambda w: MambaSpec(4, checkpoint_interval=0), ValueError,
     r"checkpoint_interval.* 0"),
    ("zero state shape", lambda w: MambaSpec(4, shapes=((0,),)), ValueError,
     r"shapes.*\(\(0,\),\)"),
    ("unknown dtype", lambda w: FullAttentionSpec(4, dtype="float13"), ValueError, r"float13"),
    ("pool of one block", lambda w: KVCacheConfig(1, G), ValueError, r"num_blocks.* 1$"),
    ("huge pool", lambda w: KVCacheConfig(2**31, G), ValueError, r"num_blocks.*2147483648"),
    ("no groups", lambda w: KVCacheConfig(8, []), ValueError, r"kv_cache_groups"),
    ("group without a spec", lambda w: KVCacheGroupSpec(["x"], "full"), ValueError,
     r"kv_cache_spec.*str"),
    ("zero memory budget", lambda w: KVCacheConfig.from_layer_specs(
        {"x": FullAttentionSpec(4)}, 0), ValueError, r"kv_cache_memory_bytes.* 0"),
    ("negative memory budget", lambda w: KVCacheConfig.from_layer_specs(
        {"x": FullAttentionSpec(4)}, -1), ValueError, r"kv_cache_memory_bytes.*-1"),
    ("budget below two blocks", lambda w: KVCacheConfig.from_layer_specs(
        {"x": FullAttentionSpec(4)}, 10), ValueError, r"kv_cache_memory_bytes=10 buys 0"),
    ("mismatched block sizes", lambda w: KVCacheConfig.from_layer_specs(
        {"a": FullAttentionSpec(4, num_kv_heads=3, head_size=7),
         "b": FullAttentionSpec(5, num_kv_heads=2, head_size=64)}, 1 << 20), ValueError,
     r"cannot unify page sizes.*block_size=\d+"),
    # requests and hashing
    ("token id 2**32", lambda w: Request("r", [1, 2**32]), ValueError, r"token id 4294967296"),
    ("negative token id", lambda w: Request("r", [1, -1]), ValueError, r"token id -1"),
    ("float token id", lambda w: Request("r", [1, 3.5]), ValueError, r"token id 3\.5"),
    ("bool token id", lambda w: Request("r", [1, True]), ValueError, r"token id True"),
    ("prompt is a string", lambda w: Request("r", "hello"), ValueError, r"got str"),
    ("empty prompt", lambda w: Request("r", []), ValueError, r"'r'.*empty"),
    ("empty request id", lambda w: Request("", [1]), ValueError, r"request_id.*''"),
    ("max_tokens 0", lambda w: Request("r", [1], max_tokens=0), ValueError, r"max_tokens.* 0"),
    ("int salt", lambda w: Request("r", [1], cache_salt=5), ValueError, r"cache_salt.*int"),
    ("append a negative token", lambda w: w.running.append_output_token_ids([7, -2]),
     ValueError, r"token id -2"),
    ("append a token 2**32", lambda w: w.running.append_output_token_ids(2**32), ValueError,
     r"token id 4294967296"),
    ("append a float token", lambda w: w.running.append_output_token_ids([7, 1.5]),
     ValueError, r"token id 1\.5"),
    ("append a str token", lambda w: w.running.append_output_token_ids(["7"]), ValueError,
     r"token id '7'"),
    ("append a bool token", lambda w: w.running.append_output_token_ids(True), ValueError,
     r"token id True"),
    ("append None", lambda w: w.running.append_output_token_ids([None]), ValueError,
     r"token id None"),
    ("prompt token None", lambda w: Request("r", [1, None]), ValueError, r"token id None"),
    ("prompt token a str", lambda w: Request("r", [1, "7"]), ValueError, r"token id '7'"),
    ("prompt is an int", lambda w: Request("r", 5), ValueError, r"prompt_token_ids.*int"),
    ("int request id", lambda w: Request(7, [1]), ValueError, r"request_id.*7"),
    ("bytes lora name", lambda w: Request("r", [1], lora_name=b"x"), ValueError,
     r"lora_name.*bytes"),
    ("multimodal item of two", lambda w: Request("r", [1], mm_hashes=[("h", 0)]), ValueError,
     r"mm_hashes.*\('h', 0\)"),
    ("multimodal offset -1", lambda w: Request("r", [1], mm_hashes=[("h", -1, 2)]), ValueError,
     r"offset.*-1"),
    ("hash block size 0", lambda w: compute_block_hashes([1, 2], 0), ValueError,
     r"block_size.* 0"),
    ("unknown hash", lambda w: compute_block_hashes([1, 2], 1, hash_algo="sha1"), ValueError,
     r"'sha1'"),
    ("hash token 2**40", lambda w: compute_block_hashes([1, 2**40], 1), ValueError,
     r"token id 1099511627776"),
    ("hash token float", lambda w: compute_block_hashes([1, 2.0], 1), ValueError,
     r"token id 2\.0"),
    ("hash token negative", lambda w: compute_block_hashes([1, -2], 1), ValueError,
     r"token id -2"),
    ("int lora name", lambda w: compute_block_hashes([1, 2], 1, lora_name=5), ValueError,
     r"lora_name.*int"),
    # the manager
    ("manager of a string", lambda w: KVCacheManager("config"), ValueError, r"got str"),
    ("unknown hash for manager", lambda w: KVCacheManager(KVCacheConfig(8, G), hash_algo="md5"),
     ValueError, r"'md5'"),
    ("unknown eviction policy", lambda w: KVCacheManager(KVCacheConfig(8, G),
                                                         eviction_policy="fifo"),
     ValueError, r"'fifo'"),
    ("negative token count", lambda w: w.kv.allocate_slots(w.running, -1), ValueError,
     r"num_new_tokens.*-1"),
    ("huge token count", lambda w: w.kv.allocate_slots(w.running, 10**12), ValueError,
     r"1000000000000 new tokens exceed"),
    ("float token count", lambda w: w.kv.allocate_slots(w.running, 2.0), ValueError,
     r"num_new_tokens.*2\.0"),
    ("bool token count", lambda w: w.kv.allocate_slots(w.running, True), ValueError,
     r"num_new_tokens.*True"),
    ("tokens past the request", lambda w: w.kv.allocate_slots(w.running, 5), ValueError,
     r"10 computed \+ 0 cached \+ 5 new tokens exceed its 14 tokens"),
    ("hit count without its blocks", lambda w: w.kv.allocate_slots(w.query, 1, w.num_hit),
     ValueError, r"new_computed_blocks must be the KVCacheBlocks"),
    ("negative hit count", lambda w: w.kv.allocate_slots(w.running, 0, -4), ValueError,
     r"num_new_computed_tokens.*-4"),
    ("allocate for an unknown request", lambda w: w.kv.allocate_slots("ghost", 1), ValueError,
     r"Request, got str"),
    ("look up a request id", lambda w: w.kv.get_computed_blocks("q"), ValueError,
     r"Request, got str"),
    ("duplicate request id", lambda w: w.kv.allocate_slots(Request("a", [1, 2, 3]), 1),
     ValueError, r"'a' is already in use"),
    ("hit shorter than its blocks", lambda w: w.kv.allocate_slots(w.query, 1, w.num_hit - 4,
                                                                  w.hit),
     ValueError, r"cover 20 tokens.*num_new_computed_tokens=16"),
    ("hit as plain ids", lambda w: w.kv.allocate_slots(w.query, 1, w.num_hit,
                                                       w.hit.get_block_ids()),
     ValueError, r"new_computed_blocks"),
    ("hit for a running request", lambda w: w.kv.allocate_slots(w.running, 0, 4, w.hit),
     ValueError, r"'a' already holds blocks"),
    ("evict a huge block id", lambda w: w.kv.evict_blocks([1, 10**9]), ValueError,
     r"block id .*got 1000000000"),
    ("evict a negative block id", lambda w: w.kv.evict_blocks([-1]), ValueError,
     r"block id .*got -1"),
    ("evict a str block id", lambda w: w.kv.evict_blocks(["3"]), ValueError, r"block id .*got '3'"),
    ("free twice", lambda w: w.kv.free(w.finished), KeyError, r"holds no blocks"),
    ("free a request never seen", lambda w: w.kv.free(Request("never", [1])), KeyError,
     r"'never' holds no blocks"),
    ("block ids of an unknown request", lambda w: w.kv.get_block_ids("nope"), KeyError,
     r"'nope' holds no blocks"),
    # the engine
    ("token outside the vocabulary", lambda w: w.llm.generate([[1, 2, 512]]), ValueError,
     r"token id 512"),
    ("float token in a prompt", lambda w: w.llm.generate([[5], [1, 2.5]]), ValueError,
     r"prompt 1: .*token id 2\.5"),
    ("empty prompt list", lambda w: w.llm.generate([[]]), ValueError, r"prompt 0 is empty"),
    ("prompt past the context", lambda w: w.llm.generate([[1] * 5000]), ValueError,
     r"5000 tokens"),
    ("text without tokenizer", lambda w: w.llm.generate(["hello"]), ValueError,
     r"prompt 0 is a string"),
    ("params per prompt mismatch", lambda w: w.llm.generate([[1], [2]], [SamplingParams()]),
     ValueError, r"one per prompt \(2\)"),
    ("int salt in a prompt", lambda w: w.llm.generate(
        [{"prompt_token_ids": [1, 2], "cache_salt": 7}]), ValueError, r"cache_salt.* 7"),
    ("unknown prompt key", lambda w: w.llm.generate([{"tokens": [1, 2]}]), ValueError,
     r"'tokens'"),
    ("max_tokens 0 sampling", lambda w: SamplingParams(max_tokens=0), ValueError,
     r"max_tokens.* 0"),
    ("negative temperature", lambda w: SamplingParams(temperature=-1.0), ValueError,
     r"temperature.*-1\.0"),
    ("engine block_size 0", lambda w: LLM("gemma3-tiny", block_size=0), ValueError,
     r"block_size.* 0"),
    ("engine pool of one block", lambda w: LLM("gemma3-tiny", num_blocks=1), ValueError,
     r"num_blocks.* 1"),
    ("engine pool beyond memory", lambda w: LLM("gemma3-tiny", num_blocks=10**9), ValueError,
     r"1000000000 blocks"),
    ("engine budget beyond memory", lambda w: LLM("gemma3-tiny", kv_cache_memory_bytes=2**40),
     ValueError, r"needs 10\d{11} bytes"),
    ("engine zero budget", lambda w: LLM("gemma3-tiny", kv_cache_memory_bytes=0), ValueError,
     r"kv_cache_memory_bytes.* 0"),
    ("engine zero token budget", lambda w: LLM("gemma3-tiny", num_blocks=8,
                                               max_num_batched_tokens=0),
     ValueError, r"max_num_batched_tokens.* 0"),
    ("engine float token budget", lambda w: LLM("gemma3-tiny", num_blocks=8,
                                                max_num_batched_tokens=2.5),
     ValueError, r"max_num_batched_tokens.*2\.5"),
    ("engine zero seqs", lambda w: LLM("gemma3-tiny", num_blocks=8, max_num_seqs=0),
     ValueError, r"max_num_seqs.* 0"),
    ("engine unknown hash", lambda w: LLM("gemma3-tiny", hash_algo="md5"), ValueError,
     r"'md5'"),
    ("unknown preset", lambda w: LLM("no-such-preset"), FileNotFoundError, r"'no-such-preset'"),
    ("model of an int", lambda w: LLM(12345), ValueError, r"got int"),
    ("checkpoint without config.json", lambda w: LLM(os.path.join(w.ckpt, "no_config")),
     FileNotFoundError, r"no config\.json in .*no_config"),
    ("garbage config.json", lambda w: LLM(os.path.join(w.ckpt, "garbage_config")), ValueError,
     r"garbage_config.*config\.json"),
    ("config.json not an object", lambda w: LLM(os.path.join(w.ckpt, "list_config")),
     ValueError, r"list_config.*no model_type"),
    ("unsupported model_type", lambda w: LLM(os.path.join(w.ckpt, "bert")), ValueError,
     r"'bert'"),
    ("weights missing", lambda w: LLM(os.path.join(w.ckpt, "no_weights")), FileNotFoundError,
     r"cannot load weights from .*no_weights"),
    ("garbage weights", lambda w: LLM(os.path.join(w.ckpt, "garbage_weights")), ValueError,
     r"corrupt checkpoint in .*garbage_weights"),
    # the command line
    ("cli: no command", lambda w: cli(), CliError, r"required: command"),
    ("cli: unknown command", lambda w: cli("fly"), CliError, r"invalid choice: 'fly'"),
    ("cli: serve without a model", lambda w: cli("serve"), CliError, r"required: model"),
    ("cli: serve with a bad port", lambda w: cli("serve", "gemma3-tiny", "--port", "-1"),
     CliError, r"--port must be >= 0, got -1"),
    ("cli: serve with a bad events URL", lambda w: cli("serve", "gemma3-tiny", "--events",
                                                       "localhost:6379"), CliError,
     r"--events 'localhost:6379' is not a Redis URL"),
    ("cli: simulate without args", lambda w: cli("simulate"), CliError, r"--model, --memory"),
    ("cli: cluster of no instances", lambda w: cli("simulate", "--instances", "0"), CliError,
     r"--instances must be an int in \[1, 1024\], got 0"),
    ("cli: cluster with an unknown policy", lambda w: cli("simulate", "--instances", "2",
                                                          "--router", "fastest"),
     CliError, r"routing policy 'fastest' is unknown"),
    ("cli: cluster with a bad mix", lambda w: cli("simulate", "--instances", "2", "--mix",
                                                  "0.5,nan,0.3"),
     CliError, r"--mix '0.5,nan,0.3': give three shares"),
    ("cli: route with a file kv store", lambda w: cli("route", "--backend", "http://127.0.0.1:1",
                                                      "--kv-store", "cpu://"),
     CliError, r"--kv-store 'cpu://' is not a redis:// URL"),
    ("cli: memory not a size", lambda w: cli(*SIM[:4], "lots"), CliError, r"'lots'"),
    ("cli: negative memory", lambda w: cli(*SIM[:3], "--memory=-5GiB"), CliError, r"'-5GiB'"),
    ("cli: zero memory", lambda w: cli(*SIM[:4], "0GiB"), CliError, r"'0GiB' must be positive"),
    ("cli: memory below two blocks", lambda w: cli(*SIM[:4], "1KiB", *SIM[5:]), CliError,
     r"kv_cache_memory_bytes=1024"),
    ("cli: unknown model", lambda w: cli("simulate", "--model", "gpt-9", "--memory", "1GiB"),
     CliError, r"'gpt-9'"),
    ("cli: block size not an int", lambda w: cli(*SIM, "--block-size", "x"), CliError,
     r"--block-size: invalid int value: 'x'"),
    ("cli: block size 0", lambda w: cli(*SIM, "--block-size", "0"), CliError,
     r"block_size.* 0"),
    ("cli: missing trace", lambda w: cli(*SIM[:5], "--trace", "/no/such.jsonl"), CliError,
     r"'/no/such\.jsonl'"),
    ("cli: corrupt trace", lambda w: cli(*SIM[:5], "--trace",
                                         os.path.join(w.ckpt, "traces", "bad.jsonl")),
     CliError, r"bad\.jsonl:2: malformed"),
    ("cli: sweep not numbers", lambda w: cli(*SIM, "--sweep", "1,x"), CliError, r"'x'"),
    ("cli: unknown eviction policy", lambda w: cli(*SIM, "--eviction-policy", "mru"),
     CliError, r"'mru'"),
    ("cli: unknown benchmark", lambda w: cli("bench", "nope"), CliError, r"'nope'"),
    ("cli: unknown demo preset", lambda w: cli("demo", "--presets", "nope", "--no-progress"),
     CliError, r"'nope'"),
    ("cli: unknown option", lambda w: cli("demo", "--bogus"), CliError, r"--bogus"),
    ("cli process: unknown command", lambda w: cli_process("fly"), CliError, r"'fly'"),
    ("cli process: unknown benchmark", lambda w: cli_process("bench", "nope"), CliError,
     r"unknown benchmark 'nope'"),
]


def test_catalogue_is_large_and_unique():
    names = [row[0] for row in ROWS]
    assert len(names) == len(set(names)) and len(names) >= 30


@pytest.mark.parametrize("name, call, error, pattern", ROWS, ids=[row[0] for row in ROWS])
def test_bad_input_fails_cleanly_and_changes_nothing(world, name, call, error, pattern):
    before = world_snapshot(world)
    with pytest.raises(error) as info:
        call(world)
    assert type(info.value) is error or error is CliError, type(info.value)
    assert re.search(pattern, str(info.value), re.MULTILINE), str(info.value)
    after = world_snapshot(world)
    assert [k for k in before if before[k] != after[k]] == []
    world.kv.check_integrity()
