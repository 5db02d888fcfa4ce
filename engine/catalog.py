"""The published DFlash pairs: a target from its maker and the draft trained for it, by a name a
user recognises, with their hub ids and what they take (a download, memory).

Sizes are estimates from parameter counts (as the hub's model pages round them) times bytes
per parameter, computed here once (``PairSize``) for every place that shows them: stored, what
the download takes (the target as its maker stores it, MXFP4 or FP8 where it is quantised; the
draft in bf16); and once loaded, in bf16 (the engine computes in bf16 on a GPU and dequantises
what it cannot run quantised), plus a margin for the KV cache and activations of a few thousand
tokens. Each entry says
where its hub ids were read (``seen``): z-lab's README gives both ids of the first pairs; the
later drafts' ids are those of z-lab's hub pages, their targets' follow the makers' naming and
were not confirmed. A pair's entry may pin a revision (``REPO@REVISION``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from .errors import CheckpointError
from .hub import HubProbe, HubRef, cached, format_bytes, parse_hub_ref

BF16 = 2.0  # bytes per parameter
MXFP4_WEIGHT = 4.25 / 8  # 4-bit values plus an 8-bit scale per 32


def mixed_bytes(quantized_billions: float, other_billions: float, quantized_bytes: float) -> float:
    """Bytes per parameter, on average, of a target storing some weights quantised, the rest in bf16."""
    return (quantized_billions * quantized_bytes + other_billions * BF16) / (quantized_billions + other_billions)


# gpt-oss stores its experts in MXFP4 and the rest in bf16. Experts: layers x experts x (2880 x 5760
# gate/up + 2880 x 2880 down) = 24 x 32 x 24.9M = 19.1e9 of 20.9e9 (13.8 GB stored) for 20b,
# 36 x 128 x 24.9M = 114.7e9 of 116.8e9 (65.1 GB) for 120b
GPT_OSS_20B = mixed_bytes(19.1, 1.8, MXFP4_WEIGHT)
GPT_OSS_120B = mixed_bytes(114.7, 2.1, MXFP4_WEIGHT)
FP8 = 1.0  # MiMo-V2.5 ships FP8 weights
MXFP4_AND_FP8 = 0.6  # MiMo-V2.5-Pro-FP4: MXFP4 experts (most of the weights), FP8 attention and dense layers
MEMORY_MARGIN = 1.10  # KV cache, activations and allocator slack on top of the weights
MEMORY_FLOOR_BYTES = 1.0e9

ZLAB_README = "both ids as in z-lab's README"
ZLAB_README_AND_PAGE = "target id as in z-lab's README, draft id as on z-lab's hub page"
ZLAB_DRAFT_PAGE = "draft id as on z-lab's hub page; target id by the maker's naming, not confirmed"


class NotEnoughMemoryError(CheckpointError):
    """A pair needs more memory once loaded than this machine (or its GPU) has free."""


# The targets' stored formats (engine.quantization loads "mxfp4" and "fp8"); a format this engine
# cannot load is refused before the download, in these words.
MXFP4_IN_FP8 = "mxfp4 experts in fp8"
UNLOADABLE = {MXFP4_IN_FP8: "its experts are stored as MXFP4 inside a block-wise FP8 config, which transformers "
                            "cannot load; run it with --engine vllm on a GPU (a vLLM server that loads it)"}
FORMAT_NAMES = {"mxfp4": "MXFP4", "fp8": "FP8", MXFP4_IN_FP8: "MXFP4 and FP8"}


@dataclass(frozen=True)
class PairSize:
    """What a pair takes, in bytes: stored (the download) per checkpoint, and once loaded."""

    target_stored: float
    draft_stored: float
    loaded: float  # every weight in bf16 (a quantised target dequantised), with the margin
    kept_quantized: float | None = None  # where the device computes in the stored format; None: not quantised
    format_name: str = ""  # "MXFP4", "FP8"

    @property
    def stored(self) -> float:
        return self.target_stored + self.draft_stored

    def loaded_here(self, kept_quantized: bool, bytes_per_parameter: float = BF16) -> float:
        """Once loaded on a device that computes in the stored format (``kept_quantized``) or not,
        with weights widened to ``bytes_per_parameter`` (bf16: 2, float32: 4)."""
        if kept_quantized and self.kept_quantized is not None:
            return self.kept_quantized
        return self.loaded * bytes_per_parameter / BF16

    def words(self) -> str:
        """'18.4 GB stored, about 20.2 GB once loaded'; for a quantised target also what it takes
        where the GPU computes in its format."""
        text = f"{format_bytes(self.stored)} stored, about {format_bytes(self.loaded)} once loaded"
        if self.kept_quantized is None:
            return text
        return f"{text} in bf16, {format_bytes(self.kept_quantized)} kept in {self.format_name} on a GPU with its kernels"


@dataclass(frozen=True)
class PublishedPair:
    name: str  # in the model menu, stored with sessions: "Qwen3-8B + z-lab DFlash b16"
    target: str  # hub id, optionally @revision
    draft: str  # hub id, optionally /folder (MiMo's dflash/) and @revision
    target_billions: float  # parameters
    draft_billions: float
    stored_bytes: float = BF16  # per target parameter as the hub stores it
    seen: str = ZLAB_DRAFT_PAGE  # where the hub ids were read
    quantization: str | None = None  # the target's stored format: "mxfp4", "fp8", MXFP4_IN_FP8; None: bf16

    @property
    def size(self) -> PairSize:
        """The one source of every size the menu, the API and the loading messages show."""
        target_stored = self.target_billions * 1e9 * self.stored_bytes
        draft = self.draft_billions * 1e9 * BF16
        kept = _with_margin(target_stored + draft) if self.quantization in ("mxfp4", "fp8") else None
        return PairSize(target_stored, draft, _with_margin((self.target_billions + self.draft_billions) * 1e9 * BF16),
                        kept, FORMAT_NAMES.get(self.quantization or "", ""))

    @property
    def unloadable(self) -> str:
        """Why this engine cannot load the target at all ("" when it can)."""
        return UNLOADABLE.get(self.quantization or "", "")

    @property
    def download_bytes(self) -> float:
        return self.size.stored

    @property
    def memory_bytes(self) -> float:
        return self.size.loaded

    @property
    def refs(self) -> tuple[HubRef, HubRef]:
        return parse_hub_ref(self.target), parse_hub_ref(self.draft)

    def describe(self) -> str:
        """One line for the menu's details and the API: ids, download and memory (estimates)."""
        return f"{self.target} + {self.draft}; {self.size.words()} in bf16 (estimates); {self.seen}"


PUBLISHED_PAIRS: tuple[PublishedPair, ...] = (
    PublishedPair("Qwen3-8B + z-lab DFlash b16", "Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16", 8.2, 1.0,
                  seen=ZLAB_README),
    PublishedPair("Qwen3-4B + z-lab DFlash b16", "Qwen/Qwen3-4B", "z-lab/Qwen3-4B-DFlash-b16", 4.0, 0.5,
                  seen=ZLAB_README),
    PublishedPair("Qwen3-Coder-30B-A3B + z-lab DFlash", "Qwen/Qwen3-Coder-30B-A3B-Instruct",
                  "z-lab/Qwen3-Coder-30B-A3B-DFlash", 30.5, 0.5, seen=ZLAB_README),
    PublishedPair("Llama-3.1-8B-Instruct + z-lab DFlash", "meta-llama/Llama-3.1-8B-Instruct",
                  "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat", 8.0, 1.0,
                  seen="draft id as in z-lab's README; target id by Meta's naming (a gated repository)"),
    PublishedPair("gpt-oss-20b + z-lab DFlash", "openai/gpt-oss-20b", "z-lab/gpt-oss-20b-DFlash", 20.9, 0.8,
                  stored_bytes=GPT_OSS_20B, seen=ZLAB_README, quantization="mxfp4"),
    PublishedPair("gpt-oss-120b + z-lab DFlash", "openai/gpt-oss-120b", "z-lab/gpt-oss-120b-DFlash", 116.8, 0.8,
                  stored_bytes=GPT_OSS_120B, seen=ZLAB_README_AND_PAGE, quantization="mxfp4"),
    PublishedPair("Qwen3-Coder-Next + z-lab DFlash", "Qwen/Qwen3-Coder-Next", "z-lab/Qwen3-Coder-Next-DFlash",
                  80.0, 0.5, seen=ZLAB_README_AND_PAGE),
    PublishedPair("Qwen3.5-4B + z-lab DFlash", "Qwen/Qwen3.5-4B", "z-lab/Qwen3.5-4B-DFlash", 4.5, 0.5),
    PublishedPair("Qwen3.5-9B + z-lab DFlash", "Qwen/Qwen3.5-9B", "z-lab/Qwen3.5-9B-DFlash", 9.0, 1.0),
    PublishedPair("Qwen3.5-27B + z-lab DFlash", "Qwen/Qwen3.5-27B", "z-lab/Qwen3.5-27B-DFlash", 27.0, 4.0),
    PublishedPair("Qwen3.5-35B-A3B + z-lab DFlash", "Qwen/Qwen3.5-35B-A3B", "z-lab/Qwen3.5-35B-A3B-DFlash",
                  35.0, 0.5),
    PublishedPair("Qwen3.6-27B + z-lab DFlash", "Qwen/Qwen3.6-27B", "z-lab/Qwen3.6-27B-DFlash", 27.0, 2.0),
    PublishedPair("Qwen3.6-35B-A3B + z-lab DFlash", "Qwen/Qwen3.6-35B-A3B", "z-lab/Qwen3.6-35B-A3B-DFlash",
                  35.0, 0.5),
    PublishedPair("MiMo-V2.5 + its own DFlash", "XiaomiMiMo/MiMo-V2.5-DFlash", "XiaomiMiMo/MiMo-V2.5-DFlash/dflash",
                  311.0, 1.0, stored_bytes=FP8, seen="repository as on the hub; its dflash/ folder as in a "
                  "third-party copy of its config, not confirmed", quantization="fp8"),
    PublishedPair("MiMo-V2.5-Pro-FP4 + its own DFlash", "XiaomiMiMo/MiMo-V2.5-Pro-FP4-DFlash",
                  "XiaomiMiMo/MiMo-V2.5-Pro-FP4-DFlash/dflash", 1020.0, 1.5, stored_bytes=MXFP4_AND_FP8,
                  seen="repository and its dflash/ folder as a public copy of dflash/config.json names them",
                  quantization=MXFP4_IN_FP8),
)


def _with_margin(weights: float) -> float:
    return max(weights * MEMORY_MARGIN, weights + MEMORY_FLOOR_BYTES)


def find_pair(name: str, pairs: tuple[PublishedPair, ...] | None = None) -> PublishedPair | None:
    """A pair by its menu name, or that name as an API client or a command line types it
    ('qwen3-8b-z-lab-dflash-b16')."""
    pairs = PUBLISHED_PAIRS if pairs is None else pairs
    wanted = _slug(name)
    return next((pair for pair in pairs if pair.name == name or _slug(pair.name) == wanted), None)


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._]+", "-", name).strip("-").lower()


def pair_of(target: str | None, draft: str | None, pairs: tuple[PublishedPair, ...] | None = None
            ) -> PublishedPair | None:
    """The published pair whose target (and draft, when given) these hub ids name, if any."""
    pairs = PUBLISHED_PAIRS if pairs is None else pairs
    wanted = [_same(source) for source in (target, draft)]
    for pair in pairs:
        target_ref, draft_ref = pair.refs
        if wanted[0] == (target_ref.repo_id, target_ref.subfolder) and wanted[1] in (
                None, (draft_ref.repo_id, draft_ref.subfolder)):
            return pair
    return None


def _same(source: str | None):
    if not source:
        return None
    try:
        ref = parse_hub_ref(source)
    except Exception:  # a path, not a hub id
        return ("", source)
    return (ref.repo_id, ref.subfolder)


def download_note(source: str, pairs: tuple[PublishedPair, ...] | None = None) -> str:
    """What a published target or draft's download takes, with the pair's sizes beside it
    ("Qwen/Qwen3-8B: 16.4 GB of the pair's 18.4 GB stored, about 20.2 GB once loaded"), else ""."""
    pairs = PUBLISHED_PAIRS if pairs is None else pairs
    wanted = _same(source)
    for pair in pairs:
        target, draft = pair.refs
        size = pair.size
        for ref, stored in ((target, size.target_stored), (draft, size.draft_stored)):
            if wanted == (ref.repo_id, ref.subfolder):
                return (f"{ref.repo_id}{'/' + ref.subfolder if ref.subfolder else ''}: {format_bytes(stored)} of "
                        f"the pair's {size.words()}")
    return ""


FreeMemory = Callable[[], tuple[float, str]]


def fits(pair: PublishedPair, free_memory: FreeMemory, bytes_per_parameter: float = BF16,
         kept_quantized: bool = False) -> str:
    """"" when the pair fits in the memory ``free_memory()`` reports, else why not, in one line.
    Loaded with weights of ``bytes_per_parameter`` (bf16: 2, float32: 4), or as stored where the
    device computes in the target's format (``kept_quantized``)."""
    needed = pair.size.loaded_here(kept_quantized, bytes_per_parameter)
    free, where = free_memory()
    if needed <= free:
        return ""
    return (f"{pair.name} needs about {format_bytes(needed)} once loaded in "
            f"{loaded_words(pair, bytes_per_parameter, kept_quantized)} and this machine has {format_bytes(free)} of "
            f"{where} free")


def loaded_words(pair: PublishedPair, bytes_per_parameter: float, kept_quantized: bool) -> str:
    if kept_quantized and pair.size.kept_quantized is not None:
        return pair.size.format_name
    return {2.0: "bf16", 4.0: "float32"}.get(float(bytes_per_parameter), f"{bytes_per_parameter:g} bytes a parameter")


def check_fits(pair: PublishedPair, free_memory: FreeMemory, bytes_per_parameter: float = BF16,
               kept_quantized: bool = False) -> None:
    """Refuse, before any download, a pair this engine cannot load (its stored format) or that
    cannot fit in the memory free here (``NotEnoughMemoryError``), in one line."""
    if pair.unloadable:
        raise CheckpointError(f"{pair.name}: {pair.unloadable}")
    problem = fits(pair, free_memory, bytes_per_parameter, kept_quantized)
    if problem:
        raise NotEnoughMemoryError(f"{problem}: it cannot run here (pick a smaller pair, or run it where more "
                                   "memory is free)")


def is_downloaded(pair: PublishedPair) -> bool:
    """Both checkpoints complete in the hub cache (no network asked)."""
    target, draft = pair.refs
    return cached(target, "target") is not None and cached(draft, "draft") is not None


def availability(pair: PublishedPair, probe: HubProbe, free_memory: FreeMemory | None = None,
                 bytes_per_parameter: float = BF16, kept_quantized: bool = False) -> str:
    """What picking the pair means here, for the menu: this engine cannot load it, or it cannot
    fit in the memory free here (said first); it is downloaded; it downloads first; or it cannot
    be had on this machine now (no network) and what it would take. Sizes as ``PairSize.words``
    states them."""
    size = pair.size.words()
    if is_downloaded(pair):
        state = f"downloaded, {size}"
    elif probe.reachable():
        state = f"downloads first: {size}"
    else:
        state = f"needs a download: {size}; no network"
    if pair.unloadable:
        return f"does not load here: {pair.unloadable} ({state})"
    if free_memory is not None:
        free, where = free_memory()
        needed = pair.size.loaded_here(kept_quantized, bytes_per_parameter)
        if needed > free:
            return (f"does not fit here: about {format_bytes(needed)} once loaded in "
                    f"{loaded_words(pair, bytes_per_parameter, kept_quantized)}, {format_bytes(free)} of {where} free "
                    f"({state})")
    return state
