"""A vLLM server the Studio starts itself: the command line (``plan_server``, pure), the process
with its log file, a readiness wait with progress, a clear error with the log's tail when it
dies, and a stop that takes its worker processes with it."""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import time
from collections import deque
from pathlib import Path
from typing import Callable

from ..errors import EngineUnavailableError
from .config import ServerPlan, VLLMConfig, default_vllm_python, draft_block_size, target_window

CPU_WINDOW_CAP = 4096  # the CPU build keeps the KV cache in VLLM_CPU_KVCACHE_SPACE GiB: keep windows modest
INSTALL_HINT = "install it with `bash scripts/install_vllm.sh`, or pass --vllm-python PATH to vLLM's interpreter"
Progress = Callable[[float, str], None]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def vllm_python(config: VLLMConfig) -> Path:
    python = Path(config.python) if config.python else default_vllm_python()
    if not python.exists():
        raise EngineUnavailableError(f"vLLM's Python {python} does not exist: {INSTALL_HINT}")
    return python


def is_cpu_build(python: Path) -> bool:
    """The CPU build (``vllm-cpu``) is installed in the environment of ``python``."""
    prefix = python.parent.parent
    return any(prefix.glob("lib/python*/site-packages/vllm_cpu-*.dist-info"))


def plan_server(config: VLLMConfig, python: Path, target_dir: Path, draft_dir: Path | None, port: int,
                cpu: bool, served_name: str) -> ServerPlan:
    """The command line of a vLLM server for this pair: DFlash with num_speculative_tokens =
    block - 1 and per-request acceptance metrics (the Cycles are rebuilt from them)."""
    argv = [str(python), "-m", "vllm.entrypoints.openai.api_server",  # its console script cannot find
            "--model", str(target_dir), "--served-model-name", served_name,  # its version in vllm-cpu
            "--host", "127.0.0.1", "--port", str(port),
            "--enable-per-request-metrics",
            "--tensor-parallel-size", str(config.tensor_parallel_size),
            "--pipeline-parallel-size", str(config.pipeline_parallel_size)]
    block = 1
    if draft_dir is not None:
        block = config.block_size or draft_block_size(draft_dir)
        speculative = {"method": "dflash", "model": str(draft_dir), "num_speculative_tokens": block - 1}
        argv += ["--speculative-config", json.dumps(speculative),
                 "--per-request-spec-decode-metrics", "detailed"]  # vLLM refuses it without speculation
    dtype = config.dtype or ("float32" if cpu else None)
    if dtype:
        argv += ["--dtype", dtype]
    window = config.max_model_len or (min(target_window(target_dir) or CPU_WINDOW_CAP, CPU_WINDOW_CAP) if cpu else None)
    if window:
        argv += ["--max-model-len", str(window)]
    argv += list(config.extra_args)
    env = {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")} if cpu else {}
    return ServerPlan(tuple(argv), env, port, block, served_name)


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(deque(f, maxlen=lines)).rstrip()
    except OSError:
        return "(no log)"


def die_with_parent() -> None:
    """In the child before exec: Linux sends it SIGTERM when the thread that started it ends, so
    a Studio killed without cleanup (SIGKILL, SIGTERM) leaves no vLLM server behind."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: close() and atexit still stop it
        pass


class VLLMServer:
    """One vLLM server process, in its own process group (vLLM forks an engine-core worker)."""

    def __init__(self, plan: ServerPlan, log_path: Path):
        self.plan = plan
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.plan.port}"

    def start(self) -> "VLLMServer":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, **self.plan.env)
        env.pop("PYTHONPATH", None)  # vLLM's environment must not see the Studio's packages
        with open(self.log_path, "ab") as log:
            log.write(f"$ {' '.join(self.plan.argv)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(self.plan.argv, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                                            preexec_fn=die_with_parent)
        atexit.register(self.stop)  # stopped with the Studio, however it ends its interpreter
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def exited(self, within_s: float = 3.0) -> bool:
        """Whether the server process has ended, waiting up to ``within_s`` for it (a killed
        server drops its connections a moment before its exit can be seen)."""
        if self.process is None:
            return True
        try:
            self.process.wait(timeout=within_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def died_error(self, what: str) -> EngineUnavailableError:
        code = self.process.poll() if self.process is not None else None
        status = f"exited with code {code}" if code is not None else "is not answering"
        return EngineUnavailableError(f"the vLLM server {what} {status}. Log {self.log_path}, last lines:\n"
                                      f"{log_tail(self.log_path, 5)}")

    def wait_ready(self, timeout_s: float, progress: Progress | None = None, poll_s: float = 0.5) -> None:
        """Poll /health until it answers 200; report progress with the log's last line."""
        import httpx

        start = time.monotonic()
        while True:
            if not self.alive():
                raise self.died_error("failed to start:")
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            waited = time.monotonic() - start
            if waited > timeout_s:
                self.stop()
                raise EngineUnavailableError(f"the vLLM server did not become ready in {timeout_s:.0f} s. "
                                             f"Log {self.log_path}, last lines:\n{log_tail(self.log_path)}")
            if progress is not None:
                last = log_tail(self.log_path, 1).split("] ")[-1][:120]
                progress(min(0.95, 0.2 + waited / 120), f"starting vLLM ({waited:.0f} s): {last}")
            time.sleep(poll_s)

    def restart(self, timeout_s: float, progress: Progress | None = None) -> None:
        """Start this server again on the same port (so its URL stays valid) after it died."""
        if self.process is not None and self.process.poll() is None:
            return
        self.process = None
        self.start()
        try:
            self.wait_ready(timeout_s, progress)
        except BaseException:
            self.stop()
            raise

    def stop(self, grace_s: float = 15.0) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=5)
        except ProcessLookupError:
            pass


def default_log_path(port: int) -> Path:
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "dflash-studio" / "logs" / f"vllm-{port}.log"


def start_server(config: VLLMConfig, target_dir: Path, draft_dir: Path | None, served_name: str,
                 progress: Progress | None = None, log_suffix: str = "") -> VLLMServer:
    """Start a server for this pair on a free loopback port and wait until it answers."""
    python = vllm_python(config)
    cpu = config.device == "cpu" or (config.device is None and is_cpu_build(python))
    port = free_port()
    plan = plan_server(config, python, target_dir, draft_dir, port, cpu, served_name)
    log_path = Path(config.log_path) if config.log_path else default_log_path(port)
    if log_suffix:
        log_path = log_path.with_name(log_path.stem + log_suffix + log_path.suffix)
    server = VLLMServer(plan, log_path).start()
    if progress is not None:
        progress(0.2, f"starting vLLM on port {port} (log: {log_path})")
    try:
        server.wait_ready(config.startup_timeout_s, progress)
    except BaseException:
        server.stop()
        raise
    return server
