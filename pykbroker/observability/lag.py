"""Consumer lag computed by the broker: what Burrow and kafka-lag-exporter compute from outside.

For each group this broker coordinates and each partition it has committed an offset for, the lag
is the partition's end offset (the high watermark: what a read_uncommitted consumer can reach, as
ListOffsets LATEST answers) minus the committed offset. The end offset is known for partitions with
a replica on this broker (the leader's, or the one a follower last learned); in a cluster where a
group's partition has no replica on its coordinator, that row is left out rather than guessed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

TopicPartition = tuple[str, int]


class _Committed(Protocol):
    offset: int


@dataclass(frozen=True)
class LagRow:
    group: str
    topic: str
    partition: int
    committed: int
    end_offset: int

    @property
    def lag(self) -> int:
        # A committed offset past the end (after a truncation or records deletion) is no lag, not a negative one.
        return max(self.end_offset - self.committed, 0)


def consumer_lag(committed: Mapping[str, Mapping[TopicPartition, _Committed]],
                 end_offsets: Mapping[TopicPartition, int]) -> list[LagRow]:
    rows = []
    for group, offsets in committed.items():
        for tp, value in offsets.items():
            end = end_offsets.get(tp)
            if end is None or value.offset < 0:
                continue
            rows.append(LagRow(group, tp[0], tp[1], value.offset, end))
    return rows
