"""The hand-written Produce/Fetch response encoders against kio, byte for byte, for every version."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from pykbroker.protocol import codec
from pykbroker.protocol.fast_codec import encode_fetch_response, encode_metadata_response, encode_produce_response

i16 = st.integers(-(1 << 15), (1 << 15) - 1)
i32 = st.integers(-(1 << 31), (1 << 31) - 1)
i64 = st.integers(-(1 << 63), (1 << 63) - 1)
offset = st.one_of(st.just(-1), st.integers(0, (1 << 63) - 1))
error_code = st.sampled_from(list(ErrorCode))
name = st.text(min_size=0, max_size=300)
message = st.one_of(st.none(), st.text(max_size=200))

produce_partition = st.fixed_dictionaries({
    "index": i32,
    "error_code": error_code,
    "base_offset": offset,
    "log_append_time": st.one_of(st.just(-1), st.integers(0, 1 << 45)),
    "log_start_offset": offset,
    "record_errors": st.just(()),
    "error_message": message,
})
produce_body = st.fixed_dictionaries({
    "responses": st.lists(st.fixed_dictionaries({
        "name": name,
        "partition_responses": st.lists(produce_partition, max_size=4),
    }), max_size=3),
    "throttle_time": st.one_of(st.just(0), st.integers(0, (1 << 31) - 1)),
})

records = st.one_of(st.just(b""), st.binary(max_size=300), st.none())
fetch_partition = st.fixed_dictionaries({
    "partition_index": i32,
    "error_code": error_code,
    "high_watermark": offset,
    "last_stable_offset": offset,
    "log_start_offset": offset,
    "aborted_transactions": st.one_of(st.none(), st.lists(
        st.fixed_dictionaries({"producer_id": i64, "first_offset": i64}), max_size=3)),
    "preferred_read_replica": st.one_of(st.just(-1), i32),
    "records": records,
})
fetch_body = st.fixed_dictionaries({
    "throttle_time": st.one_of(st.just(0), st.integers(0, (1 << 31) - 1)),
    "error_code": error_code,
    "session_id": st.one_of(st.just(0), i32),
    "responses": st.lists(st.fixed_dictionaries({
        "topic": name,
        "topic_id": st.one_of(st.none(), st.just(uuid.UUID(int=0)), st.uuids()),
        "partitions": st.lists(fetch_partition, max_size=4),
    }), max_size=3),
})


nodes = st.lists(i32, max_size=4).map(tuple)
metadata_partition = st.fixed_dictionaries({
    "error_code": error_code,
    "partition_index": i32,
    "leader_id": i32,
    "leader_epoch": i32,
    "replica_nodes": nodes,
    "isr_nodes": nodes,
    "offline_replicas": nodes,
})
metadata_body = st.fixed_dictionaries({
    "throttle_time": st.one_of(st.just(0), st.integers(0, (1 << 31) - 1)),
    "brokers": st.lists(st.fixed_dictionaries({
        "node_id": i32, "host": name, "port": i32, "rack": st.one_of(st.none(), name)}), max_size=3),
    "cluster_id": st.one_of(st.none(), name),
    "controller_id": i32,
    "topics": st.lists(st.fixed_dictionaries({
        "error_code": error_code,
        "name": name,
        "topic_id": st.one_of(st.just(uuid.UUID(int=0)), st.uuids()),
        "is_internal": st.booleans(),
        "partitions": st.lists(metadata_partition, max_size=4),
    }, optional={"topic_authorized_operations": i32}), max_size=3),
}, optional={"cluster_authorized_operations": i32})


@pytest.mark.parametrize("version", range(9, 13))
@settings(max_examples=150, deadline=None)
@given(body=metadata_body)
def test_metadata_response_matches_kio(version: int, body: dict[str, Any]) -> None:
    assert encode_metadata_response(version, body) == codec.encode_response(3, version, body)


def test_metadata_topic_without_a_name_is_kios_before_v12() -> None:
    body = {"brokers": [], "cluster_id": None, "controller_id": -1, "topics": [
        {"error_code": ErrorCode.invalid_topic_exception, "name": None, "topic_id": uuid.UUID(int=0),
         "is_internal": False, "partitions": []}]}
    assert encode_metadata_response(11, body) is None
    assert encode_metadata_response(12, body) == codec.encode_response(3, 12, body)
    assert encode_metadata_response(8, body) is None  # not a flexible version: kio's


@pytest.mark.parametrize("version", range(3, 12))
@settings(max_examples=150, deadline=None)
@given(body=produce_body)
def test_produce_response_matches_kio(version: int, body: dict[str, Any]) -> None:
    assert encode_produce_response(version, body) == codec.encode_response(0, version, body)


@pytest.mark.parametrize("version", range(4, 18))
@settings(max_examples=150, deadline=None)
@given(body=fetch_body)
def test_fetch_response_matches_kio(version: int, body: dict[str, Any]) -> None:
    assert encode_fetch_response(version, body) == codec.encode_response(1, version, body)


def test_large_lengths_use_multibyte_varints() -> None:
    body = {"throttle_time": 0, "error_code": ErrorCode.none, "session_id": 0, "responses": [
        {"topic": "t" * 200, "topic_id": uuid.uuid4(), "partitions": [
            {"partition_index": i, "error_code": ErrorCode.none, "high_watermark": 5, "last_stable_offset": 5,
             "log_start_offset": 0, "aborted_transactions": None, "preferred_read_replica": -1,
             "records": b"x" * 70000} for i in range(200)]}]}
    for version in range(4, 18):
        assert encode_fetch_response(version, body) == codec.encode_response(1, version, body)


def test_produce_with_record_errors_falls_back() -> None:
    part = {"index": 0, "error_code": ErrorCode.invalid_record, "base_offset": -1, "log_append_time": -1,
            "log_start_offset": -1, "record_errors": [{"batch_index": 0, "batch_index_error_message": "x"}],
            "error_message": "bad"}
    body = {"responses": [{"name": "t", "partition_responses": [part]}], "throttle_time": 0}
    assert encode_produce_response(9, body) is None
    assert encode_produce_response(7, body) is not None  # v7 has no record_errors field


def test_versions_outside_the_range_fall_back() -> None:
    assert encode_produce_response(2, {"responses": [], "throttle_time": 0}) is None
    assert encode_fetch_response(3, {"throttle_time": 0, "responses": []}) is None


@pytest.mark.parametrize("version", range(5))
def test_api_versions_answers_are_kio_bytes_encoded_once(version: int) -> None:
    from pykbroker.protocol import fast_codec
    from pykbroker.server.dispatcher import INTER_BROKER_APIS, SHARE_APIS, api_versions_body

    encode = fast_codec.FAST_ENCODERS[18]
    bodies = [api_versions_body(ErrorCode.none, version, INTER_BROKER_APIS),
              api_versions_body(ErrorCode.none, version, SHARE_APIS | INTER_BROKER_APIS),
              api_versions_body(ErrorCode.unsupported_version, version),
              {**api_versions_body(ErrorCode.none, version), "throttle_time": 250,
               "supported_features": [{"name": "group.version", "min_version": 1, "max_version": 1}]}]
    answers = []
    for body in bodies:
        first = encode(version, body)
        assert first == [codec.encode_response(18, version, body)]
        again = encode(version, dict(body))  # an equal body built anew: the same bytes, not encoded again
        assert again is not None and again[0] is first[0]
        answers.append(first[0])
    assert len(set(answers)) == len(answers)  # every field is part of the key
    assert encode(version, {**bodies[0], "some_new_field": 1}) is None  # a field the memo does not know
