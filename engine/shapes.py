"""A published pair's shape with random weights: its target and draft built from their
``config.json`` files alone (a few kilobytes from the hub, or the hub cache), at full size, to
measure what a cycle costs on this machine before anyone downloads the weights.

    models = random_pair(find_pair("Qwen3-8B + z-lab DFlash b16"), "cuda", torch.bfloat16)
    costs = measure(models)      # engine.costs: DFlash pays where E[tau] > costs.plain_steps(block)

Nothing is shrunk; a pair that cannot fit in the memory free here is refused in one line
before anything is built (``catalog.check_fits``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .catalog import PublishedPair, check_fits
from .errors import CheckpointError
from .hub import HubProbe, HubRef
from .memory import free_memory

# keys of a published config that describe stored weights, not the shape: random weights are built
# in the compute dtype, so a quantised target is measured as it runs once dequantised
STORAGE_KEYS = ("quantization_config", "architectures", "transformers_version", "torch_dtype", "dtype", "auto_map")


def hub_config(ref: HubRef, probe: HubProbe | None = None) -> dict:
    """A checkpoint's ``config.json`` alone: from the hub cache, else downloaded (no weights)."""
    from huggingface_hub import hf_hub_download

    filename = f"{ref.subfolder}/config.json" if ref.subfolder else "config.json"
    try:
        path = hf_hub_download(ref.repo_id, filename, revision=ref.revision, local_files_only=True)
    except Exception:  # not in the cache: the hub library raises several kinds
        if not (probe or HubProbe()).reachable():
            raise CheckpointError(f"{ref}: its config.json is not in the hub cache and there is no network to read "
                                  "it (the shape needs only that file)") from None
        try:
            path = hf_hub_download(ref.repo_id, filename, revision=ref.revision)
        except Exception as exc:
            raise CheckpointError(f"{ref}: cannot read its config.json ({type(exc).__name__}: {exc})") from exc
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{ref}: its config.json cannot be read ({exc})") from exc


def random_target(raw: dict, device: torch.device, dtype: torch.dtype):
    from transformers import AutoConfig, AutoModelForCausalLM

    values = {k: v for k, v in raw.items() if k not in STORAGE_KEYS}
    model_type = values.pop("model_type", None)
    try:
        config = AutoConfig.for_model(model_type, **values)
        with torch.device(device):
            return AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"cannot build a {model_type} target from its config: {exc}") from exc


def random_draft(raw: dict, device: torch.device, dtype: torch.dtype):
    from .draft import DRAFT_CLASSES, place_draft
    from .draft_config import config_from_dict

    config, form = config_from_dict(raw)
    mimo = bool((raw.get("dflash_config") or {}).get("use_swa"))  # MiMo's drafts ship a mask embedding
    with torch.device(device):
        draft = DRAFT_CLASSES[form](config, mask_embedding=mimo)
    return place_draft(draft, device, dtype)


def random_pair(pair: PublishedPair, device: str | torch.device | None, dtype: torch.dtype,
                probe: HubProbe | None = None):
    """``LoadedModels`` of random weights in ``pair``'s full shape (no tokenizer)."""
    from .loading import LoadedModels, check_compatible, pick_device

    device = pick_device(str(device) if device else None)
    check_fits(pair, lambda: free_memory(str(device)), torch.finfo(dtype).bits / 8)  # before reading anything
    target_ref, draft_ref = pair.refs
    target_raw, draft_raw = hub_config(target_ref, probe), hub_config(draft_ref, probe)
    torch.manual_seed(0)
    target = random_target(target_raw, device, dtype)
    draft = random_draft(draft_raw, device, dtype)
    check_compatible(draft, target)
    window = int(getattr(target.config, "max_position_embeddings", 0) or 2048)
    return LoadedModels(target, None, draft, device, dtype, f"{pair.name} (random weights)", [], window)
