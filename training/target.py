"""`train target`: a small Qwen3ForCausalLM coder trained from scratch on the corpus (raw source
windows) mixed with chat request->code pairs, saved with save_pretrained (safetensors) plus
generation_config.json and the tokenizer, so AutoModelForCausalLM/AutoTokenizer load it."""

from __future__ import annotations

import functools

import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from engine.errors import InvalidRequestError
from engine.features import decoder_layers
from engine.loading import pick_device

from .common import (Budget, JsonlLog, Progress, ThreadGovernor, TrainClock, cosine_lr, decay_start, load_checkpoint,
                     mixed_precision, model_device, optimizer_update, save_checkpoint, set_lr, set_seed, set_threads,
                     write_json)
from .request_data import NAME_LINE


@dataclass
class TargetShape:
    layers: int = 12
    hidden: int = 256
    intermediate: int = 768
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    max_positions: int = 1024
    rope_theta: float = 10000.0

    def check(self) -> "TargetShape":
        """Refuse a shape the model cannot be built or trained with, in one line, before any work."""
        if self.heads % self.kv_heads:
            raise InvalidRequestError(f"train target: --heads {self.heads} is not a multiple of --kv-heads "
                                      f"{self.kv_heads} (each key/value head serves a whole group of query heads)")
        if self.head_dim % 2:
            raise InvalidRequestError(f"train target: --head-dim {self.head_dim} must be even (rotary position "
                                      "embeddings turn pairs of dimensions)")
        return self


@dataclass
class TargetTrainConfig:
    seq_len: int = 256
    batch_size: int = 16
    lr: float = 1.5e-3
    min_lr_ratio: float = 0.1
    warmup: float = 0.03
    # Minutes at the end of a time budget over which the learning rate decays from its held peak
    # (common.decay_start); None: a cosine over the whole run.
    decay_minutes: float | None = None
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    chat_fraction: float = 0.5
    # With reply-only chat data: the loss weight of the reply's first line (``def name(...)``),
    # where the request's words must become the name; the rest of a reply weighs 1.
    name_weight: float = 1.0
    checkpoint_minutes: float = 5.0
    eval_windows: int = 24
    samples: int = 6
    sample_tokens: int = 96
    # Sequence-level unlikelihood (Welleck et al. 2019, "Neural text generation with unlikelihood
    # training"): on the model's own greedy continuations, push down the tokens that continue a
    # back-to-back repeat, so that greedy text stops looping. Off unless a sequence file is given.
    unlikelihood_weight: float = 1.0
    unlikelihood_batch: int = 8
    loop_min_span: int = 8


def build_config(shape: TargetShape, tokenizer):
    from transformers import Qwen3Config

    from .tokenizer import stop_token_ids

    vocab = ((len(tokenizer) + 63) // 64) * 64
    return Qwen3Config(
        vocab_size=vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim,
        max_position_embeddings=shape.max_positions, rope_theta=shape.rope_theta,
        tie_word_embeddings=True, rms_norm_eps=1e-6, hidden_act="silu",
        attention_bias=False, attention_dropout=0.0, use_cache=True,
        eos_token_id=stop_token_ids(tokenizer), pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )


# ---------------------------------------------------------------- data


def build_streams(tokenizer, corpus: Path | None, seed: int) -> dict:
    """Token streams {raw_train, chat_train, raw_held, chat_held} (int32 1-D tensors) plus the
    held-out chat prompts/reply pairs used for greedy samples."""
    from .corpus import chat_examples, read_source, split_files
    from .tokenizer import render_chat

    train_files, held_files = split_files(corpus)
    eos = tokenizer.eos_token_id
    rng = random.Random(seed)
    out = {}
    for name, files in (("train", train_files), ("held", held_files)):
        raw_texts, chat_texts = [], []
        for p in files:
            src = read_source(p)
            raw_texts.append(src)
            for conv in chat_examples(src, rng):
                chat_texts.append(render_chat(conv))
        rng.shuffle(chat_texts)
        for kind, texts in (("raw", raw_texts), ("chat", chat_texts)):
            ids: list[int] = []
            if texts:
                for seq in tokenizer(texts, add_special_tokens=False)["input_ids"]:
                    ids.extend(seq)
                    ids.append(eos)
            out[f"{kind}_{name}"] = torch.tensor(ids, dtype=torch.int32)
    return out


def data_builder(data_mix: str):
    """The stream builder for ``train target --data``."""
    from .request_data import (build_coder_streams, build_copy_streams, build_request_streams, build_task_streams,
                               build_wording_streams)

    builders = {"corpus": build_streams, "requests": build_request_streams, "copy": build_copy_streams,
                "wording": build_wording_streams, "tasks": build_task_streams, "coder": build_coder_streams}
    if data_mix not in builders:
        raise InvalidRequestError(f"--data must be one of {', '.join(builders)}, not {data_mix!r}")
    return builders[data_mix]


def sample_windows(stream: torch.Tensor, n: int, seq_len: int, gen: torch.Generator):
    if n == 0:  # a batch of chat windows only (--chat-fraction 1, or a small batch rounded up to all chat)
        return torch.zeros((0, seq_len), dtype=torch.long)
    if len(stream) <= seq_len:
        reps = seq_len // max(1, len(stream)) + 2
        stream = stream.repeat(reps)
    starts = torch.randint(0, len(stream) - seq_len, (n,), generator=gen)
    return torch.stack([stream[s : s + seq_len] for s in starts.tolist()]).long()


def weighted_next_token_loss(logits: torch.Tensor, tokens: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of each next token, averaged with ``weights`` (of the predicted tokens)."""
    per_token = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten(),
                                                  reduction="none")
    w = weights[:, 1:].flatten()
    return (per_token * w).sum() / w.sum().clamp_min(1e-6)


def example_windows(stream: torch.Tensor, mask: torch.Tensor, starts: torch.Tensor, n: int, seq_len: int,
                    gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(windows, their masks): ``n`` windows of ``seq_len`` that each start at an example's start."""
    usable = starts[starts <= len(stream) - seq_len]
    picks = usable[torch.randint(0, len(usable), (n,), generator=gen)].tolist()
    return (torch.stack([stream[s : s + seq_len] for s in picks]).long(),
            torch.stack([mask[s : s + seq_len] for s in picks]))


def eval_windows(stream: torch.Tensor, n: int, seq_len: int) -> torch.Tensor:
    if len(stream) <= seq_len:
        stream = stream.repeat(seq_len // max(1, len(stream)) + 2)
    n = max(1, min(n, (len(stream) - 1) // seq_len))
    step = (len(stream) - seq_len) // n
    return torch.stack([stream[i * step : i * step + seq_len] for i in range(n)]).long()


@torch.no_grad()
def heldout_loss(model, windows: torch.Tensor, batch: int = 8) -> float:
    model.eval()
    total, count = 0.0, 0
    device = model_device(model)
    for i in range(0, len(windows), batch):
        x = windows[i : i + batch].to(device)
        with mixed_precision(device):
            out = model(input_ids=x, labels=x)
        total += out.loss.item() * len(x)
        count += len(x)
    model.train()
    return total / max(1, count)


def sample_prompts(tokenizer, corpus: Path | None, n: int, seed: int) -> list[dict]:
    """Held-out prompts: half code prefixes, half chat requests (from held-out files)."""
    from .corpus import chat_examples, read_source, split_files
    from .tokenizer import render_chat

    _, held = split_files(corpus)
    rng = random.Random(seed + 1)
    prompts = []
    for p in held:
        src = read_source(p)
        lines = [ln for ln in src.splitlines()]
        for conv in chat_examples(src, rng)[:2]:
            prompts.append({"kind": "chat", "prompt": render_chat(conv[:1], add_generation_prompt=True)})
        defs = [i for i, ln in enumerate(lines) if ln.lstrip().startswith("def ")]
        for i in defs[:2]:
            prompts.append({"kind": "complete", "prompt": "\n".join(lines[max(0, i - 3) : i + 2]) + "\n"})
    rng.shuffle(prompts)
    chats = [p for p in prompts if p["kind"] == "chat"][: (n + 1) // 2]
    comps = [p for p in prompts if p["kind"] == "complete"][: n // 2]
    return chats + comps


@torch.no_grad()
def greedy_samples(model, tokenizer, prompts: list[dict], max_new_tokens: int) -> list[dict]:
    from engine.repetition import is_loop

    from .tokenizer import stop_token_ids

    model.eval()
    out = []
    stops = stop_token_ids(tokenizer)
    for p in prompts:
        ids = tokenizer(p["prompt"], add_special_tokens=False, return_tensors="pt")["input_ids"].to(model_device(model))
        gen = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=stops, pad_token_id=tokenizer.pad_token_id)
        new = gen[0, ids.shape[1]:].tolist()
        out.append({"kind": p["kind"], "prompt": p["prompt"][-200:],
                    "reply": tokenizer.decode(new), "new_tokens": len(new), "loop": is_loop(new)})
    model.train()
    return out


# ---------------------------------------------------------------- unlikelihood (anti-loop)


def looping_positions(tokens: torch.Tensor, start: int = 0, min_span: int = 8,
                      max_period: int = 64) -> torch.Tensor:
    """Boolean mask over a 1-D token tensor: True where the ``min_span`` tokens ending at that
    position are an exact copy of the ``min_span`` tokens one period earlier (the text is
    repeating itself back to back), for positions >= ``start`` (the continuation). Unlike
    ``engine.repetition.repetitions`` (the loop metric, which waits for a whole second copy), this
    marks a repeat from its ``min_span``-th token on, which is where training should push back;
    vectorised per period because it runs over thousands of sequences."""
    n = len(tokens)
    mask = torch.zeros(n, dtype=torch.bool)
    for period in range(1, min(max_period, n // 2) + 1):
        same = (tokens[period:] == tokens[:-period]).long()  # same[i]: tokens[i + period] == tokens[i]
        if len(same) < min_span:
            break
        sums = torch.cumsum(torch.nn.functional.pad(same, (1, 0)), 0)
        full = torch.nonzero(sums[min_span:] - sums[:-min_span] == min_span).flatten()
        mask[full + min_span - 1 + period] = True
    mask[:start] = False
    return mask


def unlikelihood_loss(logits: torch.Tensor, tokens: torch.Tensor, penalize: torch.Tensor) -> torch.Tensor:
    """Mean of -log(1 - p(token)) over the penalized positions (``penalize`` [B, T] marks the
    token at each position; position 0 has no prediction)."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    token_logp = logp.gather(-1, tokens[:, 1:, None]).squeeze(-1)
    log_not = torch.log((-torch.expm1(token_logp)).clamp_min(1e-6))  # log(1 - p), accurate near p = 1
    marks = penalize[:, 1:].float()
    return -(log_not * marks).sum() / marks.sum().clamp_min(1.0)


def load_loop_sequences(path: Path, min_span: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The regenerated sequences of a `train draft` work directory (``train_sequences.pt``, the
    target's own greedy continuations), kept where the continuation loops: (tokens, mask)."""
    from .draft import SequencePool

    path = Path(path)
    pool = SequencePool.load(path / "train_sequences.pt" if path.is_dir() else path)
    out = []
    for seq, start in zip(pool.seqs, pool.prompt_lens):
        seq = seq.long()
        mask = looping_positions(seq, start, min_span)
        if mask.any():
            out.append((seq, mask))
    return out


def freeze_below(model, layer: int) -> None:
    """Freeze the embedding (tied with the lm_head) and the decoder layers below ``layer``."""
    if not 0 < layer < model.config.num_hidden_layers:
        raise InvalidRequestError(f"--train-from-layer must be between 1 and {model.config.num_hidden_layers - 1}")
    model.get_input_embeddings().weight.requires_grad_(False)
    model.get_output_embeddings().weight.requires_grad_(False)
    for index, block in enumerate(decoder_layers(model)):
        block.requires_grad_(index >= layer)


def sequence_batch(items, pad_id: int):
    """Right-padded tokens, attention mask and penalize mask for a list of (tokens, mask)."""
    width = max(len(t) for t, _ in items)
    tokens = torch.full((len(items), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(items), width), dtype=torch.long)
    penalize = torch.zeros((len(items), width), dtype=torch.bool)
    for row, (t, m) in enumerate(items):
        tokens[row, : len(t)] = t
        attention[row, : len(t)] = 1
        penalize[row, : len(t)] = m
    return tokens, attention, penalize


# ---------------------------------------------------------------- export


def export_model(model, tokenizer, out: Path, meta: dict) -> None:
    from transformers import GenerationConfig

    from .tokenizer import stop_token_ids

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    GenerationConfig(eos_token_id=stop_token_ids(tokenizer), pad_token_id=tokenizer.pad_token_id,
                     do_sample=False, max_new_tokens=256).save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    write_json(out / "training_meta.json", meta)


# ---------------------------------------------------------------- training


def train_target(out: Path, tokenizer_dir: Path, work: Path | None = None,
                 corpus: Path | None = None, shape: TargetShape | None = None,
                 cfg: TargetTrainConfig | None = None, budget: Budget | None = None,
                 seed: int = 0, threads: int | None = None, progress: bool = True,
                 init: Path | None = None, unlikelihood: Path | None = None,
                 train_from_layer: int = 0, data_mix: str = "corpus", own_replies: int = 0,
                 grow_to: int | None = None, device: str | None = None, log=print) -> dict:
    """Train from scratch, or fine-tune ``init`` (a saved target: its shape wins over ``shape``).
    ``unlikelihood``: a `train draft` work directory (or its train_sequences.pt) whose looping
    continuations get the unlikelihood term on top of the usual next-token loss.
    ``train_from_layer``: with ``init``, train only the decoder layers from this one up and the
    final norm; below it (and the tied embedding / lm_head) the target stays bit-identical, so a
    DFlash draft that reads features from those layers keeps its inputs.
    ``data_mix``: "corpus" (raw source + docstring chat pairs) or "requests" (request -> code
    fine-tuning data, ``request_data.build_request_streams``).
    ``own_replies``: with ``init`` and ``data_mix`` "coder", ``init`` first answers this many
    training requests, and the follow-up chats also edit those replies (``own_replies.py``).
    ``grow_to``: with ``init``, this many decoder layers (``grow_target``: the added ones start as
    the identity).
    ``device``: where to train (default: CUDA when there is one, else the CPU). The weights and
    the optimizer stay fp32 everywhere; on CUDA the forward passes run in bf16 autocast."""
    from .tokenizer import load_tokenizer

    out = Path(out)
    work = Path(work) if work else out / "_train"
    shape, cfg = shape or TargetShape(), cfg or TargetTrainConfig()
    budget = budget or Budget(max_minutes=50)
    saved = _saved_config(init) if init is not None else None
    if saved is None:
        shape.check()
    positions = saved["max_position_embeddings"] if saved else shape.max_positions
    if cfg.seq_len > positions:
        raise InvalidRequestError(f"train target: --seq-len {cfg.seq_len} is above the model's {positions} positions "
                                  "(--max-positions for a new target)")
    set_threads(threads)
    run_device = pick_device(device)
    gen = set_seed(seed)
    tokenizer = load_tokenizer(tokenizer_dir or init)
    jlog = JsonlLog(work / "log.jsonl")
    if own_replies and (init is None or data_mix != "coder"):
        raise InvalidRequestError("train target: --own-replies needs --init (the model that answers) and --data coder")
    grown_from = None
    if grow_to and saved is not None:
        grown_from = saved["num_hidden_layers"]
        grown_layer_sources(grown_from, grow_to)  # refuses a shrink before the data is built
    data = _target_data(work / "data.pt", tokenizer, corpus, seed, log, data_mix,
                        own=(init, work / "own_replies.jsonl", own_replies) if own_replies else None,
                        device=run_device)
    jlog.write("data", **{k: len(v) for k, v in data.items()})

    torch.manual_seed(seed)
    model, shape = _target_model(init, shape, tokenizer, grow_to)
    model.to(run_device)
    loop_seqs = _looping_continuations(unlikelihood, cfg.loop_min_span, log)
    if train_from_layer:
        freeze_below(model, train_from_layer)
        log(f"training layers {train_from_layer}..{model.config.num_hidden_layers - 1} and the final norm only "
            f"({sum(p.numel() for p in model.parameters() if p.requires_grad) / 1e6:.2f}M params)")
    n_params = sum(p.numel() for p in model.parameters())
    sources = {"init": str(init) if init else None, "unlikelihood": str(unlikelihood) if unlikelihood else None,
               "data": data_mix, "grown_from_layers": grown_from if grown_from != shape.layers else None}
    run = _TargetRun(model, _adamw(model, cfg), gen, tokenizer, data, cfg, out, work / "checkpoint.pt", jlog, log,
                     meta={"kind": "target", "params": n_params, **sources, "shape": asdict(shape),
                           "train": asdict(cfg), "seed": seed, "device": run_device.type},
                     prompts=sample_prompts(tokenizer, corpus, cfg.samples, seed))
    if not run.resume():
        jlog.write("start", params=n_params, shape=asdict(shape), train=asdict(cfg), seed=seed,
                   budget=asdict(budget), **sources)
    log(f"target: Qwen3ForCausalLM {n_params / 1e6:.2f}M params, {shape.layers} layers x "
        f"hidden {shape.hidden}, vocab {model.config.vocab_size}, on {run_device}")
    run.train(budget, loop_seqs, progress, threads)
    res = run.checkpoint(final=True)
    jlog.write("done", **res)
    log(f"done: {run.clock.step} steps, {run.clock.work:,} tokens, {run.clock.elapsed / 60:.1f} min -> {out}")
    return res


def _target_data(path: Path, tokenizer, corpus: Path | None, seed: int, log, data_mix: str = "corpus",
                 own: tuple[Path, Path, int] | None = None, device: torch.device = torch.device("cpu")) -> dict:
    """The token streams (built once, then read back on a resume). ``own``: (the model that
    answers, where its replies are kept, how many) for follow-ups over the model's own replies,
    generated on ``device``."""
    if path.exists():
        return torch.load(path, weights_only=True)
    t0 = time.time()
    build = data_builder(data_mix)
    if own:
        from transformers import Qwen3ForCausalLM

        from .own_replies import own_replies
        answerer, replies_path, n = own
        model = Qwen3ForCausalLM.from_pretrained(str(answerer), dtype=torch.float32).to(device)
        build = functools.partial(build, own_replies=own_replies(replies_path, model, tokenizer, n, seed, log))
        del model
    data = build(tokenizer, corpus, seed)
    save_checkpoint(path, data)
    log("data: " + ", ".join(f"{k} {len(v):,} tokens" for k, v in data.items()) + f" ({time.time() - t0:.0f} s)")
    return data


def grown_layer_sources(layers: int, grow_to: int) -> list[tuple[int, bool]]:
    """For each layer of a ``layers``-deep stack grown to ``grow_to``: (the layer it starts as,
    whether it is an inserted copy). The copies are spread evenly, each right after the layer it
    copies (LLaMA Pro's interleaved growth), so every depth of the stack gains room."""
    if grow_to < layers:
        raise InvalidRequestError(f"train target: --layers {grow_to} is below the init model's {layers} layers "
                                  "(a target can grow, not shrink)")
    extra, sources = grow_to - layers, []
    for i in range(layers):
        sources.append((i, False))
        sources += [(i, True)] * ((i + 1) * extra // layers - i * extra // layers)
    return sources


def grown_layer_ids(layer_ids: list[int], layers: int, grow_to: int) -> list[int]:
    """Where layers ``layer_ids`` of a ``layers``-deep stack sit once it is grown to ``grow_to``:
    a DFlash draft that read them reads the same features there (each copy starts as the identity)."""
    where = {source: index for index, (source, copy) in enumerate(grown_layer_sources(layers, grow_to)) if not copy}
    return [where[i] for i in layer_ids]


def grow_target(model, grow_to: int):
    """``model`` with ``grow_to`` decoder layers, computing exactly what it computed: each added
    layer copies the one below it with its output projections (attention's ``o_proj``, the MLP's
    ``down_proj``) at zero, so it starts as the identity on the residual stream and training
    decides what it adds."""
    from transformers import AutoModelForCausalLM

    config = model.config
    sources = grown_layer_sources(config.num_hidden_layers, grow_to)
    if len(sources) == config.num_hidden_layers:
        return model
    grown_config = type(config).from_dict(config.to_dict())
    grown_config.num_hidden_layers = grow_to
    if getattr(config, "layer_types", None):
        grown_config.layer_types = [config.layer_types[src] for src, _ in sources]
    grown = AutoModelForCausalLM.from_config(grown_config, dtype=model.dtype)
    source = model.state_dict()
    state = {k: v for k, v in source.items() if ".layers." not in k}
    prefix = next(k for k in source if ".layers.0." in k).split(".layers.0.")[0]
    for new_index, (src, copy) in enumerate(sources):
        for name, value in decoder_layers(model)[src].state_dict().items():
            zero = copy and name.endswith(("o_proj.weight", "o_proj.bias", "down_proj.weight", "down_proj.bias"))
            state[f"{prefix}.layers.{new_index}.{name}"] = torch.zeros_like(value) if zero else value.clone()
    grown.load_state_dict(state)
    return grown


def _target_model(init: Path | None, shape: TargetShape, tokenizer, grow_to: int | None = None):
    """A new model of ``shape``, or the saved ``init`` (whose shape wins, but for a depth of
    ``grow_to``: ``grow_target``); the shape it has."""
    from transformers import Qwen3ForCausalLM

    if init is None:
        return Qwen3ForCausalLM(build_config(shape, tokenizer)), shape
    model = Qwen3ForCausalLM.from_pretrained(str(init), dtype=torch.float32)
    if grow_to:
        model = grow_target(model, grow_to)
    c = model.config
    return model, TargetShape(layers=c.num_hidden_layers, hidden=c.hidden_size, intermediate=c.intermediate_size,
                              heads=c.num_attention_heads, kv_heads=c.num_key_value_heads, head_dim=c.head_dim,
                              max_positions=c.max_position_embeddings, rope_theta=shape.rope_theta)


def _saved_config(model_dir: Path) -> dict:
    import json

    return json.loads((Path(model_dir) / "config.json").read_text())


def _looping_continuations(unlikelihood: Path | None, min_span: int, log) -> list:
    if not unlikelihood:
        return []
    loop_seqs = load_loop_sequences(unlikelihood, min_span)
    marked = sum(int(m.sum()) for _, m in loop_seqs)
    log(f"unlikelihood: {len(loop_seqs):,} looping continuations, {marked:,} repeat tokens to push down")
    if not loop_seqs:
        raise InvalidRequestError(f"no looping continuations in {unlikelihood}")
    return loop_seqs


def _adamw(model, cfg: TargetTrainConfig) -> torch.optim.AdamW:
    """AdamW over the trainable parameters; no weight decay on norms and biases."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW([{"params": [p for p in trainable if p.dim() >= 2], "weight_decay": cfg.weight_decay},
                              {"params": [p for p in trainable if p.dim() < 2], "weight_decay": 0.0}],
                             lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8)


@dataclass
class _TargetRun:
    """One `train target` run: its model, optimizer, data and clock; evaluation and checkpoints."""

    model: torch.nn.Module
    opt: torch.optim.Optimizer
    gen: torch.Generator
    tokenizer: object
    data: dict
    cfg: TargetTrainConfig
    out: Path
    ckpt_path: Path
    jlog: JsonlLog
    log: object
    meta: dict  # what every export's training_meta.json starts with
    prompts: list
    clock: TrainClock = field(default_factory=TrainClock)

    def __post_init__(self):
        self.ev_raw = eval_windows(self.data["raw_held"], self.cfg.eval_windows, self.cfg.seq_len)
        self.ev_chat = eval_windows(self.data["chat_held"], self.cfg.eval_windows, self.cfg.seq_len)

    def resume(self) -> bool:
        """Continue from the work directory's checkpoint, when there is one."""
        state = load_checkpoint(self.ckpt_path)
        if state is None:
            return False
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.gen.set_state(state["generator"])
        self.clock = TrainClock(state["step"], state["tokens"], state["elapsed"], last_checkpoint=state["elapsed"])
        self.log(f"resumed from {self.ckpt_path} at step {self.clock.step} ({self.clock.work:,} tokens, "
                 f"{self.clock.elapsed / 60:.1f} min)")
        self.jlog.write("resume", step=self.clock.step, tokens=self.clock.work, elapsed=self.clock.elapsed)
        return True

    def evaluate(self, final: bool = False) -> dict:
        clock = self.clock
        res = {"step": clock.step, "tokens": clock.work, "elapsed_min": round(clock.elapsed / 60, 2),
               "heldout_loss_raw": round(heldout_loss(self.model, self.ev_raw), 4),
               "heldout_loss_chat": round(heldout_loss(self.model, self.ev_chat), 4)}
        if final or self.cfg.samples:
            samples = greedy_samples(self.model, self.tokenizer, self.prompts, self.cfg.sample_tokens)
            res["loop_fraction"] = round(sum(s["loop"] for s in samples) / max(1, len(samples)), 3)
            self.jlog.write("samples", step=clock.step, samples=samples)
        self.jlog.write("eval", **res)
        self.log(f"eval step {clock.step}: held-out loss raw {res['heldout_loss_raw']:.3f} chat "
                 f"{res['heldout_loss_chat']:.3f} loops {res.get('loop_fraction')}")
        return res

    def checkpoint(self, final: bool = False) -> dict:
        res = self.evaluate(final)
        clock = self.clock
        save_checkpoint(self.ckpt_path, {"model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
                                         "generator": self.gen.get_state(), "step": clock.step,
                                         "tokens": clock.work, "elapsed": clock.elapsed})
        meta = {**self.meta, "steps": clock.step, "tokens": clock.work, "minutes": round(clock.elapsed / 60, 1),
                **{k: v for k, v in res.items() if k.startswith("heldout") or k == "loop_fraction"},
                "data_tokens": {k: len(v) for k, v in self.data.items()}, "final": final}
        export_model(self.model, self.tokenizer, self.out, meta)
        return res

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, per-token loss weights) on the model's device: ``sampled_batch``."""
        x, weights = self.sampled_batch()
        device = model_device(self.model)
        return x.to(device), weights.to(device)

    def sampled_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, per-token loss weights): raw source windows mixed with chat windows
        (``chat_fraction`` of the batch). With a reply mask (``--data requests``) chat windows
        start at a request and only reply tokens weigh (the name line ``name_weight``)."""
        cfg, data = self.cfg, self.data
        n_chat = int(round(cfg.batch_size * cfg.chat_fraction)) if len(data["chat_train"]) else 0
        raw = sample_windows(data["raw_train"], cfg.batch_size - n_chat, cfg.seq_len, self.gen)
        if "chat_train_starts" not in data or not n_chat:
            parts = [raw] + ([sample_windows(data["chat_train"], n_chat, cfg.seq_len, self.gen)] if n_chat else [])
            x = torch.cat(parts)
            return x, torch.ones_like(x, dtype=torch.float32)
        chat, mask = example_windows(data["chat_train"], data["chat_train_mask"], data["chat_train_starts"],
                                     n_chat, cfg.seq_len, self.gen)
        weights = torch.where(mask == NAME_LINE, cfg.name_weight, mask.float())
        return torch.cat([raw, chat]), torch.cat([torch.ones_like(raw, dtype=torch.float32), weights])

    def losses(self, x: torch.Tensor, weights: torch.Tensor, loop_seqs: list):
        """The next-token loss, the unlikelihood loss (None without looping continuations), their sum."""
        device = model_device(self.model)
        with mixed_precision(device):
            mle = weighted_next_token_loss(self.model(input_ids=x).logits, x, weights)
        if not loop_seqs:
            return mle, None, mle
        picks = torch.randint(0, len(loop_seqs), (self.cfg.unlikelihood_batch,), generator=self.gen).tolist()
        seqs, attention, penalize = (t.to(device) for t in
                                     sequence_batch([loop_seqs[i] for i in picks], self.tokenizer.pad_token_id))
        with mixed_precision(device):
            ul = unlikelihood_loss(self.model(input_ids=seqs, attention_mask=attention).logits, seqs, penalize)
        return mle, ul, mle + self.cfg.unlikelihood_weight * ul

    def train(self, budget: Budget, loop_seqs: list, progress: bool, threads: int | None) -> None:
        cfg, clock = self.cfg, self.clock
        self.model.train()
        governor = ThreadGovernor(threads)
        bar = Progress("train target", enabled=progress, initial=budget.progress(clock.step, clock.work, clock.elapsed))
        clock.checkpointed()  # the clock runs from here
        loss_ema = None
        peak_until = decay_start(budget, cfg.decay_minutes)
        while (p := budget.progress(clock.step, clock.work, clock.elapsed)) < 1.0:
            lr = cosine_lr(p, cfg.lr, cfg.warmup, cfg.min_lr_ratio, peak_until)
            set_lr(self.opt, lr)
            x, weights = self.batch()
            mle, ul, loss = self.losses(x, weights, loop_seqs)
            gnorm = optimizer_update(self.opt, loss, self.model.parameters(), cfg.grad_clip)
            dt = clock.advance(x.numel())
            lv, ul_value = mle.item(), (None if ul is None else ul.item())
            loss_ema = lv if loss_ema is None else 0.95 * loss_ema + 0.05 * lv
            if clock.step % 10 == 0 or clock.step == 1:
                self.jlog.write("train", step=clock.step, tokens=clock.work, loss=round(lv, 4), lr=lr,
                                unlikelihood=None if ul_value is None else round(ul_value, 4),
                                grad_norm=round(gnorm, 3), tok_s=round(x.numel() / dt, 1),
                                elapsed=round(clock.elapsed, 1), threads=governor.current)
            extra = {} if ul_value is None else {"ul": f"{ul_value:.3f}"}
            bar.update(budget.progress(clock.step, clock.work, clock.elapsed), loss=f"{loss_ema:.3f}", **extra,
                       tok_s=f"{x.numel() / dt:.0f}", lr=f"{lr:.1e}", thr=governor.current)
            governor.step(x.numel() / dt)
            if clock.checkpoint_due(cfg.checkpoint_minutes):
                self.checkpoint()
                clock.checkpointed()
        bar.close()
