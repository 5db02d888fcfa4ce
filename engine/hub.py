"""Checkpoints from the Hugging Face hub: ``owner/name[/subfolder][@revision]`` references, the
files a checkpoint needs and no others, a download that reports its progress, and a cheap
answer to "can the hub be reached from here" that never hangs.

    ref = parse_hub_ref("Qwen/Qwen3-8B@9c925d6")          # pinned to a commit
    folder = fetch(ref, "target", progress)              # downloads what is missing, or raises
"""

from __future__ import annotations

import os
import re
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from urllib.parse import urlparse

from .errors import CheckpointError

Progress = Callable[[float, str], None]

DEFAULT_ENDPOINT = "https://huggingface.co"
REPO_PART = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9_-])?$")
TRUE_WORDS = {"1", "on", "yes", "true"}

# What a checkpoint folder needs, and only that: a hub repository often holds more (gpt-oss
# ships its weights three times: top level, original/ and metal/; many repos add a README's
# images, ONNX or GGUF exports, or remote code this project never runs).
WEIGHT_FILES = ("*.safetensors", "*.safetensors.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja", "chat_template.json")
TARGET_FILES = ("config.json", "generation_config.json", *WEIGHT_FILES, *TOKENIZER_FILES)
# MiMo's drafts ship the mask token's embedding beside their weights (mask_embedding.pt)
DRAFT_FILES = ("config.json", *WEIGHT_FILES, "mask_embedding.pt")
KINDS = ("target", "draft")


@dataclass(frozen=True)
class HubRef:
    """A checkpoint on the hub: a repository, a folder inside it ("" = its top level) and a
    revision (a branch, tag or commit; None = the default branch)."""

    repo_id: str
    subfolder: str = ""
    revision: str | None = None

    def __str__(self) -> str:
        text = f"{self.repo_id}/{self.subfolder}" if self.subfolder else self.repo_id
        return f"{text}@{self.revision}" if self.revision else text


def parse_hub_ref(source: str) -> HubRef:
    """``owner/name``, ``owner/name/subfolder`` (MiMo's ``dflash/``), each optionally ``@revision``
    (``REPO@REVISION`` pins a branch, tag or commit; a revision may hold '/', as ``refs/pr/3``)."""
    text = source.strip()
    path, at, revision = text.partition("@")
    if at and not revision.strip():
        raise CheckpointError(f"{source!r}: nothing after '@' (give a branch, tag or commit: REPO@REVISION)")
    parts = [part for part in path.strip("/").split("/")]
    if len(parts) < 2 or any(not part for part in parts):
        raise CheckpointError(f"{source!r} is not a hub id (owner/name[/folder][@revision]) nor a directory")
    owner, name, folder = parts[0], parts[1], parts[2:]
    for part in (owner, name):
        if not REPO_PART.match(part) or ".." in part:
            raise CheckpointError(f"{source!r}: {part!r} is not a valid hub owner or repository name")
    if any(part in (".", "..") for part in folder):
        raise CheckpointError(f"{source!r}: a folder inside a repository cannot be '.' or '..'")
    return HubRef(f"{owner}/{name}", "/".join(folder), revision.strip() or None)


def download_patterns(kind: str, subfolder: str = "") -> tuple[list[str], list[str]]:
    """``(allow_patterns, ignore_patterns)`` for ``snapshot_download``: the files a target (config,
    weights and their index, tokenizer, generation config, chat template) or a draft (config,
    weights, MiMo's mask embedding) needs, in ``subfolder`` only, not in the folders below it."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS} (got {kind!r})")
    files = TARGET_FILES if kind == "target" else DRAFT_FILES
    prefix = f"{subfolder.strip('/')}/" if subfolder.strip("/") else ""
    # fnmatch's '*' crosses '/', so "*.safetensors" alone would also take original/*.safetensors
    return [prefix + name for name in files], [prefix + "*/*"]


# ------------------------------------------------------------------------------- the network


def offline_by_setting() -> bool:
    """HF_HUB_OFFLINE set to a true value: the user asked for no hub traffic at all."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in TRUE_WORDS


def endpoint_address(endpoint: str | None = None) -> tuple[str, int]:
    url = urlparse(endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT)
    return url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)


def can_connect(address: tuple[str, int], timeout_s: float) -> bool:
    """One TCP connection, in a thread that is waited for at most ``timeout_s``: a name lookup
    has no timeout of its own and can hang for a minute where DNS is unreachable."""
    answer: list[bool] = []

    def attempt() -> None:
        try:
            socket.create_connection(address, timeout=timeout_s).close()
            answer.append(True)
        except OSError:
            answer.append(False)

    worker = threading.Thread(target=attempt, name="hub-probe", daemon=True)
    worker.start()
    worker.join(timeout_s)
    return bool(answer and answer[0])


@dataclass
class HubProbe:
    """Whether the hub can be reached, asked at most once per ``ttl_s`` (the model menu asks for
    every entry; a menu must not wait on the network each time)."""

    timeout_s: float = 2.0
    ttl_s: float = 300.0
    endpoint: str | None = None
    connect: Callable[[tuple[str, int], float], bool] = can_connect
    _answer: tuple[float, bool] | None = None

    def reachable(self) -> bool:
        if offline_by_setting():
            return False
        now = time.monotonic()
        if self._answer is None or now - self._answer[0] > self.ttl_s:
            self._answer = (now, self.connect(endpoint_address(self.endpoint), self.timeout_s))
        return self._answer[1]


# ------------------------------------------------------------------------------- downloads


def format_bytes(count: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{int(count)} B"


def progress_bar_class(report: Progress, label: str):
    """A tqdm class for ``snapshot_download(tqdm_class=...)``: its byte count goes to ``report``
    (the app's loading status) and, on a terminal, to one tqdm bar on stderr (the CLI's). The
    hub also opens a bar counting files and one counting bytes received (the same bytes before
    decompression): both stay silent."""
    from tqdm import tqdm

    class DownloadBar(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs.pop("name", None)
            description = str(kwargs.get("desc") or "")
            self.reports = kwargs.get("unit") == "B" and not description.startswith("Downloading bytes")
            self.received = float(kwargs.get("initial") or 0)
            kwargs["disable"] = None if self.reports else True  # None: shown on a terminal only
            kwargs.update(desc=f"downloading {label}", file=sys.stderr, leave=False)
            super().__init__(*args, **kwargs)

        def update(self, n=1):
            self.received += n or 0
            if self.reports and self.total:
                report(min(self.received / self.total, 1.0),
                       f"downloading {label}: {format_bytes(self.received)} of {format_bytes(self.total)}")
            return super().update(n)

    return DownloadBar


def cached(ref: HubRef, kind: str) -> Path | None:
    """The local folder of ``ref`` when every file it needs is in the hub cache; no network."""
    from huggingface_hub import snapshot_download

    allow, ignore = download_patterns(kind, ref.subfolder)
    try:
        folder = Path(snapshot_download(ref.repo_id, revision=ref.revision, allow_patterns=allow,
                                        ignore_patterns=ignore, local_files_only=True))
    except Exception:  # not in the cache, or only part of it: the hub library raises several kinds
        return None
    folder = folder / ref.subfolder if ref.subfolder else folder
    return folder if (folder / "config.json").is_file() else None


def fetch(ref: HubRef, kind: str, progress: Progress | None = None, probe: HubProbe | None = None,
          size_note: str = "") -> Path:
    """The local folder of ``ref``: from the hub cache, or downloaded (only the files a ``kind``
    needs). Without network an uncached checkpoint is refused at once, with what it would take
    (``size_note``, e.g. "about 16.4 GB"), instead of waiting on timeouts."""
    what = f"{kind} {ref}"
    folder = cached(ref, kind)
    if folder is not None:
        return folder
    probe = probe or HubProbe()
    if not probe.reachable():
        needs = f"needs a download ({size_note})" if size_note else "needs a download"
        raise CheckpointError(f"{what} is not downloaded yet and {needs}; no network here "
                              f"(download it on a networked machine into the hub cache, or pass its directory)")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    report = progress or (lambda fraction, message: None)
    allow, ignore = download_patterns(kind, ref.subfolder)
    try:
        local = Path(snapshot_download(ref.repo_id, revision=ref.revision, allow_patterns=allow,
                                       ignore_patterns=ignore, tqdm_class=progress_bar_class(report, str(ref))))
    except GatedRepoError:
        raise CheckpointError(f"{what}: the repository is gated; accept its licence on the hub and log in "
                              "(hf auth login) or set HF_TOKEN") from None
    except RevisionNotFoundError:
        raise CheckpointError(f"{what}: no revision {ref.revision!r} in {ref.repo_id}") from None
    except RepositoryNotFoundError:
        raise CheckpointError(f"{what}: no such repository on the hub (or it is private)") from None
    except Exception as exc:  # network errors, disk full, an interrupted transfer
        raise CheckpointError(f"{what} could not be downloaded ({type(exc).__name__}: {exc})") from exc
    folder = local / ref.subfolder if ref.subfolder else local
    if not (folder / "config.json").is_file():
        where = f"folder {ref.subfolder!r} of " if ref.subfolder else ""
        raise CheckpointError(f"{what}: no config.json in the {where}repository {ref.repo_id}")
    return folder
