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

    def before_append(self, ctx: RequestContext, p: Partition, records: bytes,
                      transactional_id: str | None) -> Awaitable[None] | None:
        """Before the partition's records are validated: what to wait for first, or None (most produces wait
        for nothing, and pay no coroutine). The produce re-checks leadership after a wait."""
        return None

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


BeforeAppend = Callable[[RequestContext, Partition, bytes, "str | None"], "Awaitable[None] | None"]
CheckBatch = Callable[[RequestContext, Partition, BatchHeader, "str | None"], None]
Transform = Callable[[Partition, bytearray, list[BatchHeader], int], tuple[bytearray, list[BatchHeader]]]


def _overrides(hook: AppendHook, step: str) -> bool:
    return getattr(type(hook), step) is not getattr(AppendHook, step)


class AppendHooks:
    """The registered hooks, called in the order they registered.

    Each step is None when no hook takes part in it, and a single hook's own method when one does, so
    that a produce pays per partition only for the steps a feature of this broker uses (the handler
    skips a None step).
    """

    def __init__(self) -> None:
        self._hooks: list[AppendHook] = []
        self.before_append: BeforeAppend | None = None
        self.check_batch: CheckBatch | None = None
        self.transform: Transform | None = None
        self.writes_elsewhere = False  # some hook's transform may write another partition (also_written)

    def register(self, hook: AppendHook) -> None:
        self._hooks.append(hook)
        before = [h for h in self._hooks if _overrides(h, "before_append")]
        checks = [h for h in self._hooks if _overrides(h, "check_batch")]
        transforms = [h for h in self._hooks if _overrides(h, "transform")]

        def before_all(ctx: RequestContext, p: Partition, records: bytes, transactional_id: str | None
                       ) -> Awaitable[None] | None:
            waits = [w for h in before if (w := h.before_append(ctx, p, records, transactional_id)) is not None]
            if not waits:
                return None

            async def in_turn() -> None:
                for w in waits:
                    await w

            return in_turn()

        def check_all(ctx: RequestContext, p: Partition, header: BatchHeader, transactional_id: str | None) -> None:
            for h in checks:
                h.check_batch(ctx, p, header, transactional_id)

        def transform_all(p: Partition, buf: bytearray, batches: list[BatchHeader], now: int
                          ) -> tuple[bytearray, list[BatchHeader]]:
            for h in transforms:
                if not batches:
                    break
                buf, batches = h.transform(p, buf, batches, now)
            return buf, batches

        self.before_append = None if not before else before[0].before_append if len(before) == 1 else before_all
        self.check_batch = None if not checks else checks[0].check_batch if len(checks) == 1 else check_all
        self.transform = None if not transforms else transforms[0].transform if len(transforms) == 1 \
            else transform_all
        self.writes_elsewhere = any(_overrides(h, "also_written") for h in self._hooks)

    def internal_appender(self, ctx: RequestContext, topic: str) -> InternalAppender | None:
        return next((a for h in self._hooks if (a := h.internal_appender(ctx, topic)) is not None), None)

    def also_written(self) -> list[tuple[Partition, int]]:
        return [w for h in self._hooks if (w := h.also_written()) is not None]
