"""Services that run inside the broker's task group but live in higher layers (the web console): the broker owns
this hook and calls it; whoever starts the broker registers them, so the server names none of them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class BoundListener:
    """A listener as bound: its name, security protocol, host and actual port (port 0 picks one)."""

    name: str
    security_protocol: str
    host: str
    port: int


@dataclass(frozen=True)
class StartedBroker:
    """What a service learns when the broker has bound its listeners."""

    broker_id: int
    cluster_id: str
    listeners: tuple[BoundListener, ...]
    metrics_port: int | None  # the bound port of pykbroker.metrics.listener, None when it is off


class ExtraService(Protocol):
    """Opened after the listeners are bound (an error here stops the start), served in the broker's task group,
    closed first at shutdown, while the broker still answers."""

    async def open(self, broker: StartedBroker) -> None: ...

    async def serve(self) -> None: ...

    async def close(self) -> None: ...
