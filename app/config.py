"""``AppConfig``: how the app is served and which models it offers, validated once at the edge."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.config import MAX_BLOCK_SIZE, EngineConfig
from engine.errors import InvalidRequestError

LOOPBACK_NAMES = ("localhost",)
HOST_NAME = re.compile(r"[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]")


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def parse_auth(value: str | None) -> tuple[str, str] | None:
    if not value:
        return None
    user, sep, password = value.partition(":")
    if not sep or not user or not password:
        raise InvalidRequestError("--auth must be USER:PASSWORD (both non-empty)")
    return user, password


@dataclass(frozen=True)
class ApiConfig:
    """The OpenAI-compatible API served beside the page (``/v1/...``, ``/health``)."""

    enabled: bool = True
    key: str | None = None  # Bearer key for /v1; required off loopback
    store: bool = True  # each API conversation becomes a stored session (--no-store-api: not)

    def validate(self, host: str) -> "ApiConfig":
        if self.key is not None and (len(self.key) < 8 or any(c.isspace() for c in self.key)):
            raise InvalidRequestError("--api-key must be at least 8 characters with no spaces")
        if self.enabled and self.key is None and not is_loopback(host):
            raise InvalidRequestError(
                f"refusing to serve the OpenAI-compatible API on {host} without a key: anyone on the network "
                "could use the model. Add --api-key KEY (clients send 'Authorization: Bearer KEY'), "
                "or --no-api, or keep the default 127.0.0.1."
            )
        return self


@dataclass(frozen=True)
class AppConfig:
    host: str = "127.0.0.1"
    port: int | None = None  # None: Gradio's first free port from 7860
    db_path: Path | None = None  # None: storage.default_db_path()
    engine: EngineConfig = field(default_factory=EngineConfig)
    models_dir: Path | None = None  # each subfolder with target/ and draft/ is offered in the model picker
    max_new_tokens: int = 256
    block_size: int | None = None
    fallback: bool = True  # dynamic fallback starts on (as fast as fixed blocks at greedy, faster at T > 0); the toggle turns it off
    open_browser: bool = True
    auth: tuple[str, str] | None = None
    flush_interval_s: float = 1.0
    allowed_hosts: tuple[str, ...] = ()  # extra Host names to answer to (a reverse proxy, a LAN name)
    max_upload_mb: int = 32  # session imports; Gradio's default is no limit
    api: ApiConfig = field(default_factory=ApiConfig)
    vllm: Any = None  # engine.vllm.VLLMConfig with --engine vllm; None: the local engine

    def validate(self) -> "AppConfig":
        if not is_loopback(self.host) and self.auth is None:
            raise InvalidRequestError(
                f"refusing to listen on {self.host} without authentication: anyone on the network could use "
                "the model and read your sessions. Add --auth USER:PASSWORD, or keep the default 127.0.0.1."
            )
        if self.port is not None and not 0 < self.port < 65536:
            raise InvalidRequestError(f"--port must be between 1 and 65535 (got {self.port})")
        if not 1 <= self.max_new_tokens <= 32768:
            raise InvalidRequestError(f"--max-new-tokens must be between 1 and 32768 (got {self.max_new_tokens})")
        if self.block_size is not None and not 1 <= self.block_size <= MAX_BLOCK_SIZE:
            raise InvalidRequestError(f"--block-size must be between 1 and {MAX_BLOCK_SIZE} (got {self.block_size})")
        if self.models_dir is not None and not Path(self.models_dir).is_dir():
            raise InvalidRequestError(f"--models-dir {self.models_dir} is not a directory")
        for name in self.allowed_hosts:
            if not HOST_NAME.fullmatch(name):
                raise InvalidRequestError(f"--allowed-host takes a host name without scheme or port (got {name!r})")
        if self.flush_interval_s <= 0 or self.flush_interval_s > 1.0:
            raise InvalidRequestError("the reply flush interval must be in (0, 1] seconds")
        self.api.validate(self.host)
        return self
