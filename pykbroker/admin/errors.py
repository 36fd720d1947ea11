"""What a failed admin command says and the exit code it leaves, so that scripts can tell the cases apart."""

from __future__ import annotations

from typing import Any

EXIT_OK = 0
EXIT_FAILED = 1  # the cluster answered with an error, or an item of the request failed
EXIT_USAGE = 2  # the command line is wrong (click's own code for usage errors)
EXIT_UNREACHABLE = 3  # no broker answered in time, or the connection or authentication failed

# librdkafka's local errors that mean the cluster was not reached (rather than refused the request).
_UNREACHABLE = frozenset({"_TRANSPORT", "_TIMED_OUT", "_ALL_BROKERS_DOWN", "_RESOLVE", "_AUTHENTICATION", "_SSL",
                          "_WAIT_COORD", "_NO_BROKERS"})


class AdminError(Exception):
    """A command's failure: the message printed on stderr and the process's exit code."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED, *, error: str | None = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.error = error  # Kafka's error name (UNKNOWN_TOPIC_OR_PARTITION...), when the cluster gave one

    def as_json(self) -> dict[str, Any]:
        return {"error": self.error or "ERROR", "message": str(self)}


def error_name(code: int) -> str:
    """Kafka's name of an error code (UNKNOWN_TOPIC_OR_PARTITION, ...)."""
    # Imported on the first error: importing kio takes about half a second, which --help should not pay.
    from kio.schema.errors import ErrorCode

    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return f"UNKNOWN_ERROR_{code}"


def from_kafka(exc: BaseException, what: str) -> AdminError:
    """An AdminError from confluent-kafka's KafkaException (or anything else raised by a request). A broker's
    error keeps Kafka's name for its code (librdkafka abbreviates some: UNKNOWN_TOPIC_OR_PART), so the CLI
    names an error the same whichever client asked; librdkafka's own errors keep theirs (_TRANSPORT, ...)."""
    err = exc.args[0] if exc.args else None
    if err is not None and callable(getattr(err, "name", None)):
        return kafka_error(err, what)
    return AdminError(f"{what}: {exc}", EXIT_FAILED)


def kafka_error(err: Any, what: str) -> AdminError:
    """An AdminError from a confluent-kafka KafkaError (a failed call's, or a topic's in Metadata)."""
    code_name = str(err.name())
    code = err.code()
    exit_code = EXIT_UNREACHABLE if code_name in _UNREACHABLE else EXIT_FAILED
    kafka_name = error_name(int(code)) if isinstance(code, int) and code > 0 else code_name.lstrip("_")
    return AdminError(f"{what}: {kafka_name}: {err.str()}", exit_code, error=kafka_name)
