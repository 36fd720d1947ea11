"""Request dispatch: from a frame's bytes to a response frame's bytes, with no sockets.

The network edge hands every frame here and writes back what it gets.  Errors
follow Kafka: a request it cannot parse (bad header, unknown API key, an
unsupported version of anything but ApiVersions, a malformed body) closes the
connection with a log line; problems inside a well-formed request are error
codes in the response.
"""

from __future__ import annotations

import logging
import re
import struct
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from time import perf_counter
from typing import Any

import anyio
from kio.schema.errors import ErrorCode

from pykbroker.coordinator.group import handlers as groups
from pykbroker.coordinator.transaction import handlers as txn
from pykbroker.logsetup import fields
from pykbroker.metadata.store import CLIENT_METRICS_RESOURCE
from pykbroker.protocol import codec
from pykbroker.protocol.bounds import BoundsError, check_request
from pykbroker.protocol.fast_codec import FAST_ENCODERS
from pykbroker.protocol.fast_fetch_request import check_fetch_request
from pykbroker.protocol.framing import CloseConnection, encode_frame
from pykbroker.protocol.header import (
    HeaderError,
    RequestHeader,
    encode_response_header,
    finish_flexible_header,
    parse_request_header_prefix,
)
from pykbroker.protocol.responses.api_versions import ApiVersionsResponse, SupportedFeatureKey
from pykbroker.quotas import QuotaManager, Usage, charge, run_timed
from pykbroker.security.request import RequestContext
from pykbroker.security.sasl.authenticator import SaslAuthenticator, SaslClose, SaslServerSettings
from pykbroker.security.sasl.settings import server_settings as sasl_server_settings
from pykbroker.security.session import Session
from pykbroker.server.context import Services
from pykbroker.server.handlers import acls as acl_handlers
from pykbroker.server.handlers import admin, cluster, configs, fetch, metadata, offsets, produce, share
from pykbroker.server.handlers import quotas as client_quotas
from pykbroker.server.handlers import sasl as sasl_handlers
from pykbroker.server.handlers import telemetry as client_telemetry
from pykbroker.server.parked import Parked, Settled
from pykbroker.server.transmit import Part, ResponseParts, frame

log = logging.getLogger("pykbroker.requests")
# One debug line per completed request (client id, API, latency), as Kafka's kafka.request.logger.
request_log = logging.getLogger("pykbroker.request.logger")

# A response body: a dict of kio's field names, typed per API in pykbroker.protocol.responses.
ResponseBody = Mapping[str, Any]
# A handler's answer: the response body, None (no response), or Parked (pykbroker/server/parked.py).
Handler = Callable[[Services, RequestContext, Any], Awaitable[ResponseBody | Parked[ResponseBody | None] | None]]

API_VERSIONS = 18
_SIZE_AND_CORRELATION = struct.Struct(">ii")
_SOFTWARE_RE = re.compile(r"^[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?$")


@dataclass(frozen=True)
class ApiSpec:
    key: int
    min_version: int
    max_version: int
    handler: Handler


async def handle_api_versions(svc: Services, ctx: RequestContext, req: Any) -> ApiVersionsResponse:
    if ctx.version >= 3:
        for value in (req.client_software_name, req.client_software_version):
            if not _SOFTWARE_RE.match(value or ""):
                return {"error_code": ErrorCode.invalid_request, "api_keys": (), "throttle_time": 0}
        # KIP-714 subscriptions may match on the client software this connection names.
        svc.telemetry.note_client_software(ctx.peer, req.client_software_name, req.client_software_version)
    return api_versions_body(ErrorCode.none, ctx.version, hidden_apis(svc))


# Feature flags (KIP-584) this broker supports, as (name, min version, max version).  None: pykbroker
# has no feature levels (no KRaft metadata.version/kraft.version, nothing finalized, no UpdateFeatures),
# implements transactions without KIP-890 part 2 (no per-transaction epoch bump, EndTxn v5 is unstable
# in Kafka 3.9) and KIP-848 groups without a group.version gate.  With no features and finalized epoch
# -1, clients keep their defaults: the Java client 4.x never sees transaction.version 2.
SUPPORTED_FEATURES: tuple[tuple[str, int, int], ...] = ()


def supported_features(version: int, features: tuple[tuple[str, int, int], ...] = SUPPORTED_FEATURES
                       ) -> list[SupportedFeatureKey]:
    """ApiVersions v0-3 omit features whose min version is 0: clients before KAFKA-17011 (Kafka 3.9)
    refuse a response containing one.  v4 lists them all."""
    return [{"name": n, "min_version": lo, "max_version": hi} for n, lo, hi in features if version >= 4 or lo >= 1]


# Share group APIs (KIP-932): Kafka advertises them only once share groups are enabled (the share.version
# feature); pykbroker's switch is group.share.enable (docs/queues.md).
SHARE_APIS = frozenset({76, 77, 78, 79, 90, 91, 92})
# Share coordinator APIs brokers send each other (Read/Write/DeleteShareGroupState): answered for principals
# with CLUSTER_ACTION, never advertised to clients.
INTER_BROKER_APIS = frozenset({84, 85, 86})


# Client telemetry APIs (KIP-714): Kafka advertises them only with a client telemetry reporter, and clients
# that see them ask for a subscription at once (librdkafka logs its new client instance id at info level).
TELEMETRY_APIS = frozenset({71, 72})


def telemetry_advertised(svc: Services) -> bool:
    """pykbroker.client.telemetry.enable: true, false, or auto (while a CLIENT_METRICS subscription exists)."""
    mode = svc.config["pykbroker.client.telemetry.enable"]
    if mode == "auto":
        return any(svc.store.entity_configs(CLIENT_METRICS_RESOURCE).values())
    return bool(mode == "true")


def hidden_apis(svc: Services) -> frozenset[int]:
    hidden = INTER_BROKER_APIS if svc.shares is not None else SHARE_APIS | INTER_BROKER_APIS
    return hidden if telemetry_advertised(svc) else hidden | TELEMETRY_APIS


def api_versions_body(error: ErrorCode, version: int = 0, hidden: frozenset[int] = frozenset()
                      ) -> ApiVersionsResponse:
    return {
        "error_code": error,
        "api_keys": [
            {"api_key": s.key, "min_version": s.min_version, "max_version": s.max_version}
            for s in sorted(API_TABLE.values(), key=lambda s: s.key) if s.key not in hidden
        ],
        "throttle_time": 0,
        "supported_features": supported_features(version),
        "finalized_features_epoch": -1,
        "finalized_features": (),
        "zk_migration_ready": False,
    }


API_TABLE: dict[int, ApiSpec] = {
    s.key: s
    for s in [
        ApiSpec(0, 0, 11, produce.handle_produce),
        ApiSpec(1, 0, 17, fetch.handle_fetch),
        ApiSpec(2, 0, 10, offsets.handle_list_offsets),
        ApiSpec(3, 0, 12, metadata.handle_metadata),
        ApiSpec(18, 0, 4, handle_api_versions),
        ApiSpec(19, 0, 7, admin.handle_create_topics),
        ApiSpec(20, 0, 6, admin.handle_delete_topics),
        ApiSpec(21, 0, 2, offsets.handle_delete_records),
        ApiSpec(29, 1, 3, acl_handlers.handle_describe_acls),
        ApiSpec(30, 1, 3, acl_handlers.handle_create_acls),
        ApiSpec(31, 1, 3, acl_handlers.handle_delete_acls),
        ApiSpec(32, 0, 4, configs.handle_describe_configs),
        ApiSpec(33, 0, 2, configs.handle_alter_configs),
        ApiSpec(44, 0, 1, configs.handle_incremental_alter_configs),
        ApiSpec(37, 0, 3, admin.handle_create_partitions),
        # --- group coordinator ---
        ApiSpec(8, 0, 9, groups.handle_offset_commit),
        ApiSpec(9, 0, 9, groups.handle_offset_fetch),
        ApiSpec(10, 0, 6, groups.handle_find_coordinator),
        ApiSpec(11, 0, 9, groups.handle_join_group),
        ApiSpec(12, 0, 4, groups.handle_heartbeat),
        ApiSpec(13, 0, 5, groups.handle_leave_group),
        ApiSpec(14, 0, 5, groups.handle_sync_group),
        ApiSpec(15, 0, 5, groups.handle_describe_groups),
        ApiSpec(16, 0, 5, groups.handle_list_groups),
        ApiSpec(42, 0, 2, groups.handle_delete_groups),
        ApiSpec(47, 0, 0, groups.handle_offset_delete),
        ApiSpec(68, 0, 1, groups.handle_consumer_group_heartbeat),
        ApiSpec(69, 0, 1, groups.handle_consumer_group_describe),
        # --- end group coordinator ---
        # --- client quotas and telemetry ---
        ApiSpec(48, 0, 1, client_quotas.handle_describe_client_quotas),
        ApiSpec(49, 0, 1, client_quotas.handle_alter_client_quotas),
        ApiSpec(71, 0, 0, client_telemetry.handle_get_telemetry_subscriptions),
        ApiSpec(72, 0, 0, client_telemetry.handle_push_telemetry),
        ApiSpec(74, 0, 0, client_telemetry.handle_list_client_metrics_resources),
        # --- end client quotas and telemetry ---
        # --- SASL (pykbroker.security.sasl) ---
        ApiSpec(17, 0, 1, sasl_handlers.handle_sasl_handshake),
        ApiSpec(36, 0, 2, sasl_handlers.handle_sasl_authenticate),
        ApiSpec(50, 0, 0, sasl_handlers.handle_describe_user_scram_credentials),
        ApiSpec(51, 0, 0, sasl_handlers.handle_alter_user_scram_credentials),
        # --- end SASL ---
        # --- cluster-shaped APIs ---
        ApiSpec(23, 0, 4, cluster.handle_offset_for_leader_epoch),
        ApiSpec(34, 0, 2, cluster.handle_alter_replica_log_dirs),
        ApiSpec(35, 0, 4, cluster.handle_describe_log_dirs),
        ApiSpec(43, 0, 2, cluster.handle_elect_leaders),
        ApiSpec(45, 0, 0, cluster.handle_alter_partition_reassignments),
        ApiSpec(46, 0, 0, cluster.handle_list_partition_reassignments),
        ApiSpec(60, 0, 1, cluster.handle_describe_cluster),
        ApiSpec(75, 0, 0, cluster.handle_describe_topic_partitions),
        # --- end cluster-shaped APIs ---
        # --- transaction coordinator ---
        ApiSpec(22, 0, 5, txn.handle_init_producer_id),
        ApiSpec(24, 0, 5, txn.handle_add_partitions_to_txn),
        ApiSpec(25, 0, 4, txn.handle_add_offsets_to_txn),
        ApiSpec(26, 0, 4, txn.handle_end_txn),
        ApiSpec(27, 0, 1, txn.handle_write_txn_markers),
        ApiSpec(28, 0, 4, txn.handle_txn_offset_commit),
        ApiSpec(61, 0, 0, txn.handle_describe_producers),
        ApiSpec(65, 0, 0, txn.handle_describe_transactions),
        ApiSpec(66, 0, 1, txn.handle_list_transactions),
        # --- end transaction coordinator ---
        # --- share groups (KIP-932), advertised only with group.share.enable ---
        ApiSpec(76, 1, 1, share.handle_share_group_heartbeat),
        ApiSpec(77, 1, 1, share.handle_share_group_describe),
        ApiSpec(78, 1, 2, share.handle_share_fetch),
        ApiSpec(79, 1, 2, share.handle_share_acknowledge),
        ApiSpec(90, 0, 1, share.handle_describe_share_group_offsets),
        ApiSpec(91, 0, 0, share.handle_alter_share_group_offsets),
        ApiSpec(92, 0, 0, share.handle_delete_share_group_offsets),
        ApiSpec(84, 0, 0, share.handle_read_share_group_state),
        ApiSpec(85, 0, 0, share.handle_write_share_group_state),
        ApiSpec(86, 0, 0, share.handle_delete_share_group_state),
        # --- end share groups ---
    ]
}


def _check_table() -> None:
    for s in API_TABLE.values():
        available = codec.supported_versions(s.key)  # kio's versions and pykbroker.protocol.legacy's
        assert available.start <= s.min_version and s.max_version < available.stop, s


_check_table()


class Dispatcher:
    """Turns request frames into response frames; one instance per broker."""

    def __init__(self, services: Services) -> None:
        self.services = services
        # SASL_* listeners' settings (made on the first SASL connection; the config checked them at start).
        self._sasl: dict[str, SaslServerSettings] | None = None

    def _sasl_gate(self, frame: bytes, session: Session) -> SaslAuthenticator | bytes:
        """The connection's authenticator (made on its first frame), or the reply to a raw SASL token
        (the frames after a SaslHandshake v0 carry tokens without a Kafka header)."""
        auth = session.authenticator
        if auth is None:
            if self._sasl is None:
                store = self.services.store  # SCRAM logins read the credentials the metadata store holds
                self._sasl = sasl_server_settings(self.services.config,
                                                  lambda user, mech: store.scram_credentials(user).get(mech))
            settings = self._sasl.get(session.listener)
            if settings is None:
                raise CloseConnection(f"listener {session.listener} uses SASL but has no SASL settings")
            auth = session.authenticator = SaslAuthenticator(settings, session, anyio.current_time)
        if auth.expects_raw_token:
            try:
                return encode_frame(auth.raw_token(frame))
            except SaslClose as e:
                raise CloseConnection(str(e)) from None
        return auth

    def parse(self, frame: bytes) -> tuple[RequestHeader, Any] | bytes:
        """Decode a frame; returns (header, request) or, for an unsupported ApiVersions, the reply.

        Raises CloseConnection where Kafka would close the connection.
        """
        try:
            header = parse_request_header_prefix(frame)
        except HeaderError as e:
            raise CloseConnection(f"malformed request header: {e}") from None
        spec = API_TABLE.get(header.api_key)
        if spec is None:
            raise CloseConnection(f"unknown API key {header.api_key}")
        if not spec.min_version <= header.api_version <= spec.max_version:
            if header.api_key == API_VERSIONS:
                # KIP-511: answer in v0 so any client can read which versions we have.
                body = codec.encode_response(API_VERSIONS, 0, api_versions_body(ErrorCode.unsupported_version, 0,
                                                                             hidden_apis(self.services)))
                return encode_frame(encode_response_header(header.correlation_id, False) + body)
            raise CloseConnection(
                f"unsupported version {header.api_version} of API key {header.api_key} "
                f"(supported {spec.min_version}-{spec.max_version})"
            )
        try:
            if codec.is_flexible(header.api_key, header.api_version):
                header = finish_flexible_header(frame, header)
        except HeaderError as e:
            raise CloseConnection(f"malformed request header: {e}") from None
        try:
            # Every length is checked against the frame before kio allocates anything for it (Fetch,
            # listing thousands of partitions, has a pass of its own: pykbroker.protocol.fast_fetch_request).
            if not (header.api_key == 1 and check_fetch_request(header.api_version, frame, header.body_offset)):
                frame = check_request(header.api_key, header.api_version, frame, header.body_offset)
        except BoundsError as e:
            raise CloseConnection(
                f"rejected {codec.API_NAMES[header.api_key]} v{header.api_version} request before decoding: {e}"
            ) from None
        try:
            request = codec.decode_request(header.api_key, header.api_version, frame, header.body_offset)
        except Exception as e:  # kio raises a variety of errors on malformed input
            raise CloseConnection(
                f"malformed {codec.API_NAMES[header.api_key]} v{header.api_version} request: {e!r}"
            ) from None
        return header, request

    async def handle(self, frame: bytes, session: Session | None = None) -> bytes | ResponseParts | None:
        """Process one request frame; None means no response (acks=0 produce)."""
        out = await self.handle_pipelined(frame, session)
        return await out.finish() if isinstance(out, Parked) else out

    async def handle_pipelined(self, frame: bytes, session: Session | None = None
                               ) -> bytes | ResponseParts | Parked[bytes | ResponseParts | None] | None:
        """As ``handle``, but a request whose in-order work is done and that only waits for an
        acknowledgement (an acks=all or log.flush.on.ack produce) comes back ``Parked``: the network edge
        may process the connection's next requests before awaiting its ``finish``."""
        if session is None:
            session = Session()
        started = perf_counter()
        auth = self._sasl_gate(frame, session) if session.uses_sasl else None
        if isinstance(auth, bytes):
            return auth
        parsed = self.parse(frame)
        if isinstance(parsed, bytes):
            return parsed
        header, request = parsed
        if auth is not None:
            try:
                auth.check(header.api_key, codec.API_NAMES[header.api_key].upper(), len(frame))
            except SaslClose as e:
                raise CloseConnection(str(e)) from None
        peer = session.peer
        ctx = RequestContext(header, session.listener, peer, session, self.services.authorizer)
        spec = API_TABLE[header.api_key]
        quotas = self.services.quotas
        usage: Usage | None = None
        try:
            if quotas is not None and quotas.active():  # the one check when no client quota is stored
                request, usage = self._metered(quotas, session, header, request, len(frame))
                body, usage.handler_seconds = await run_timed(spec.handler(self.services, ctx, request))
            else:
                body = await spec.handler(self.services, ctx, request)
        except CloseConnection:
            raise
        except Exception:
            raise self._failed(header, peer) from None
        if isinstance(body, Parked):
            parked = body
            settle = None
            if (inner := parked.settle) is not None:
                def settle(done: Settled[bytes | ResponseParts | None]) -> None:
                    inner(lambda answer, error: self._settled(answer, error, header, peer, session, started, usage,
                                                              done))
            return Parked(lambda: self._finish_parked(parked, header, peer, session, started, usage),
                          replicated=parked.replicated, long_poll=parked.long_poll, settle=settle)
        return self._respond(body, header, peer, session, started, usage)

    def _settled(self, body: ResponseBody | None, error: BaseException | None, header: RequestHeader, peer: str,
                 session: Session, started: float, usage: Usage | None,
                 done: Settled[bytes | ResponseParts | None]) -> None:
        """``_finish_parked`` for a request settled by a callback: its response, or the close, to ``done``."""
        if error is None:
            try:
                response = self._respond(body, header, peer, session, started, usage)
            except Exception as e:  # CloseConnection (an encoding failure) or a bug
                error = e
            else:
                done(response, None)
                return
        if not isinstance(error, CloseConnection):  # a handler's bug ends its connection, never the broker
            log.error("request failed", exc_info=error, extra=fields(
                api=codec.API_NAMES[header.api_key], version=header.api_version, client_id=header.client_id,
                peer=peer, correlation_id=header.correlation_id))
            error = CloseConnection("internal error while handling the request")
        done(None, error)

    async def _finish_parked(self, parked: Parked[ResponseBody | None], header: RequestHeader, peer: str,
                             session: Session, started: float, usage: Usage | None) -> bytes | ResponseParts | None:
        """The acknowledgement wait of a parked request, then its response as for any other."""
        try:
            body = await parked.finish()
        except CloseConnection:
            raise
        except Exception:
            raise self._failed(header, peer) from None
        return self._respond(body, header, peer, session, started, usage)

    @staticmethod
    def _failed(header: RequestHeader, peer: str) -> CloseConnection:
        """A handler's bug ends its connection (with the traceback logged), never the broker."""
        log.exception("request failed", extra=fields(
            api=codec.API_NAMES[header.api_key], version=header.api_version, client_id=header.client_id, peer=peer,
            correlation_id=header.correlation_id))
        return CloseConnection("internal error while handling the request")

    def _respond(self, body: ResponseBody | None, header: RequestHeader, peer: str, session: Session,
                 started: float, usage: Usage | None) -> bytes | ResponseParts | None:
        """Encode a handler's answer into a response frame (None: acks=0, nothing to send)."""
        quotas = self.services.quotas
        if body is None:
            if usage is not None and quotas is not None:  # acks=0: no response, but still muted
                self._throttle(quotas, usage, None, [], session, header.api_version)
            self._done(header, peer, started, 0)
            return None
        api_key = header.api_key
        version = header.api_version
        flexible = codec.is_flexible(api_key, version) and api_key != API_VERSIONS
        try:
            fast = FAST_ENCODERS.get(api_key)
            parts: list[Part] | None = fast(version, body) if fast is not None else None
            if parts is None:
                parts = [codec.encode_response(api_key, version, body)]
            if usage is not None and quotas is not None:
                parts = self._throttle(quotas, usage, body, parts, session, version)
        except Exception:
            # A body the version cannot carry is a broker bug: it ends this connection, not the broker.
            log.exception("response encoding failed", extra=fields(
                api=codec.API_NAMES[api_key], version=version, client_id=header.client_id, peer=peer,
                correlation_id=header.correlation_id))
            raise CloseConnection("internal error while encoding the response") from None
        # Frame size, response header v0/v1 and body in one join: fetch payloads can be large.
        size = sum(map(len, parts))
        if flexible:
            prefix = _SIZE_AND_CORRELATION.pack(size + 5, header.correlation_id) + b"\x00"
        else:
            prefix = _SIZE_AND_CORRELATION.pack(size + 4, header.correlation_id)
        parts.insert(0, prefix)
        self._done(header, peer, started, size)
        return frame(parts)  # bytes, or parts with fetched records left in their files (pykbroker.server.transmit)

    @staticmethod
    def _metered(quotas: QuotaManager, session: Session, header: RequestHeader, request: Any,
                 request_bytes: int) -> tuple[Any, Usage]:
        """The usage record of a request under client quotas; a consumer's fetch asks for no more than
        its quota can let through (Kafka's getMaxValueInQuotaWindow), else it would never be answered."""
        user, client_id = session.principal.name, header.client_id or ""
        follower = header.api_key == 1 and fetch.replica_id_of(request, header.api_version) >= 0
        if header.api_key == 1 and not follower and hasattr(request, "max_bytes"):
            cap = quotas.fetch_max_bytes(user, client_id)
            if cap is not None and cap < request.max_bytes:
                request = replace(request, max_bytes=max(cap, 1))
        return request, Usage(header.api_key, user, client_id, request_bytes, 0.0, follower)

    @staticmethod
    def _throttle(quotas: QuotaManager, usage: Usage, body: ResponseBody | None, parts: list[Part],
                  session: Session, version: int) -> list[Part]:
        """Charge a request to its client's quotas.  A throttled client gets the throttle time in the
        response at once (a throttled fetch gets no data) and its connection is muted until then (KIP-219)."""
        now = anyio.current_time()
        throttle = charge(quotas, usage, None if body is None else sum(map(len, parts)), now * 1000.0)
        if not throttle.ms:
            return parts
        session.muted_until = max(session.muted_until, now + throttle.ms / 1000.0)
        if body is None:
            return parts
        body = {**body, "throttle_time": max(throttle.ms, body.get("throttle_time") or 0)}
        if throttle.drop_fetch_data:
            body["responses"] = []
        fast = FAST_ENCODERS.get(usage.api_key)
        again = fast(version, body) if fast is not None else None
        return again if again is not None else [codec.encode_response(usage.api_key, version, body)]

    def _done(self, header: RequestHeader, peer: str, started: float, response_bytes: int) -> None:
        """Request metrics, and the request log at debug level (Kafka's kafka.request.logger)."""
        seconds = perf_counter() - started
        self.services.stats.request(header.api_key, header.api_version, seconds)
        if request_log.isEnabledFor(logging.DEBUG):
            request_log.debug("completed request", extra={"kv": {
                "api": codec.API_NAMES.get(header.api_key, header.api_key), "version": header.api_version,
                "client_id": header.client_id, "correlation_id": header.correlation_id, "peer": peer,
                "latency_ms": round(seconds * 1000, 3), "response_bytes": response_bytes}})
