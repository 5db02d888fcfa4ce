"""Load a transformers target (safetensors only, never remote code) and a z-lab-format draft,
check that they fit together, and pick device and dtype."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from .catalog import check_fits, download_note, find_pair, pair_of
from .chat_formats import end_token_ids
from .config import EngineConfig
from .draft import DFlashDraftModel, draft_setting, load_draft
from .errors import CheckpointError, IncompatibleDraftError, InvalidRequestError
from .features import decoder_layers
from .hub import HubProbe, fetch, parse_hub_ref
from .memory import free_memory, keeps_format
from .quantization import (check_dequantizable, device_kernels, loading_config, plan_quantization,
                           quantization_settings, quiet_transformers, widen_to)
from .shipped import ASSETS_ENV, DEFAULT_PAIR, assets_dir, pair_dirs, pair_name  # noqa: F401 (re-exported)
from .target_cache import check_rollback_config, check_verify_contract
from .weights import check_weight_files, guard_logits, safetensors_files

EMBEDDED_NAME = DEFAULT_PAIR.name


def embedded_pair() -> tuple[Path, Path]:
    """The default shipped pair (engine.shipped): what runs when no --target is given."""
    return pair_dirs(DEFAULT_PAIR)


def pick_device(device: str | None) -> torch.device:
    """``--device`` (cpu, cuda, cuda:1, mps), checked here: torch's own errors are tracebacks."""
    if not device:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        chosen = torch.device(device)
    except (RuntimeError, ValueError) as exc:
        raise InvalidRequestError(f"--device {device!r} is not a device torch knows ({exc})") from None
    if chosen.type == "cuda" and not torch.cuda.is_available():
        raise InvalidRequestError(f"--device {device}: this torch has no CUDA device (it runs on cpu)")
    if chosen.type == "cuda" and chosen.index is not None and chosen.index >= torch.cuda.device_count():
        raise InvalidRequestError(f"--device {device}: there are {torch.cuda.device_count()} CUDA devices")
    if chosen.type == "mps" and not torch.backends.mps.is_available():
        raise InvalidRequestError(f"--device {device}: MPS is not available here")
    return chosen


def pick_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    if dtype:
        try:
            value = getattr(torch, dtype)
        except AttributeError:
            value = None
        if not isinstance(value, torch.dtype):
            raise CheckpointError(f"unknown dtype {dtype!r} (use float32, bfloat16 or float16)")
        return value
    return torch.bfloat16 if device.type == "cuda" else torch.float32


SMALL_MODEL_PARAMETERS = 100_000_000
NO_TOKENIZER_LIMIT = int(1e30)  # what transformers itself uses for "no limit known"


def pick_threads(requested: int | None, device: torch.device, parameters: int) -> int | None:
    """CPU threads for torch. A small model's matrices are too small to split across cores:
    extra threads only add synchronisation, and on a shared machine OpenMP's spinning threads
    make multi-row matmuls (verify blocks, draft passes) many times slower (measured here: a
    verify of 8 tokens 480 ms with 2 busy threads vs 3 ms with one). So small models get one."""
    if requested:
        return requested
    if device.type == "cpu" and parameters < SMALL_MODEL_PARAMETERS:
        return 1
    return None


def resolve(source: str, what: str, progress: Callable[[float, str], None] | None = None,
            probe: HubProbe | None = None) -> Path:
    """A local directory, or a hub id ``owner/name[/folder][@revision]`` (MiMo's drafts live in
    ``owner/name/dflash``; ``@revision`` pins a branch, tag or commit): from the hub cache, or
    downloaded when the network allows it (only the files a ``what`` needs, with progress)."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise CheckpointError(f"{what} {source} is a file; give the checkpoint's directory")
    parts = source.strip("/").split("/")
    # A path whose first folder is here (assets/models/…) is a local path with a typo, not a hub id.
    if len(parts) < 2 or source.startswith((".", "/", "~")) or Path(parts[0]).is_dir():
        raise CheckpointError(f"{what} not found: {source} (no such directory{_did_you_mean(path)})")
    return fetch(parse_hub_ref(source), what, progress, probe, download_note(source))


def _did_you_mean(path: Path) -> str:
    """"; did you mean assets/models/tiny-coder-requests/target?": the closest name in the
    deepest folder of ``path`` that exists, with the rest of the path after it."""
    import difflib

    missing = path
    while missing.parent != missing and not missing.parent.is_dir():
        missing = missing.parent
    folder = missing.parent
    if missing == folder:
        return ""
    names = [child.name for child in folder.iterdir() if child.is_dir()]
    close = difflib.get_close_matches(missing.name, names, n=1, cutoff=0.75)
    return f"; did you mean {folder / close[0] / path.relative_to(missing)}?" if close else ""


def load_target(directory: Path, device: torch.device, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the app and the CLI report loading progress themselves
    if not (directory / "config.json").is_file():
        raise CheckpointError(f"no config.json in target directory {directory}")
    safetensors_files(directory, "target")
    check_weight_files(directory)
    check_rollback_config(directory)  # refuse before reading gigabytes of weights
    config = read_json(directory / "config.json")
    quantization = plan_quantization(config, device_kernels(device))  # refuses what cannot load here
    options = target_load_options(device, dtype)
    if quantization is not None:
        settings = quantization_settings(config)
        check_dequantizable(directory, settings, quantization)
        options["quantization_config"] = loading_config(settings, quantization)
    try:
        with quiet_transformers() if quantization is not None else contextlib.nullcontext():
            target, info = AutoModelForCausalLM.from_pretrained(directory, **options)
    except Exception as exc:  # transformers and safetensors raise many types; all mean "cannot load"
        # one line: transformers' missing-library errors span several ("... requires the timm
        # library ...\n`pip install timm`..."), and the page and the CLI show one line per error
        reason = " ".join(str(exc).split())
        raise CheckpointError(f"cannot load target from {directory}: {type(exc).__name__}: {reason}") from exc
    if quantization is not None and quantization.dequantized:
        widen_to(target, dtype)
    missing = sorted(info.get("missing_keys") or [])
    if missing:  # transformers would fill them with random values and only warn
        raise CheckpointError(f"inconsistent weights in {directory}: {len(missing)} tensor(s) the config needs are "
                              f"missing ({', '.join(missing[:3])}{'…' if len(missing) > 3 else ''})")
    guard_logits(target)
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, trust_remote_code=False)
    except Exception as exc:
        raise CheckpointError(f"cannot load the tokenizer in {directory}: {exc}") from exc
    # The runtime holds prompts to the target's context window itself and refuses in one line;
    # the tokenizer's own limit would only add transformers' "sequence length is longer" warning.
    tokenizer.model_max_length = NO_TOKENIZER_LIMIT
    return target.eval(), tokenizer


def stored_format(directory: Path, device: torch.device, dtype: torch.dtype) -> str:
    """How the target in ``directory`` loads here when it is stored quantized, in words; ""
    otherwise. A format that cannot load here is refused now, before anything is read."""
    config_path = directory / "config.json"
    plan = plan_quantization(read_json(config_path), device_kernels(device)) if config_path.is_file() else None
    return plan.describe(dtype) if plan is not None else ""


def target_load_options(device: torch.device, dtype: torch.dtype) -> dict:
    """How transformers loads a target: each tensor read from its safetensors file (memory-mapped)
    and written straight into the device in ``dtype``, shard by shard (``device_map``), instead of
    a whole model built in host memory and then moved (16 GB of host RAM for an 8B target in
    bf16, twice that for a checkpoint stored in fp32 and cast). Never remote code."""
    return dict(dtype=dtype, device_map={"": device}, use_safetensors=True, trust_remote_code=False,
                output_loading_info=True)


def check_compatible(draft: DFlashDraftModel, target) -> None:
    """Refuse a draft that cannot work with this target, with the reason."""
    tconf = target.config.get_text_config() if hasattr(target.config, "get_text_config") else target.config
    rows = target.get_input_embeddings().weight.shape[0]
    n_layers = len(decoder_layers(target))
    problems = []
    feature_width = getattr(draft.config, "target_hidden_size", None) or draft.config.hidden_size
    if feature_width != tconf.hidden_size:
        problems.append(f"hidden size {feature_width} ≠ target's {tconf.hidden_size}")
    elif draft.config.hidden_size != tconf.hidden_size and (draft.embed_tokens is None or draft.lm_head is None):
        problems.append(f"draft hidden size {draft.config.hidden_size} ≠ target's {tconf.hidden_size} and the draft "
                        "has no own embed_tokens and lm_head to use instead of the target's")
    if getattr(draft.config, "vocab_size", rows) != rows and draft.config.vocab_size != tconf.vocab_size:
        problems.append(f"vocabulary {draft.config.vocab_size} ≠ target's embedding rows {rows}")
    bad_layers = [i for i in draft.target_layer_ids if not 0 <= i < n_layers]
    if bad_layers:
        problems.append(f"target_layer_ids {bad_layers} beyond the target's {n_layers} layers")
    declared = draft_setting(draft.config, "num_target_layers")
    if declared is not None and int(declared) != n_layers:
        problems.append(f"draft was trained for a {declared}-layer target, this one has {n_layers}")
    if not 0 <= draft.mask_token_id < rows:
        problems.append(f"mask_token_id {draft.mask_token_id} is outside the target embedding ({rows} rows)")
    if problems:
        raise IncompatibleDraftError("draft does not fit the target: " + "; ".join(problems))


def stop_tokens(target, tokenizer) -> list[int]:
    ids: list[int] = []
    gen = getattr(target, "generation_config", None)
    for value in (getattr(gen, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if value is None:
            continue
        ids.extend(value if isinstance(value, (list, tuple)) else [value])
    ids.extend(end_token_ids(tokenizer))  # the chat format's own (harmony's <|call|>, Qwen's <|im_end|>)
    return sorted(set(int(i) for i in ids))


@dataclass
class LoadedModels:
    target: object
    tokenizer: object
    draft: DFlashDraftModel | None
    device: torch.device
    dtype: torch.dtype
    name: str
    stop_token_ids: list[int] = field(default_factory=list)
    context_window: int = 2048
    target_path: str = ""
    draft_path: str = ""
    quantization: str = ""  # how a quantized target was loaded ("MXFP4, dequantized to float32 at load"); "" if not


def part_of(report: Callable[[float, str], None], start: float, end: float) -> Callable[[float, str], None]:
    """``report`` for one step of a load that takes the share [start, end] of the whole."""
    return lambda fraction, message: report(start + (end - start) * fraction, message)


def load_models(config: EngineConfig, progress: Callable[[float, str], None] | None = None) -> LoadedModels:
    """Load target (+ draft); ``progress(fraction, message)`` reports the steps."""
    report = progress or (lambda fraction, message: None)
    probe = HubProbe()  # asked only when a checkpoint is on the hub and not in its cache
    device = pick_device(config.device)
    dtype = pick_dtype(config.dtype, device)
    if config.target is None:
        target_dir, draft_dir = embedded_pair()
        if not target_dir.is_dir():
            raise CheckpointError(f"the embedded tiny coder is missing ({target_dir}); reinstall or pass --target")
        draft_source = str(draft_dir) if config.draft is None else config.draft
        name = config.name or EMBEDDED_NAME
    else:
        config = published_pair_config(config, device, dtype)
        target_dir = resolve(config.target, "target", part_of(report, 0.0, 0.5), probe)
        draft_source = config.draft
        name = config.name or pair_name(config.target, config.draft)
    # the draft's files too before the target loads: a draft that cannot be had fails in seconds
    draft_dir = resolve(draft_source, "draft", part_of(report, 0.5, 0.6), probe) if (
        config.speculative and draft_source) else None
    stored = stored_format(target_dir, device, dtype)
    report(0.6, f"loading target {target_dir.name} on {device.type} ({str(dtype).removeprefix('torch.')}"
                f"{'; ' + stored if stored else ''})")
    target, tokenizer = load_target(target_dir, device, dtype)
    draft = None
    draft_path = ""
    if draft_dir is not None:
        report(0.9, "loading DFlash draft")
        draft = load_draft(draft_dir, device=device, dtype=dtype)
        check_compatible(draft, target)
        check_verify_contract(target)  # plain decoding never runs a block after the cache
        draft_path = str(draft_dir)
    threads = pick_threads(config.threads, device, sum(p.numel() for p in target.parameters()))
    if threads:
        torch.set_num_threads(threads)
    report(1.0, "ready")
    window = getattr(target.config, "max_position_embeddings", None) or 2048
    return LoadedModels(target, tokenizer, draft, device, dtype, name, stop_tokens(target, tokenizer),
                        int(window), str(target_dir), draft_path, stored)


def published_pair_config(config: EngineConfig, device: torch.device, dtype: torch.dtype) -> EngineConfig:
    """A published pair (engine.catalog) named by its menu name as ``--target`` (its hub ids
    then fill target and draft), or given by its hub ids: refused in one line, before anything
    is downloaded, when its stored format cannot be loaded or it cannot fit in the memory free
    here (the GPU's on CUDA; a quantised target counted as stored where the GPU computes in it)."""
    from dataclasses import replace

    named = None if Path(config.target).expanduser().exists() else find_pair(config.target)
    if named is not None:
        config = replace(config, target=named.target, draft=config.draft or named.draft,
                         name=config.name or named.name)
    pair = named or pair_of(config.target, config.draft)
    if pair is not None:
        check_fits(pair, lambda: free_memory(str(device)), torch.finfo(dtype).bits / 8,
                   keeps_format(pair.quantization, str(device)))
    return config


def describe(models: LoadedModels) -> dict:
    n_target = sum(p.numel() for p in models.target.parameters())
    n_draft = sum(p.numel() for p in models.draft.parameters()) if models.draft is not None else 0
    return {
        "name": models.name, "device": models.device.type, "dtype": str(models.dtype).removeprefix("torch."),
        "target_parameters": n_target, "draft_parameters": n_draft,
        "block_size": models.draft.block_size if models.draft is not None else 1,
        "context_window": models.context_window,
    }


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from exc
