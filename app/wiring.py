"""Composition root of the app: the model catalog, the engine host (ONE worker thread that
loads models and runs generations, in order), the session store and the Gradio page.

    studio = build_studio(config)          # nothing loads yet
    studio.host.start()                    # the model loads in the background, with progress
    studio.demo.launch(**studio.launch_kwargs())
"""

from __future__ import annotations

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # before gradio is imported

import threading  # noqa: E402
from concurrent.futures import Future, ThreadPoolExecutor  # noqa: E402
from dataclasses import dataclass, field, replace  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable  # noqa: E402

from engine.config import EngineConfig  # noqa: E402
from engine.errors import CheckpointError  # noqa: E402
from engine.events import LoadStatus  # noqa: E402
from engine.shipped import DEFAULT_PAIR, SHIPPED_PAIRS, name_slug, pair_dirs, pair_name  # noqa: E402

from .config import AppConfig  # noqa: E402
from .netguard import GuardConfig, guard_middleware  # noqa: E402

@dataclass(frozen=True)
class ModelChoice:
    key: str  # the pair's name: shown in the model menu, stored with sessions, the API's model id
    target: str | None  # None: the default shipped pair (engine.loading.embedded_pair)
    draft: str | None
    note: str = ""  # where the pair comes from
    hint: str = ""  # what it is for, in a newcomer's words (the menu shows "key — hint")
    aliases: tuple[str, ...] = ()  # older names that still mean this pair (stored sessions, API clients)
    speed: str = ""  # its measured speed, for the header (engine.shipped.ShippedPair.speed())


def available_models(config: AppConfig, assets: Path | None = None) -> list[ModelChoice]:
    """Every pair this Studio can run, each once: the one given on the command line (it starts
    first), the shipped pairs (the default first), then each pair in ``--models-dir``; with
    ``--engine-url`` only the model that vLLM server serves; then the published pairs
    (engine.catalog), which download when picked. The model menu, the API's
    /v1/models and model switching all read this one list; a new source of pairs adds its
    entries here."""
    if config.vllm is not None and config.vllm.url:
        return [ModelChoice(f"vLLM at {config.vllm.url}", config.vllm.target, None, "vLLM server")]
    choices = [*_command_line_pair(config, assets), *_shipped_pairs(assets), *_models_dir_pairs(config.models_dir)]
    choices = choices or [ModelChoice(DEFAULT_PAIR.name, None, None, "shipped", DEFAULT_PAIR.purpose)]
    return _unique([*choices, *published_pairs(device=config.engine.device, dtype=config.engine.dtype)])


def published_pairs(probe=None, device: str | None = None, dtype: str | None = None) -> list[ModelChoice]:
    """The published pairs (engine.catalog), after the local ones: picking one downloads it first
    where the hub can be reached; without network its entry says what it would take; a pair
    found in the hub cache says "downloaded"; one that cannot fit in the memory free here (the
    GPU's on CUDA) says so, before anyone downloads it."""
    from engine import catalog
    from engine.hub import HubProbe
    from engine.memory import bytes_per_parameter, free_memory, keeps_format

    probe = probe or HubProbe()
    free = free_memory(device)  # asked once for the whole menu
    per_parameter = bytes_per_parameter(device, dtype)  # float32 on a CPU takes twice what bf16 takes
    return [ModelChoice(pair.name, pair.target, pair.draft, pair.describe(),
                        catalog.availability(pair, probe, lambda: free, per_parameter,
                                             keeps_format(pair.quantization, device)))
            for pair in catalog.PUBLISHED_PAIRS]


def _command_line_pair(config: AppConfig, assets: Path | None) -> list[ModelChoice]:
    target, draft = config.engine.target, config.engine.draft
    if not target:
        return []
    return [ModelChoice(pair_name(target, draft, assets), target, draft, "command line")]


def _shipped_pairs(assets: Path | None) -> list[ModelChoice]:
    choices = []
    for pair in SHIPPED_PAIRS:
        target, draft = pair_dirs(pair, assets)
        if target.is_dir() and draft.is_dir():
            choices.append(ModelChoice(pair.name, str(target), str(draft), "shipped", pair.purpose, pair.aliases,
                                       pair.speed()))
    return choices


def _models_dir_pairs(models_dir: Path | None) -> list[ModelChoice]:
    if models_dir is None:
        return []
    choices = []
    for folder in sorted(Path(models_dir).iterdir()):
        if (folder / "target").is_dir():
            draft = folder / "draft"
            choices.append(ModelChoice(folder.name, str(folder / "target"), str(draft) if draft.is_dir() else None,
                                       str(folder)))
    return choices


def _unique(choices: list[ModelChoice]) -> list[ModelChoice]:
    """Each pair once (the first entry for the same folders wins, with the others' aliases), and
    each name once (a later pair with a taken name gets a number)."""
    by_folders: dict[tuple, int] = {}
    unique: list[ModelChoice] = []
    for choice in choices:
        folders = (choice.target and str(Path(choice.target).resolve()), choice.draft and str(Path(choice.draft).resolve()))
        if folders[0] is not None and folders in by_folders:
            first = unique[by_folders[folders]]
            merged = tuple(dict.fromkeys(first.aliases + (choice.key,) * (choice.key != first.key) + choice.aliases))
            unique[by_folders[folders]] = replace(first, hint=first.hint or choice.hint, aliases=merged,
                                                  speed=first.speed or choice.speed)
            continue
        taken = {c.key for c in unique}
        key, n = choice.key, 2
        while key in taken:
            key, n = f"{choice.key}-{n}", n + 1
        by_folders[folders] = len(unique)
        unique.append(replace(choice, key=key))
    return unique


Loader = Callable[[ModelChoice, Callable[[float, str], None]], Any]


def engine_loader(base: EngineConfig, vllm=None) -> Loader:
    """Loads a pair with the local engine (torch is imported only here, on the worker), or with
    vLLM when ``vllm`` (an ``engine.vllm.VLLMConfig``) is given: a server started for the pair,
    or the one at its url."""

    def load(choice: ModelChoice, progress):
        if vllm is not None:
            from engine.vllm import VLLMEngine

            return VLLMEngine.open(replace(vllm, target=choice.target, draft=choice.draft), progress)
        from engine.runtime import Engine

        config = EngineConfig(target=choice.target, draft=choice.draft, device=base.device, dtype=base.dtype,
                              speculative=base.speculative, threads=base.threads, name=choice.key,
                              compile=base.compile)
        engine = Engine.load(config, progress=progress)
        progress(1.0, "measuring what a cycle costs (for the speed estimate)")
        engine.measure_costs()
        return engine

    return load


def close_engine(engine) -> None:
    """Release what an engine holds (a vLLM server it started); engines without close() hold nothing."""
    close = getattr(engine, "close", None)
    if close is not None:
        close()


class EngineHost:
    """Holds the current engine; ONE worker thread runs model loads and generations in order.

    ``switch`` queues a load; while it runs, ``status()`` reports its progress. A failed load
    (an incompatible draft, a missing checkpoint) keeps the previous engine and reports why.
    ``submit(fn, model=...)`` runs ``fn`` on that model, loading it first when another one is
    loaded (as LM Studio and Ollama do): a request naming a model waits behind what runs.
    """

    def __init__(self, catalog: list[ModelChoice], loader: Loader, initial_key: str | None = None):
        self.catalog = {choice.key: choice for choice in catalog}
        self.loader = loader
        self.initial_key = initial_key or (catalog[0].key if catalog else "")
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dflash-engine")
        self._lock = threading.Lock()
        self._engine = None
        self._key = ""
        self._closed = False
        self._status = LoadStatus("loading", 0.0, "waiting to start", self.initial_key)

    # -------------------------------------------------------------- what the UI reads
    @property
    def engine(self):
        return self._engine

    @property
    def current_key(self) -> str:
        return self._key or self.initial_key

    def status(self) -> LoadStatus:
        with self._lock:
            return self._status

    def models(self) -> list[ModelChoice]:
        return list(self.catalog.values())

    def choices(self) -> list[tuple[str, str]]:
        """(label, key) for the model menu: 'tiny-coder — answers simple requests'."""
        return [(f"{key} — {choice.hint}" if choice.hint else key, key) for key, choice in self.catalog.items()]

    def resolve(self, name: str | None) -> str | None:
        """The menu key a name means: a key, an older name of it (a stored session's, an API
        client's), or either as an API id ('tiny-coder-embedded'); None when no pair has it."""
        if not name:
            return None
        if name in self.catalog:
            return name
        wanted = name_slug(name)
        for key, choice in self.catalog.items():
            if name in choice.aliases or wanted in {name_slug(n) for n in (key, *choice.aliases)}:
                return key
        return None

    # -------------------------------------------------------------- work on the one worker
    def start(self) -> Future:
        return self.switch(self.initial_key)

    def switch(self, key: str) -> Future:
        key = self.resolve(key) or key
        if key not in self.catalog:
            return _failed(CheckpointError(f"unknown model {key!r}"))
        with self._lock:
            self._status = LoadStatus("loading", 0.0, "queued", key, "")
        return self._executor.submit(self._load, key)

    def submit(self, fn: Callable[[Any], Any], model: str | None = None) -> Future:
        """Run ``fn(engine)`` on the engine worker after everything queued before it; with
        ``model``, on that model (loaded first if need be; ``fn(None)`` when it cannot load:
        the status says why, and the request is not answered by another model)."""
        if model is None:
            return self._executor.submit(self._answer, fn)
        key = self.resolve(model)
        if key is None:
            return _failed(CheckpointError(f"unknown model {model!r}"))
        return self._executor.submit(self._run_on, key, fn)

    def _run_on(self, key: str, fn: Callable[[Any], Any]):
        if key != self._key or self._engine is None:
            try:
                self._load(key)
            except BaseException:  # noqa: BLE001 - the status reports it; fn refuses without an engine
                return fn(None)
        return self._answer(fn)

    def _answer(self, fn: Callable[[Any], Any]):
        self._forget_refusal()  # the loaded model answers: a pick refused earlier is old news
        return fn(self._engine)

    def _forget_refusal(self) -> None:
        with self._lock:
            if self._status.state == "ready" and self._status.error:
                self._status = LoadStatus("ready", 1.0, "ready", self._key, "")

    def shutdown(self) -> None:
        """Cancel what is queued and release the engine, without waiting for what runs: a load
        still running closes what it loads when it ends (``_load``)."""
        with self._lock:
            self._closed = True
            engine = self._engine
        self._executor.shutdown(wait=False, cancel_futures=True)
        close_engine(engine)  # a vLLM server the Studio started stops with it

    def _load(self, key: str):
        def progress(fraction: float, message: str) -> None:
            with self._lock:
                self._status = LoadStatus("loading", float(fraction), message, key, "")

        try:
            engine = self.loader(self.catalog[key], progress)
        except BaseException as exc:
            reason = str(exc) or type(exc).__name__
            with self._lock:
                state = "ready" if self._engine is not None else "failed"
                self._status = LoadStatus(state, 1.0, "", self._key or key, f"{key}: {reason}")
            raise
        with self._lock:
            closed = self._closed
            if not closed:
                previous, self._engine, self._key = self._engine, engine, key
                self._status = LoadStatus("ready", 1.0, "ready", key, "")
        if closed:  # shut down while it loaded: nobody will answer on it
            close_engine(engine)
            raise CheckpointError(f"{key}: loaded after the app closed; released")
        if previous is not None and previous is not engine:
            close_engine(previous)
        return engine


def _failed(exc: Exception) -> Future:
    future: Future = Future()
    future.set_exception(exc)
    return future


def guard_config(config: AppConfig) -> GuardConfig:
    """The network guard (app.netguard) for this server: its Host names, login gate and caps."""
    return GuardConfig(bind_host=config.host, allowed_hosts=config.allowed_hosts,
                       login_required=config.auth is not None,
                       upload_limit_bytes=(config.max_upload_mb + 1) * 1024 * 1024)


@dataclass
class Studio:
    config: AppConfig
    store: Any
    host: EngineHost
    ctx: Any  # ui.context.UIContext: what the page is handed
    demo: Any
    api: Any = None  # app.api.ApiService, or None with --no-api
    extra_launch: dict = field(default_factory=dict)

    @property
    def replies(self):  # service.replies.ReplyService: runs and records the page's and the API's replies
        return self.ctx.replies

    def launch_kwargs(self, **overrides) -> dict:
        from ui.layout import launch_options

        kwargs = dict(
            server_name=self.config.host, server_port=self.config.port, auth=self.config.auth,
            inbrowser=self.config.open_browser, share=False, ssr_mode=False, show_error=True, quiet=False,
            run_history=False, max_file_size=f"{self.config.max_upload_mb}mb", allowed_paths=[],
            app_kwargs=self.app_kwargs(), **launch_options(),
        )
        kwargs.update(self.extra_launch)
        kwargs.update(overrides)
        return kwargs

    def app_kwargs(self) -> dict:
        """What Gradio passes to the FastAPI app it serves: the network guard in front of every
        route, then the OpenAI-compatible API (/v1, /health; before the page's own routes)."""
        kwargs = {"middleware": [guard_middleware(guard_config(self.config))]}
        if self.api is not None:
            from .api import server_additions

            middleware, routes = server_additions(self.api)
            kwargs["middleware"] += middleware
            kwargs["routes"] = routes
        return kwargs

    def close(self) -> None:
        try:
            self.demo.close()
        finally:
            self.host.shutdown()
            self.store.close()


def build_studio(config: AppConfig, *, store=None, loader: Loader | None = None,
                 catalog: list[ModelChoice] | None = None) -> Studio:
    """Wire store + engine host + UI. Tests pass an in-memory store and a FakeEngine loader."""
    from ui.layout import build_ui

    ctx = build_context(config, store=store, loader=loader, catalog=catalog)
    return Studio(config, ctx.store, ctx.engines, ctx, build_ui(ctx), api=build_api_service(config, ctx.replies))


def build_api_service(config: AppConfig, replies):
    """The OpenAI-compatible API's service over the reply service (None with --no-api)."""
    if not config.api.enabled:
        return None
    from .api import ApiService
    from .api_requests import Defaults as ApiDefaults

    defaults = ApiDefaults(max_tokens=config.max_new_tokens, block_size=config.block_size, fallback=config.fallback)
    return ApiService(replies, config.api, defaults, login_required=config.auth is not None)


def build_replies(config: AppConfig, *, store=None, loader: Loader | None = None,
                  catalog: list[ModelChoice] | None = None):
    """The reply service: the store, the engine host (nothing loads yet) and the registry of running replies."""
    from service.replies import ReplyService
    from storage import SessionStore, default_db_path

    config.validate()
    if store is None:
        store = SessionStore(config.db_path or default_db_path())
    catalog = catalog if catalog is not None else available_models(config)
    host = EngineHost(catalog, loader or engine_loader(config.engine, config.vllm))
    return ReplyService(store, host, flush_interval_s=config.flush_interval_s)


def build_context(config: AppConfig, *, store=None, loader: Loader | None = None,
                  catalog: list[ModelChoice] | None = None):
    """The UI's context (the reply service + defaults) without building the page."""
    from ui.context import Defaults, UIContext

    replies = build_replies(config, store=store, loader=loader, catalog=catalog)
    defaults = Defaults(max_new_tokens=config.max_new_tokens, block_size=config.block_size,
                        fallback=config.fallback and config.vllm is None)  # vLLM has no per-request fallback
    return UIContext(replies, defaults=defaults)
