"""A benchmark trace as one file, so that separate processes replay the same tokens.

The comparison with another manager runs each side in its own process (the
other manager may live in another Python environment); both read the trace
from this file, and `load_trace` rebuilds the fingerprint from the tokens it
read and refuses a file whose tokens do not match the fingerprint stored in it.

Format: the line `hybridkv-trace 1`, one line of JSON (name, seed, running
cap, params, fingerprint, and per request its id, the request it waits for,
and its prompt and decode lengths), then every request's prompt and decode
token ids as little-endian unsigned 32-bit integers, in request order.

    >>> import os, tempfile
    >>> from hybridkv.tools.bench_traces import shared_prefix_trace
    >>> trace = shared_prefix_trace(num_requests=3, prefix_len=32, unique_len=8, decode_steps=2)
    >>> path = os.path.join(tempfile.mkdtemp(), "t.trace")
    >>> save_trace(trace, path)
    >>> load_trace(path) == trace, load_trace(path).fingerprint() == trace.fingerprint()
    (True, True)
"""

from __future__ import annotations

import json
import sys
from array import array

from hybridkv.tools.traces import Trace, TraceRequest

MAGIC = b"hybridkv-trace 1\n"


def _uint32_array(values=()) -> array:
    for code in ("I", "L"):
        if array(code).itemsize == 4:
            return array(code, values)
    raise RuntimeError("this platform has no 32-bit unsigned array type")


def save_trace(trace: Trace, path: str) -> None:
    """Write `trace` to `path` (overwriting it)."""
    header = {"name": trace.name, "seed": trace.seed, "max_running": trace.max_running,
              "params": trace.params, "fingerprint": trace.fingerprint(),
              "requests": [[r.request_id, r.after, len(r.prompt), len(r.output)]
                           for r in trace.requests]}
    tokens = _uint32_array()
    for r in trace.requests:
        tokens.extend(r.prompt)
        tokens.extend(r.output)
    if sys.byteorder != "little":
        tokens.byteswap()
    with open(path, "wb") as f:
        f.write(MAGIC)
        f.write(json.dumps(header, separators=(",", ":")).encode() + b"\n")
        f.write(tokens.tobytes())


def load_trace(path: str) -> Trace:
    """The trace stored in `path`; ValueError when the file is not a trace file or its
    tokens do not give the fingerprint it records."""
    with open(path, "rb") as f:
        if f.readline() != MAGIC:
            raise ValueError(f"{path}: not a hybridkv trace file (no {MAGIC.strip()!r} line)")
        header = json.loads(f.readline())
        tokens = _uint32_array()
        tokens.frombytes(f.read())
    if sys.byteorder != "little":
        tokens.byteswap()
    expected = sum(n_prompt + n_decode for _, _, n_prompt, n_decode in header["requests"])
    if len(tokens) != expected:
        raise ValueError(f"{path}: {len(tokens)} token ids, the header lists {expected}")
    requests, pos = [], 0
    for request_id, after, n_prompt, n_decode in header["requests"]:
        prompt = tuple(tokens[pos:pos + n_prompt])
        decode = tuple(tokens[pos + n_prompt:pos + n_prompt + n_decode])
        pos += n_prompt + n_decode
        requests.append(TraceRequest(request_id, prompt, decode, after))
    trace = Trace(header["name"], header.get("seed", 0), tuple(requests),
                  header.get("max_running", 4), header["params"])
    if trace.fingerprint() != header["fingerprint"]:
        raise ValueError(f"{path}: tokens give fingerprint {trace.fingerprint()}, the file "
                         f"records {header['fingerprint']}")
    return trace
