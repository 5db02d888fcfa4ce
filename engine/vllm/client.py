"""``VLLMEngine``: the Engine interface over a vLLM server's OpenAI-compatible HTTP API.

Prompts are encoded here with the target's own tokenizer and sent as token ids to
``/v1/completions`` (so that vLLM sees exactly the tokens the local engine would); the reply
streams back with the token ids of each step, and the final usage chunk carries vLLM's
per-request speculative-decoding metrics, from which the cycles are checked (``steps``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from ..chat_formats import ChatFormat, ChatOptions, chat_format, end_token_ids
from ..config import FallbackConfig, SamplingConfig
from ..detok import IncrementalDetokenizer
from ..errors import CheckpointError, DFlashError, EngineUnavailableError, InvalidRequestError
from ..events import Cycle, Event, Failed, Finished, Started, mark_context_full
from ..extras import require
from ..interface import VLLM_CAPABILITIES, Capabilities
from ..prompts import Message, encode_prompt, fit_request, has_chat_template
from .steps import acceptance_lengths, chunk_steps, make_cycle, per_position_acceptance, positions_from_cycles
from .config import VLLMConfig
from .server import VLLMServer, start_server

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class Endpoint:
    """One server: its base URL (without /v1), the model name it serves, the API key."""

    url: str
    model: str = ""
    api_key: str | None = None

    @classmethod
    def parse(cls, url: str, api_key: str | None = None) -> "Endpoint":
        base = url.rstrip("/")
        return cls(base[: -len("/v1")] if base.endswith("/v1") else base, "", api_key)

    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def get(self, path: str, timeout: float = 10.0) -> dict:
        import httpx

        try:
            response = httpx.get(self.url + path, headers=self.headers(), timeout=timeout)
        except httpx.HTTPError as exc:
            raise EngineUnavailableError(f"cannot reach the vLLM server at {self.url} ({type(exc).__name__}: {exc})") from exc
        return checked_json(response, self.url + path)

    def post(self, path: str, body: dict, timeout: float = 120.0) -> dict:
        import httpx

        try:
            response = httpx.post(self.url + path, json=body, headers=self.headers(), timeout=timeout)
        except httpx.HTTPError as exc:
            raise EngineUnavailableError(f"cannot reach the vLLM server at {self.url} ({type(exc).__name__}: {exc})") from exc
        return checked_json(response, self.url + path)


def checked_json(response, where: str) -> dict:
    if response.status_code in (401, 403):
        raise EngineUnavailableError(f"{where} refused the API key (HTTP {response.status_code}): check --engine-api-key")
    if response.status_code >= 400:
        raise InvalidRequestError(f"vLLM refused the request (HTTP {response.status_code}): {error_text(response.text)}")
    return response.json()


def error_text(body: str) -> str:
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        return body[:300]
    error = data.get("error", data) if isinstance(data, dict) else data
    return str(error.get("message", error) if isinstance(error, dict) else error)[:300]


@dataclass(frozen=True)
class ServedModel:
    """What a server told about itself: its model, window, and its speculation (from a probe)."""

    endpoint: Endpoint
    window: int
    root: str
    block_size: int  # num_spec_tokens + 1; 1 for a server without speculation


def describe_server(endpoint: Endpoint, wanted: str | None = None, plain: bool = False) -> ServedModel:
    """Ask /v1/models for the model, then send a 2-token probe to learn whether the server
    speculates and reports per-request metrics (the Cycles are rebuilt from them)."""
    models = endpoint.get("/v1/models").get("data") or []
    if not models:
        raise EngineUnavailableError(f"the vLLM server at {endpoint.url} serves no model")
    chosen = next((m for m in models if m.get("id") == wanted), None) if wanted else models[0]
    if chosen is None:
        raise EngineUnavailableError(f"the vLLM server at {endpoint.url} does not serve {wanted!r} "
                                     f"(it serves {', '.join(m.get('id', '?') for m in models)})")
    endpoint = replace(endpoint, model=chosen["id"])
    probe = endpoint.post("/v1/completions", {"model": endpoint.model, "prompt": "def", "max_tokens": 2,
                                              "temperature": 0})
    metrics = probe.get("metrics")
    if metrics is None and plain:  # a server for plain decoding: nothing to rebuild, every step is one token
        metrics = {}
    if metrics is None:
        raise EngineUnavailableError(
            f"the vLLM server at {endpoint.url} does not report per-request metrics: start it with "
            "--per-request-spec-decode-metrics detailed --enable-per-request-metrics")
    spec = metrics.get("speculative_decoding")
    block = int(spec.get("num_spec_tokens") or 0) + 1 if spec else 1
    window = int(chosen.get("max_model_len") or 2048)
    return ServedModel(endpoint, window, str(chosen.get("root") or chosen["id"]), block)


def load_tokenizer(source: str):
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from ..loading import resolve

    hf_logging.disable_progress_bar()
    directory = resolve(source, "tokenizer")
    try:
        return AutoTokenizer.from_pretrained(directory, trust_remote_code=False), directory
    except Exception as exc:
        raise CheckpointError(f"cannot load the tokenizer in {directory}: {exc}") from exc


def stop_token_ids(tokenizer, target_dir: Path) -> list[int]:
    """The stop tokens the local engine uses: generation_config's eos ids and the tokenizer's."""
    ids = []
    path = target_dir / "generation_config.json"
    if path.is_file():
        value = json.loads(path.read_text()).get("eos_token_id")
        ids.extend(value if isinstance(value, list) else [value] if value is not None else [])
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.append(tokenizer.eos_token_id)
    ids.extend(end_token_ids(tokenizer))  # the chat format's own, as the local engine stops
    return sorted(set(int(i) for i in ids))


class VLLMEngine:
    """A DFlash-serving vLLM server (and, for plain decoding, a second one without a draft)."""

    def __init__(self, config: VLLMConfig, tokenizer, served: ServedModel, name: str, stop_ids: list[int],
                 server: VLLMServer | None = None, target_dir: Path | None = None):
        self.config = config
        self.tokenizer = tokenizer
        self.served = served
        self._name = name
        self.stop_ids = stop_ids
        self.server = server  # the server this engine started (stopped by close())
        self.target_dir = target_dir
        self.plain: ServedModel | None = served if served.block_size == 1 else None
        self.plain_server: VLLMServer | None = None
        self.merged_chunks = 0  # replies whose chunks did not match vLLM's per-step list (see steps)
        self._lock = threading.Lock()
        self._closed = False

    # ---------------------------------------------------------------- construction
    @classmethod
    def launch(cls, config: VLLMConfig, progress=None) -> "VLLMEngine":
        """Start a vLLM server for ``config.target`` + ``config.draft`` (default: the embedded pair)."""
        from ..loading import EMBEDDED_NAME, embedded_pair, resolve
        from ..shipped import pair_name

        require_sse_reader()
        report = progress or (lambda fraction, message: None)
        if config.target is None:
            target_dir, draft_dir = embedded_pair()
            draft_dir = Path(resolve(config.draft, "draft")) if config.draft else draft_dir
            name = EMBEDDED_NAME
        else:
            target_dir = resolve(config.target, "target")
            draft_dir = resolve(config.draft, "draft") if config.draft else None
            name = pair_name(config.target, config.draft)  # a shipped pair's name, not its folder's
        report(0.05, f"loading the tokenizer of {name}")
        tokenizer, _ = load_tokenizer(str(target_dir))
        server = start_server(config, target_dir, draft_dir, config.served_name or name, report)
        try:
            served = describe_server(Endpoint(server.url, api_key=None))
        except BaseException:
            server.stop()
            raise
        report(1.0, "ready")
        return cls(config, tokenizer, served, name, stop_token_ids(tokenizer, target_dir), server, target_dir)

    @classmethod
    def connect(cls, config: VLLMConfig, progress=None) -> "VLLMEngine":
        """Use a running server at ``config.url``; the tokenizer comes from ``config.target`` or
        the server's model directory (when it is on this machine or on the hub)."""
        require_sse_reader()
        report = progress or (lambda fraction, message: None)
        report(0.1, f"asking the vLLM server at {config.url}")
        served = describe_server(Endpoint.parse(config.url, config.api_key), config.served_name)
        try:
            tokenizer, target_dir = load_tokenizer(config.target or served.root)
        except CheckpointError as exc:
            raise CheckpointError(f"{exc}. Pass --target DIR|REPO with the served model's tokenizer") from exc
        engine = cls(config, tokenizer, served, served.endpoint.model, stop_token_ids(tokenizer, target_dir))
        if config.plain_url:
            engine.plain = describe_server(Endpoint.parse(config.plain_url, config.api_key), plain=True)
        report(1.0, "ready")
        return engine

    @classmethod
    def open(cls, config: VLLMConfig, progress=None) -> "VLLMEngine":
        config.validate()
        return cls.connect(config, progress) if config.url else cls.launch(config, progress)

    # ---------------------------------------------------------------- facts
    @property
    def name(self) -> str:
        return f"{self._name} (vLLM)"

    @property
    def block_size(self) -> int:
        return self.served.block_size

    @property
    def speculative(self) -> bool:
        return self.served.block_size > 1

    @property
    def has_chat_template(self) -> bool:
        return has_chat_template(self.tokenizer)

    @property
    def chat_format(self) -> ChatFormat:
        return chat_format(self.tokenizer)

    @property
    def capabilities(self) -> Capabilities:
        return VLLM_CAPABILITIES

    @property
    def context_window(self) -> int:
        return self.served.window

    def info(self) -> dict:
        return {"name": self.name, "engine": "vllm", "device": f"vLLM at {self.served.endpoint.url}",
                "dtype": self.config.dtype or "", "block_size": self.block_size, "context_window": self.served.window,
                "log": str(self.server.log_path) if self.server else "", "merged_chunks": self.merged_chunks}

    # ---------------------------------------------------------------- prompts
    def encode(self, prompt: str | list[Message], raw: bool = False, chat: ChatOptions | None = None) -> list[int]:
        return encode_prompt(self.tokenizer, prompt, raw, chat)

    def decode(self, token_ids) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def check_request(self, prompt_ids: list[int], sampling: SamplingConfig) -> SamplingConfig:
        sampling = fit_request(prompt_ids, sampling, self.served.window)
        if sampling.block_size not in (None, 1, self.block_size):
            raise InvalidRequestError(f"block size {sampling.block_size}: {VLLM_CAPABILITIES.block_size_note} "
                                      f"(this server: block {self.block_size})")
        return sampling

    # ---------------------------------------------------------------- plain decoding
    def plain_model(self) -> ServedModel:
        """The server for plain decoding: this one when it has no draft, else a second server for
        the same target without one (started now, once, when the Studio started the first)."""
        with self._lock:
            if self.plain is not None:
                return self.plain
            if self.target_dir is None:
                raise InvalidRequestError(
                    "plain decoding on vLLM needs a server without a draft: start one for the same target and "
                    "pass --engine-plain-url URL (DFlash and plain decoding cannot share one vLLM server)")
            self.plain_server = start_server(self.config, self.target_dir, None, self.served.endpoint.model,
                                             log_suffix="-plain")
            self.plain = describe_server(Endpoint(self.plain_server.url), plain=True)
            return self.plain

    # ---------------------------------------------------------------- generation
    def generate(self, prompt_ids: list[int], sampling: SamplingConfig, fallback: FallbackConfig | None = None,
                 cancel: threading.Event | None = None, slot_details: bool = True,
                 speculative: bool = True) -> Iterator[Event]:
        """The same events as the local engine; ``fallback`` and ``slot_details`` have no
        counterpart in vLLM (see VLLM_CAPABILITIES). Raises InvalidRequestError at once."""
        sampling = self.check_request(list(prompt_ids), sampling)
        plain = not speculative or sampling.block_size == 1 or not self.speculative
        served = self.plain_model() if plain else self.served
        return mark_context_full(self._events(served, list(prompt_ids), sampling, cancel), self.served.window)

    def _events(self, served: ServedModel, prompt_ids, sampling, cancel) -> Iterator[Event]:
        try:
            self.revive(served)
            yield from ReplyStream(self, served, prompt_ids, sampling, cancel).run()
        except DFlashError as exc:
            yield Failed(kind=type(exc).__name__, message=str(exc))
        except Exception as exc:  # surfaced as an event, with the traceback in the log
            log.exception("vLLM generation failed")
            yield Failed(kind=type(exc).__name__, message=f"{type(exc).__name__}: {exc}")

    def request_body(self, served: ServedModel, prompt_ids, sampling: SamplingConfig) -> dict:
        body = {"model": served.endpoint.model, "prompt": prompt_ids, "max_tokens": sampling.max_new_tokens,
                "temperature": sampling.temperature, "top_p": sampling.top_p, "stream": True,
                "stream_options": {"include_usage": True}, "return_token_ids": True,
                "skip_special_tokens": True, "stop_token_ids": self.stop_ids}
        if sampling.top_k:
            body["top_k"] = sampling.top_k
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        return body

    def own_server(self, served: ServedModel) -> VLLMServer | None:
        """The server this engine started for ``served`` (None for a server at a URL)."""
        return self.plain_server if served is self.plain and self.plain_server else self.server

    def revive(self, served: ServedModel) -> None:
        """A server this engine started that has died since the last request is started again
        (same port, same log) before the next request, instead of failing every request until
        the Studio restarts. A server at a URL is the user's to restart."""
        server = self.own_server(served)
        if server is None or self._closed or server.alive():
            return
        with self._lock:
            if not server.alive():
                log.warning("the vLLM server died (log %s); starting it again", server.log_path)
                server.restart(self.config.startup_timeout_s)

    def server_gone(self, served: ServedModel, exc: Exception, mid_reply: bool) -> EngineUnavailableError:
        """Why a request could not go on: the server this engine started died (with its log's
        tail), or the one at the URL stopped answering."""
        server = self.own_server(served)
        what = "stopped mid-reply:" if mid_reply else "is down:"
        if server is not None and server.exited():
            return server.died_error(what)
        return EngineUnavailableError(f"the vLLM server at {served.endpoint.url} {what.rstrip(':')} "
                                      f"({type(exc).__name__}: {exc})")

    def close(self) -> None:
        self._closed = True
        for server in (self.plain_server, self.server):
            if server is not None:
                server.stop()


class ReplyStream:
    """One streamed reply turned into Started, Cycle..., Finished."""

    def __init__(self, engine: VLLMEngine, served: ServedModel, prompt_ids: list[int], sampling: SamplingConfig,
                 cancel: threading.Event | None):
        self.engine, self.served, self.prompt_ids, self.sampling, self.cancel = engine, served, prompt_ids, sampling, cancel
        self.speculative = served.block_size > 1
        self.detok = IncrementalDetokenizer(engine.tokenizer, prompt_ids)
        self.tokens: list[int] = []
        self.pieces: list[str] = []
        self.cycles: list[Cycle] = []
        self.metrics: dict = {}
        self.finish_reason = "length"
        self.t0 = self.last = 0.0
        self.prefill_ms = 0.0

    def run(self) -> Iterator[Event]:
        import httpx

        endpoint = self.served.endpoint
        body = self.engine.request_body(self.served, self.prompt_ids, self.sampling)
        self.t0 = self.last = time.perf_counter()
        cancelled = False
        timeout = httpx.Timeout(self.engine.config.request_timeout_s, connect=10.0)
        try:
            with httpx.stream("POST", endpoint.url + "/v1/completions", json=body, headers=endpoint.headers(),
                              timeout=timeout) as response:
                if response.status_code >= 400:
                    checked_json_error(response)
                for data in sse_events(response):
                    yield from self.consume(data)
                    if self.cancel is not None and self.cancel.is_set():
                        cancelled = True  # leaving the stream closes it: vLLM aborts the request
                        break
        except httpx.HTTPError as exc:
            gone = self.engine.server_gone(self.served, exc, mid_reply=bool(self.tokens))
            yield Failed(kind=type(gone).__name__, message=str(gone),
                         interrupted=bool(self.tokens))
            return
        if not self.tokens:
            raise EngineUnavailableError("the vLLM server ended the reply without a token")
        yield self.finished("cancelled" if cancelled else self.finish_reason)

    def consume(self, data: dict) -> Iterator[Event]:
        if data.get("metrics") is not None:
            self.metrics = data["metrics"].get("speculative_decoding") or {}
        for choice in data.get("choices") or ():
            ids = [int(t) for t in choice.get("token_ids") or ()]
            if choice.get("finish_reason"):
                self.finish_reason = "stop" if choice["finish_reason"] == "stop" else "length"
            if ids:
                yield from self.add_tokens(ids)

    def add_tokens(self, ids: list[int]) -> Iterator[Event]:
        now = time.perf_counter()
        elapsed_ms, self.last = (now - self.last) * 1000, now
        if not self.tokens:
            self.prefill_ms = elapsed_ms
            first = ids.pop(0)
            self.tokens.append(first)
            self.pieces.append(self.detok.push(first))
            yield Started(len(self.prompt_ids), self.sampling.max_new_tokens, self.served.block_size,
                          self.sampling.temperature, first, self.pieces[0], self.prefill_ms, self.speculative)
            if not ids:
                return
        counts = chunk_steps(len(ids), self.served.block_size, self.speculative)
        share = elapsed_ms / len(counts)
        for accepted in counts:
            emitted, ids = ids[: accepted + 1], ids[accepted + 1:]
            pieces = [self.detok.push(t) for t in emitted]
            cycle = make_cycle(len(self.cycles) + 1, emitted, pieces, accepted,
                                     self.served.block_size if self.speculative else 1, self.tokens[-1],
                                     len(self.prompt_ids) + len(self.tokens) - 1, share)
            self.cycles.append(cycle)
            self.tokens.extend(emitted)
            self.pieces.extend(pieces)
            yield cycle

    def finished(self, reason: str) -> Finished:
        self.pieces.append(self.detok.flush())
        total_ms = (time.perf_counter() - self.t0) * 1000
        taus = tuple(c.tau for c in self.cycles)
        positions = positions_from_cycles(self.cycles)
        accepted, drafted = self.metrics.get("per_step_accepted"), self.metrics.get("per_step_drafted")
        if accepted is not None and drafted is not None:
            truth = acceptance_lengths(len(self.tokens), accepted)
            if truth != taus:  # vLLM merged the chunks of several steps: its per-step list wins
                self.engine.merged_chunks += 1
                log.warning("vLLM merged stream chunks: per-step %s, chunks %s", truth, taus)
                taus = truth
            positions = per_position_acceptance(accepted[: len(taus)], drafted[: len(taus)])
        return Finished(
            reason=reason, token_ids=tuple(self.tokens), text="".join(self.pieces), acceptance_lengths=taus,
            prompt_tokens=len(self.prompt_ids), prefill_ms=self.prefill_ms, decode_ms=total_ms - self.prefill_ms,
            total_ms=total_ms, cycles=len(taus), per_position_acceptance=positions,
        )


def checked_json_error(response) -> None:
    response.read()
    checked_json(response, "vLLM")
    raise EngineUnavailableError(f"vLLM answered HTTP {response.status_code}")


def require_sse_reader():
    """httpx-sse's ``EventSource``; checked before a server is started or asked, so that a
    missing [vllm] extra is the load's one-line reason, not a failure mid-reply."""
    return require("httpx_sse", "vllm", "the vLLM engine").EventSource


def sse_events(response) -> Iterator[dict]:
    """The JSON objects of vLLM's server-sent event stream (framing read by httpx-sse: comments,
    fields and data split over lines as the SSE spec has them), until ``[DONE]``; an error object
    that vLLM sends inside the stream becomes an exception."""
    for event in require_sse_reader()(response).iter_sse():
        if event.data == "[DONE]":
            return
        if not event.data:
            continue
        data = json.loads(event.data)
        if "error" in data and not data.get("choices"):
            raise InvalidRequestError(f"vLLM: {error_text(event.data)}")
        yield data
