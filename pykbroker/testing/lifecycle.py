"""``with`` and ``async with`` for the test harness's processes: start on entry, stop on exit (the async forms
run the blocking start and stop in a worker thread, so an event loop under test keeps running)."""

from __future__ import annotations

import abc
from types import TracebackType
from typing import Self

import anyio.to_thread


class StartStop(abc.ABC):
    """A harness process (a broker, a cluster) that is started and stopped as a context manager."""

    @abc.abstractmethod
    def start(self) -> Self:
        """Start, waiting (bounded) until it serves."""

    @abc.abstractmethod
    def stop(self) -> object:
        """Stop and clean up."""

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        await anyio.to_thread.run_sync(self.start)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await anyio.to_thread.run_sync(self.stop)
