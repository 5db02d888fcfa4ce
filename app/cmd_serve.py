"""`dflash-studio serve` (also what `dflash-studio` alone runs) and `dflash-studio desktop`:
the Gradio app on loopback, the model loading in the background, sessions in SQLite."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

from .config import ApiConfig, AppConfig, parse_auth
from .options import add_model_options

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome", "microsoft-edge")


def register(subparsers) -> None:
    serve = subparsers.add_parser("serve", help="run the app in the browser (the default command)")
    _add_app_options(serve)
    serve.add_argument("--no-browser", action="store_true", help="do not open a browser tab")
    serve.set_defaults(func=run_serve)

    desktop = subparsers.add_parser("desktop", help="run the app in its own window (pywebview, else Chromium --app)")
    _add_app_options(desktop)
    desktop.set_defaults(func=run_desktop, no_browser=True)


def _add_app_options(parser) -> None:
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1; any other needs --auth)")
    parser.add_argument("--port", type=int, help="port, exactly (default: 7860, or the next free one when 7860 is busy)")
    parser.add_argument("--auth", metavar="USER:PASSWORD", help="require this login (needed off loopback)")
    parser.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                        help="also answer to this Host name (a reverse proxy, a LAN name); other names are "
                             "refused as DNS rebinding (repeatable)")
    parser.add_argument("--db", type=Path, metavar="PATH", help="session database (default: $DFLASH_STUDIO_DB or the user data dir)")
    parser.add_argument("--models-dir", type=Path, metavar="DIR",
                        help="offer every DIR/<name>/ holding target/ (and draft/) in the model picker")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="default reply length (default 256)")
    parser.add_argument("--block-size", type=int, help="default block size (default: the draft's)")
    parser.add_argument("--fallback", action=argparse.BooleanOptionalAction, default=True,
                        help="start with dynamic fallback on (the default; measured figures: docs/performance.md)")
    parser.add_argument("--allow-no-model", action="store_true",
                        help="start even when the model cannot load (the page says why; pick another there); "
                             "otherwise that is an error at start (exit 2)")
    api = parser.add_argument_group("OpenAI-compatible API (/v1 on the same port)")
    api.add_argument("--api-key", default=os.environ.get("DFLASH_STUDIO_API_KEY"), metavar="KEY",
                     help="require 'Authorization: Bearer KEY' on /v1 (needed off loopback; "
                          "default: $DFLASH_STUDIO_API_KEY)")
    api.add_argument("--no-store-api", dest="store_api", action="store_false",
                     help="do not store API requests as sessions")
    api.add_argument("--no-api", dest="api", action="store_false", help="serve no /v1 API at all")
    add_model_options(parser)


def app_config(args) -> AppConfig:
    from .options import engine_config, vllm_config

    return AppConfig(
        host=args.host, port=args.port, db_path=args.db, engine=engine_config(args), models_dir=args.models_dir,
        max_new_tokens=args.max_new_tokens, block_size=args.block_size, fallback=args.fallback,
        open_browser=not args.no_browser, auth=parse_auth(args.auth), allowed_hosts=tuple(args.allowed_host),
        api=ApiConfig(enabled=args.api, key=args.api_key or None, store=args.store_api),
        vllm=vllm_config(args),
    ).validate()


QUICK_LOAD_S = 5.0  # a load that fails this fast (a wrong path) fails before the server starts


def _start(args):
    from .wiring import build_studio

    config = app_config(args)
    studio = build_studio(config)
    loading = studio.host.start()  # loads in the background; the page works meanwhile
    if studio.store.recovered:
        print(f"dflash-studio: {studio.store.recovered} reply(ies) left streaming by the last run marked interrupted",
              file=sys.stderr)
    if not args.allow_no_model:
        try:
            loading.result(timeout=QUICK_LOAD_S)
        except FutureTimeout:
            pass  # a long load: serve meanwhile (the page shows its progress), fail later if it fails
        except BaseException:
            studio.close()
            raise_load_error(loading)
    return studio, loading


def raise_load_error(loading) -> None:
    """The initial model load's failure as one named error (exit 2 with one line)."""
    from engine.errors import CheckpointError, DFlashError

    exc = loading.exception()
    if isinstance(exc, DFlashError):
        raise exc
    raise CheckpointError(f"the model cannot load: {type(exc).__name__}: {exc} "
                          "(--allow-no-model starts the app anyway)") from exc


def _serve_until_closed(studio, loading, args, **overrides) -> None:
    from engine.errors import InvalidRequestError

    kwargs = studio.launch_kwargs(prevent_thread_lock=True, **overrides)
    try:
        studio.demo.launch(**kwargs)
    except OSError as exc:  # Gradio's words name its own internals (GRADIO_SERVER_PORT)
        where = f"{kwargs['server_name'] or '127.0.0.1'}:{kwargs['server_port']}" if kwargs.get("server_port") else "any port from 7860"
        raise InvalidRequestError(f"cannot listen on {where} (in use?): choose another with --port, "
                                  f"or stop what listens there ({exc.__class__.__name__})") from None
    print(addresses(studio.demo.local_url, studio.api is not None), flush=True)
    if not args.allow_no_model:
        try:
            loading.result()
        except BaseException:
            raise_load_error(loading)


def addresses(page_url: str, api: bool) -> str:
    """What the server prints once it listens: the page, and the base URL an editor takes."""
    page = page_url.rstrip("/")
    lines = [f"dflash-studio: the page:  {page}/"]
    if api:
        lines.append(f"dflash-studio: OpenAI-compatible API base URL:  {page}/v1")
    return "\n".join(lines)


def run_serve(args) -> int:
    studio, loading = _start(args)
    try:
        _serve_until_closed(studio, loading, args)
        studio.demo.block_thread()  # until Ctrl-C
    finally:
        studio.close()
    return 0


def run_desktop(args) -> int:
    studio, loading = _start(args)
    try:
        _serve_until_closed(studio, loading, args, inbrowser=False)
        open_window(studio.demo.local_url)
    finally:
        studio.close()
    return 0


def open_window(url: str) -> None:
    """A native window (pywebview) if installed, else Chromium/Chrome in --app mode; returns when
    the window closes. Without either, opens the default browser and serves until Ctrl-C."""
    try:
        import webview  # type: ignore[import-not-found]
    except ImportError:
        webview = None
    if webview is not None:
        webview.create_window("DFlash Studio", url, width=1440, height=920)
        webview.start()
        return
    browser = next((path for name in BROWSERS if (path := shutil.which(name))), None)
    if browser is not None:
        profile = tempfile.mkdtemp(prefix="dflash-studio-window-")
        command = [browser, f"--app={url}", f"--user-data-dir={profile}", "--no-first-run",
                   "--window-size=1440,920"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            command.append("--no-sandbox")  # Chromium refuses to run as root otherwise
        result = subprocess.run(command, check=False)
        if not result or result.returncode == 0:
            return
        print(f"dflash-studio: {Path(browser).name} could not open a window (exit {result.returncode}); "
              f"the app is still served at {url}. Ctrl-C to quit.", file=sys.stderr)
    else:
        import webbrowser

        print(f"dflash-studio: no pywebview or Chromium found; opening {url} in the default browser "
              "(pip install 'dflash-studio[desktop]' for a native window). Ctrl-C to quit.", file=sys.stderr)
        webbrowser.open(url)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
