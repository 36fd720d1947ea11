"""The errors a log raises, with the Kafka error code each is answered with."""

from __future__ import annotations

import errno


class OffsetOutOfRange(Exception):
    """The requested offset is outside [log start offset, log end offset]."""

    error_code = 1  # OFFSET_OUT_OF_RANGE


def out_of_descriptors(exc: BaseException) -> bool:
    """EMFILE/ENFILE: the process's (or system's) open-file limit, not a failing disk.

    Such an operation fails on its own, with a log line; its log dir stays online, since
    taking it offline would stop every partition in it for what closing a connection cures.
    """
    return isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE)


class KafkaStorageError(Exception):
    """A disk operation on the log failed, or its log dir is offline (KAFKA_STORAGE_ERROR).

    Raised instead of the OSError so callers answer error code 56 rather than dropping the
    connection; the log has already reported the failure so that its whole dir goes offline.
    """

    error_code = 56  # KAFKA_STORAGE_ERROR
