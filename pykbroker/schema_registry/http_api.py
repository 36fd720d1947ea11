"""Confluent Schema Registry's REST API as a Starlette app over a :class:`RegistryBackend`.

Reads are answered from this broker's copy of the registry; writes go to the backend, which appends them to
``_schemas`` when this broker is the writer and raises NotWriter otherwise: the request is then forwarded as
is (its Authorization header included) to the writer's advertised registry URL. A read that finds nothing on a
broker that is not the writer is asked of the writer too, since this broker's replica may lag a registration
just acknowledged there. A forwarded request carries ``X-Pykbroker-Forwarded`` and is never forwarded again.

Errors are Confluent's: ``{"error_code", "message"}`` with its HTTP statuses; request bodies are bounded; a
failure of our own is a 500 with error_code 50001 and one log line, never a traceback to the client."""

from __future__ import annotations

import json
import logging
import re
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import unquote

import httpx
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from . import errors as e
from .registry import Registry, Write, _flag
from .security_api import RegistrySecurity, Unauthorized

log = logging.getLogger("pykbroker.schema_registry")

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
ACCEPTED_CONTENT_TYPES = ("application/vnd.schemaregistry.v1+json", "application/vnd.schemaregistry+json",
                          "application/json", "application/octet-stream")
FORWARDED_HEADER = "x-pykbroker-forwarded"
FORWARD_TIMEOUT_S = 30.0


class RegistryBackend(Protocol):
    """The registry as this broker holds it (service.py): state to read, and the one way to write."""

    registry: Registry
    max_request_bytes: int
    forward_verify: ssl.SSLContext | bool  # how forwarded requests check an https writer

    def is_writer(self) -> bool: ...

    def has_replica(self) -> bool:
        """Whether this broker holds a replica of ``_schemas`` to answer reads from (else it forwards them)."""
        ...

    def writer_url(self) -> str | None: ...

    async def write(self, plan: Callable[[Registry], Write]) -> Any:
        """Plan against the up-to-date state, append, wait until committed, apply; the plan's result. Raises
        NotWriter when this broker does not lead ``_schemas``, RegistryError for the plan's refusals and for a
        write that could not be committed."""
        ...


def json_response(doc: Any, status: int = 200) -> Response:
    return Response(json.dumps(doc, separators=(",", ":"), ensure_ascii=False), status_code=status,
                    media_type=CONTENT_TYPE)


def error_response(err: e.RegistryError) -> Response:
    return json_response(err.body(), err.http_status)


class _BodyError(Exception):
    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass
class Call:
    """One request as the endpoints see it."""

    request: Request
    body: Any
    raw: bytes

    def q(self, name: str, default: str = "") -> str:
        return self.request.query_params.get(name, default)

    def flag(self, *names: str) -> bool:
        return any(_flag(self.request.query_params.get(n, "")) for n in names)

    def num(self, name: str, default: int) -> int:
        try:
            return int(self.request.query_params.get(name, default))
        except ValueError:
            return default

    @property
    def subject(self) -> str:
        return path_subject(self.request) or ""

    @property
    def version(self) -> str:
        return str(self.request.path_params["version"])

    @property
    def schema_id(self) -> int:
        return int(self.request.path_params["id"])


Handler = Callable[[Call], Awaitable[Response]]

ENCODED_SLASH = "%2F"
_ENCODED_SLASH_RE = re.compile("%2f", re.IGNORECASE)


def path_subject(request: Request) -> str | None:
    """The subject of the path, a ``/`` in it sent as ``%2F`` (Protobuf references are registered under their
    import path, e.g. ``common/address.proto``)."""
    value = request.path_params.get("subject")
    return None if value is None else str(value).replace(ENCODED_SLASH, "/")


class _EncodedSlashes:
    """Routes on the path with ``%2F`` kept encoded, so that a subject may contain ``/``: the server decodes
    the path before routing, which would split such a subject into two path segments."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        raw = scope.get("raw_path") if scope.get("type") == "http" else None
        if raw and b"%2f" in raw.lower():
            text = raw.split(b"?", 1)[0].decode("latin-1")
            scope = dict(scope, path=ENCODED_SLASH.join(unquote(part) for part in _ENCODED_SLASH_RE.split(text)))
        await self.app(scope, receive, send)


def build_app(backend: RegistryBackend, *, security: RegistrySecurity | None = None) -> Starlette:
    client: dict[str, httpx.AsyncClient] = {}

    def http() -> httpx.AsyncClient:
        if "c" not in client:
            client["c"] = httpx.AsyncClient(timeout=FORWARD_TIMEOUT_S, verify=backend.forward_verify)
        return client["c"]

    async def forward(call: Call) -> Response:
        if call.request.headers.get(FORWARDED_HEADER):
            raise e.unknown_leader("This broker is not the schema registry's writer and the request was already "
                                   "forwarded once")
        url = backend.writer_url()
        if url is None:
            raise e.unknown_leader("Leader not known: no broker leads the _schemas partition now")
        raw_path = call.request.scope.get("raw_path")
        path = raw_path.split(b"?", 1)[0].decode("latin-1") if raw_path else call.request.url.path
        target = url.rstrip("/") + path
        if call.request.url.query:
            target += "?" + call.request.url.query
        headers = {FORWARDED_HEADER: "1"}
        for name in ("authorization", "content-type", "accept"):
            if name in call.request.headers:
                headers[name] = call.request.headers[name]
        try:
            r = await http().request(call.request.method, target, content=call.raw, headers=headers)
        except httpx.HTTPError as exc:
            raise e.forwarding_failed(f"Error while forwarding the request to the schema registry's writer at "
                                      f"{url}: {exc!r}") from None
        return Response(r.content, status_code=r.status_code,
                        media_type=r.headers.get("content-type", CONTENT_TYPE))

    async def write(call: Call, plan: Callable[[Registry], Write]) -> Response:
        try:
            result = await backend.write(plan)
        except e.NotWriter:
            return await forward(call)
        return json_response(result)

    async def read_body(request: Request) -> bytes:
        limit = backend.max_request_bytes
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise _BodyError(413, 413, f"The request body ({length} bytes) exceeds "
                                       f"pykbroker.schema.registry.max.request.bytes ({limit})")
        buf = bytearray()
        async for chunk in request.stream():
            buf += chunk
            if len(buf) > limit:
                raise _BodyError(413, 413, f"The request body exceeds pykbroker.schema.registry.max.request.bytes "
                                           f"({limit})")
        return bytes(buf)

    def parse_json(request: Request, raw: bytes) -> Any:
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype and ctype not in ACCEPTED_CONTENT_TYPES:
            raise _BodyError(415, 415, f"Unsupported content type {ctype!r}: send {ACCEPTED_CONTENT_TYPES[0]}")
        if not raw.strip():
            raise _BodyError(422, 422, "The request needs a JSON body")
        try:
            return json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise _BodyError(400, 400, f"Malformed JSON in the request body: {exc}") from None

    def endpoint(operation: str, handler: Handler, *, body: bool = False, global_scope: bool = False
                 ) -> Callable[[Request], Awaitable[Response]]:
        async def run(request: Request) -> Response:
            raw = b""
            try:
                if security is not None:
                    try:
                        principal = await security.authenticate(request.headers.get("authorization"))
                    except Unauthorized as exc:
                        return Response(json.dumps({"error_code": e.UNAUTHORIZED,
                                                    "message": str(exc) or "Unauthorized"}),
                                        status_code=401, media_type=CONTENT_TYPE,
                                        headers={"WWW-Authenticate": 'Basic realm="schema-registry"'})
                    subject = None if global_scope else path_subject(request)
                    host = request.client.host if request.client is not None else ""
                    if not security.authorize(principal, host, operation, subject):
                        return json_response({"error_code": e.FORBIDDEN,
                                              "message": f"User {principal or 'ANONYMOUS'} is not authorized to "
                                                         f"{operation} {('subject ' + subject) if subject else ''}"
                                                         .rstrip()}, 403)
                    request.state.principal, request.state.host = principal, host
                doc: Any = None
                if body:
                    raw = await read_body(request)
                    doc = parse_json(request, raw)
                call = Call(request, doc, raw)
                if (not backend.has_replica() and not request.headers.get(FORWARDED_HEADER)
                        and backend.writer_url() is not None):
                    return await forward(call)
                try:
                    return await handler(call)
                except e.RegistryError as err:
                    if (request.method in ("GET", "POST") and operation == "READ" and err.http_status == 404
                            and not backend.is_writer() and not request.headers.get(FORWARDED_HEADER)
                            and backend.writer_url() is not None):
                        return await forward(call)  # our replica may lag a registration the writer acknowledged
                    raise
            except e.RegistryError as err:
                return error_response(err)
            except _BodyError as err:
                return json_response({"error_code": err.code, "message": err.message}, err.status)
            except Exception as exc:  # a bug of ours: one line, and Confluent's store error to the client
                log.error("schema registry %(method)s %(path)s failed: %(error)r",
                          {"method": request.method, "path": request.url.path, "error": exc})
                return json_response({"error_code": e.STORE_ERROR, "message": f"Internal error: {exc!r}"}, 500)

        return run

    def reg() -> Registry:
        return backend.registry

    # --- endpoints ---

    async def root(call: Call) -> Response:
        return json_response({})

    async def schema_types(call: Call) -> Response:
        return json_response(sorted(reg().formats.schema_types))

    async def contexts(call: Call) -> Response:
        return json_response(["."])

    async def list_schemas(call: Call) -> Response:
        out = reg().list_schemas(prefix=call.q("subjectPrefix"), deleted=call.flag("deleted"),
                                 latest_only=call.flag("latestOnly"))
        if security is not None:
            out = [d for d in out if _may(call, "READ", d["subject"])]
        return json_response(_paged(call, out))

    def _may(call: Call, operation: str, subject: str) -> bool:
        assert security is not None
        return security.authorize(call.request.state.principal, call.request.state.host, operation, subject)

    def _may_read_id(call: Call) -> None:
        """A schema by id: READ on at least one subject holding it (Confluent's SCHEMA_READ rule)."""
        if security is None:
            return
        if not any(_may(call, "READ", s) for s in reg().subjects_of_id(call.schema_id, deleted=True)):
            raise e.RegistryError(403, e.FORBIDDEN, f"User {call.request.state.principal or 'ANONYMOUS'} is not "
                                                    f"authorized to READ schema {call.schema_id}")

    async def schema_by_id(call: Call) -> Response:
        _may_read_id(call)
        return json_response(reg().schema_by_id(call.schema_id, fmt=call.q("format")))

    async def schema_text_by_id(call: Call) -> Response:
        _may_read_id(call)
        return Response(reg().schema_text_by_id(call.schema_id, fmt=call.q("format")), media_type=CONTENT_TYPE)

    async def subjects_of_id(call: Call) -> Response:
        _may_read_id(call)
        subject = call.q("subject") or None
        out = reg().subjects_of_id(call.schema_id, subject=subject, deleted=call.flag("deleted"))
        if security is not None:
            out = [s for s in out if _may(call, "READ", s)]
        return json_response(_paged(call, out))

    async def versions_of_id(call: Call) -> Response:
        _may_read_id(call)
        subject = call.q("subject") or None
        out = reg().versions_of_id(call.schema_id, subject=subject, deleted=call.flag("deleted"))
        if security is not None:
            out = [v for v in out if _may(call, "READ", v["subject"])]
        return json_response(_paged(call, out))

    def _paged(call: Call, items: list[Any]) -> list[Any]:
        items = items[max(0, call.num("offset", 0)):]
        limit = call.num("limit", -1)
        return items[:limit] if limit > 0 else items

    async def list_subjects(call: Call) -> Response:
        out = reg().list_subjects(deleted=call.flag("deleted"), deleted_only=call.flag("deleted_only", "deletedOnly"),
                                  prefix=call.q("subjectPrefix"))
        if security is not None:
            out = [s for s in out if _may(call, "READ", s)]
        return json_response(_paged(call, out))

    async def list_versions(call: Call) -> Response:
        return json_response(_paged(call, reg().list_versions(
            call.subject, deleted=call.flag("deleted"), deleted_only=call.flag("deleted_only", "deletedOnly"))))

    async def get_version(call: Call) -> Response:
        return json_response(reg().get_version(call.subject, call.version, deleted=call.flag("deleted"),
                                               fmt=call.q("format")))

    async def get_version_schema(call: Call) -> Response:
        return Response(reg().get_version_schema(call.subject, call.version, deleted=call.flag("deleted"),
                                                 fmt=call.q("format")), media_type=CONTENT_TYPE)

    async def referenced_by(call: Call) -> Response:
        return json_response(_paged(call, reg().referenced_by(call.subject, call.version)))

    async def register(call: Call) -> Response:
        subject, normalize = call.subject, call.flag("normalize")
        return await write(call, lambda r: r.plan_register(subject, call.body, normalize=normalize))

    async def lookup(call: Call) -> Response:
        return json_response(reg().lookup(call.subject, call.body, normalize=call.flag("normalize"),
                                          deleted=call.flag("deleted")))

    async def delete_subject(call: Call) -> Response:
        subject, permanent = call.subject, call.flag("permanent")
        return await write(call, lambda r: r.plan_delete_subject(subject, permanent=permanent))

    async def delete_version(call: Call) -> Response:
        subject, version, permanent = call.subject, call.version, call.flag("permanent")
        Registry.parse_version(version)  # 42202 here, not from the writer
        return await write(call, lambda r: r.plan_delete_version(subject, version, permanent=permanent))

    async def get_config(call: Call) -> Response:
        return json_response(reg().get_config(None))

    async def put_config(call: Call) -> Response:
        return await write(call, lambda r: r.plan_set_config(None, call.body))

    async def delete_config(call: Call) -> Response:
        return await write(call, lambda r: r.plan_delete_config(None))

    async def get_subject_config(call: Call) -> Response:
        return json_response(reg().get_config(call.subject, default_to_global=call.flag("defaultToGlobal")))

    async def put_subject_config(call: Call) -> Response:
        subject = call.subject
        return await write(call, lambda r: r.plan_set_config(subject, call.body))

    async def delete_subject_config(call: Call) -> Response:
        subject = call.subject
        return await write(call, lambda r: r.plan_delete_config(subject))

    async def get_mode(call: Call) -> Response:
        return json_response(reg().get_mode(None))

    async def put_mode(call: Call) -> Response:
        force = call.flag("force")
        return await write(call, lambda r: r.plan_set_mode(None, call.body, force=force))

    async def get_subject_mode(call: Call) -> Response:
        return json_response(reg().get_mode(call.subject, default_to_global=call.flag("defaultToGlobal")))

    async def put_subject_mode(call: Call) -> Response:
        subject, force = call.subject, call.flag("force")
        return await write(call, lambda r: r.plan_set_mode(subject, call.body, force=force))

    async def delete_subject_mode(call: Call) -> Response:
        subject = call.subject
        return await write(call, lambda r: r.plan_delete_mode(subject))

    async def compatibility(call: Call) -> Response:
        version = call.request.path_params.get("version")
        return json_response(reg().check_compatibility(call.subject, version, call.body,
                                                       normalize=call.flag("normalize"),
                                                       verbose=call.flag("verbose")))

    async def not_found(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        detail = exc.detail if isinstance(exc, HTTPException) else "Internal error"
        return json_response({"error_code": status, "message": f"HTTP {status} {detail}"}, status)

    R, W, D = "READ", "WRITE", "DELETE"
    DC, AC = "DESCRIBE_CONFIGS", "ALTER_CONFIGS"
    routes = [
        Route("/", endpoint(R, root), methods=["GET"]),
        Route("/schemas/types", endpoint(R, schema_types), methods=["GET"]),
        Route("/contexts", endpoint(R, contexts), methods=["GET"]),
        Route("/schemas", endpoint(R, list_schemas), methods=["GET"]),
        Route("/schemas/ids/{id:int}", endpoint(R, schema_by_id), methods=["GET"]),
        Route("/schemas/ids/{id:int}/schema", endpoint(R, schema_text_by_id), methods=["GET"]),
        Route("/schemas/ids/{id:int}/subjects", endpoint(R, subjects_of_id), methods=["GET"]),
        Route("/schemas/ids/{id:int}/versions", endpoint(R, versions_of_id), methods=["GET"]),
        Route("/subjects", endpoint(R, list_subjects), methods=["GET"]),
        Route("/subjects/{subject}", endpoint(R, lookup, body=True), methods=["POST"]),
        Route("/subjects/{subject}", endpoint(D, delete_subject), methods=["DELETE"]),
        Route("/subjects/{subject}/versions", endpoint(R, list_versions), methods=["GET"]),
        Route("/subjects/{subject}/versions", endpoint(W, register, body=True), methods=["POST"]),
        Route("/subjects/{subject}/versions/{version}", endpoint(R, get_version), methods=["GET"]),
        Route("/subjects/{subject}/versions/{version}", endpoint(D, delete_version), methods=["DELETE"]),
        Route("/subjects/{subject}/versions/{version}/schema", endpoint(R, get_version_schema), methods=["GET"]),
        Route("/subjects/{subject}/versions/{version}/referencedby", endpoint(R, referenced_by), methods=["GET"]),
        Route("/config", endpoint(DC, get_config, global_scope=True), methods=["GET"]),
        Route("/config", endpoint(AC, put_config, body=True, global_scope=True), methods=["PUT"]),
        Route("/config", endpoint(AC, delete_config, global_scope=True), methods=["DELETE"]),
        Route("/config/{subject}", endpoint(DC, get_subject_config), methods=["GET"]),
        Route("/config/{subject}", endpoint(AC, put_subject_config, body=True), methods=["PUT"]),
        Route("/config/{subject}", endpoint(AC, delete_subject_config), methods=["DELETE"]),
        Route("/mode", endpoint(DC, get_mode, global_scope=True), methods=["GET"]),
        Route("/mode", endpoint(AC, put_mode, body=True, global_scope=True), methods=["PUT"]),
        Route("/mode/{subject}", endpoint(DC, get_subject_mode), methods=["GET"]),
        Route("/mode/{subject}", endpoint(AC, put_subject_mode, body=True), methods=["PUT"]),
        Route("/mode/{subject}", endpoint(AC, delete_subject_mode), methods=["DELETE"]),
        Route("/compatibility/subjects/{subject}/versions", endpoint(R, compatibility, body=True), methods=["POST"]),
        Route("/compatibility/subjects/{subject}/versions/{version}", endpoint(R, compatibility, body=True),
              methods=["POST"]),
    ]

    async def close_client() -> None:
        c = client.pop("c", None)
        if c is not None:
            await c.aclose()

    app = Starlette(routes=routes, exception_handlers={HTTPException: not_found},
                    middleware=[Middleware(_EncodedSlashes)])
    app.state.close = close_client
    return app
