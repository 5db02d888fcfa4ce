"""The published DFlash pairs: a target from its maker and the draft trained for it, by a name a
user recognises, with their hub ids and what they take (a download, memory).

Sizes are estimates from parameter counts (as the hub's model pages round them) times bytes
per parameter: stored bytes for the download, bf16 for memory (the engine computes in bf16 on a
GPU), plus a margin for the KV cache and activations of a few thousand tokens. Each entry says
where its hub ids were read (``seen``): z-lab's README gives both ids of the first pairs; the
later drafts' ids are those of z-lab's hub pages, their targets' follow the makers' naming and
were not confirmed. A pair's entry may pin a revision (``REPO@REVISION``).
"""

from __future__ import annotations

from dataclasses import dataclass

from .hub import HubProbe, HubRef, cached, format_bytes, parse_hub_ref

BF16 = 2.0  # bytes per parameter
MXFP4 = 0.53  # gpt-oss stores its experts in MXFP4 (4.25 bits) and the rest in bf16: 13.8 GB for 21B
FP8 = 1.0  # MiMo-V2.5 ships FP8 weights
MEMORY_MARGIN = 1.10  # KV cache, activations and allocator slack on top of the weights
MEMORY_FLOOR_BYTES = 1.0e9

ZLAB_README = "both ids as in z-lab's README"
ZLAB_README_AND_PAGE = "target id as in z-lab's README, draft id as on z-lab's hub page"
ZLAB_DRAFT_PAGE = "draft id as on z-lab's hub page; target id by the maker's naming, not confirmed"


@dataclass(frozen=True)
class PublishedPair:
    name: str  # in the model menu, stored with sessions: "Qwen3-8B + z-lab DFlash b16"
    target: str  # hub id, optionally @revision
    draft: str  # hub id, optionally /folder (MiMo's dflash/) and @revision
    target_billions: float  # parameters
    draft_billions: float
    stored_bytes: float = BF16  # per target parameter as the hub stores it
    seen: str = ZLAB_DRAFT_PAGE  # where the hub ids were read

    @property
    def download_bytes(self) -> float:
        return self.target_billions * 1e9 * self.stored_bytes + self.draft_billions * 1e9 * BF16

    @property
    def memory_bytes(self) -> float:
        weights = (self.target_billions + self.draft_billions) * 1e9 * BF16
        return max(weights * MEMORY_MARGIN, weights + MEMORY_FLOOR_BYTES)

    @property
    def refs(self) -> tuple[HubRef, HubRef]:
        return parse_hub_ref(self.target), parse_hub_ref(self.draft)

    def describe(self) -> str:
        """One line for the menu's details and the API: ids, download and memory (estimates)."""
        return (f"{self.target} + {self.draft}; download about {format_bytes(self.download_bytes)}, memory about "
                f"{format_bytes(self.memory_bytes)} in bf16 (estimates); {self.seen}")


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
                  stored_bytes=MXFP4, seen=ZLAB_README),
    PublishedPair("gpt-oss-120b + z-lab DFlash", "openai/gpt-oss-120b", "z-lab/gpt-oss-120b-DFlash", 116.8, 0.8,
                  stored_bytes=MXFP4, seen=ZLAB_README_AND_PAGE),
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
                  "third-party copy of its config, not confirmed"),
)


def find_pair(name: str, pairs: tuple[PublishedPair, ...] = PUBLISHED_PAIRS) -> PublishedPair | None:
    return next((pair for pair in pairs if pair.name == name), None)


def download_note(source: str, pairs: tuple[PublishedPair, ...] = PUBLISHED_PAIRS) -> str:
    """"about 18.4 GB" for a published target or draft: what picking its pair downloads, the figure
    the menu gives (``PublishedPair.download_bytes``), so that the warning and the menu agree; else ""."""
    try:
        wanted = parse_hub_ref(source)
    except Exception:  # a path, not a hub id: nothing to download
        return ""
    same = (wanted.repo_id, wanted.subfolder)
    for pair in pairs:
        target, draft = pair.refs
        if same in ((target.repo_id, target.subfolder), (draft.repo_id, draft.subfolder)):
            return f"about {format_bytes(pair.download_bytes)} for the pair"
    return ""


def is_downloaded(pair: PublishedPair) -> bool:
    """Both checkpoints complete in the hub cache (no network asked)."""
    target, draft = pair.refs
    return cached(target, "target") is not None and cached(draft, "draft") is not None


def availability(pair: PublishedPair, probe: HubProbe) -> str:
    """What picking the pair means here, for the menu: it is downloaded; it downloads first; or
    it cannot be had on this machine now (no network) and what it would take."""
    if is_downloaded(pair):
        return f"downloaded, needs about {format_bytes(pair.memory_bytes)} of memory"
    size = format_bytes(pair.download_bytes)
    if probe.reachable():
        return f"downloads {size} first, needs about {format_bytes(pair.memory_bytes)} of memory"
    return f"needs a download of {size}; no network"
