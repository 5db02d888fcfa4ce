"""One ASGI middleware in front of the WHOLE server (pages, Gradio API, file routes, /v1):

- **Host check** (DNS-rebinding defence): a page on ``evil.example`` whose name an attacker
  re-points at 127.0.0.1 reaches this server with ``Host: evil.example``; only the names this
  server really answers to pass (loopback names, the bound address, ``--allowed-host`` names;
  on a wildcard bind also IP literals and this machine's name, since a rebinding page always
  comes from a domain name).
- **Origin check**: a request that carries an ``Origin`` (or ``Sec-Fetch-Site: cross-site`` on a
  state-changing method) from another site is refused, ``Origin: null`` included. Gradio's own
  CORS layer only withholds headers; it still runs a cross-site POST.
- **Login gate** (when ``--auth`` is on): without a login only the login page and its static
  files are served; every other route answers 401, whatever Gradio's per-route checks say.
  Prefixes that check their own credentials (the OpenAI-compatible ``/v1`` API key) pass through.
- **Body cap**: a request body over the limit is refused with 413 before it is parsed.

Install it with ``guard_middleware(config)`` in the app's middleware list (see app.wiring).
"""

from __future__ import annotations

import ipaddress
import json
import socket
from dataclasses import dataclass
from typing import Any, Awaitable, Callable
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.requests import HTTPConnection

from .config import LOOPBACK_NAMES, is_loopback

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Callable, Callable], Awaitable[None]]

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", "[::]", ""})
LOOPBACK_HOSTS = frozenset({*LOOPBACK_NAMES, "127.0.0.1", "::1"})
# What Gradio's login page needs before anyone has logged in (GET only).
LOGIN_PAGE_PATHS = frozenset({
    "/", "/favicon.ico", "/manifest.json", "/robots.txt", "/theme.css", "/config", "/config/",
    "/gradio_api/theme.css", "/gradio_api/login_check", "/gradio_api/login_check/", "/gradio_api/token",
    "/gradio_api/token/", "/gradio_api/user", "/gradio_api/user/", "/logout",
    "/gradio_api/startup-events",  # Gradio calls it itself once the server is up (idempotent)
})
LOGIN_PAGE_PREFIXES = ("/assets/", "/static/", "/svelte/", "/pwa_icon")
LOGIN_POSTS = frozenset({"/login", "/login/"})
UPLOAD_PATHS = frozenset({"/gradio_api/upload", "/gradio_api/upload/"})


@dataclass(frozen=True)
class GuardConfig:
    bind_host: str = "127.0.0.1"
    allowed_hosts: tuple[str, ...] = ()  # extra names the server answers to (a reverse proxy, a LAN name)
    login_required: bool = False  # --auth is on: the login gate is active
    self_authenticating_prefixes: tuple[str, ...] = ("/v1/",)  # routes that check their own API key
    body_limit_bytes: int = 8 * 1024 * 1024  # JSON/form bodies (a prompt is capped far below)
    upload_limit_bytes: int = 33 * 1024 * 1024  # Gradio's max_file_size plus multipart overhead

    @property
    def wildcard(self) -> bool:
        return self.bind_host.strip() in WILDCARD_HOSTS


def host_name(netloc: str) -> str:
    """``Host``-header or origin netloc -> lower-case host name without port or brackets."""
    netloc = netloc.strip().lower()
    if netloc.startswith("["):
        return netloc[1:netloc.find("]")] if "]" in netloc else netloc[1:]
    if netloc.count(":") > 1:  # a bare IPv6 literal
        return netloc
    return netloc.rsplit(":", 1)[0] if ":" in netloc else netloc


def is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def allowed_names(config: GuardConfig) -> frozenset[str]:
    names = set(LOOPBACK_HOSTS) | {name.lower() for name in config.allowed_hosts}
    if not config.wildcard:
        names.add(host_name(config.bind_host))
    else:
        names.update({socket.gethostname().lower(), socket.getfqdn().lower()})
    return frozenset(names)


def host_allowed(host_header: str | None, config: GuardConfig, names: frozenset[str]) -> bool:
    if not host_header:
        return False
    name = host_name(host_header)
    if name in names:
        return True
    # A wildcard bind answers on every interface address; a rebinding page never has an IP literal
    # for a name. A loopback-only server answers only to loopback addresses.
    if is_ip_literal(name):
        return config.wildcard or is_loopback(name)
    return False


def origin_allowed(origin: str, host_header: str, names: frozenset[str]) -> bool:
    """Same origin as the (already checked) Host, or an origin on a name this server answers to."""
    if origin.strip().lower() == "null":
        return False
    parts = urlsplit(origin.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return False
    if parts.netloc.lower() == host_header.strip().lower():
        return True
    return host_name(parts.netloc) in names


def logged_in(scope: Scope) -> bool:
    """Gradio's login cookie names a token the app issued (fails closed without a Gradio app)."""
    app = scope.get("app")
    tokens, cookie_id = getattr(app, "tokens", None), getattr(app, "cookie_id", None)
    if not isinstance(tokens, dict) or cookie_id is None:
        return False
    cookies = HTTPConnection(scope).cookies  # Starlette's parser: the one Gradio's own login check reads them with
    for name in (f"access-token-{cookie_id}", f"access-token-unsecure-{cookie_id}"):
        token = cookies.get(name)
        if token and tokens.get(token) is not None:
            return True
    return False


def login_exempt(scope: Scope, config: GuardConfig) -> bool:
    path, method = scope.get("path", ""), scope.get("method", "GET")
    if any(path.startswith(prefix) for prefix in config.self_authenticating_prefixes):
        return True
    if method == "POST":
        return path in LOGIN_POSTS
    if method not in ("GET", "HEAD"):
        return False
    return path in LOGIN_PAGE_PATHS or path.startswith(LOGIN_PAGE_PREFIXES)


def refusal(scope: Scope, config: GuardConfig, names: frozenset[str]) -> tuple[int, str] | None:
    """Why this request is refused (status, message), or None to let it through."""
    headers = Headers(scope=scope)
    host = headers.get("host")
    if not host_allowed(host, config, names):
        return 421 if scope["type"] == "http" else 403, (
            f"refused: Host {host!r} is not a name this server answers to (DNS-rebinding protection). "
            "If you reach it through that name on purpose, start it with --allowed-host NAME.")
    origin = headers.get("origin")
    if origin is not None and not origin_allowed(origin, host, names):
        return 403, f"refused: a cross-site request from origin {origin!r}"
    method = scope.get("method", "GET")
    if origin is None and method not in SAFE_METHODS and headers.get("sec-fetch-site") == "cross-site":
        return 403, "refused: a cross-site request"
    if config.login_required and not login_exempt(scope, config) and not logged_in(scope):
        return 401, "Not authenticated: log in first."
    limit = config.upload_limit_bytes if scope.get("path") in UPLOAD_PATHS else config.body_limit_bytes
    length = headers.get("content-length")
    if length is not None and (not length.strip().isdigit() or int(length) > limit):
        return 413, f"refused: the request body is over {limit // (1024 * 1024)} MB"
    return None


class NetworkGuard:
    """Pure ASGI middleware (works for HTTP streaming and websockets alike)."""

    def __init__(self, app: ASGIApp, config: GuardConfig):
        self.app = app
        self.config = config
        self.names = allowed_names(config)

    async def __call__(self, scope: Scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        refused = refusal(scope, self.config, self.names)
        if refused is not None:
            await _refuse(scope, send, *refused)
            return
        if scope["type"] == "websocket":
            await self.app(scope, receive, send)
            return
        limit = self.config.upload_limit_bytes if scope.get("path") in UPLOAD_PATHS else self.config.body_limit_bytes
        started = False

        async def tracked_send(message):
            nonlocal started
            started = started or message.get("type") == "http.response.start"
            await send(message)

        try:
            await self.app(scope, _capped(receive, limit), tracked_send)
        except BodyTooLarge:
            if started:
                raise
            await _refuse(scope, send, 413, f"refused: the request body is over {limit // (1024 * 1024)} MB")


class BodyTooLarge(Exception):
    """A chunked request body ran past the cap (no Content-Length to refuse it up front)."""


def _capped(receive, limit: int):
    seen = 0

    async def capped_receive():
        nonlocal seen
        message = await receive()
        if message.get("type") == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise BodyTooLarge(f"request body over {limit} bytes")
        return message

    return capped_receive


async def _refuse(scope: Scope, send, status: int, message: str) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008, "reason": message[:120]})
        return
    # "error" in OpenAI's shape, so that /v1 clients read this refusal like any other API error
    error = {"message": message, "type": "invalid_request_error", "param": None, "code": None}
    body = json.dumps({"detail": message, "error": error}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def guard_middleware(config: GuardConfig):
    """The Starlette ``Middleware`` entry for an app's middleware list."""
    from starlette.middleware import Middleware

    return Middleware(NetworkGuard, config=config)
