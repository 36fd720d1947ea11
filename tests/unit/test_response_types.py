"""The response TypedDicts of pykbroker.protocol.responses against kio's response classes.

Handlers build response bodies as dicts typed by those TypedDicts and ``codec.build`` reads them by kio's
field names, silently ignoring any other key.  So every key of a TypedDict must be a field of kio's class
at the same place in some version the codec can encode, a nested TypedDict must sit where kio has a struct
(or an array of structs), and a primitive's Python type must be one ``build`` accepts for its Kafka type.
A required key must be a field of every version the broker answers.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import operator
import pkgutil
import types
import typing
import uuid
from collections.abc import Sequence
from typing import Any

import pytest

from pykbroker.protocol import codec, responses
from pykbroker.protocol.file_range import FileRange
from pykbroker.server.dispatcher import API_TABLE

# Kafka type -> the Python types a handler may give (durations and timestamps in milliseconds).
PYTHON_TYPES: dict[str, frozenset[Any]] = {
    **dict.fromkeys(["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "error_code",
                     "timedelta_i32", "timedelta_i64", "datetime_i64"], frozenset({int})),
    "string": frozenset({str}), "bool": frozenset({bool}), "bytes": frozenset({bytes}),
    "float64": frozenset({float}), "uuid": frozenset({uuid.UUID}), "records": frozenset({bytes, FileRange}),
}


def _response_types() -> dict[str, type]:
    found: dict[str, type] = {}
    for info in pkgutil.iter_modules(responses.__path__):
        module = importlib.import_module(f"{responses.__name__}.{info.name}")
        for name, obj in vars(module).items():
            if typing.is_typeddict(obj) and obj.__module__ == module.__name__ and name.endswith("Response"):
                assert name not in found, f"{name} is defined twice"
                found[name] = obj
    return found


TYPES = _response_types()


def _strip(hint: Any) -> Any:
    """The hint without None."""
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(hint) if a is not types.NoneType]
        return functools.reduce(operator.or_, args)
    return hint


def _members(hint: Any) -> set[Any]:
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        return set(typing.get_args(hint))
    return {hint}


def _check(td: type, classes: list[tuple[type, bool]], where: str) -> None:
    """``classes``: kio's classes at this place, each with whether the broker answers its version."""
    hints = typing.get_type_hints(td)
    # Under postponed annotations Python 3.11 cannot see NotRequired in __required_keys__: read the hints.
    required = [k for k, h in typing.get_type_hints(td, include_extras=True).items()
                if typing.get_origin(h) is not typing.NotRequired]
    by_name: dict[str, list[tuple[dataclasses.Field[Any], bool]]] = {}
    for cls, answered in classes:
        for f in dataclasses.fields(cls):
            by_name.setdefault(f.name, []).append((f, answered))
    for key in required:
        assert all(key in {f.name for f in dataclasses.fields(c)} for c, answered in classes if answered), \
            f"{where}.{key} is required but some version answered lacks it"
    for key, hint in hints.items():
        assert key in by_name, f"{where}.{key} is no field of kio's {classes[0][0].__name__} in any version"
        inner = _strip(hint)
        for f, _ in by_name[key]:
            kio_type = _strip(f.type)
            if typing.get_origin(kio_type) is tuple:
                assert typing.get_origin(inner) is Sequence, f"{where}.{key} is an array: {hint}"
                element = typing.get_args(inner)[0]
                kio_element = typing.get_args(kio_type)[0]
            else:
                assert typing.get_origin(inner) is not Sequence, f"{where}.{key} is no array: {hint}"
                element, kio_element = inner, kio_type
            if dataclasses.is_dataclass(kio_element):
                assert typing.is_typeddict(element), f"{where}.{key} is a struct: {hint}"
            else:
                allowed = PYTHON_TYPES[f.metadata["kafka_type"]]
                assert _members(element) <= allowed, f"{where}.{key}: {hint} for {f.metadata['kafka_type']}"
        if typing.is_typeddict(element := (typing.get_args(inner)[0] if typing.get_origin(inner) is Sequence
                                           else inner)):
            nested = []
            for f, answered in by_name[key]:
                kio_type = _strip(f.type)
                nested.append((typing.get_args(kio_type)[0] if typing.get_origin(kio_type) is tuple else kio_type,
                               answered))
            _check(element, nested, f"{where}.{key}")


@pytest.mark.parametrize("api_key", sorted(API_TABLE))
def test_response_type_mirrors_kio(api_key: int) -> None:
    spec = API_TABLE[api_key]
    classes = [(codec.response_class(api_key, v), spec.min_version <= v <= spec.max_version)
               for v in codec.supported_versions(api_key)]
    name = codec.response_class(api_key, spec.max_version).__name__
    assert name in TYPES, f"no TypedDict {name} in {responses.__name__}"
    _check(TYPES[name], classes, name)
