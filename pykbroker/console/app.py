"""The console's web application (Starlette): server-rendered pages over `ClusterClient`, sessions in a signed
cookie, a CSRF token on every form, and writes refused unless the console is writable.

With a SASL listener each person logs in as a Kafka user (a form, or HTTP basic) and their clients connect as
that user, so the broker's ACLs apply to what they see and do; the password stays in this process's memory, never
in the cookie."""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import math
import re
import secrets
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import anyio.to_thread
from starlette.applications import Starlette
from starlette.datastructures import FormData
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from pykbroker.admin.errors import AdminError
from pykbroker.logsetup import fields

from .cluster import SEARCH_SCAN, ClusterClient, LoginFailed, login, render
from .rates import MessagesInRate

log = logging.getLogger("pykbroker.console")
HERE = Path(__file__).parent
PAGE_SIZE = 50
PARTITION_PAGE_SIZE = 100
SEARCH_WAIT_S = 10.0  # a search's longest wait for records (it scans at most cluster.SEARCH_SCAN of them)
SESSION_IDLE_S = 3600.0
MAX_SESSIONS = 1000
T = TypeVar("T")
_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")


@dataclass(frozen=True)
class Access:
    """How the console reaches the broker: its listener's client properties, and the SASL mechanisms a login
    tries (none: the console is open and connects as ANONYMOUS)."""

    properties: dict[str, str]
    mechanisms: tuple[str, ...]
    timeout: float = 10.0

    @property
    def needs_login(self) -> bool:
        return bool(self.mechanisms)


@dataclass
class Page:
    number: int
    pages: int
    total: int

    def link(self, request: Request, number: int) -> str:
        params = dict(request.query_params)
        params["page"] = str(number)
        return request.url.path + "?" + "&".join(f"{quote(k)}={quote(v)}" for k, v in params.items())


def paginate(items: Sequence[T], page: int, size: int) -> tuple[list[T], Page]:
    pages = max(1, math.ceil(len(items) / size))
    page = min(max(1, page), pages)
    return list(items[(page - 1) * size:page * size]), Page(page, pages, len(items))


class _Session:
    def __init__(self, user: str, client: ClusterClient) -> None:
        self.user = user
        self.client = client
        self.used = time.monotonic()


class Sessions:
    """Logged-in users' clients by session id (the cookie holds only the id); idle ones are closed."""

    def __init__(self) -> None:
        self._by_id: dict[str, _Session] = {}
        self._lock = threading.Lock()

    def add(self, sid: str, user: str, client: ClusterClient) -> None:
        with self._lock:
            self._expire()
            if len(self._by_id) >= MAX_SESSIONS:
                oldest = min(self._by_id, key=lambda k: self._by_id[k].used)
                self._by_id.pop(oldest).client.close()
            self._by_id[sid] = _Session(user, client)

    def get(self, sid: str | None) -> _Session | None:
        with self._lock:
            self._expire()
            entry = self._by_id.get(sid) if sid else None
            if entry is not None:
                entry.used = time.monotonic()
            return entry

    def remove(self, sid: str | None) -> None:
        with self._lock:
            entry = self._by_id.pop(sid, None) if sid else None
        if entry is not None:
            entry.client.close()

    def _expire(self) -> None:
        now = time.monotonic()
        for sid in [s for s, e in self._by_id.items() if now - e.used > SESSION_IDLE_S]:
            self._by_id.pop(sid).client.close()

    def close(self) -> None:
        with self._lock:
            entries, self._by_id = list(self._by_id.values()), {}
        for entry in entries:
            entry.client.close()


class Forbidden(Exception):
    pass


class Console:
    def __init__(self, access: Access, *, read_only: bool, rates: MessagesInRate, secret: str | None = None) -> None:
        self.access = access
        self.read_only = read_only
        self.rates = rates
        self.sessions = Sessions()
        self.basic = Sessions()  # HTTP basic logins, by a hash of the credentials
        self._open_client: ClusterClient | None = None
        self._secret = secret or secrets.token_urlsafe(32)
        self.templates = Jinja2Templates(directory=str(HERE / "templates"))
        self.templates.env.globals["read_only"] = read_only
        self.templates.env.globals["needs_login"] = access.needs_login
        self.templates.env.filters["time"] = _format_ms
        self.templates.env.filters["bytes"] = _format_bytes

    # --- sessions, logins, CSRF ---

    def csrf_token(self, request: Request) -> str:
        token = request.session.get("csrf")
        if not token:
            token = request.session["csrf"] = secrets.token_urlsafe(24)
        return str(token)

    def check_csrf(self, request: Request, form: FormData) -> None:
        sent = form.get("csrf")
        expected = request.session.get("csrf")
        if not isinstance(sent, str) or not expected or not secrets.compare_digest(sent, str(expected)):
            raise Forbidden("missing or wrong CSRF token")

    def _props(self, user: str, password: str, mechanism: str) -> dict[str, str]:
        return {**self.access.properties, "sasl.mechanism": mechanism, "sasl.username": user,
                "sasl.password": password}

    def try_login(self, user: str, password: str) -> ClusterClient:
        """A client connected as ``user``, after the broker accepted the login with one of the mechanisms."""
        why = "no SASL mechanism to try"
        for mechanism in self.access.mechanisms:
            props = self._props(user, password, mechanism)
            try:
                login(props, self.access.timeout)
            except LoginFailed as e:
                why = str(e)
                continue
            return ClusterClient(props, self.access.timeout)
        raise LoginFailed(why)

    async def client_for(self, request: Request) -> tuple[str, ClusterClient] | Response:
        """The request's user and clients, or the response that asks for a login."""
        if not self.access.needs_login:
            if self._open_client is None:
                self._open_client = ClusterClient(self.access.properties, self.access.timeout)
            return "ANONYMOUS", self._open_client
        entry = self.sessions.get(request.session.get("sid"))
        if entry is not None:
            return entry.user, entry.client
        basic = _basic_credentials(request)
        if basic is not None:
            user, password = basic
            key = hashlib.sha256(f"{self._secret}\0{user}\0{password}".encode()).hexdigest()
            entry = self.basic.get(key)
            if entry is None:
                try:
                    client = await anyio.to_thread.run_sync(self.try_login, user, password)
                except LoginFailed as e:
                    log.info("console login refused", extra=fields(user=user, reason=str(e)))
                    return PlainTextResponse("login refused\n", status_code=401,
                                             headers={"WWW-Authenticate": 'Basic realm="pykbroker console"'})
                self.basic.add(key, user, client)
                entry = self.basic.get(key)
                assert entry is not None
            return entry.user, entry.client
        if request.method == "GET":
            return RedirectResponse("/login?next=" + quote(request.url.path), status_code=303)
        return PlainTextResponse("login required\n", status_code=401,
                                 headers={"WWW-Authenticate": 'Basic realm="pykbroker console"'})

    def page(self, request: Request, template: str, user: str, status: int = 200, **context: Any) -> Response:
        context.update(request=request, user=user, csrf=self.csrf_token(request), nav=template.split(".")[0],
                       message=request.query_params.get("message"), error=context.get("error"))
        return self.templates.TemplateResponse(request, template, context, status_code=status)

    # --- handlers ---

    async def login_page(self, request: Request) -> Response:
        if not self.access.needs_login:
            return RedirectResponse("/", status_code=303)
        return self.page(request, "login.html", "", next=_safe_next(request.query_params.get("next")))

    async def login_submit(self, request: Request) -> Response:
        form = await request.form()
        self.check_csrf(request, form)
        if not self.access.needs_login:
            return RedirectResponse("/", status_code=303)
        user, password = str(form.get("username", "")), str(form.get("password", ""))
        nxt = _safe_next(str(form.get("next", "/")))
        try:
            client = await anyio.to_thread.run_sync(self.try_login, user, password)
        except LoginFailed as e:
            log.info("console login refused", extra=fields(user=user, reason=str(e)))
            return self.page(request, "login.html", "", status=401, next=nxt,
                             error="Login refused by the broker: wrong user name or password.")
        old = request.session.get("sid")
        self.sessions.remove(old)
        sid = secrets.token_urlsafe(24)
        request.session.clear()  # a new session id and CSRF token after a login
        request.session["sid"] = sid
        self.sessions.add(sid, user, client)
        log.info("console login", extra=fields(user=user))
        return RedirectResponse(nxt, status_code=303)

    async def logout(self, request: Request) -> Response:
        form = await request.form()
        self.check_csrf(request, form)
        self.sessions.remove(request.session.get("sid"))
        request.session.clear()
        return RedirectResponse("/login" if self.access.needs_login else "/", status_code=303)

    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs))

    async def overview(self, request: Request, user: str, client: ClusterClient) -> Response:
        try:
            info = await self._run(client.overview)
        except AdminError as e:
            return self.page(request, "overview.html", user, info=None, error=str(e), rates=self.rates)
        return self.page(request, "overview.html", user, info=info, rates=self.rates,
                         spark=self.rates.sparkline())

    async def topics(self, request: Request, user: str, client: ClusterClient) -> Response:
        q = request.query_params.get("q", "").strip()
        internal = request.query_params.get("internal") == "1"
        try:
            rows, md = await self._run(client.topic_names)
            rows = [r for r in rows if (internal or not r.internal) and q.lower() in r.name.lower()]
            shown, page = paginate(rows, _int(request.query_params.get("page"), 1), PAGE_SIZE)
            await self._run(client.count_messages, shown, md)
            await self._run(client.measure_sizes, shown, md)
        except AdminError as e:
            return self.page(request, "topics.html", user, rows=[], page=None, q=q, internal=internal, error=str(e),
                             rates=self.rates)
        return self.page(request, "topics.html", user, rows=shown, page=page, q=q, internal=internal,
                         rates=self.rates)

    async def topic(self, request: Request, user: str, client: ClusterClient) -> Response:
        name = request.path_params["name"]
        try:
            parts = await self._run(client.topic, name)
            shown, page = paginate(parts, _int(request.query_params.get("page"), 1), PARTITION_PAGE_SIZE)
            offsets = await self._run(client.offsets, [(name, p.partition) for p in shown])
            for p in shown:
                p.start, p.end = offsets[(name, p.partition)]
        except AdminError as e:
            return self.page(request, "topic.html", user, name=name, parts=[], page=None, configs=[], error=str(e))
        try:
            configs = await self._run(client.configs, "TOPIC", name)
            config_error = None
        except AdminError as e:
            configs, config_error = [], str(e)
        return self.page(request, "topic.html", user, name=name, parts=shown, page=page, configs=configs,
                         config_error=config_error, partitions=len(parts))

    async def messages(self, request: Request, user: str, client: ClusterClient) -> Response:
        name = request.path_params["name"]
        qp = request.query_params
        partition = _int(qp.get("partition"), 0)
        limit = min(max(1, _int(qp.get("limit"), 20)), 100)
        offset_text, ts_text = qp.get("offset", "").strip(), qp.get("timestamp", "").strip()
        contains = qp.get("contains", "")
        ctx: dict[str, Any] = dict(name=name, partition=partition, limit=limit, offset=offset_text,
                                   timestamp=ts_text, contains=contains, scan=SEARCH_SCAN, records=None, start=None)
        try:
            parts = await self._run(client.topic, name)
            ctx["partitions"] = [p.partition for p in parts]
            if "partition" in qp:
                timestamp = _timestamp_ms(ts_text) if ts_text else None
                offset = int(offset_text) if offset_text and timestamp is None else None
                if offset is None and timestamp is None:
                    # the newest records; a search looks back over as many as it may scan
                    offset = -SEARCH_SCAN if contains else -limit
                search: dict[str, Any] = {"wait_s": SEARCH_WAIT_S, "contains": contains.encode()} if contains else {}
                records, start = await self._run(client.browse, name, partition, offset=offset,
                                                 timestamp_ms=timestamp, limit=limit, **search)
                ctx.update(records=records, start=start)
        except ValueError as e:
            ctx["error"] = f"bad offset or timestamp: {e}"
        except AdminError as e:
            ctx["error"] = str(e)
        return self.page(request, "messages.html", user, **ctx)

    async def groups(self, request: Request, user: str, client: ClusterClient) -> Response:
        try:
            rows = await self._run(client.groups)
        except AdminError as e:
            return self.page(request, "groups.html", user, rows=[], page=None, error=str(e))
        shown, page = paginate(rows, _int(request.query_params.get("page"), 1), PAGE_SIZE)
        return self.page(request, "groups.html", user, rows=shown, page=page)

    async def group(self, request: Request, user: str, client: ClusterClient) -> Response:
        group_id = request.path_params["group"]
        try:
            detail = await self._run(client.group, group_id)
        except AdminError as e:
            return self.page(request, "group.html", user, group_id=group_id, detail=None, error=str(e))
        shown, page = paginate(detail.partitions, _int(request.query_params.get("page"), 1), PARTITION_PAGE_SIZE)
        members, _ = paginate(detail.members, 1, PARTITION_PAGE_SIZE)
        total_lag = sum(p.lag or 0 for p in detail.partitions)
        return self.page(request, "group.html", user, group_id=group_id, detail=detail, parts=shown, page=page,
                         members=members, total_lag=total_lag)

    async def share_groups(self, request: Request, user: str, client: ClusterClient) -> Response:
        try:
            rows = await self._run(client.share_groups)
        except AdminError as e:
            return self.page(request, "share_groups.html", user, rows=[], page=None, error=str(e))
        shown, page = paginate(rows, _int(request.query_params.get("page"), 1), PAGE_SIZE)
        return self.page(request, "share_groups.html", user, rows=shown, page=page)

    async def share_group(self, request: Request, user: str, client: ClusterClient) -> Response:
        group_id = request.path_params["group"]
        try:
            detail = await self._run(client.share_group, group_id)
        except AdminError as e:
            return self.page(request, "share_group.html", user, group_id=group_id, detail=None, error=str(e))
        shown, page = paginate(detail["offsets"], _int(request.query_params.get("page"), 1), PARTITION_PAGE_SIZE)
        members, _ = paginate(detail["members"], 1, PARTITION_PAGE_SIZE)
        total_lag = sum(o["lag"] or 0 for o in detail["offsets"])
        return self.page(request, "share_group.html", user, group_id=group_id, detail=detail, parts=shown,
                         page=page, members=members, total_lag=total_lag)

    async def acls(self, request: Request, user: str, client: ClusterClient) -> Response:
        try:
            rows = await self._run(client.acls)
        except AdminError as e:
            return self.page(request, "acls.html", user, rows=[], page=None, error=str(e))
        shown, page = paginate(rows, _int(request.query_params.get("page"), 1), PARTITION_PAGE_SIZE)
        return self.page(request, "acls.html", user, rows=shown, page=page)

    async def users(self, request: Request, user: str, client: ClusterClient) -> Response:
        try:
            rows = await self._run(client.users)
        except AdminError as e:
            return self.page(request, "users.html", user, rows=[], page=None, error=str(e))
        shown, page = paginate(rows, _int(request.query_params.get("page"), 1), PARTITION_PAGE_SIZE)
        return self.page(request, "users.html", user, rows=shown, page=page)

    async def brokers(self, request: Request, user: str, client: ClusterClient) -> Response:
        try:
            info = await self._run(client.overview)
            ids = [b.node_id for b in info.brokers]
            broker_id = _int(request.query_params.get("broker"), ids[0] if ids else 0)
            configs = await self._run(client.configs, "BROKER", str(broker_id))
        except AdminError as e:
            return self.page(request, "brokers.html", user, ids=[], broker_id=None, rows=[], page=None,
                             error=str(e))
        q = request.query_params.get("q", "").strip()
        configs = [c for c in configs if q.lower() in c.name.lower()]
        shown, page = paginate(configs, _int(request.query_params.get("page"), 1), PARTITION_PAGE_SIZE)
        return self.page(request, "brokers.html", user, ids=ids, broker_id=broker_id, rows=shown, page=page, q=q)

    # --- writes ---

    async def create_topic(self, request: Request, user: str, client: ClusterClient, form: FormData) -> Response:
        name = str(form.get("name", "")).strip()
        partitions = _int(str(form.get("partitions", "1")), 1)
        rf = _int(str(form.get("replication_factor", "1")), 1)
        if not _TOPIC.fullmatch(name) or name in (".", ".."):
            return _back("/topics", error=f"invalid topic name {name!r}")
        await self._run(client.create_topic, name, partitions, rf)
        log.info("console created a topic", extra=fields(user=user, topic=name))
        return _back(f"/topics/{quote(name)}", message=f"created topic {name}")

    async def delete_topic(self, request: Request, user: str, client: ClusterClient, form: FormData) -> Response:
        name = request.path_params["name"]
        if str(form.get("confirm", "")) != name:
            return _back(f"/topics/{quote(name)}", error="type the topic's name to confirm its deletion")
        await self._run(client.delete_topic, name)
        log.info("console deleted a topic", extra=fields(user=user, topic=name))
        return _back("/topics", message=f"deleted topic {name}")

    async def produce(self, request: Request, user: str, client: ClusterClient, form: FormData) -> Response:
        name = request.path_params["name"]
        part_text = str(form.get("partition", "")).strip()
        key = str(form.get("key", ""))
        headers = []
        for line in str(form.get("headers", "")).splitlines():
            if line.strip():
                k, _, v = line.partition("=")
                headers.append((k.strip(), v.encode()))
        partition, offset = await self._run(client.produce, name, int(part_text) if part_text else None,
                                            key.encode() if key else None, str(form.get("value", "")).encode(),
                                            headers)
        return _back(f"/topics/{quote(name)}/messages?partition={partition}&offset={offset}",
                     message=f"produced to partition {partition} at offset {offset}")

    async def reset_group(self, request: Request, user: str, client: ClusterClient, form: FormData) -> Response:
        group_id = request.path_params["group"]
        to = str(form.get("to", ""))
        if to not in ("earliest", "latest"):
            return _back(f"/groups/{quote(group_id)}", error="reset to earliest or latest")
        count = await self._run(client.reset_offsets, group_id, to)
        log.info("console reset a group's offsets", extra=fields(user=user, group=group_id, to=to))
        return _back(f"/groups/{quote(group_id)}", message=f"reset {count} partition(s) to {to}")


def _back(path: str, *, message: str | None = None, error: str | None = None) -> Response:
    sep = "&" if "?" in path else "?"
    if message:
        path += f"{sep}message={quote(message)}"
    if error:
        path += f"{sep}message={quote('error: ' + error)}"
    return RedirectResponse(path, status_code=303)


def _int(text: str | None, default: int) -> int:
    try:
        return int(text) if text else default
    except ValueError:
        return default


def _timestamp_ms(text: str) -> int:
    """Milliseconds since the epoch, or an ISO 8601 time (UTC unless it says otherwise)."""
    if text.lstrip("-").isdigit():
        return int(text)
    when = datetime.fromisoformat(text)
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


def _format_bytes(n: int) -> str:
    """1536 -> "1.5 KiB": sizes as people read them (the exact count is in the cell's data-bytes)."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _format_ms(ms: int) -> str:
    if ms is None or ms < 0:
        return ""
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _safe_next(value: str | None) -> str:
    """Only a path of this console, never another site."""
    if not value or not value.startswith("/") or value.startswith("//"):
        return "/"
    return value


def _basic_credentials(request: Request) -> tuple[str, str] | None:
    header = request.headers.get("authorization", "")
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic" or not encoded:
        return None
    try:
        user, sep, password = base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return (user, password) if sep else None


def build_app(console: Console) -> Starlette:
    Handler = Callable[[Request, str, ClusterClient], Awaitable[Response]]
    Writer = Callable[[Request, str, ClusterClient, FormData], Awaitable[Response]]

    def read(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            got = await console.client_for(request)
            if isinstance(got, Response):
                return got
            return await handler(request, *got)
        return endpoint

    def write(handler: Writer) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            got = await console.client_for(request)
            if isinstance(got, Response):
                return got
            form = await request.form()
            try:
                console.check_csrf(request, form)
            except Forbidden as e:
                return PlainTextResponse(f"forbidden: {e}\n", status_code=403)
            if console.read_only:
                return PlainTextResponse("forbidden: the console is read-only (pykbroker.console.read.only)\n",
                                         status_code=403)
            try:
                return await handler(request, got[0], got[1], form)
            except AdminError as e:
                referer = request.headers.get("referer", "")
                path = _safe_next("/" + referer.split("/", 3)[3] if referer.count("/") >= 3 else "/")
                return _back(path.split("?")[0], error=str(e))
            except ValueError as e:
                return _back("/", error=str(e))
        return endpoint

    async def guarded(request: Request, fn: Callable[[Request], Awaitable[Response]]) -> Response:
        try:
            return await fn(request)
        except Forbidden as e:
            return PlainTextResponse(f"forbidden: {e}\n", status_code=403)

    async def login_submit(request: Request) -> Response:
        return await guarded(request, console.login_submit)

    async def logout(request: Request) -> Response:
        return await guarded(request, console.logout)

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok\n")

    routes = [
        Route("/", read(console.overview)),
        Route("/login", console.login_page, methods=["GET"]),
        Route("/login", login_submit, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/healthz", healthz),
        Route("/topics", read(console.topics), methods=["GET"]),
        Route("/topics", write(console.create_topic), methods=["POST"]),
        Route("/topics/{name}", read(console.topic), methods=["GET"]),
        Route("/topics/{name}/delete", write(console.delete_topic), methods=["POST"]),
        Route("/topics/{name}/messages", read(console.messages), methods=["GET"]),
        Route("/topics/{name}/produce", write(console.produce), methods=["POST"]),
        Route("/groups", read(console.groups)),
        Route("/groups/{group}", read(console.group), methods=["GET"]),
        Route("/groups/{group}/reset", write(console.reset_group), methods=["POST"]),
        Route("/share-groups", read(console.share_groups)),
        Route("/share-groups/{group}", read(console.share_group), methods=["GET"]),
        Route("/acls", read(console.acls)),
        Route("/users", read(console.users)),
        Route("/brokers", read(console.brokers)),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    middleware = [Middleware(SessionMiddleware, secret_key=console._secret, session_cookie="pykbroker_console",
                             max_age=8 * 3600, same_site="strict", https_only=False)]
    app = Starlette(routes=routes, middleware=middleware)
    app.state.console = console
    app.state.render = render
    return app
