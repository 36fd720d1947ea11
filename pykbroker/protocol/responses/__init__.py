"""Response bodies as ``TypedDict``s, one module per area of handlers.

Handlers answer with plain dicts holding the union of every version's fields, which
:func:`pykbroker.protocol.codec.build` (or a hand-written encoder of
:mod:`pykbroker.protocol.fast_codec`) turns into the negotiated version.  These classes give those
dicts kio's field names and value types so that mypy checks them, at no cost at run time (a
``TypedDict`` is a plain dict).  Classes are named after Kafka's message schemas and hold the fields
of every version the codec can encode; a field that not every version the broker answers has, or
that has a default, is ``NotRequired`` (``build`` fills in Kafka's default).  Durations and
timestamps are milliseconds, error codes ints (``ErrorCode`` is an ``IntEnum``).
``tests/unit/test_response_types.py`` checks every field against kio's classes.
"""
