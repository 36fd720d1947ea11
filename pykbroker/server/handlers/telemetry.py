"""GetTelemetrySubscriptions, PushTelemetry and ListClientMetricsResources (KIP-714).

The state machine is :class:`pykbroker.server.telemetry.ClientTelemetry`; these handlers feed it
the CLIENT_METRICS subscriptions from the metadata store and the request's client.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from pykbroker.protocol.responses.telemetry import (
    GetTelemetrySubscriptionsResponse,
    ListConfigResourcesResponse,
    PushTelemetryResponse,
)
from pykbroker.security.authorizer import AclOperation
from pykbroker.security.authz import cluster_allowed
from pykbroker.security.request import RequestContext
from pykbroker.server.context import Services, now_ms
from pykbroker.server.telemetry import ClientTelemetry


def _telemetry(svc: Services) -> ClientTelemetry:
    tel = svc.telemetry
    tel.update_subscriptions(svc.store.client_metrics_configs())
    return tel


async def handle_get_telemetry_subscriptions(svc: Services, ctx: RequestContext, req: Any
                                            ) -> GetTelemetrySubscriptionsResponse:
    tel = _telemetry(svc)
    return tel.get_subscriptions(req.client_instance_id, tel.selector(ctx.header.client_id, ctx.peer), now_ms())


async def handle_push_telemetry(svc: Services, ctx: RequestContext, req: Any) -> PushTelemetryResponse:
    tel = _telemetry(svc)
    error = tel.push(req.client_instance_id, int(req.subscription_id), bool(req.terminating),
                     int(req.compression_type), bytes(req.metrics or b""),
                     tel.selector(ctx.header.client_id, ctx.peer), now_ms())
    return {"throttle_time": 0, "error_code": error}


async def handle_list_client_metrics_resources(svc: Services, ctx: RequestContext, req: Any
                                               ) -> ListConfigResourcesResponse:
    # Telemetry push/subscriptions need no ACL (as Kafka); listing the resources needs DESCRIBE_CONFIGS.
    if not cluster_allowed(ctx, AclOperation.DESCRIBE_CONFIGS):
        return {"throttle_time": 0, "error_code": ErrorCode.cluster_authorization_failed, "config_resources": []}
    names = sorted(name for name, configs in svc.store.client_metrics_configs().items() if configs)
    return {"throttle_time": 0, "error_code": ErrorCode.none,
            "config_resources": [{"resource_name": n, "resource_type": 16} for n in names]}
