"""Confluent Schema Registry's error answers: an HTTP status and a JSON body ``{"error_code", "message"}``.

The codes are Confluent's, so that clients that switch on them (the serializers retry on 5xx, tools test for
40401 or 40403) behave as against Confluent's registry."""

from __future__ import annotations

# 404
SUBJECT_NOT_FOUND = 40401
VERSION_NOT_FOUND = 40402
SCHEMA_NOT_FOUND = 40403
SUBJECT_SOFT_DELETED = 40404
SUBJECT_NOT_SOFT_DELETED = 40405
VERSION_SOFT_DELETED = 40406
VERSION_NOT_SOFT_DELETED = 40407
SUBJECT_COMPATIBILITY_NOT_CONFIGURED = 40408
SUBJECT_MODE_NOT_CONFIGURED = 40409
# 409
INCOMPATIBLE_SCHEMA = 409
# 422
INVALID_SCHEMA = 42201
INVALID_VERSION = 42202
INVALID_COMPATIBILITY_LEVEL = 42203
INVALID_MODE = 42204
OPERATION_NOT_PERMITTED = 42205
REFERENCE_EXISTS = 42206
# 500
STORE_ERROR = 50001
OPERATION_TIMEOUT = 50002
REQUEST_FORWARDING_FAILED = 50003
UNKNOWN_LEADER = 50004
# 401 / 403 (Confluent's security plugin)
UNAUTHORIZED = 40101
FORBIDDEN = 40301


class RegistryError(Exception):
    """An answer other than success: raised by the registry and answered by the HTTP layer as is."""

    def __init__(self, http_status: int, error_code: int, message: str) -> None:
        super().__init__(message)
        self.http_status = http_status
        self.error_code = error_code
        self.message = message

    def body(self) -> dict[str, object]:
        return {"error_code": self.error_code, "message": self.message}


def subject_not_found(subject: str) -> RegistryError:
    return RegistryError(404, SUBJECT_NOT_FOUND, f"Subject '{subject}' not found.")


def version_not_found(subject: str, version: object) -> RegistryError:
    return RegistryError(404, VERSION_NOT_FOUND, f"Version {version} not found.")


def schema_not_found(detail: str = "Schema not found") -> RegistryError:
    return RegistryError(404, SCHEMA_NOT_FOUND, detail)


def invalid_schema(message: str) -> RegistryError:
    return RegistryError(422, INVALID_SCHEMA, message)


def invalid_version(version: object) -> RegistryError:
    return RegistryError(422, INVALID_VERSION,
                         f"The specified version '{version}' is not a valid version id. Allowed values are between "
                         "[1, 2^31-1] and the string \"latest\"")


def not_permitted(message: str) -> RegistryError:
    return RegistryError(422, OPERATION_NOT_PERMITTED, message)


def unknown_leader(message: str = "Leader not known.") -> RegistryError:
    return RegistryError(500, UNKNOWN_LEADER, message)


def store_error(message: str) -> RegistryError:
    return RegistryError(500, STORE_ERROR, message)


def timeout(message: str) -> RegistryError:
    return RegistryError(500, OPERATION_TIMEOUT, message)


def forwarding_failed(message: str) -> RegistryError:
    return RegistryError(500, REQUEST_FORWARDING_FAILED, message)


class NotWriter(Exception):
    """This broker is not the registry's writer (it does not lead ``_schemas``): the write is forwarded."""
