"""confluent-kafka's AdminClient (librdkafka) with the CLI's timeout and errors: every call waits at most the
command's ``--timeout`` and turns a failure into an AdminError with Kafka's error name."""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from confluent_kafka.admin import AdminClient

from .errors import EXIT_UNREACHABLE, AdminError, from_kafka

K = TypeVar("K")

# librdkafka's own log lines (connection refused, retries) go here; shown with --verbose only, since the
# command's error message already says what failed.
rdkafka_log = logging.getLogger("pykbroker.admin.rdkafka")


def librdkafka_config(props: Mapping[str, str], timeout: float) -> dict[str, Any]:
    conf: dict[str, Any] = dict(props)
    conf.setdefault("socket.connection.setup.timeout.ms", str(int(max(timeout, 1) * 1000)))
    conf["logger"] = rdkafka_log
    return conf


class Admin:
    """One AdminClient per command; its calls bounded by ``timeout`` seconds."""

    def __init__(self, props: Mapping[str, str], timeout: float) -> None:
        self.timeout = timeout
        self._login_errors: list[Any] = []
        conf = librdkafka_config(props, timeout)
        conf["error_cb"] = self._on_error
        self.client = AdminClient(conf)

    def _on_error(self, err: Any) -> None:
        if err.name() in ("_AUTHENTICATION", "_SSL") and not self._login_errors:
            self._login_errors.append(err)

    def _failure(self, e: Exception, what: str) -> AdminError:
        """The AdminError of a failed call. librdkafka reports a failed login or TLS handshake only to its error
        callback, while the request itself fails as a transport error; the login's reason is the useful one."""
        error = from_kafka(e, what)
        if error.exit_code == EXIT_UNREACHABLE:
            self.client.poll(0)  # serves the error callback
            if self._login_errors:
                err = self._login_errors[0]
                return AdminError(f"{what}: {err.name()}: {err.str()}", EXIT_UNREACHABLE,
                                  error=str(err.name()).lstrip("_"))
        return error

    @property
    def request_timeout(self) -> float:
        return self.timeout

    def wait(self, future: concurrent.futures.Future[Any], what: str) -> Any:
        """The result of one admin call, or an AdminError."""
        try:
            return future.result(timeout=self.timeout + 1)
        except concurrent.futures.TimeoutError as e:
            raise AdminError(f"{what}: no answer within {self.timeout:g} s", EXIT_UNREACHABLE,
                             error="REQUEST_TIMED_OUT") from e
        except Exception as e:
            raise self._failure(e, what) from e

    def wait_each(self, futures: Mapping[K, concurrent.futures.Future[Any]],
                  what: Callable[[K], str]) -> dict[K, Any]:
        """Each item's result or AdminError: one failed topic must not hide what happened to the others."""
        out: dict[K, Any] = {}
        for key, future in futures.items():
            try:
                out[key] = self.wait(future, what(key))
            except AdminError as e:
                out[key] = e
        return out

    def metadata(self, topic: str | None = None) -> Any:
        """librdkafka's ClusterMetadata (brokers, controller, partitions, replicas and ISR) of every topic, or of
        ``topic``: then the client must have ``allow.auto.create.topics=false``, or the request creates the topic
        where the cluster has auto.create.topics.enable on."""
        try:
            return self.client.list_topics(topic=topic, timeout=self.timeout)
        except Exception as e:
            raise self._failure(e, "Metadata") from e
