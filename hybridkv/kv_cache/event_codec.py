"""Wire format of block events, shared by publishers (servers) and consumers (routers).

One message carries a batch of events in order, as compact JSON::

    {"v": 1, "events": [["S", "<hash hex>", 0], ["R", "<hash hex>", 1], ["C"]]}

`S` is `BlockStored`, `R` is `BlockRemoved` (hash and group id), `C` is
`AllBlocksCleared`. Block ids stay local to an instance and are not sent; like
the events themselves, a message never carries a cache salt or tokens.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from hybridkv.kv_cache.events import AllBlocksCleared, BlockEvent, BlockRemoved, BlockStored

WIRE_VERSION = 1


def encode_events(events: Iterable[BlockEvent]) -> bytes:
    """One message for `events`, in order. Raises TypeError on a non-event."""
    rows: list[list[object]] = []
    for event in events:
        if isinstance(event, BlockStored):
            rows.append(["S", event.block_hash.hex(), event.group_id])
        elif isinstance(event, BlockRemoved):
            rows.append(["R", event.block_hash.hex(), event.group_id])
        elif isinstance(event, AllBlocksCleared):
            rows.append(["C"])
        else:
            raise TypeError(f"not a block event: {event!r}")
    return json.dumps({"v": WIRE_VERSION, "events": rows}, separators=(",", ":")).encode()


def decode_events(message: bytes | str) -> list[BlockEvent]:
    """The events of one message (block ids are -1: they are not sent).

    Raises ValueError naming what is wrong for a malformed message or another version.
    """
    try:
        body = json.loads(message)
    except (TypeError, ValueError) as err:
        raise ValueError(f"block event message is not JSON: {err}") from None
    if not isinstance(body, dict) or body.get("v") != WIRE_VERSION:
        raise ValueError(f"block event message has version {_version(body)!r}, "
                         f"expected {WIRE_VERSION}")
    rows = body.get("events")
    if not isinstance(rows, list):
        raise ValueError("block event message has no 'events' list")
    return [_decode_row(row) for row in rows]


def _version(body: object) -> object:
    return body.get("v") if isinstance(body, dict) else None


def _decode_row(row: object) -> BlockEvent:
    if row == ["C"]:
        return AllBlocksCleared()
    if (isinstance(row, list) and len(row) == 3 and row[0] in ("S", "R")
            and isinstance(row[1], str) and isinstance(row[2], int) and row[2] >= 0):
        try:
            block_hash = bytes.fromhex(row[1])
        except ValueError:
            raise ValueError(f"block event row has a bad hash: {row!r}") from None
        kind = BlockStored if row[0] == "S" else BlockRemoved
        return kind(block_hash, row[2], -1)
    raise ValueError(f"malformed block event row: {row!r}")
