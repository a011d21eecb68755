import pytest

from hybridkv.kv_cache.event_codec import decode_events, encode_events
from hybridkv.kv_cache.events import AllBlocksCleared, BlockRemoved, BlockStored


def test_round_trip_keeps_order_and_drops_block_ids():
    events = [BlockStored(b"\x01\x02", 0, 7), BlockRemoved(b"\xff", 2, 9), AllBlocksCleared(),
              BlockStored(b"\x00" * 32, 1, 3)]
    decoded = decode_events(encode_events(events))
    assert decoded == [BlockStored(b"\x01\x02", 0, -1), BlockRemoved(b"\xff", 2, -1),
                       AllBlocksCleared(), BlockStored(b"\x00" * 32, 1, -1)]


def test_message_carries_hashes_and_groups_only():
    message = encode_events([BlockStored(b"\xab" * 4, 5, 123)])
    assert message == b'{"v":1,"events":[["S","abababab",5]]}'


@pytest.mark.parametrize("message, fragment", [
    (b"{", "not JSON"),
    (b'{"v":2,"events":[]}', "version 2"),
    (b'{"v":1}', "'events'"),
    (b'{"v":1,"events":[["X","00",0]]}', "malformed"),
    (b'{"v":1,"events":[["S","zz",0]]}', "bad hash"),
    (b'{"v":1,"events":[["S","00",-1]]}', "malformed"),
])
def test_bad_messages_are_refused(message, fragment):
    with pytest.raises(ValueError, match=fragment):
        decode_events(message)


def test_non_event_is_refused():
    with pytest.raises(TypeError, match="not a block event"):
        encode_events([object()])
