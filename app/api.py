"""The OpenAI-compatible HTTP API on the app's own server and port, beside the page:

    GET  /v1/models            every pair this Studio can run (a request naming one switches to it)
    POST /v1/chat/completions  chat, streamed (server-sent events) or not
    POST /v1/completions       raw text continuation, streamed or not
    GET  /health               200 when a model is loaded, 503 while loading or after a failed load
    GET  /v1/openapi.json      the schema of all this

An interface like the page: requests become engine calls on the same ONE worker (in order,
behind what the page asked for), engine events become OpenAI objects, and each conversation is
stored as a session (``api_sessions``). Errors always have OpenAI's shape, never a page or a
traceback. On loopback no key is needed; with ``--api-key`` every /v1 request needs
``Authorization: Bearer KEY``.
"""

from __future__ import annotations

import hmac
import json
import re
import secrets
from urllib.parse import urlsplit
from dataclasses import dataclass, field

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.datastructures import Headers
from starlette.routing import Route

from engine.errors import DFlashError, EmptyPromptError, PromptTooLongError
from engine.events import Failed, Finished
from engine.interface import capabilities_of
from engine.shipped import name_slug
from engine.stops import unsafe_tail
from service.items import EventItem, Refused, ReplyError
from service.replies import ReplyService

from .api_render import Envelope, ReplyTally, error_body
from .api_requests import (
    ApiRequest,
    ChatCompletionRequest,
    CompletionRequest,
    Defaults,
    UnsupportedParameter,
    to_api_request,
)
from .api_runs import Run, finish_run, start_run
from .config import ApiConfig

API_PREFIX = "/v1"
MAX_BODY_BYTES = 4 * 1024 * 1024
ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 403: "invalid_request_error",
               404: "invalid_request_error",
               405: "invalid_request_error", 413: "invalid_request_error", 503: "server_error"}


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.param, self.code = status, param, code

    def response(self) -> JSONResponse:
        type_ = ERROR_TYPES.get(self.status, "server_error")
        return JSONResponse(error_body(str(self), type_, self.param, self.code), status_code=self.status,
                            headers={"WWW-Authenticate": "Bearer"} if self.status == 401 else None)


def model_id(key: str) -> str:
    """The id clients use for a model-menu key: the key itself ('tiny-coder', 'Qwen3-8B-DFlash-b16'),
    or, for a key with other characters, a slug ('vLLM at http://h:8000' -> 'vllm-at-http-h-8000')."""
    if re.fullmatch(r"[A-Za-z0-9._+-]+", key):
        return key
    return name_slug(key) or "model"


@dataclass
class ApiService:
    """What the routes need: the reply service (store, engine host, Stop flags) and settings."""

    replies: ReplyService
    config: ApiConfig = field(default_factory=ApiConfig)
    defaults: Defaults = field(default_factory=Defaults)
    login_required: bool = False  # the page needs a login (--auth): then /v1 needs a key too

    # ------------------------------------------------------------------ checks
    def refusal(self, headers: Headers) -> ApiError | None:
        """Why a request may not reach any /v1 route (checked before its body is read)."""
        origin = headers.get("origin")
        if origin is not None and urlsplit(origin.strip()).netloc.lower() != headers.get("host", "").lower():
            # Editors and scripts send no Origin; a browser does, and only this server's own page may
            # call the API from one (the server-wide guard lets other ports of this machine through).
            return ApiError(403, f"requests from web pages of another origin ({origin}) are not accepted",
                            code="cross_origin")
        if self.config.key is None and self.login_required:
            return ApiError(401, "This server requires a login (--auth); the API needs a key of its own: "
                                 "start it with --api-key KEY and send 'Authorization: Bearer KEY'.",
                            code="invalid_api_key")
        if self.config.key is not None:
            scheme, _, token = headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.config.key.encode()):
                return ApiError(401, "Missing or incorrect API key: send 'Authorization: Bearer <the key given "
                                     "to dflash-studio serve --api-key>'.", code="invalid_api_key")
        length = headers.get("content-length", "0")
        if length.isdigit() and int(length) > MAX_BODY_BYTES:
            return ApiError(413, f"the request body is over {MAX_BODY_BYTES // 1024 // 1024} MB")
        return None

    def model_cards(self) -> list[dict]:
        """One card per pair the Studio can run, the loaded one first."""
        host = self.replies.engines
        keys = [choice.key for choice in host.models()]
        current = host.current_key
        return [self.model_card(key) for key in sorted(keys, key=lambda key: key != current)]

    def model_card(self, key: str) -> dict:
        host = self.replies.engines
        choice = host.catalog[key]
        loaded = key == host.current_key
        engine = host.engine if loaded else None
        status = host.status()
        state = status.state if loaded or status.model_key == key else "not loaded (loads on request)"
        return {"id": model_id(key), "object": "model", "created": 0, "owned_by": "dflash-studio",
                "dflash": {"name": key, "purpose": choice.hint or None, "source": choice.note or None,
                           "loaded": loaded and engine is not None, "status": state,
                           "block_size": getattr(engine, "block_size", None),
                           "speculative": getattr(engine, "speculative", None),
                           # which path answers (compiled / eager), compile seconds, recompiles after warm-up
                           "decode_path": engine.path_info() if hasattr(engine, "path_info") else None}}

    def check_model(self, name: str | None) -> str:
        """The menu key a request's ``model`` names (None: the loaded one); 404 for no pair here."""
        if name is None:
            return self.replies.engines.current_key
        key = self.replies.engines.resolve(name)
        if key is None:
            ids = ", ".join(model_id(choice.key) for choice in self.replies.engines.models())
            raise ApiError(404, f"The model '{name}' does not exist here; this server has {ids} "
                                "(GET /v1/models).", param="model", code="model_not_found")
        return key

    def check_engine(self, request: ApiRequest, key: str) -> None:
        """Refuse a request the loaded engine cannot take (prompt over the context window...)
        before anything is stored; while a model loads, or for another model than the loaded
        one, the worker checks it once that model is loaded."""
        status = self.replies.engines.status()
        engine = self.replies.engines.engine
        if key != self.replies.engines.current_key:
            return
        if engine is None:
            if status.state == "failed":
                raise ApiError(503, f"no model is loaded: {status.error}", code="model_not_loaded")
            return
        capabilities = capabilities_of(engine)
        for name, supported in (("block_size", capabilities.block_size_choice), ("fallback", capabilities.fallback)):
            if name in request.params and not supported:
                raise ApiError(400, f"{name}: not supported by the {capabilities.kind} engine this server runs",
                               param=name, code="unsupported_parameter")
        try:
            engine.check_request(engine.encode(request.prompt, raw=request.raw), request.sampling)
        except PromptTooLongError as exc:
            raise ApiError(400, f"{exc}. Shorten the prompt.", param="messages" if request.kind == "chat" else "prompt",
                           code="context_length_exceeded") from None
        except DFlashError as exc:
            raise ApiError(400, str(exc), param="messages" if request.kind == "chat" else "prompt") from None

    # ------------------------------------------------------------------ completions
    async def complete(self, body, http_request: Request, endpoint: str):
        try:
            request = to_api_request(body, self.defaults)
        except UnsupportedParameter as exc:
            raise ApiError(400, str(exc), param=exc.param, code="unsupported_parameter") from None
        except EmptyPromptError as exc:
            raise ApiError(400, str(exc), param="messages" if endpoint == "chat.completions" else "prompt",
                           code="empty_prompt") from None
        key = self.check_model(request.model)
        await anyio.to_thread.run_sync(self.check_engine, request, key)
        run = await start_run(self.replies, request, endpoint, self.config.store, model=key)
        try:
            await self._first_item(run, http_request)
        except BaseException:
            finish_run(self.replies, run)
            raise
        envelope = Envelope(("chatcmpl-" if request.kind == "chat" else "cmpl-") + secrets.token_hex(12),
                            model_id(key), kind=request.kind)
        if request.stream:
            return StreamingResponse(self._stream(run, envelope, request), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            return JSONResponse(await self._collect(run, envelope, http_request))
        finally:
            finish_run(self.replies, run)

    async def _first_item(self, run: Run, http_request: Request) -> None:
        """Wait (in the engine queue) until the worker starts the reply or refuses it."""
        item = await run.next(http_request)
        if item is None:
            raise ApiError(499, "the client closed the request")
        if isinstance(item, Refused):
            raise ApiError(400, item.reason)
        if isinstance(item, ReplyError):
            raise ApiError(500, f"the reply could not be started: {item.error}")

    def _tally(self) -> ReplyTally:
        return ReplyTally(rejected_known=capabilities_of(self.replies.engines.engine).rejected_drafts)

    async def _collect(self, run: Run, envelope: Envelope, http_request: Request) -> dict:
        tally = self._tally()
        async for item in run.items(http_request):
            if isinstance(item, ReplyError):
                raise ApiError(500, f"the reply could not be saved: {item.error}")
            if isinstance(item, EventItem) and isinstance(item.event, Failed):
                raise ApiError(500, f"generation failed: {item.event.kind}: {item.event.message}")
            if isinstance(item, EventItem):
                tally.add(item.event)
        if tally.finished is None and not run.cancel.is_set():
            raise ApiError(500, "the generation ended without a result")
        return envelope.response(tally)

    async def _stream(self, run: Run, envelope: Envelope, request: ApiRequest):
        tally, sent, first, thought = self._tally(), 0, True, 0  # thought: reasoning characters sent
        try:
            async for item in run.items():
                if isinstance(item, ReplyError) or (isinstance(item, EventItem) and isinstance(item.event, Failed)):
                    message = (item.error if isinstance(item, ReplyError)
                               else f"generation failed: {item.event.kind}: {item.event.message}")
                    yield sse(error_body(message, "server_error"))
                    break
                if not isinstance(item, EventItem):
                    continue
                event = item.event
                info = tally.add(event)
                if isinstance(event, Finished):
                    yield sse(envelope.chunk(tally.text[sent:], tally.finish_reason, tally.summary(), first,
                                             tally.reasoning[thought:]))
                    if request.include_usage:
                        yield sse(envelope.usage_chunk(tally))
                elif info is not None:
                    safe = len(tally.text) - (unsafe_tail(tally.text, request.stop) if request.stop else 0)
                    yield sse(envelope.chunk(tally.text[sent:max(sent, safe)], None, info, first,
                                             tally.reasoning[thought:]))
                    sent, first, thought = max(sent, safe), False, len(tally.reasoning)
            yield "data: [DONE]\n\n"
        finally:
            finish_run(self.replies, run)


def sse(body: dict) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False, separators=(',', ':'))}\n\n"


# ====================================================================== the ASGI app


def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = ".".join(loc) or None
    if first.get("type") == "json_invalid":
        message = "the request body is not valid JSON"
    else:
        reason = str(first.get("msg", "invalid value")).removeprefix("Value error, ")  # a validator's own words
        message = f"{param + ': ' if param else ''}{reason}"
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more problem{'s' * (len(errors) > 2)})"
    return ApiError(400, message, param=param).response()


def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    if exc.status_code == 404:
        message = f"Unknown endpoint: {request.method} {request.url.path}. This server has GET /v1/models, " \
                  "POST /v1/chat/completions and POST /v1/completions."
    elif exc.status_code == 405:
        message = f"Method {request.method} is not allowed on {request.url.path}"
    else:
        message = str(exc.detail)
    return ApiError(exc.status_code, message).response()


def _server_error(request: Request, exc: Exception) -> JSONResponse:
    return ApiError(500, f"internal error: {type(exc).__name__}: {exc}").response()


def _api_error(request: Request, exc: ApiError) -> JSONResponse:
    return exc.response()


class Gate:
    """ASGI middleware of the /v1 app: the key and the body size, before anything else runs."""

    def __init__(self, app, service: ApiService):
        self.app, self.service = app, service

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            refusal = self.service.refusal(Headers(scope=scope))
            if refusal is not None:
                await refusal.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


def build_api(service: ApiService) -> FastAPI:
    """The /v1 application (``ApiDispatch`` hands it every /v1 request)."""
    api = FastAPI(title="DFlash Studio: OpenAI-compatible API", version="1", docs_url=None, redoc_url=None,
                  openapi_url="/openapi.json", servers=[{"url": "/v1"}])
    api.add_middleware(Gate, service=service)
    api.add_exception_handler(ApiError, _api_error)
    api.add_exception_handler(RequestValidationError, _validation_error)
    api.add_exception_handler(StarletteHTTPException, _http_error)
    api.add_exception_handler(Exception, _server_error)

    def openapi() -> dict:
        """The schema, with the model ids this server answers to right now."""
        schema = FastAPI.openapi(api)
        ids = [card["id"] for card in service.model_cards()]
        for name in ("ChatCompletionRequest", "CompletionRequest"):
            model = schema["components"]["schemas"][name]["properties"]["model"]
            model["anyOf"] = [{"type": "string", "enum": ids}, {"type": "null"}]
        return schema

    api.openapi = openapi

    @api.get("/models")
    async def list_models() -> dict:
        return {"object": "list", "data": service.model_cards()}

    @api.get("/models/{model}")
    async def get_model(model: str) -> dict:
        return service.model_card(service.check_model(model))

    @api.post("/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        return await service.complete(body, request, "chat.completions")

    @api.post("/completions")
    async def completions(body: CompletionRequest, request: Request):
        return await service.complete(body, request, "completions")

    return api


class ApiDispatch:
    """ASGI middleware of the app's server that hands every /v1 request to the API app. A
    middleware, not a ``Mount``: a mount's pattern does not match paths with a line break
    (``/v1/models/%0A``), which would then fall through to the page's routes and their
    non-OpenAI error bodies."""

    def __init__(self, app, api: FastAPI, prefix: str = API_PREFIX):
        self.app, self.api, self.prefix = app, api, prefix

    async def __call__(self, scope, receive, send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and (path == self.prefix or path.startswith(self.prefix + "/")):
            root = scope.get("root_path", "")
            scope = {**scope, "app_root_path": scope.get("app_root_path", root), "root_path": root + self.prefix}
            await self.api(scope, receive, send)
            return
        await self.app(scope, receive, send)


def server_additions(service: ApiService) -> tuple[list, list]:
    """(middleware, routes) for the app's server: /v1 (the API) and /health."""
    from starlette.middleware import Middleware

    async def health(request: Request) -> JSONResponse:
        status = service.replies.engines.status()
        body = {"status": {"ready": "ok"}.get(status.state, status.state), "model": model_id(status.model_key),
                "message": status.error or status.message}
        return JSONResponse(body, status_code=200 if status.state == "ready" else 503)

    return [Middleware(ApiDispatch, api=build_api(service))], [Route("/health", health, methods=["GET"])]
