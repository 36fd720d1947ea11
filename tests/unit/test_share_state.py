"""Share coordinator pieces without sockets: leader-epoch fencing, share group records in __consumer_offsets,
and the persister's routing of each key to its share coordinator (this broker or another)."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import pytest
from kio.schema.errors import ErrorCode

from pykbroker.coordinator.serde_primitives import SerdeError
from pykbroker.coordinator.share import membership, serde
from pykbroker.coordinator.share.partition import RecordState, StateBatch
from pykbroker.coordinator.share.persister import Persister, batches_body, batches_from
from pykbroker.coordinator.share.state_store import fence

TID = uuid.UUID(int=7)


def snap(leader_epoch: int, start: int = 0) -> serde.Snapshot:
    return serde.Snapshot(1, leader_epoch, start, (StateBatch(start, start + 2, RecordState.ACKNOWLEDGED, 1),))


def test_an_older_leader_is_fenced() -> None:
    assert fence(None, 3) == ErrorCode.none
    assert fence(snap(3), 3) == ErrorCode.none
    assert fence(snap(3), 4) == ErrorCode.none
    assert fence(snap(3), 2) == ErrorCode.fenced_leader_epoch
    assert fence(snap(3), -1) == ErrorCode.none  # admin summary reads
    assert fence(snap(3), 3, state_epoch=0) == ErrorCode.fenced_state_epoch  # state reset by an admin since
    assert fence(snap(3), 3, state_epoch=1) == ErrorCode.none


def test_share_group_records_round_trip_and_replay() -> None:
    key = membership.encode_key("g1")
    assert membership.decode_key(key) == "g1"
    assert membership.decode_value(membership.encode_value(42)) == 42
    other = b"\x00\x03" + key[2:]  # a consumer group's metadata key: not a share group record
    assert membership.decode_key(other) is None
    with pytest.raises(SerdeError):
        membership.decode_value(b"\x00\x09" + membership.encode_value(1)[2:])
    records: list[tuple[bytes | None, bytes | None]] = [
        (membership.encode_key("g1"), membership.encode_value(1)),
        (membership.encode_key("g2"), membership.encode_value(5)),
        (membership.encode_key("g1"), membership.encode_value(3)),
        (other, b"ignored"),
        (None, b"x"),
        (membership.encode_key("g3"), membership.encode_value(2)),
        (membership.encode_key("g3"), None),  # deleted
        (membership.encode_key("g4"), b"\x00"),  # truncated value: skipped
    ]
    t1, t2 = uuid.uuid4(), uuid.uuid4()
    records += [
        (membership.encode_state_topics_key("g1"), membership.encode_state_topics({t1: "orders"})),
        (membership.encode_state_topics_key("g1"), membership.encode_state_topics({t1: "orders", t2: "pay"})),
        (membership.encode_state_topics_key("g3"), membership.encode_state_topics({t2: "pay"})),
        (membership.encode_state_topics_key("g3"), None),  # deleted with its group
        (membership.encode_state_topics_key("g4"), b"\x00\x00\x00"),  # truncated: skipped
    ]
    replayed = membership.replay(records)
    assert replayed.epochs == {"g1": 3, "g2": 5}
    assert replayed.state_topics == {"g1": {t1: "orders", t2: "pay"}}
    assert membership.decode_state_topics(membership.encode_state_topics({})) == {}


def test_state_batches_wire_round_trip() -> None:
    batches = (StateBatch(0, 4, RecordState.ACKNOWLEDGED, 1), StateBatch(5, 5, RecordState.AVAILABLE, 3),
               StateBatch(6, 9, RecordState.ARCHIVED, 5))

    class W:
        def __init__(self, d: dict[str, int]) -> None:
            self.__dict__.update(d)

    assert batches_from([W(b) for b in batches_body(batches)]) == batches
    with pytest.raises(ValueError):
        batches_from([W({"first_offset": 0, "last_offset": 1, "delivery_state": 9, "delivery_count": 1})])


class FakeStore:
    """The local share coordinator: the keys it coordinates are those whose node is ``owner[key]``."""

    def __init__(self, owner: dict[int, int | None]) -> None:
        self.owner = owner
        self.written: list[tuple[serde.StateKey, serde.Snapshot | None]] = []
        self.states: dict[serde.StateKey, serde.Snapshot] = {}

    def coordinator_node(self, key: serde.StateKey) -> int | None:
        return self.owner[key.partition]

    async def read(self, key: serde.StateKey, leader_epoch: int) -> tuple[ErrorCode, serde.Snapshot | None]:
        return fence(self.states.get(key), leader_epoch), self.states.get(key)

    async def write(self, items: Any) -> dict[serde.StateKey, ErrorCode]:
        self.written += items
        return {k: ErrorCode.none for k, _ in items}


class FakeRemote:
    def __init__(self) -> None:
        self.calls: list[tuple[int, str, list[serde.StateKey]]] = []

    async def read_state(self, broker: int, key: serde.StateKey, leader_epoch: int) -> tuple[ErrorCode, None]:
        self.calls.append((broker, "read", [key]))
        return ErrorCode.not_coordinator, None

    async def write_state(self, broker: int, group: str, items: Any) -> dict[serde.StateKey, ErrorCode]:
        self.calls.append((broker, group, [k for k, _ in items]))
        return {k: ErrorCode.none for k, _ in items}

    async def close(self) -> None:
        pass


def test_persister_routes_each_key_to_its_share_coordinator() -> None:
    local = FakeStore({0: 1, 1: 2, 2: 3, 3: None})
    p = Persister(local, 1)  # type: ignore[arg-type]
    keys = [serde.StateKey("g", TID, i) for i in range(4)]

    async def main() -> None:
        # Without other brokers' connections (embedded metadata), only local keys can be written.
        codes = await p.write([(k, snap(0)) for k in keys])
        assert codes == {keys[0]: ErrorCode.none, keys[1]: ErrorCode.coordinator_not_available,
                         keys[2]: ErrorCode.coordinator_not_available, keys[3]: ErrorCode.coordinator_not_available}
        remote = FakeRemote()
        p.remote = remote  # type: ignore[assignment]
        local.written.clear()
        codes = await p.write([(k, snap(0)) for k in keys] + [(serde.StateKey("h", TID, 1), None)])
        assert [k for k, _ in local.written] == [keys[0]]
        assert sorted(remote.calls) == [(2, "g", [keys[1]]), (2, "h", [serde.StateKey("h", TID, 1)]),
                                        (3, "g", [keys[2]])]
        assert codes[keys[3]] == ErrorCode.coordinator_not_available  # no leader for its state partition
        local.states[keys[0]] = snap(5)
        assert await p.read(keys[0], 4) == (ErrorCode.fenced_leader_epoch, snap(5))
        assert await p.read(keys[0], 6) == (ErrorCode.none, snap(5))
        assert await p.read(keys[2], 6) == (ErrorCode.not_coordinator, None)
        assert remote.calls[-1] == (3, "read", [keys[2]])

    anyio.run(main)


# --- the share coordinator's APIs on an embedded broker (no sockets: frames through the dispatcher) ----------

def _broker(path: Any) -> Any:
    from pykbroker.config import BrokerConfig
    from pykbroker.server.broker import Broker

    b = Broker(BrokerConfig({"log.dirs": str(path), "listeners": "PLAINTEXT://127.0.0.1:0",
                             "group.share.enable": "true", "offsets.topic.num.partitions": "1",
                             "transaction.state.log.num.partitions": "1",
                             "share.coordinator.state.topic.num.partitions": "2"}))
    b.startup()
    return b


async def _call(b: Any, api_key: int, body: dict[str, Any]) -> Any:
    import struct

    from pykbroker.protocol import codec
    from pykbroker.protocol.framing import FrameDecoder
    from tests.unit.test_dispatcher import frame_for

    out = await b.dispatcher.handle(frame_for(api_key, 0, body, 1))
    dec = FrameDecoder(1 << 30)
    dec.feed(out)
    payload = dec.next_frame()
    assert payload is not None and struct.unpack_from(">i", payload, 0)[0] == 1
    return codec.decode_response(api_key, 0, payload, 5)


def _write(leader_epoch: int, start: int, state_epoch: int = 1) -> dict[str, Any]:
    return {"group_id": "g", "topics": [{"topic_id": TID, "partitions": [
        {"partition": 0, "state_epoch": state_epoch, "leader_epoch": leader_epoch, "start_offset": start,
         "state_batches": [{"first_offset": start, "last_offset": start + 4, "delivery_state": 2,
                            "delivery_count": 1}]}]}]}


def _read(leader_epoch: int) -> dict[str, Any]:
    return {"group_id": "g", "topics": [{"topic_id": TID, "partitions": [
        {"partition": 0, "leader_epoch": leader_epoch}]}]}


def test_share_coordinator_apis_fence_old_leaders_and_survive_a_restart(tmp_path: Any) -> None:
    def codes(resp: Any) -> list[int]:
        return [int(p.error_code) for t in resp.results for p in t.partitions]

    async def first(b: Any) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(b.shares.state.run)
            assert codes(await _call(b, 85, _write(3, 10))) == [ErrorCode.none]
            assert codes(await _call(b, 84, _read(2))) == [ErrorCode.fenced_leader_epoch]
            got = (await _call(b, 84, _read(5))).results[0].partitions[0]  # a newer leader: recorded
            assert (got.error_code, got.start_offset, len(got.state_batches)) == (0, 10, 1)
            assert int(got.state_batches[0].delivery_state) == 2
            assert codes(await _call(b, 85, _write(4, 20))) == [ErrorCode.fenced_leader_epoch]
            assert codes(await _call(b, 85, _write(5, 15))) == [ErrorCode.none]
            # An admin reset (state epoch 2) fences the leader's state of epoch 1.
            assert codes(await _call(b, 85, _write(5, 15, state_epoch=2))) == [ErrorCode.none]
            assert codes(await _call(b, 85, _write(5, 16, state_epoch=1))) == [ErrorCode.fenced_state_epoch]
            tg.cancel_scope.cancel()

    async def second(b: Any) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(b.shares.state.run)
            got = (await _call(b, 84, _read(5))).results[0].partitions[0]
            assert (got.error_code, got.start_offset) == (0, 15)  # replayed from __share_group_state
            assert codes(await _call(b, 85, _write(4, 30))) == [ErrorCode.fenced_leader_epoch]
            deleted = await _call(b, 86, {"group_id": "g", "topics": [{"topic_id": TID, "partitions": [
                {"partition": 0}]}]})
            assert codes(deleted) == [ErrorCode.none]
            got = (await _call(b, 84, _read(6))).results[0].partitions[0]
            assert (got.error_code, got.start_offset) == (0, -1)  # no state any more
            from pykbroker.server.dispatcher import hidden_apis
            assert {84, 85, 86} <= hidden_apis(b.services)  # inter-broker: never advertised to clients
            tg.cancel_scope.cancel()

    for step in (first, second):
        b = _broker(tmp_path)
        try:
            anyio.run(step, b)
        finally:
            b.log_manager.shutdown()
            b.store.close()


def test_a_group_with_no_session_left_is_idle() -> None:
    from pykbroker.coordinator.share.session import ShareSessions

    s = ShareSessions()
    s.open("g", "a")
    s.open("g", "b")
    s.open("h", "a")
    s.close("g", "a")
    assert s.has_group("g")
    s.close_member("g", "b")
    assert not s.has_group("g") and s.has_group("h")
