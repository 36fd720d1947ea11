"""The group coordinator: classic and consumer-protocol groups, offsets in ``__consumer_offsets``.

Layout: :mod:`.serde` (record formats), :mod:`.timers`, :mod:`.classic` (the classic group
state), :mod:`.consumer` (KIP-848 groups), :mod:`.manager` (the sans-I/O coordinator core),
:mod:`.service` (the anyio edge: timers, log appends, loading) and :mod:`.handlers` (the APIs).
"""
