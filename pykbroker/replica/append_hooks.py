"""The produce path's extension points, owned by the floor of the partitions: features that look at a
partition's batches around the append (transaction verification, delayed delivery) register a hook here
at broker start, and the produce handler calls the hooks without naming any feature."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from kio.schema.errors import ErrorCode

from pykbroker.protocol.records import BatchHeader
from pykbroker.replica.replica_manager import Partition
from pykbroker.security.request import RequestContext

# Appends records a feature owns to one of its internal topics: (partition, records, now) -> base offset.
InternalAppender = Callable[[Partition, bytes, int], int]


class ForwardFirst(Exception):
    """A hook's answer from :meth:`AppendHook.transform`: part of the batch must first be written
    elsewhere (``await send()``, which answers the code the producer gets if it fails: ``error_message``
    then), and only then is what is left (``buf``/``batches``, empty when nothing is) appended here."""

    def __init__(self, buf: bytearray, batches: list[BatchHeader], send: Callable[[], Awaitable[ErrorCode]],
                 error_message: str) -> None:
        super().__init__(error_message)
        self.buf, self.batches, self.send, self.error_message = buf, batches, send, error_message


class AppendHook:
    """One feature's part in a produce; every step does nothing unless the feature overrides it."""

    def internal_appender(self, ctx: RequestContext, topic: str) -> InternalAppender | None:
        """How this request appends to internal topic ``topic`` (``(partition, records, now)`` -> base
        offset), when this feature owns such appends; None otherwise."""
        return None

    async def before_append(self, ctx: RequestContext, p: Partition, records: bytes,
                            transactional_id: str | None) -> None:
        """Before the partition's records are validated; may wait (the produce re-checks leadership after)."""

    def check_batch(self, ctx: RequestContext, p: Partition, header: BatchHeader,
                    transactional_id: str | None) -> None:
        """The first batch's header, validated: raise ProducerStateError to refuse the append."""

    def transform(self, p: Partition, buf: bytearray, batches: list[BatchHeader], now: int
                  ) -> tuple[bytearray, list[BatchHeader]]:
        """The validated records, before the append: what is left to append (may raise ForwardFirst)."""
        return buf, batches

    def also_written(self) -> tuple[Partition, int] | None:
        """After a transform: another partition it wrote, and that partition's min ISR (for acks and fsync)."""
        return None


class AppendHooks:
    """The registered hooks, called in the order they registered."""

    def __init__(self) -> None:
        self._hooks: list[AppendHook] = []

    def register(self, hook: AppendHook) -> None:
        self._hooks.append(hook)

    def internal_appender(self, ctx: RequestContext, topic: str) -> InternalAppender | None:
        return next((a for h in self._hooks if (a := h.internal_appender(ctx, topic)) is not None), None)

    async def before_append(self, ctx: RequestContext, p: Partition, records: bytes,
                            transactional_id: str | None) -> None:
        for h in self._hooks:
            await h.before_append(ctx, p, records, transactional_id)

    def check_batch(self, ctx: RequestContext, p: Partition, header: BatchHeader,
                    transactional_id: str | None) -> None:
        for h in self._hooks:
            h.check_batch(ctx, p, header, transactional_id)

    def transform(self, p: Partition, buf: bytearray, batches: list[BatchHeader], now: int
                  ) -> tuple[bytearray, list[BatchHeader]]:
        for h in self._hooks:
            if not batches:
                break
            buf, batches = h.transform(p, buf, batches, now)
        return buf, batches

    def also_written(self) -> list[tuple[Partition, int]]:
        return [w for h in self._hooks if (w := h.also_written()) is not None]
