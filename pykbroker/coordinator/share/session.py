"""Share sessions (KIP-932): per (group, member), the partitions a member's ShareFetch requests cover,
so that incremental requests name only what changed, as KIP-227's fetch sessions do for Fetch.

Epoch 0 opens a session (replacing the member's previous one), -1 closes it, any other epoch must be the
next one the broker expects; a mismatch is INVALID_SHARE_SESSION_EPOCH, a missing session
SHARE_SESSION_NOT_FOUND.  Sessions live in memory only: after a restart clients open new ones.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

INITIAL_EPOCH = 0
FINAL_EPOCH = -1
# Kafka's group.share.max.share.sessions default: share sessions a broker keeps.
MAX_SESSIONS = 2000

TopicIdPartition = tuple[uuid.UUID, int]


def next_epoch(epoch: int) -> int:
    return 1 if epoch >= 2**31 - 1 else epoch + 1


@dataclass
class ShareSession:
    group_id: str
    member_id: str
    epoch: int = 0  # the epoch the next request must carry (0 until the opening request is answered)
    partitions: list[TopicIdPartition] = field(default_factory=list)


class ShareSessions:
    def __init__(self, max_sessions: int = MAX_SESSIONS) -> None:
        self.max_sessions = max_sessions
        self._sessions: dict[tuple[str, str], ShareSession] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, group_id: str, member_id: str) -> ShareSession | None:
        return self._sessions.get((group_id, member_id))

    def check(self, group_id: str, member_id: str, epoch: int) -> ErrorCode:
        """Whether a request with this epoch may proceed (nothing changes)."""
        if epoch == INITIAL_EPOCH:
            if (group_id, member_id) not in self._sessions and len(self._sessions) >= self.max_sessions:
                return ErrorCode.share_session_limit_reached
            return ErrorCode.none
        s = self._sessions.get((group_id, member_id))
        if s is None:
            return ErrorCode.share_session_not_found
        if epoch != FINAL_EPOCH and epoch != s.epoch:
            return ErrorCode.invalid_share_session_epoch
        return ErrorCode.none

    def open(self, group_id: str, member_id: str) -> ShareSession:
        s = self._sessions[(group_id, member_id)] = ShareSession(group_id, member_id)
        return s

    def advance(self, s: ShareSession) -> None:
        s.epoch = next_epoch(s.epoch)

    def close(self, group_id: str, member_id: str) -> ShareSession | None:
        return self._sessions.pop((group_id, member_id), None)

    def close_member(self, group_id: str, member_id: str) -> None:
        self._sessions.pop((group_id, member_id), None)

    def has_group(self, group_id: str) -> bool:
        """Whether any member of the group has a session open here."""
        return any(g == group_id for g, _ in self._sessions)
