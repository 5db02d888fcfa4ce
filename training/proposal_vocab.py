"""`train proposals`: the token ids a draft proposes from, by how often its target writes them.

A draft may propose from part of the vocabulary only: the head then multiplies by a quarter of
the target's embedding table, which on a CPU is the difference between a table that stays in
cache and one that does not. The first ids of a byte-level BPE are the ones its training corpus
used most, which fits a target trained on that corpus; a target fine-tuned on other text (the
request pair writes English identifiers and docstrings) writes many later ids, and every one of
them ends a block. This step counts the ids in the target's own greedy replies to training
prompts and keeps the most written ones.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import torch

from engine.errors import CheckpointError, InvalidRequestError


def reply_token_counts(pools) -> Counter:
    """How often each id appears in the generated part of every sequence of these pools."""
    counts: Counter = Counter()
    for pool in pools:
        for seq, prompt_len in zip(pool.seqs, pool.prompt_lens):
            counts.update(seq[prompt_len:].tolist())
    return counts


def most_written(counts: Counter, size: int, vocab_size: int) -> list[int]:
    """The ``size`` ids written most (ties: the lower id, i.e. the earlier BPE merge), topped up
    with the lowest unseen ids when fewer distinct ids were written; sorted."""
    if not 1 <= size <= vocab_size:
        raise InvalidRequestError(f"--size must be between 1 and the vocabulary size {vocab_size} (got {size})")
    ranked = sorted((i for i in counts if 0 <= i < vocab_size), key=lambda i: (-counts[i], i))[:size]
    chosen = set(ranked)
    for i in range(vocab_size):
        if len(chosen) >= size:
            break
        chosen.add(i)
    return sorted(chosen)


def coverage(counts: Counter, ids: list[int]) -> float:
    """Share of the counted tokens that lie in ``ids``."""
    total = sum(counts.values())
    return sum(counts[i] for i in ids) / total if total else 0.0


def write_proposal_ids(draft_dir: Path, ids: list[int]) -> None:
    """Store ``ids`` as the draft's ``dflash_config.proposal_ids`` (replacing a
    ``proposal_vocab_size``); the weights are untouched."""
    path = Path(draft_dir) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"no config.json in draft directory {draft_dir}")
    config = json.loads(path.read_text())
    extra = config.setdefault("dflash_config", {})
    extra.pop("proposal_vocab_size", None)
    config.pop("proposal_vocab_size", None)
    extra["proposal_ids"] = list(ids)
    path.write_text(json.dumps(config, indent=2) + "\n")


def build_proposal_ids(target_dir: str, draft_dir: Path, size: int, pools: list[Path] | None = None,
                       work: Path | None = None, prompts_file: Path | None = None, corpus: Path | None = None,
                       num_sequences: int = 1200, chat_fraction: float = 0.5, new_tokens: int = 96,
                       seed: int = 0, threads: int | None = None, progress: bool = True, log=print) -> dict:
    """Count the target's reply tokens (in existing sequence pools, e.g. a draft run's
    ``train_sequences.pt``, or in replies generated here to ``num_sequences`` training prompts,
    resumable in ``work``), then write the ``size`` most written ids into the draft's config."""
    from engine.draft import load_draft

    from .common import JsonlLog, set_threads
    from .draft import (DraftTrainConfig, SequencePool, build_prompts, extra_prompt_rows, fill_pool,
                        load_target_and_tokenizer, stop_ids)

    draft = load_draft(draft_dir)  # fails early on a directory that is not a draft
    vocab_size = draft.config.vocab_size
    if pools:
        loaded = []
        for path in pools:
            pool = SequencePool.load(Path(path))
            if not len(pool):
                raise InvalidRequestError(f"no sequences in {path}")
            loaded.append(pool)
    else:
        if work is None:
            raise InvalidRequestError("give --pool (sequence pools to count) or --work (where to generate replies)")
        set_threads(threads)
        device = torch.device("cpu")
        target, tokenizer = load_target_and_tokenizer(target_dir, device, torch.float32)
        cfg = DraftTrainConfig(num_sequences=num_sequences, chat_fraction=chat_fraction, new_tokens=new_tokens,
                               gen_batch=64)
        prompts = build_prompts(tokenizer, corpus, num_sequences, cfg, seed, heldout=False,
                                extra=extra_prompt_rows(prompts_file, seed, log))
        work = Path(work)
        work.mkdir(parents=True, exist_ok=True)
        pool = SequencePool.load(work / "proposal_sequences.pt")
        # build_prompts shuffles the extra rows in with its own: the first ones sample the whole mix
        fill_pool(pool, work / "proposal_sequences.pt", target, tokenizer, prompts[:num_sequences], cfg,
                  stop_ids(target, tokenizer), device, None, log, JsonlLog(work / "log.jsonl"),
                  "target replies", progress)
        loaded = [pool]
    counts = reply_token_counts(loaded)
    ids = most_written(counts, size, vocab_size)
    write_proposal_ids(draft_dir, ids)
    prefix = list(range(size))
    result = {"sequences": sum(len(p) for p in loaded), "tokens": sum(counts.values()), "size": size,
              "coverage": round(coverage(counts, ids), 4), "prefix_coverage": round(coverage(counts, prefix), 4)}
    log(f"{result['tokens']:,} reply tokens in {result['sequences']} sequences: the {size} most written ids "
        f"cover {100 * result['coverage']:.1f} % of them (the first {size} ids: {100 * result['prefix_coverage']:.1f} %)"
        f" -> {Path(draft_dir) / 'config.json'}")
    return result
