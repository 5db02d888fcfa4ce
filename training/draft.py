"""`train draft`: a DFlash draft for any transformers causal-LM target, by self-distillation.

1. The target regenerates continuations greedily (batched, KV cache) from corpus prefixes and
   chat prompts, so the draft learns exactly what greedy decoding will ask it to predict.
2. Each step runs the frozen target once over [prompt + continuation] to get the features of
   ``target_layer_ids`` and its greedy next-token labels, samples random anchors in the
   continuation, and trains the draft on all blocks at once with the block-diagonal mask:
   a block sees context strictly BEFORE its anchor (``kv_pos < anchor``) plus its own block
   (bidirectional), never another block. Slot k predicts the token AT anchor + k (same-position
   labels), weighted by exp(-(k-1)/gamma); slot 0 (the anchor) has weight 0.
"""

from __future__ import annotations

import json
import math
import random
import re
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.errors import IncompatibleDraftError, InvalidRequestError
from engine.loading import pick_device

from .common import (Budget, JsonlLog, Progress, ThreadGovernor, TrainClock, cosine_lr, load_checkpoint,
                     optimizer_update, save_checkpoint, set_lr, set_seed, set_threads, write_json)


@dataclass
class DraftTrainConfig:
    layers: int = 2
    block_size: int = 8
    gamma: float | None = None  # None: 4 for B <= 8, 7 above
    target_layer_ids: list[int] | None = None
    num_target_features: int = 4
    intermediate_size: int | None = None
    mask_token_id: int | None = None
    init_from: str | None = None  # an existing draft to fine-tune (its width wins; it may have fewer layers)
    lr: float = 6e-4
    min_lr_ratio: float = 0.05
    warmup: float = 0.04
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    batch_size: int = 8  # sequences per step
    anchors: int = 64  # random blocks per sequence
    num_sequences: int = 2048
    prompt_tokens: int = 128
    min_prompt_tokens: int = 16
    new_tokens: int = 160
    gen_batch: int = 32
    chat_fraction: float = 0.5
    gen_fraction: float = 0.35
    checkpoint_minutes: float = 5.0
    eval_sequences: int = 32
    eval_anchors: int = 96
    cache_features_gb: float = 4.0  # cache target features in RAM below this size (0: online)
    trim_loops: bool = False  # cut each regenerated continuation after the 2nd copy of a repeated span
    dtype: str | None = None
    device: str | None = None

    def decay_gamma(self) -> float:
        return self.gamma if self.gamma else (4.0 if self.block_size <= 8 else 7.0)


# ---------------------------------------------------------------- pure pieces (tested)


def trim_repetition(tokens: list[int], min_span: int = 8) -> int:
    """How much of a continuation to keep: up to the end of the second back-to-back copy of the
    first repeated span of ``min_span``+ tokens (all of it when nothing repeats). An undertrained
    target's greedy continuations often end in such loops (half of the tiny coder's regenerated
    tokens); a draft trained on them spends its capacity copying, which is easy and says little."""
    from engine.repetition import repetitions

    return min((end for end, _ in repetitions(tokens, min_span)), default=len(tokens))


def loss_weights(block_size: int, gamma: float) -> torch.Tensor:
    """[B] weights: 0 for the anchor slot, exp(-(k-1)/gamma) for k = 1..B-1."""
    k = torch.arange(block_size, dtype=torch.float32)
    w = torch.exp(-(k - 1) / gamma)
    w[0] = 0.0
    return w


def sample_anchors(prompt_len: int, length: int, n: int, gen: torch.Generator) -> torch.Tensor:
    """Up to n distinct sorted anchors in [prompt_len, length - 2] (the anchor is a token the
    target produced; at least one label follows it)."""
    lo, hi = max(prompt_len, 0), length - 2
    if hi < lo:
        return torch.zeros(0, dtype=torch.long)
    count = hi - lo + 1
    if count <= n:
        return torch.arange(lo, hi + 1)
    return (torch.randperm(count, generator=gen)[:n] + lo).sort().values


def block_inputs(seq: torch.Tensor, anchors: torch.Tensor, block_size: int, mask_id: int):
    """Block token ids [N*B]: [tok[a], MASK x (B-1)] per anchor; positions [N*B]: a + j."""
    n = len(anchors)
    ids = torch.full((n, block_size), mask_id, dtype=torch.long)
    ids[:, 0] = seq[anchors]
    pos = anchors[:, None] + torch.arange(block_size)[None, :]
    return ids.reshape(-1), pos.reshape(-1)


def training_mask(anchors: torch.Tensor, valid: torch.Tensor, ctx_len: int, block_size: int) -> torch.Tensor:
    """Bool [N*B, ctx_len + N*B] (True = visible). Query slot of block n sees context keys with
    position < anchors[n] (strictly: the anchor's own features do not exist at inference) and
    the B keys of its own block; never another block. Invalid blocks see only themselves (no
    fully masked rows, which would make attention NaN) and carry zero loss weight."""
    n = len(anchors)
    kv_pos = torch.arange(ctx_len)
    ctx_vis = kv_pos[None, :] < anchors[:, None]  # [N, C]
    ctx_vis &= valid[:, None]
    blk = torch.eye(n, dtype=torch.bool)  # [N, N]: own block only
    blk_vis = blk.repeat_interleave(block_size, dim=1)  # [N, N*B]
    vis = torch.cat([ctx_vis, blk_vis], dim=1)  # [N, C + N*B]
    return vis.repeat_interleave(block_size, dim=0)  # [N*B, C + N*B]


def block_labels(next_tokens: torch.Tensor, anchors: torch.Tensor, valid: torch.Tensor,
                 length: int, block_size: int, weights: torch.Tensor):
    """Same-position labels: slot k of the block at anchor a predicts the token AT a + k, i.e.
    next_tokens[a + k] (the target's greedy choice there). Returns labels [N, B], weights [N, B]."""
    pos = anchors[:, None] + torch.arange(block_size)[None, :]
    in_range = pos < length
    labels = next_tokens[pos.clamp(max=len(next_tokens) - 1)]
    w = weights[None, :] * in_range * valid[:, None]
    return torch.where(in_range, labels, torch.zeros_like(labels)), w


def acceptance_stats(correct: torch.Tensor, weight: torch.Tensor) -> tuple[list[float], float, int]:
    """Per-position accuracy (k = 1..B-1) and the mean acceptance length tau over full blocks:
    tau = 1 + number of leading correct slots (what greedy verification would accept)."""
    bsz = correct.shape[-1]
    valid = weight > 0
    acc = []
    for k in range(1, bsz):
        m = valid[..., k]
        acc.append(float((correct[..., k] & m).sum()) / max(1, int(m.sum())))
    full = valid[..., 1:].all(-1)
    lead = torch.cumprod(correct[..., 1:].long(), dim=-1).sum(-1)
    n_full = int(full.sum())
    tau = float((lead[full] + 1).float().mean()) if n_full else float("nan")
    return acc, tau, n_full


def decode_chain(correct: torch.Tensor, weight: torch.Tensor) -> list[int]:
    """The acceptance lengths greedy DFlash decoding has on one sequence, from the blocks
    anchored at EVERY generated position (row i: the block at the i-th generated token):
    the first cycle is anchored at the first generated token, each next one at the bonus token
    after the last accepted draft. Unlike ``acceptance_stats``' evenly spaced anchors this
    counts only the anchors decoding meets, which follow the draft's misses: it reads what
    ``bench`` measures on the same prompts, below the evenly spaced estimate."""
    valid_rows = int((weight[:, 1:] > 0).any(-1).sum())
    taus, i = [], 0
    while i < valid_rows:
        ok = correct[i, 1:] & (weight[i, 1:] > 0)
        lead = int(torch.cumprod(ok.long(), dim=0).sum())
        tau = min(lead + 1, valid_rows - i)  # the last cycle is cut at the sequence's end
        taus.append(tau)
        i += tau
    return taus


# ---------------------------------------------------------------- target side


def load_target_and_tokenizer(target: str, device, dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=dtype).to(device).eval()
    model.requires_grad_(False)
    return model, tok


def find_mask_token_id(tokenizer, target) -> int:
    """The draft's mask row: the tokenizer's mask token, a <|mask|>/<|MASK|> token, or the first
    padding row past the tokenizer's vocabulary (Qwen3: 151669)."""
    if getattr(tokenizer, "mask_token_id", None) is not None:
        return int(tokenizer.mask_token_id)
    vocab = tokenizer.get_vocab()
    for name in ("<|mask|>", "<|MASK|>", "<mask>", "<|reserved_special_token_0|>"):
        if name in vocab:
            return int(vocab[name])
    rows = target.get_input_embeddings().weight.shape[0]
    if rows > len(tokenizer):
        return len(tokenizer)
    raise ValueError("no mask row: the tokenizer has no mask token and the embedding has no "
                     "spare row; pass a mask_token_id")


def stop_ids(target, tokenizer) -> list[int]:
    eos = target.generation_config.eos_token_id if target.generation_config else None
    ids = eos if isinstance(eos, list) else ([eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return [int(i) for i in ids]


def build_prompts(tokenizer, corpus, n: int, cfg: DraftTrainConfig, seed: int, heldout: bool,
                  extra: list[dict] | None = None) -> list[tuple[list[int], str]]:
    """Token-id prompts: code prefixes (random files; mostly whole lines, often from a def/class
    line, see LINE_ALIGNED_PREFIXES) and chat requests rendered with the tokenizer's chat
    template (when it has one)."""
    from .corpus import chat_examples, read_source, split_files

    train_files, held_files = split_files(corpus)
    files = held_files if heldout else train_files
    rng = random.Random(seed + (7 if heldout else 0))
    has_chat = bool(getattr(tokenizer, "chat_template", None))
    out: list[tuple[list[int], str]] = []
    for rec in extra or []:
        if "messages" in rec and has_chat:
            text = tokenizer.apply_chat_template(rec["messages"], tokenize=False, add_generation_prompt=True)
        else:
            # a conversation, for a target with no chat template: the text of its last turn
            text = rec["prompt"] if "prompt" in rec else rec["messages"][-1]["content"]
            if rec.get("kind") == "chat" and has_chat:
                text = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                     tokenize=False, add_generation_prompt=True)
        out.append((tokenizer(text, add_special_tokens=False)["input_ids"][-cfg.prompt_tokens:], "extra"))
    n_chat = int(round(n * cfg.chat_fraction)) if has_chat else 0
    chats: list[list[int]] = []
    sources = {}
    order = list(files)
    rng.shuffle(order)
    for p in order:
        if len(chats) >= n_chat:
            break
        sources[p] = src = read_source(p)
        for conv in chat_examples(src, rng):
            text = tokenizer.apply_chat_template(conv[:1], tokenize=False, add_generation_prompt=True)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            if len(ids) <= cfg.prompt_tokens:
                chats.append(ids)
    rng.shuffle(chats)
    out += [(c, "chat") for c in chats[:n_chat]]
    file_ids, file_lines = {}, {}
    tries = 0
    while len(out) < n + len(extra or []) and files and tries < 50 * n:
        tries += 1
        p = rng.choice(files)
        if p not in file_ids:
            src = sources.get(p) or read_source(p)
            file_ids[p] = tokenizer(src, add_special_tokens=False)["input_ids"]
            lines = src.splitlines(keepends=True)
            # each line's token count and the def/class lines, found once per file (a 200,000-prompt
            # pool asks for millions of them otherwise); a line alone tokenizes the same either way
            counts = [len(ids) for ids in tokenizer(lines, add_special_tokens=False)["input_ids"]] if lines else []
            file_lines[p] = (lines, counts, definition_lines(lines))
        ids = file_ids[p]
        if len(ids) < cfg.min_prompt_tokens + 8:
            continue
        plen = rng.randint(cfg.min_prompt_tokens, min(cfg.prompt_tokens, len(ids) - 8))
        if rng.random() < LINE_ALIGNED_PREFIXES:
            lines, counts, definitions = file_lines[p]
            prefix = line_aligned_prefix(lines, tokenizer, plen, cfg.min_prompt_tokens, rng, line_counts=counts,
                                         definitions=definitions)
            if prefix:
                out.append((prefix, "complete"))
            continue
        start = rng.randint(0, len(ids) - plen - 1)
        out.append((ids[start : start + plen], "complete"))
    rng.shuffle(out)
    return out


# Share of code prefixes cut at line boundaries, as people write them (half of those start at a
# def/class line); the rest start and end at any token, like text typed mid-line.
LINE_ALIGNED_PREFIXES = 0.8
_DEFINITION = re.compile(r"\s*(async\s+def|def|class)\s")


def definition_lines(lines: list[str]) -> list[int]:
    """Indices of the lines that open a def or class."""
    return [i for i, line in enumerate(lines) if _DEFINITION.match(line)]


def line_aligned_prefix(lines: list[str], tokenizer, max_tokens: int, min_tokens: int,
                        rng: random.Random, line_counts: list[int] | None = None,
                        definitions: list[int] | None = None) -> list[int] | None:
    """Whole lines from a def/class line (or any line), as many as fit in ``max_tokens``;
    None when fewer than ``min_tokens`` fit or there is nothing after them to continue.
    ``line_counts`` and ``definitions``: each line's token count and ``definition_lines``,
    when the caller keeps them per file (they are the same for every prefix of one file)."""
    definitions = definitions if definitions is not None else definition_lines(lines)
    starts = definitions if definitions and rng.random() < 0.5 else range(len(lines))
    first = rng.choice(starts)
    text, count = "", 0
    for i in range(first, len(lines) - 1):  # leave at least one line to continue into
        line = lines[i]
        n = line_counts[i] if line_counts is not None else len(tokenizer(line, add_special_tokens=False)["input_ids"])
        if count + n > max_tokens:
            break
        text, count = text + line, count + n
    if count < min_tokens:
        return None
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids if min_tokens <= len(ids) <= max_tokens else None


@torch.no_grad()
def regenerate(target, tokenizer, prompts: list[list[int]], max_new: int, stops: list[int],
               device) -> list[list[int]]:
    """Batched greedy continuations (left padding); returns prompt + continuation (cut after the
    first stop token), without padding."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0]
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    att = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        att[i, width - len(p):] = 1
    out = target.generate(input_ids=ids.to(device), attention_mask=att.to(device),
                          max_new_tokens=max_new, do_sample=False, eos_token_id=stops,
                          pad_token_id=pad)
    result = []
    stop_set = set(stops)
    for i, p in enumerate(prompts):
        new = out[i, width:].tolist()
        for j, t in enumerate(new):
            if t in stop_set:
                new = new[: j + 1]
                break
        result.append(list(p) + new)
    return result


class SequencePool:
    """Regenerated sequences with their prompt lengths, saved as flat int tensors (resumable)."""

    def __init__(self):
        self.seqs: list[torch.Tensor] = []
        self.prompt_lens: list[int] = []
        self.kinds: list[str] = []

    def add(self, seq: list[int], prompt_len: int, kind: str) -> None:
        self.seqs.append(torch.tensor(seq, dtype=torch.int32))
        self.prompt_lens.append(prompt_len)
        self.kinds.append(kind)

    def __len__(self) -> int:
        return len(self.seqs)

    def new_tokens(self) -> int:
        return sum(len(s) - p for s, p in zip(self.seqs, self.prompt_lens))

    def save(self, path: Path) -> None:
        lens = torch.tensor([len(s) for s in self.seqs], dtype=torch.long)
        flat = torch.cat(self.seqs) if self.seqs else torch.zeros(0, dtype=torch.int32)
        kinds = torch.tensor([("complete", "chat", "extra").index(k) for k in self.kinds], dtype=torch.long)
        save_checkpoint(path, {"flat": flat, "lens": lens, "prompt_lens": torch.tensor(self.prompt_lens, dtype=torch.long), "kinds": kinds})

    @classmethod
    def load(cls, path: Path) -> "SequencePool":
        pool = cls()
        state = load_checkpoint(path)
        if state is None:
            return pool
        offs = [0] + torch.cumsum(state["lens"], 0).tolist()
        for i in range(len(state["lens"])):
            pool.seqs.append(state["flat"][offs[i] : offs[i + 1]].clone())
            pool.prompt_lens.append(int(state["prompt_lens"][i]))
            pool.kinds.append(("complete", "chat", "extra")[int(state["kinds"][i])])
        return pool


# A pool is saved at most this often while it grows (and when it is done): saving a pool of
# 200,000 sequences after every chunk would cost more than generating them on a GPU.
POOL_SAVE_SECONDS = 60.0


def fill_pool(pool: SequencePool, path: Path, target, tokenizer, prompts, cfg, stops, device,
              deadline: float | None, log, jlog, bar_desc: str, progress: bool = True) -> None:
    """Generate until every prompt has a sequence (resuming after the ones already in the pool)
    or the deadline passes. Prompts are generated in length-sorted chunks to limit padding."""
    todo = prompts[len(pool):]
    if not todo:
        return
    t0, tokens_before = time.time(), pool.new_tokens()
    saved = float("-inf")  # the first chunk is saved at once: a resume then has something
    bar = Progress(bar_desc, enabled=progress, initial=len(pool) / max(1, len(prompts)))
    governor = ThreadGovernor(torch.get_num_threads(), period=2, probe_every=4) if device.type == "cpu" else None
    for i in range(0, len(todo), cfg.gen_batch):
        if deadline is not None and time.time() > deadline:
            log(f"{bar_desc}: time share spent after {len(pool)} sequences")
            break
        chunk = todo[i : i + cfg.gen_batch]
        t_chunk = time.time()
        seqs = regenerate(target, tokenizer, [p for p, _ in chunk], cfg.new_tokens, stops, device)
        if governor is not None:
            governor.step(sum(len(s) - len(p) for s, (p, _) in zip(seqs, chunk)) / (time.time() - t_chunk))
        for (p, kind), s in zip(chunk, seqs):
            if cfg.trim_loops:
                s = s[: len(p) + trim_repetition(s[len(p):])]
            pool.add(s, len(p), kind)
        if time.time() - saved >= POOL_SAVE_SECONDS:
            pool.save(path)
            saved = time.time()
        dt = time.time() - t0
        bar.update(len(pool) / len(prompts), seqs=len(pool), new_tok_s=f"{(pool.new_tokens() - tokens_before) / max(dt, 1e-6):.0f}")
    pool.save(path)
    bar.close()
    jlog.write("generate", what=bar_desc, sequences=len(pool), new_tokens=pool.new_tokens(),
               seconds=round(time.time() - t0, 1))


# ---------------------------------------------------------------- the training step


@torch.no_grad()
def target_pass(target, layer_ids: list[int], seqs: list[torch.Tensor], device):
    """One frozen-target forward over right-padded sequences: per sequence, the features of
    ``layer_ids`` [L, k*H] and next_tokens [L] where next_tokens[p] is the target's greedy token
    AT position p (predicted from p - 1; next_tokens[0] is the first token itself)."""
    from engine.features import capture_hidden

    lengths = [len(s) for s in seqs]
    width = max(lengths)
    ids = torch.zeros((len(seqs), width), dtype=torch.long)
    att = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s.long()
        att[i, : len(s)] = 1
    with capture_hidden(target, layer_ids) as cap:
        out = target(input_ids=ids.to(device), attention_mask=att.to(device), use_cache=False)
        feats = cap.take()
    greedy = out.logits.argmax(-1).cpu()
    next_tokens = torch.cat([ids[:, :1], greedy[:, :-1]], dim=1)
    return ([feats[i, :n] for i, n in enumerate(lengths)], [next_tokens[i, :n] for i, n in enumerate(lengths)])


class FeatureCache:
    """Target features and greedy labels of every pooled sequence, computed once (the target is
    frozen), so that each training step runs only the draft."""

    def __init__(self, target, layer_ids, pool: "SequencePool", device, dtype=torch.float32,
                 batch: int = 16, log=print):
        self.feats: list[torch.Tensor] = []
        self.next_tokens: list[torch.Tensor] = []
        order = sorted(range(len(pool)), key=lambda i: len(pool.seqs[i]))
        slots: dict[int, tuple] = {}
        t0 = time.time()
        for i in range(0, len(order), batch):
            idx = order[i : i + batch]
            f, n = target_pass(target, layer_ids, [pool.seqs[j] for j in idx], device)
            for j, fj, nj in zip(idx, f, n):
                slots[j] = (fj.to("cpu", dtype), nj.to(torch.int32))
        for j in range(len(pool)):
            self.feats.append(slots[j][0])
            self.next_tokens.append(slots[j][1])
        log(f"cached target features of {len(pool)} sequences in {time.time() - t0:.0f} s")

    @staticmethod
    def estimate_bytes(pool: "SequencePool", layer_ids, hidden: int, itemsize: int = 4) -> int:
        return sum(len(s) for s in pool.seqs) * len(layer_ids) * hidden * itemsize


def draft_batch_loss(draft, target, batch: list[tuple[torch.Tensor, int]], cfg: DraftTrainConfig,
                     weights: torch.Tensor, gen: torch.Generator | None, device,
                     eval_anchors: int | None = None, cached: list[tuple] | None = None):
    """One draft forward over a batch of sequences (all their blocks at once): returns
    (loss, correct [b,N,B], weight [b,N,B]). ``cached``: per sequence (features, next_tokens)
    from a FeatureCache; otherwise the frozen target runs here."""
    bsz, n_anchor = cfg.block_size, (eval_anchors or cfg.anchors)
    mask_id = draft.mask_token_id
    lengths = [len(s) for s, _ in batch]
    width = max(lengths)
    if cached is None:
        cached = list(zip(*target_pass(target, draft.target_layer_ids, [s for s, _ in batch], device)))
    kh = cached[0][0].shape[-1]
    feats = torch.zeros((len(batch), width, kh), dtype=torch.float32, device=device)
    ids = torch.zeros((len(batch), width), dtype=torch.long)
    next_tokens = torch.zeros((len(batch), width), dtype=torch.long)
    for i, ((s, _), (f, n)) in enumerate(zip(batch, cached)):
        feats[i, : len(s)] = f.to(device, torch.float32)
        ids[i, : len(s)] = s.long()
        next_tokens[i, : len(s)] = n.long()

    all_ids, all_pos, masks, labels, wts = [], [], [], [], []
    for i, (s, plen) in enumerate(batch):
        if eval_anchors:  # deterministic, evenly spaced
            lo, hi = plen, lengths[i] - 2
            cnt = max(0, hi - lo + 1)
            a = torch.linspace(lo, hi, min(cnt, n_anchor)).round().long().unique() if cnt else torch.zeros(0, dtype=torch.long)
        else:
            a = sample_anchors(plen, lengths[i], n_anchor, gen)
        valid = torch.ones(n_anchor, dtype=torch.bool)
        valid[len(a):] = False
        a = torch.cat([a, torch.zeros(n_anchor - len(a), dtype=torch.long)])
        blk_ids, blk_pos = block_inputs(ids[i], a, bsz, mask_id)
        all_ids.append(blk_ids)
        all_pos.append(torch.cat([torch.arange(width), blk_pos]))
        masks.append(training_mask(a, valid, width, bsz))
        lab, w = block_labels(next_tokens[i], a, valid, lengths[i], bsz, weights)
        labels.append(lab)
        wts.append(w)
    blk_ids = torch.stack(all_ids).to(device)
    pos = torch.stack(all_pos).to(device)
    mask = torch.stack(masks)[:, None].to(device)
    labels = torch.stack(labels).to(device)  # [b, N, B]
    wts = torch.stack(wts).to(device)

    noise = draft.embed(target.get_input_embeddings(), blk_ids).float()
    hidden = draft(noise, feats, pos, attention_mask=mask)
    # Slot 0 (the anchor) carries no loss: project only slots 1..B-1 through the lm_head.
    hidden = hidden.view(len(batch), n_anchor, bsz, -1)[:, :, 1:]
    head = target.get_output_embeddings()
    logits = draft.compute_logits(hidden.to(head.weight.dtype), head).float()
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, :, 1:].reshape(-1), reduction="none")
    ce = ce.view_as(wts[:, :, 1:])
    loss = (ce * wts[:, :, 1:]).sum() / wts.sum().clamp(min=1e-6)
    correct = torch.zeros_like(labels, dtype=torch.bool)
    correct[:, :, 1:] = proposals(draft, logits.detach()) == labels[:, :, 1:]
    return loss, correct.cpu(), wts.cpu()


def proposals(draft, logits: torch.Tensor) -> torch.Tensor:
    """What decoding would propose from these logits: the argmax over the draft's
    ``proposal_ids`` or the ids below its ``proposal_vocab_size`` when it has either (as
    ``DFlashDraftModel.proposal_logits``)."""
    ids = getattr(draft, "proposal_ids", None)
    if ids is not None:
        ids = ids.to(logits.device)
        return ids[logits.index_select(-1, ids).argmax(-1)]
    k = draft.proposal_vocab_size
    return logits[..., :k].argmax(-1) if k is not None else logits.argmax(-1)


@torch.no_grad()
def evaluate(draft, target, pool: SequencePool, cfg, weights, device, cache=None) -> dict:
    draft.eval()
    corrects, wts, losses, chain = [], [], [], []
    for i in range(0, len(pool), cfg.batch_size):
        js = range(i, min(len(pool), i + cfg.batch_size))
        batch = [(pool.seqs[j], pool.prompt_lens[j]) for j in js]
        cached = [(cache.feats[j], cache.next_tokens[j]) for j in js] if cache else None
        # a block at every generated position (the usual 96 already cover a 96-token reply),
        # so that the decode chain below can follow any sequence to its end
        anchors = max(cfg.eval_anchors, max(len(s) - 1 - p for s, p in batch))
        loss, c, w = draft_batch_loss(draft, target, batch, cfg, weights, None, device,
                                      eval_anchors=anchors, cached=cached)
        chain.extend(tau for k in range(len(batch)) for tau in decode_chain(c[k], w[k]))
        corrects.append(c.reshape(-1, cfg.block_size))
        wts.append(w.reshape(-1, cfg.block_size))
        losses.append(loss.item())
    draft.train()
    if not corrects:
        return {}
    acc, tau, n = acceptance_stats(torch.cat(corrects), torch.cat(wts))
    return {"heldout_loss": round(sum(losses) / len(losses), 4), "tau_est": round(tau, 3),
            "tau_decode": round(sum(chain) / len(chain), 3) if chain else None,
            "position_acc": [round(a, 3) for a in acc], "eval_blocks": n}


def grow_draft(draft: torch.nn.Module, init: torch.nn.Module) -> int:
    """Load ``init`` into a draft with as many or more layers, reading the same or more target
    layers, so that both compute the same thing. Extra layers are copies of ``init``'s last layer
    whose output projections (attention's ``o_proj``, the MLP's ``down_proj``) are zero: each
    starts as the identity on the residual stream. Extra target layers get zero columns in ``fc``:
    their features start unread. Training decides what either adds. Returns the layers added."""
    state = init.state_dict()
    added = len(draft.layers) - len(init.layers)
    if added < 0:
        raise ValueError(f"cannot shrink a {len(init.layers)}-layer draft to {len(draft.layers)} layers")
    missing = set(init.target_layer_ids) - set(draft.target_layer_ids)
    if missing:
        raise ValueError(f"the grown draft must still read target layers {sorted(missing)}")
    last = len(init.layers) - 1
    for i in range(len(init.layers), len(draft.layers)):
        for name, value in init.layers[last].state_dict().items():
            zero = name.endswith(("o_proj.weight", "o_proj.bias", "down_proj.weight", "down_proj.bias"))
            state[f"layers.{i}.{name}"] = torch.zeros_like(value) if zero else value.clone()
    state["fc.weight"] = _grown_fc(init.fc.weight, init.target_layer_ids, draft.target_layer_ids)
    draft.load_state_dict(state)
    return added


def _grown_fc(weight: torch.Tensor, old_ids: list[int], new_ids: list[int]) -> torch.Tensor:
    """``fc`` maps the concatenated features of ``target_layer_ids``, one ``hidden``-wide column
    block per layer: keep each old layer's block where that layer now sits, zeros for new ones."""
    hidden = weight.shape[1] // len(old_ids)
    grown = weight.new_zeros(weight.shape[0], hidden * len(new_ids))
    for j, layer in enumerate(new_ids):
        if layer in old_ids:
            i = old_ids.index(layer)
            grown[:, j * hidden:(j + 1) * hidden] = weight[:, i * hidden:(i + 1) * hidden]
    return grown


# ---------------------------------------------------------------- the command


def check_init_draft(init, cfg: DraftTrainConfig, target_config) -> None:
    """A draft to fine-tune or grow must fit within the requested shape and fit the target."""
    problems = []
    if len(init.layers) > cfg.layers:
        problems.append(f"it has {len(init.layers)} layers, --layers is {cfg.layers}")
    if init.block_size != cfg.block_size:
        problems.append(f"its block size is {init.block_size}, --block-size is {cfg.block_size}")
    if cfg.target_layer_ids and not set(init.target_layer_ids) <= set(cfg.target_layer_ids):
        problems.append(f"it reads target layers {init.target_layer_ids}, --target-layer-ids is {cfg.target_layer_ids}")
    if init.config.hidden_size != target_config.hidden_size:
        problems.append(f"its hidden size is {init.config.hidden_size}, the target's {target_config.hidden_size}")
    deepest = max(cfg.target_layer_ids or init.target_layer_ids)
    if deepest >= target_config.num_hidden_layers:
        problems.append(f"it reads target layer {deepest}, the target has {target_config.num_hidden_layers}")
    if cfg.intermediate_size and init.config.intermediate_size != cfg.intermediate_size:
        problems.append(f"its intermediate size is {init.config.intermediate_size}")
    if problems:
        raise IncompatibleDraftError(f"cannot start from the draft in {cfg.init_from}: " + "; ".join(problems))


def train_draft(out: Path, target_dir: str, work: Path | None = None, corpus: Path | None = None,
                prompts_file: Path | None = None, cfg: DraftTrainConfig | None = None,
                budget: Budget | None = None, seed: int = 0, threads: int | None = None,
                progress: bool = True, log=print) -> dict:
    """Regenerate the target's own continuations (phase 1, resumable), then train a DFlash draft
    on blocks anchored in them (phase 2); the draft is exported at every checkpoint."""
    from engine.draft import DFlashDraftModel, load_draft, new_draft_config

    cfg = cfg or DraftTrainConfig()
    budget = budget or Budget(max_minutes=35)
    out = Path(out)
    work = Path(work) if work else out / "_train"
    set_threads(threads)
    gen = set_seed(seed)
    device = pick_device(cfg.device)
    dtype = getattr(torch, cfg.dtype) if cfg.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    if cfg.target_layer_ids:  # checked on the config, before the weights load
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(target_dir)
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        check_layer_ids(cfg.target_layer_ids, text.num_hidden_layers)
    jlog = JsonlLog(work / "log.jsonl")
    t_start = time.time()
    target, tokenizer = load_target_and_tokenizer(target_dir, device, dtype)
    tcfg = target.config.get_text_config() if hasattr(target.config, "get_text_config") else target.config
    init = load_draft(cfg.init_from) if cfg.init_from else None
    cfg, layer_ids, mask_id = _draft_layout(cfg, init, tcfg, tokenizer, target)
    gamma = cfg.decay_gamma()

    # ---- phase 1: regenerate data (resumable; the time share is gen_fraction of the budget)
    state = load_checkpoint(work / "checkpoint.pt")
    gen_elapsed = float(state["gen_elapsed"]) if state is not None else None
    train_pool = SequencePool.load(work / "train_sequences.pt")
    eval_pool = SequencePool.load(work / "eval_sequences.pt")
    if gen_elapsed is None:
        jlog.write("start", target=str(target_dir), layer_ids=layer_ids, mask_token_id=mask_id,
                   config=asdict(cfg), gamma=gamma, seed=seed, budget=asdict(budget))
        deadline = (t_start + budget.max_minutes * 60 * cfg.gen_fraction) if budget.max_minutes else None
        _regenerate(work, train_pool, eval_pool, target, tokenizer, corpus, prompts_file, cfg, seed, device,
                    deadline, log, jlog, progress)
        gen_elapsed = time.time() - t_start
        log(f"data: {len(train_pool)} train sequences ({train_pool.new_tokens():,} regenerated "
            f"tokens), {len(eval_pool)} held-out, {gen_elapsed / 60:.1f} min")
    if len(train_pool) == 0:
        raise ValueError("no training sequences were generated")

    # ---- phase 2: train
    dcfg = new_draft_config(target.config, cfg.layers, cfg.block_size, mask_id, layer_ids,
                            intermediate_size=cfg.intermediate_size)
    torch.manual_seed(seed)
    draft = DFlashDraftModel(dcfg).to(device).float().train()
    if init is not None:
        added = grow_draft(draft, init)
        new_features = sorted(set(layer_ids) - set(init.target_layer_ids))
        log(f"initialised from the draft in {cfg.init_from}"
            + (f"; {added} more layers, each starting as the identity" if added else "")
            + (f"; also reads target layers {new_features}, starting unread" if new_features else ""))
    n_params = sum(p.numel() for p in draft.parameters())
    opt = torch.optim.AdamW(draft.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    run = _DraftRun(draft, opt, gen, target, train_pool, eval_pool, cfg, device, work, out, jlog, log,
                    weights=loss_weights(cfg.block_size, gamma), gen_elapsed=gen_elapsed,
                    meta={"kind": "dflash-draft", "target": str(target_dir), "params": n_params, "config": asdict(cfg),
                          "gamma": gamma, "target_layer_ids": layer_ids, "mask_token_id": mask_id, "seed": seed})
    if state is not None and "draft" in state:
        run.resume(state)
    train_budget = Budget(max_steps=budget.max_steps, max_tokens=budget.max_tokens,
                          max_minutes=(max(0.1, budget.max_minutes - gen_elapsed / 60) if budget.max_minutes else None))
    log(f"draft: {cfg.layers} layers, {n_params / 1e6:.2f}M params, block {cfg.block_size}, "
        f"target layers {layer_ids}, mask id {mask_id}, gamma {gamma:g}")
    run.cache_features(layer_ids, tcfg.hidden_size)
    if state is None:  # the phase-1 marker, so that a resume skips generation
        save_checkpoint(work / "checkpoint.pt", {"gen_elapsed": gen_elapsed})
    run.train(train_budget, progress, threads)
    res = run.checkpoint(final=True)
    jlog.write("done", **res)
    log(f"done: draft {run.clock.step} steps -> {out}")
    return res


def check_layer_ids(layer_ids: list[int], n_target: int) -> None:
    if any(not (0 <= i < n_target) for i in layer_ids):
        raise InvalidRequestError(f"train draft: target layers {layer_ids} are out of range: the target has "
                                  f"{n_target} layers, 0 to {n_target - 1}")


def _draft_layout(cfg: DraftTrainConfig, init, tcfg, tokenizer, target) -> tuple[DraftTrainConfig, list[int], int]:
    """The config (an ``init`` draft's layer ids, mask id and width win), the target layers the
    draft reads and its mask token id."""
    from engine.draft import default_target_layer_ids

    n_target = tcfg.num_hidden_layers
    if init is not None:
        check_init_draft(init, cfg, tcfg)
        cfg = replace(cfg, target_layer_ids=cfg.target_layer_ids or init.target_layer_ids,
                      mask_token_id=init.mask_token_id, intermediate_size=init.config.intermediate_size)
    layer_ids = cfg.target_layer_ids or sorted(set(default_target_layer_ids(n_target, max(1, min(cfg.num_target_features, n_target)))))
    check_layer_ids(layer_ids, n_target)
    mask_id = cfg.mask_token_id if cfg.mask_token_id is not None else find_mask_token_id(tokenizer, target)
    return cfg, layer_ids, mask_id


def extra_prompt_rows(prompts_file: Path | str | None, seed: int, log=print) -> list[dict]:
    """The prompt rows ``--prompts`` names: a JSONL file of {prompt|messages} records or one of
    the built-in mixes."""
    if str(prompts_file) == "requests":  # the request -> code target's own kind of prompts
        from .request_data import draft_prompt_rows

        return draft_prompt_rows(seed)
    if str(prompts_file) == "coder":  # the `--data coder` target's prompts (follow-ups too) and wide ones
        from .draft_prompts import wide_prompt_rows
        from .request_data import draft_prompt_rows

        return draft_prompt_rows(seed, 3000, coder=True) + wide_prompt_rows(seed, 3000, log)
    if str(prompts_file) == "requests-wide":  # and prompts it never saw (draft_prompts)
        from .draft_prompts import wide_draft_prompt_rows

        return wide_draft_prompt_rows(seed, log=log)
    if str(prompts_file) == "code-wide":  # fewer requests, code prefixes of more shapes
        from .draft_prompts import CODE_WIDE, wide_draft_prompt_rows

        return wide_draft_prompt_rows(seed, n_wide=5200, n_requests=1200, log=log, mix=CODE_WIDE)
    if prompts_file:
        return read_prompt_rows(Path(prompts_file))
    return []


PROMPT_MIXES = ("requests", "coder", "requests-wide", "code-wide")  # the names --prompts takes besides a file


def read_prompt_rows(path: Path) -> list[dict]:
    """The rows of a --prompts file, each checked as `bench` checks a prompt file
    (InvalidRequestError naming the first bad line)."""
    from engine.bench import read_prompts

    read_prompts(path)
    return [json.loads(line) for line in path.read_text(encoding="utf-8-sig").splitlines() if line.strip()]


def _regenerate(work: Path, train_pool: SequencePool, eval_pool: SequencePool, target, tokenizer, corpus,
                prompts_file: Path | None, cfg: DraftTrainConfig, seed: int, device, deadline: float | None,
                log, jlog: JsonlLog, progress: bool = True) -> None:
    """Fill the held-out pool, then the train pool until ``deadline``, with the target's own text."""
    stops = stop_ids(target, tokenizer)
    extra = extra_prompt_rows(prompts_file, seed, log)
    eval_prompts = build_prompts(tokenizer, corpus, cfg.eval_sequences, cfg, seed, heldout=True)
    fill_pool(eval_pool, work / "eval_sequences.pt", target, tokenizer, eval_prompts, cfg, stops,
              device, None, log, jlog, "regenerate held-out", progress)
    train_prompts = build_prompts(tokenizer, corpus, cfg.num_sequences, cfg, seed, heldout=False, extra=extra)
    fill_pool(train_pool, work / "train_sequences.pt", target, tokenizer, train_prompts, cfg,
              stops, device, deadline, log, jlog, "regenerate train", progress)


@dataclass
class _DraftRun:
    """Phase 2 of `train draft`: the draft, its optimizer, the pools and the clock; checkpoints."""

    draft: torch.nn.Module
    opt: torch.optim.Optimizer
    gen: torch.Generator
    target: torch.nn.Module
    train_pool: SequencePool
    eval_pool: SequencePool
    cfg: DraftTrainConfig
    device: torch.device
    work: Path
    out: Path
    jlog: JsonlLog
    log: object
    weights: torch.Tensor
    gen_elapsed: float
    meta: dict  # what every export's training_meta.json starts with
    clock: TrainClock = field(default_factory=TrainClock)
    train_cache: FeatureCache | None = None
    eval_cache: FeatureCache | None = None

    def resume(self, state: dict) -> None:
        self.draft.load_state_dict(state["draft"])
        self.opt.load_state_dict(state["optimizer"])
        self.gen.set_state(state["generator"])
        self.clock = TrainClock(state["step"], state["blocks"], state["elapsed"], last_checkpoint=state["elapsed"])
        self.log(f"resumed draft training at step {self.clock.step} ({self.clock.elapsed / 60:.1f} min)")
        self.jlog.write("resume", step=self.clock.step, elapsed=self.clock.elapsed)

    def cache_features(self, layer_ids: list[int], hidden_size: int) -> None:
        """The target is frozen: compute its features once when they fit in memory."""
        need = FeatureCache.estimate_bytes(self.train_pool, layer_ids, hidden_size)
        if self.cfg.cache_features_gb and need < self.cfg.cache_features_gb * 2**30:
            self.eval_cache = FeatureCache(self.target, layer_ids, self.eval_pool, self.device, log=self.log)
            self.train_cache = FeatureCache(self.target, layer_ids, self.train_pool, self.device, log=self.log)
        else:
            self.log(f"features computed online ({need / 2**30:.1f} GiB would not fit in "
                     f"--cache-features-gb {self.cfg.cache_features_gb})")

    def checkpoint(self, final: bool = False) -> dict:
        clock = self.clock
        res = {"step": clock.step, "blocks": clock.work, "elapsed_min": round(clock.elapsed / 60, 2),
               **evaluate(self.draft, self.target, self.eval_pool, self.cfg, self.weights, self.device, self.eval_cache)}
        self.jlog.write("eval", **res)
        self.log(f"eval step {clock.step}: held-out loss {res.get('heldout_loss')} tau~{res.get('tau_est')} "
                 f"decode tau~{res.get('tau_decode')} acc {res.get('position_acc')}")
        save_checkpoint(self.work / "checkpoint.pt", {
            "draft": self.draft.state_dict(), "optimizer": self.opt.state_dict(), "generator": self.gen.get_state(),
            "step": clock.step, "blocks": clock.work, "elapsed": clock.elapsed, "gen_elapsed": self.gen_elapsed})
        from engine.draft import save_draft

        save_draft(self.draft, self.out)
        write_json(self.out / "training_meta.json", {
            **self.meta, "train_sequences": len(self.train_pool), "regenerated_tokens": self.train_pool.new_tokens(),
            "generation_minutes": round(self.gen_elapsed / 60, 1), "steps": clock.step, "blocks": clock.work,
            "train_minutes": round(clock.elapsed / 60, 1), "final": final,
            **{k: v for k, v in res.items() if k in ("heldout_loss", "tau_est", "tau_decode", "position_acc")}})
        return res

    def batches(self):
        """Endless batches of pool indices: a fresh random order each pass over the pool."""
        order, cursor = torch.randperm(len(self.train_pool), generator=self.gen).tolist(), 0
        while True:
            idx = []
            while len(idx) < min(self.cfg.batch_size, len(self.train_pool)):
                if cursor >= len(order):
                    order, cursor = torch.randperm(len(self.train_pool), generator=self.gen).tolist(), 0
                idx.append(order[cursor])
                cursor += 1
            yield idx

    def train(self, budget: Budget, progress: bool, threads: int | None) -> None:
        cfg, clock, pool, cache = self.cfg, self.clock, self.train_pool, self.train_cache
        bar = Progress("train draft", enabled=progress, initial=budget.progress(clock.step, clock.work, clock.elapsed))
        clock.checkpointed()  # the clock runs from here
        ema = None
        governor = ThreadGovernor(threads) if self.device.type == "cpu" else None
        batches = self.batches()
        while (p := budget.progress(clock.step, clock.work, clock.elapsed)) < 1.0:
            lr = cosine_lr(p, cfg.lr, cfg.warmup, cfg.min_lr_ratio)
            set_lr(self.opt, lr)
            idx = next(batches)
            batch = [(pool.seqs[j], pool.prompt_lens[j]) for j in idx]
            cached = [(cache.feats[j], cache.next_tokens[j]) for j in idx] if cache else None
            loss, correct, w = draft_batch_loss(self.draft, self.target, batch, cfg, self.weights, self.gen,
                                                self.device, cached=cached)
            gnorm = optimizer_update(self.opt, loss, self.draft.parameters(), cfg.grad_clip)
            nb = int((w[..., 1] > 0).sum())
            dt = clock.advance(nb)
            lv = loss.item()
            ema = lv if ema is None else 0.95 * ema + 0.05 * lv
            acc, tau, _ = acceptance_stats(correct.reshape(-1, cfg.block_size), w.reshape(-1, cfg.block_size))
            if clock.step % 10 == 0 or clock.step == 1:
                self.jlog.write("train", step=clock.step, loss=round(lv, 4), lr=lr, grad_norm=round(gnorm, 3),
                                tau_train=round(tau, 3) if not math.isnan(tau) else None,
                                acc1=round(acc[0], 3), blocks_s=round(nb / dt, 1),
                                tok_s=round(nb * (cfg.block_size - 1) / dt, 1), elapsed=round(clock.elapsed, 1),
                                threads=torch.get_num_threads())
            if governor is not None:
                governor.step(nb / dt)
            bar.update(budget.progress(clock.step, clock.work, clock.elapsed), loss=f"{ema:.3f}",
                       tau=f"{tau:.2f}", tok_s=f"{nb * (cfg.block_size - 1) / dt:.0f}")
            if clock.checkpoint_due(cfg.checkpoint_minutes):
                self.checkpoint()
                clock.checkpointed()
        bar.close()
