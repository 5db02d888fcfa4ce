"""The pairs that ship in ``assets/models``, by the names the app shows, stores and answers to,
and readable names for pairs given by path or hub id.

The folders keep the names they were built under (the rebuild script, the model cards and
users' own ``--target`` paths use them); what a pair is called is decided here:

    tiny-coder       assets/models/tiny-coder-requests   the default: answers simple requests
    tiny-coder-fast  assets/models/tiny-coder            the speed demo: high acceptance, ignores requests

``aliases`` are the names older versions stored with sessions or answered to in the API, so
that stored sessions and editors' settings keep pointing at the pair that made them.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

ASSETS_ENV = "DFLASH_STUDIO_ASSETS"


@dataclass(frozen=True)
class ShippedPair:
    name: str  # shown in the model menu, stored with sessions, the API's model id
    folder: str  # under assets/models
    purpose: str  # what it is for, in words a newcomer understands
    aliases: tuple[str, ...] = ()
    # measured with `dflash-studio bench --no-fallback` on the held-out prompt sets (greedy, block 8;
    # lowest and highest set, as in the pair's model card): the one source of the figures the page shows
    tau: tuple[float, float] = (0.0, 0.0)
    speedup: tuple[float, float] = (0.0, 0.0)

    def speed(self) -> str:
        """'τ LOW–HIGH, LOW–HIGH× plain decoding', one decimal (the header's words; the card gives two)."""
        if not self.speedup[1]:
            return ""
        return (f"τ {self.tau[0]:.1f}–{self.tau[1]:.1f}, {self.speedup[0]:.1f}–{self.speedup[1]:.1f}× "
                "plain decoding")


SHIPPED_PAIRS = (
    ShippedPair("tiny-coder", "tiny-coder-requests", "answers simple requests",
                aliases=("tiny-coder-requests", "tiny-coder-requests (answers requests)",
                         "tiny-coder-requests-answers-requests"), tau=(2.75, 3.31), speedup=(1.46, 1.77)),
    ShippedPair("tiny-coder-fast", "tiny-coder", "speed demo, does not answer requests",
                aliases=("tiny-coder (embedded)", "tiny-coder-embedded"), tau=(6.05, 6.36), speedup=(3.02, 3.13)),
)
DEFAULT_PAIR = SHIPPED_PAIRS[0]  # what the app, generate, bench and the API run when told nothing

# folder names that say nothing about the model: a readable name comes from the folder above
GENERIC_FOLDERS = frozenset({"", "target", "draft", "model", "models", "dflash", "checkpoint", "final"})


def assets_dir() -> Path:
    return Path(os.environ.get(ASSETS_ENV) or Path(__file__).resolve().parent.parent / "assets")


def pair_dirs(pair: ShippedPair, assets: Path | None = None) -> tuple[Path, Path]:
    root = (assets or assets_dir()) / "models" / pair.folder
    return root / "target", root / "draft"


def shipped_pair_at(target: str | Path, assets: Path | None = None) -> ShippedPair | None:
    """The shipped pair whose target folder this is (given by path), if any."""
    path = Path(target).expanduser()
    if not path.is_dir():
        return None
    for pair in SHIPPED_PAIRS:
        shipped = pair_dirs(pair, assets)[0]
        if shipped.is_dir() and shipped.resolve() == path.resolve():
            return pair
    return None


def readable_name(source: str) -> str:
    """'runs/mypair/target' -> 'mypair'; 'Qwen/Qwen3-8B' -> 'Qwen3-8B'; 'XiaomiMiMo/MiMo-V2.5/dflash' -> 'MiMo-V2.5'."""
    parts = [part for part in PurePosixPath(str(source).replace("\\", "/")).parts if part not in ("/", ".", "..")]
    while len(parts) > 1 and parts[-1].lower() in GENERIC_FOLDERS:
        parts.pop()
    return parts[-1] if parts else str(source)


def pair_name(target: str | Path, draft: str | Path | None = None, assets: Path | None = None) -> str:
    """A readable name for a target (+ draft) given by path or hub id: a shipped pair's own name,
    else the target's name, or the draft's when it names the target too (z-lab's
    'Qwen3-8B-DFlash-b16' for 'Qwen/Qwen3-8B'), else both joined by '+'."""
    shipped = shipped_pair_at(target, assets)
    if shipped is not None and (draft is None or Path(draft).expanduser().resolve() == pair_dirs(shipped, assets)[1].resolve()):
        return shipped.name
    name = readable_name(str(target))
    if not draft:
        return name
    other = readable_name(str(draft))
    if other.lower() == name.lower():
        return name
    if other.lower().startswith(name.lower()):
        return other
    return f"{name}+{other}"


def name_slug(name: str) -> str:
    """A name as an API client may type it: 'tiny-coder (embedded)' -> 'tiny-coder-embedded'."""
    return re.sub(r"[^A-Za-z0-9._+-]+", "-", name).strip("-").lower()
