"""SaslHandshake (17), SaslAuthenticate (36), DescribeUserScramCredentials (50) and
AlterUserScramCredentials (51).

The first two drive the connection's SASL authenticator (pykbroker.security.sasl.authenticator);
on a listener without SASL they answer ILLEGAL_SASL_STATE, as Kafka's KafkaApis does.  The SCRAM
admin APIs follow Kafka's validations and error messages; only salted keys are stored.
"""

from __future__ import annotations

import logging
from typing import Any

from kio.schema.errors import ErrorCode

from pykbroker.metadata.store import StoreUnavailable, run_store
from pykbroker.protocol.responses.sasl import (
    AlterUserScramCredentialsResponse,
    AlterUserScramCredentialsResult,
    CredentialInfo,
    DescribeUserScramCredentialsResponse,
    DescribeUserScramCredentialsResult,
    SaslAuthenticateResponse,
    SaslHandshakeResponse,
)
from pykbroker.security.authorizer import AclOperation
from pykbroker.security.authz import cluster_allowed
from pykbroker.security.request import RequestContext
from pykbroker.security.sasl.scram import (
    MAX_ITERATIONS,
    MECHANISM_BY_CODE,
    MECHANISM_CODES,
    MIN_ITERATIONS,
    ScramCredential,
)
from pykbroker.server.context import Services

log = logging.getLogger("pykbroker.security.sasl")


async def handle_sasl_handshake(svc: Services, ctx: RequestContext, req: Any) -> SaslHandshakeResponse:
    auth = ctx.session.authenticator
    if auth is None:
        return {"error_code": ErrorCode.illegal_sasl_state, "mechanisms": ()}
    return auth.handshake(ctx.version, req.mechanism).copy()


async def handle_sasl_authenticate(svc: Services, ctx: RequestContext, req: Any) -> SaslAuthenticateResponse:
    auth = ctx.session.authenticator
    if auth is None:
        return {"error_code": ErrorCode.illegal_sasl_state,
                "error_message": "SaslAuthenticate request received on a listener without SASL",
                "auth_bytes": b"", "session_lifetime": 0}
    return auth.authenticate(ctx.version, bytes(req.auth_bytes)).copy()


# --- SCRAM credential admin ---------------------------------------------------------------------

async def handle_describe_user_scram_credentials(svc: Services, ctx: RequestContext, req: Any
                                                 ) -> DescribeUserScramCredentialsResponse:
    body: DescribeUserScramCredentialsResponse = {"throttle_time": 0, "error_code": ErrorCode.none,
                                                  "error_message": None, "results": []}
    if not cluster_allowed(ctx, AclOperation.DESCRIBE):
        body.update({"error_code": ErrorCode.cluster_authorization_failed,
                     "error_message": "Cluster authorization failed."})
        return body
    stored = svc.store.scram_users()

    def infos(user: str) -> list[CredentialInfo]:
        creds = svc.store.scram_credentials(user)
        return [{"mechanism": MECHANISM_CODES[m], "iterations": c.iterations}
                for m, c in sorted(creds.items()) if m in MECHANISM_CODES]

    if req.users is None or len(req.users) == 0:
        body["results"] = [{"user": u, "error_code": ErrorCode.none, "error_message": None,
                            "credential_infos": infos(u)} for u in sorted(stored)]
        return body
    names = [u.name for u in req.users]
    duplicates = {n for n in names if names.count(n) > 1}
    results: list[DescribeUserScramCredentialsResult] = []
    for name in dict.fromkeys(names):
        if name in duplicates:
            results.append({"user": name, "error_code": ErrorCode.duplicate_resource,
                            "error_message": f"Cannot describe SCRAM credentials for the same user twice in a "
                                             f"single request: {name}", "credential_infos": []})
        elif name not in stored or not infos(name):
            results.append({"user": name, "error_code": ErrorCode.resource_not_found,
                            "error_message": f"Attempt to describe a user credential that does not exist: {name}",
                            "credential_infos": []})
        else:
            results.append({"user": name, "error_code": ErrorCode.none, "error_message": None,
                             "credential_infos": infos(name)})
    body["results"] = results
    return body


async def handle_alter_user_scram_credentials(svc: Services, ctx: RequestContext, req: Any
                                              ) -> AlterUserScramCredentialsResponse:
    users = list(dict.fromkeys([d.name for d in req.deletions] + [u.name for u in req.upsertions]))
    if not cluster_allowed(ctx, AclOperation.ALTER):
        return {"throttle_time": 0, "results": [
            {"user": u, "error_code": ErrorCode.cluster_authorization_failed,
             "error_message": "Cluster authorization failed."} for u in users]}
    errors: dict[str, tuple[ErrorCode, str]] = {}

    def fail(user: str, code: ErrorCode, message: str) -> None:
        errors.setdefault(user, (code, message))

    seen: dict[tuple[str, int], int] = {}
    for op in [*req.deletions, *req.upsertions]:
        seen[(op.name, int(op.mechanism))] = seen.get((op.name, int(op.mechanism)), 0) + 1
    for (user, _mech), count in seen.items():
        if count > 1:
            fail(user, ErrorCode.duplicate_resource, "A user credential cannot be altered twice in the same request")
    for op in [*req.deletions, *req.upsertions]:
        if not op.name:
            fail(op.name, ErrorCode.unacceptable_credential, "Username must not be empty")
        elif int(op.mechanism) not in MECHANISM_BY_CODE:
            fail(op.name, ErrorCode.unsupported_sasl_mechanism, "Unknown SCRAM mechanism")
    for up in req.upsertions:
        if up.iterations < MIN_ITERATIONS:
            fail(up.name, ErrorCode.unacceptable_credential, "Too few iterations")
        elif up.iterations > MAX_ITERATIONS:
            fail(up.name, ErrorCode.unacceptable_credential, "Too many iterations")
        elif not up.salt or not up.salted_password:
            fail(up.name, ErrorCode.unacceptable_credential, "Salt and salted password must not be empty")
    stored = svc.store.scram_users()
    for d in req.deletions:
        mech = MECHANISM_BY_CODE.get(int(d.mechanism))
        if mech is None or mech in stored.get(d.name, {}) or d.name in errors:
            continue
        if svc.store.blocking:  # the cache may not have seen a credential another broker just created
            try:
                if mech in await run_store(svc.store, svc.store.read_scram_mechanisms, d.name):
                    continue
            except StoreUnavailable as e:
                fail(d.name, ErrorCode.unknown_server_error, f"The metadata store is unavailable: {e}")
                continue
        fail(d.name, ErrorCode.resource_not_found, "Attempt to delete a user credential that does not exist")
    upserts: dict[tuple[str, str], ScramCredential] = {}
    deletions: list[tuple[str, str]] = []
    for d in req.deletions:
        if d.name not in errors:
            deletions.append((d.name, MECHANISM_BY_CODE[int(d.mechanism)]))
    for up in req.upsertions:
        if up.name not in errors:
            mech = MECHANISM_BY_CODE[int(up.mechanism)]
            upserts[(up.name, mech)] = ScramCredential.from_salted_password(
                mech, bytes(up.salt), bytes(up.salted_password), int(up.iterations))
    if upserts or deletions:
        try:
            await run_store(svc.store, svc.store.alter_scram_credentials, upserts, deletions)
        except StoreUnavailable as e:
            for user in {u for u, _ in upserts} | {u for u, _ in deletions}:
                fail(user, ErrorCode.unknown_server_error, f"The metadata store is unavailable: {e}")
        else:
            log.info("SCRAM credentials altered by %(principal)s: upserted %(upserted)s, deleted %(deleted)s",
                     {"principal": ctx.session.principal, "upserted": sorted((f'{u}/{m}' for u, m in upserts)),
                      "deleted": sorted((f'{u}/{m}' for u, m in deletions))})
    results: list[AlterUserScramCredentialsResult] = []
    for user in users:
        code, message = errors.get(user, (ErrorCode.none, None))
        results.append({"user": user, "error_code": code, "error_message": message})
    return {"throttle_time": 0, "results": results}
