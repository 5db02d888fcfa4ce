"""Smoke tests for `dflash-studio train` (tiny sizes, seconds) and the pure pieces of draft
training: the block-diagonal mask with strict context, same-position labels, loss weights."""

from __future__ import annotations

import json
import math
import re
import shlex
import subprocess
import textwrap
from pathlib import Path

import pytest
import torch

from app.cli import main as cli
from engine.errors import InvalidRequestError
from engine.repetition import is_loop
from training.common import Budget, ThreadGovernor, cosine_lr, decay_start
from training.draft import (SequencePool, acceptance_stats, block_inputs, block_labels, decode_chain, loss_weights,
                                   sample_anchors, training_mask, trim_repetition)
from training.tokenizer import CHAT_TEMPLATE, render_chat

FUNC = '''
def {name}(values, scale=2):
    """Return the {what} of the values, scaled by the factor."""
    total = 0
    for value in values:
        total += value * scale
    return total


class {cls}:
    """A small {what} holder."""

    def __init__(self, items):
        self.items = list(items)

    def describe(self, prefix="item"):
        """Describe every item in the holder as a string."""
        return ", ".join(f"{{prefix}} {{i}}" for i in self.items)
'''


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    words = ["sum", "mean", "total", "product", "weight", "count", "score", "value"]
    for i, w in enumerate(words):
        (root / f"mod_{w}.py").write_text(textwrap.dedent(FUNC.format(name=f"compute_{w}", what=w, cls=f"{w.title()}Box")) * 3)
    (root / "test").mkdir()
    (root / "test" / "test_skip.py").write_text("assert False\n")
    return root


@pytest.fixture(scope="module")
def tokenizer_dir(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("tok")
    assert cli(["train", "tokenizer", "--out", str(out), "--corpus", str(corpus), "--vocab-size", "320"]) == 0
    return out


def tiny_target(tmp_path, tokenizer_dir, arch="qwen3", layers=4):
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    vocab = ((len(tok) + 63) // 64) * 64
    kw = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(0)
    if arch == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=8, tie_word_embeddings=True, **kw))
    else:
        model = LlamaForCausalLM(LlamaConfig(tie_word_embeddings=False, **kw))
    out = tmp_path / f"target-{arch}"
    model.save_pretrained(str(out))
    GenerationConfig(eos_token_id=[tok.convert_tokens_to_ids("<|end|>"), tok.eos_token_id],
                     pad_token_id=tok.pad_token_id).save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return out


# ---------------------------------------------------------------- tokenizer


def test_tokenizer_loads_with_chat_template_and_special_tokens(tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    msgs = [{"role": "user", "content": "Add two numbers."}, {"role": "assistant", "content": "def add(a, b):\n    return a + b"}]
    assert tok.apply_chat_template(msgs, tokenize=False) == render_chat(msgs)
    assert tok.apply_chat_template(msgs[:1], tokenize=False, add_generation_prompt=True).endswith("<|assistant|>\n")
    for special in ("<|endoftext|>", "<|mask|>", "<|user|>", "<|assistant|>", "<|end|>"):
        ids = tok(special, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1, special
    assert tok.mask_token_id == tok.convert_tokens_to_ids("<|mask|>")
    assert tok.eos_token == "<|endoftext|>"
    text = "def f(x):\n    return x  # é\n"
    assert tok.decode(tok(text)["input_ids"]) == text
    assert tok.chat_template == CHAT_TEMPLATE


def test_corpus_split_is_fixed_and_skips_tests(corpus):
    from training.corpus import function_pairs, read_source, split_files

    train, held = split_files(corpus)
    assert held and train and not set(train) & set(held)
    assert all("test" not in p.parts for p in train + held)
    assert split_files(corpus) == (train, held)
    pairs = function_pairs(read_source(train[0]))
    assert any(req.startswith("Return the") for req, _ in pairs)


# ---------------------------------------------------------------- target


def test_train_target_smoke_resume_and_load(tmp_path, corpus, tokenizer_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "target"
    args = ["train", "target", "--out", str(out), "--tokenizer", str(tokenizer_dir), "--corpus", str(corpus),
            "--layers", "2", "--hidden", "32", "--intermediate", "64", "--heads", "2", "--kv-heads", "1",
            "--head-dim", "16", "--seq-len", "32", "--batch-size", "4", "--eval-windows", "2",
            "--samples", "2", "--sample-tokens", "8", "--no-progress", "--threads", "2", "--device", "cpu"]
    assert cli(args + ["--max-steps", "2"]) == 0
    assert cli(args + ["--max-steps", "4"]) == 0  # resumes from the step-2 checkpoint
    log = [json.loads(line) for line in (out / "_train" / "log.jsonl").read_text().splitlines()]
    assert [e["step"] for e in log if e["event"] == "resume"] == [2]
    evals = [e for e in log if e["event"] == "eval"]
    assert evals[-1]["step"] == 4 and math.isfinite(evals[-1]["heldout_loss_raw"])
    assert "heldout_loss_chat" in evals[-1]
    model = AutoModelForCausalLM.from_pretrained(str(out))
    tok = AutoTokenizer.from_pretrained(str(out))
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert model.config.tie_word_embeddings
    assert tok.convert_tokens_to_ids("<|end|>") in model.generation_config.eos_token_id
    assert (out / "model.safetensors").exists()
    meta = json.loads((out / "training_meta.json").read_text())
    assert meta["steps"] == 4 and meta["final"] and meta["device"] == "cpu"


@pytest.mark.parametrize("mix", [["--chat-fraction", "1"], ["--batch-size", "2", "--chat-fraction", "0.8"]],
                         ids=["all chat", "a small batch rounded to all chat"])
def test_a_batch_of_chat_windows_only_trains(tmp_path, corpus, tokenizer_dir, mix):
    out = tmp_path / "target"
    args = ["train", "target", "--out", str(out), "--tokenizer", str(tokenizer_dir), "--corpus", str(corpus),
            "--layers", "1", "--hidden", "32", "--intermediate", "64", "--heads", "2", "--kv-heads", "1",
            "--head-dim", "16", "--seq-len", "32", "--batch-size", "4", "--eval-windows", "1", "--samples", "0",
            "--no-progress", "--threads", "1", "--max-steps", "2", *mix]
    assert cli(args) == 0
    log = [json.loads(line) for line in (out / "_train" / "log.jsonl").read_text().splitlines()]
    trained = [e for e in log if e["event"] == "train"]
    assert trained and all(math.isfinite(e["loss"]) for e in trained)


def test_looping_positions_marks_back_to_back_repeats_in_the_continuation():
    from training.target import looping_positions

    unit = [11, 12, 13, 14, 15]
    tokens = torch.tensor([1, 2, 3] + unit * 4)
    mask = looping_positions(tokens, start=3, min_span=8)
    # position p is marked once the 8 tokens ending at p equal the 8 one period (5) earlier
    assert mask.nonzero().flatten().tolist() == list(range(3 + 5 + 7, len(tokens)))
    assert not looping_positions(tokens, start=len(tokens) - 2, min_span=8)[: len(tokens) - 2].any()
    code = torch.tensor(list(range(40)))  # nothing repeats
    assert not looping_positions(code, 0, 8).any()
    assert looping_positions(torch.tensor([7] * 12), 0, 8).nonzero().flatten().tolist() == [8, 9, 10, 11]


def test_unlikelihood_loss_pushes_down_only_marked_tokens():
    from training.target import sequence_batch, unlikelihood_loss

    tokens, attention, penalize = sequence_batch(
        [(torch.tensor([1, 2, 3, 2]), torch.tensor([False, False, False, True])),
         (torch.tensor([4, 5]), torch.tensor([False, False]))], pad_id=0)
    assert tokens.tolist() == [[1, 2, 3, 2], [4, 5, 0, 0]] and attention[1].tolist() == [1, 1, 0, 0]
    logits = torch.zeros(2, 4, 8, requires_grad=True)
    loss = unlikelihood_loss(logits, tokens, penalize)
    assert loss.item() == pytest.approx(-math.log(1 - 1 / 8), rel=1e-5)
    loss.backward()
    grad = logits.grad
    assert grad[0, 2, 2] > 0  # descending lowers the logit of the repeated token at the marked step
    assert grad[0, :2].abs().sum() == 0 and grad[1].abs().sum() == 0  # unmarked steps untouched
    assert unlikelihood_loss(torch.zeros(1, 3, 8), torch.tensor([[1, 2, 3]]),
                             torch.zeros(1, 3, dtype=torch.bool)).item() == 0.0


def test_train_target_fine_tunes_with_unlikelihood_on_looping_continuations(tmp_path, corpus, tokenizer_dir):
    from transformers import AutoModelForCausalLM

    init = tiny_target(tmp_path, tokenizer_dir, layers=2)
    pool = SequencePool()
    pool.add([5, 6, 7] + [20, 21, 22, 23] * 6, prompt_len=3, kind="complete")
    pool.add([5, 6, 7, 8, 9, 10], prompt_len=3, kind="chat")  # no loop: not used
    seqs = tmp_path / "draft-work"
    seqs.mkdir()
    pool.save(seqs / "train_sequences.pt")
    out = tmp_path / "tuned"
    args = ["train", "target", "--init", str(init), "--unlikelihood", str(seqs), "--out", str(out),
            "--corpus", str(corpus), "--seq-len", "32", "--batch-size", "2", "--eval-windows", "2",
            "--samples", "0", "--no-progress", "--threads", "2", "--max-steps", "3", "--lr", "1e-3"]
    assert cli(args) == 0
    log = [json.loads(line) for line in (out / "_train" / "log.jsonl").read_text().splitlines()]
    start = next(e for e in log if e["event"] == "start")
    assert start["init"] == str(init) and start["unlikelihood"] == str(seqs)
    assert all(e["unlikelihood"] > 0 for e in log if e["event"] == "train")
    tuned = AutoModelForCausalLM.from_pretrained(str(out))
    base = AutoModelForCausalLM.from_pretrained(str(init))
    assert tuned.config.hidden_size == 32 and tuned.config.num_hidden_layers == 2  # init's shape kept
    assert not torch.equal(tuned.model.embed_tokens.weight, base.model.embed_tokens.weight)
    assert json.loads((out / "training_meta.json").read_text())["unlikelihood"] == str(seqs)

    # --train-from-layer: what a draft reads (embedding, lower layers) stays bit-identical
    top = tmp_path / "tuned-top"
    args = [a if a != str(out) else str(top) for a in args]
    assert cli(args + ["--train-from-layer", "1"]) == 0
    tuned = AutoModelForCausalLM.from_pretrained(str(top))
    assert torch.equal(tuned.model.embed_tokens.weight, base.model.embed_tokens.weight)
    assert all(torch.equal(a, b) for a, b in zip(tuned.model.layers[0].parameters(), base.model.layers[0].parameters()))
    assert not all(torch.equal(a, b) for a, b in zip(tuned.model.layers[1].parameters(), base.model.layers[1].parameters()))
    assert cli(args + ["--train-from-layer", "2", "--work", str(tmp_path / "w2")]) == 2  # a clear message


def test_grown_layers_are_spread_evenly_each_after_the_layer_it_copies():
    from training.target import grown_layer_sources

    assert grown_layer_sources(3, 3) == [(0, False), (1, False), (2, False)]
    sources = grown_layer_sources(12, 16)
    assert [i for i, (_, copy) in enumerate(sources) if copy] == [3, 7, 11, 15]
    assert all(sources[i - 1][0] == src for i, (src, copy) in enumerate(sources) if copy)
    assert [src for src, copy in sources if not copy] == list(range(12))
    assert sum(copy for _, copy in grown_layer_sources(4, 12)) == 8  # two copies after every layer
    with pytest.raises(InvalidRequestError, match="grow, not shrink"):
        grown_layer_sources(4, 3)


def test_a_grown_target_computes_exactly_what_it_grew_from(tmp_path, tokenizer_dir):
    from transformers import AutoModelForCausalLM

    from training.target import grow_target

    base = AutoModelForCausalLM.from_pretrained(str(tiny_target(tmp_path, tokenizer_dir, layers=3))).eval()
    with torch.no_grad():  # give every output projection weight, so a copy that kept it would show
        for layer in base.model.layers:
            layer.self_attn.o_proj.weight.normal_(0, 0.2)
    grown = grow_target(base, 5).eval()
    assert grown.config.num_hidden_layers == 5 and len(grown.model.layers) == 5
    assert len(grown.config.layer_types) == 5
    tokens = torch.randint(0, base.config.vocab_size, (2, 12))
    with torch.no_grad():
        assert torch.allclose(grown(tokens).logits, base(tokens).logits, atol=1e-5)
        assert grown.lm_head.weight.data_ptr() == grown.model.embed_tokens.weight.data_ptr()  # still tied
    added = [grown.model.layers[i] for i in (2, 4)]  # copies of layers 1 and 2
    assert all(layer.self_attn.o_proj.weight.abs().sum() == 0 and layer.mlp.down_proj.weight.abs().sum() == 0
               for layer in added)
    assert torch.equal(added[0].self_attn.q_proj.weight, base.model.layers[1].self_attn.q_proj.weight)
    assert [layer.self_attn.layer_idx for layer in grown.model.layers] == list(range(5))  # its cache slots
    assert grow_target(base, 3) is base


def test_train_target_grows_an_init_model_deeper_and_refuses_to_shrink_it(tmp_path, corpus, tokenizer_dir, capsys):
    from transformers import AutoModelForCausalLM

    init = tiny_target(tmp_path, tokenizer_dir, layers=2)
    out = tmp_path / "grown"
    args = ["train", "target", "--init", str(init), "--corpus", str(corpus), "--seq-len", "32",
            "--batch-size", "2", "--eval-windows", "2", "--samples", "0", "--no-progress", "--threads", "2",
            "--max-steps", "1", "--lr", "1e-3", "--layers", "3"]
    assert cli(args + ["--out", str(out)]) == 0
    grown = AutoModelForCausalLM.from_pretrained(str(out))
    assert grown.config.num_hidden_layers == 3 and grown.config.hidden_size == 32
    meta = json.loads((out / "training_meta.json").read_text())
    assert meta["grown_from_layers"] == 2 and meta["shape"]["layers"] == 3
    # resuming the same run finds its grown checkpoint and keeps its depth
    assert cli(args[:-2] + ["--layers", "3", "--max-steps", "2", "--out", str(out)]) == 0
    assert AutoModelForCausalLM.from_pretrained(str(out)).config.num_hidden_layers == 3
    capsys.readouterr()
    assert cli(args[:-2] + ["--layers", "1", "--out", str(tmp_path / "shrunk")]) == 2
    assert "grow, not shrink" in capsys.readouterr().err
    assert not (tmp_path / "shrunk" / "_train" / "data.pt").exists()  # refused before any work


# ---------------------------------------------------------------- draft: pure pieces


def test_training_mask_is_block_diagonal_with_strict_context():
    anchors = torch.tensor([3, 5, 0])
    valid = torch.tensor([True, True, False])
    B, C = 3, 8
    m = training_mask(anchors, valid, C, B)
    assert m.shape == (3 * B, C + 3 * B)
    for n in range(3):
        rows = m[n * B : (n + 1) * B]
        ctx, blocks = rows[:, :C], rows[:, C:]
        want_ctx = torch.arange(C) < anchors[n] if valid[n] else torch.zeros(C, dtype=torch.bool)
        assert torch.equal(ctx, want_ctx.expand(B, C))  # strictly before the anchor (not <=)
        own = torch.zeros(3 * B, dtype=torch.bool)
        own[n * B : (n + 1) * B] = True
        assert torch.equal(blocks, own.expand(B, 3 * B))  # own block, bidirectional; no others
    assert m.any(dim=1).all()  # no fully masked rows (NaN in attention)


def test_block_inputs_and_same_position_labels():
    seq = torch.arange(100, 120)
    next_tokens = seq.clone()  # a target whose greedy choice at p is exactly seq[p]
    anchors = torch.tensor([4, 17])
    ids, pos = block_inputs(seq, anchors, 4, mask_id=1)
    assert ids.tolist() == [104, 1, 1, 1, 117, 1, 1, 1]
    assert pos.tolist() == [4, 5, 6, 7, 17, 18, 19, 20]
    w = loss_weights(4, gamma=4.0)
    labels, wts = block_labels(next_tokens, anchors, torch.tensor([True, True]), 20, 4, w)
    assert labels[0].tolist() == [104, 105, 106, 107]  # slot k predicts the token AT anchor + k
    assert labels[1, :3].tolist() == [117, 118, 119]
    assert wts[1, 3] == 0  # position 20 is past the sequence
    assert wts[0, 0] == 0 and wts[0, 1] == 1.0
    assert math.isclose(float(wts[0, 2]), math.exp(-1 / 4), rel_tol=1e-6)


def test_anchors_are_in_the_continuation():
    gen = torch.Generator().manual_seed(0)
    a = sample_anchors(prompt_len=10, length=30, n=5, gen=gen)
    assert len(a) == 5 and a.min() >= 10 and a.max() <= 28 and torch.equal(a, a.sort().values)
    assert sample_anchors(10, 15, 50, gen).tolist() == [10, 11, 12, 13]
    assert len(sample_anchors(10, 11, 5, gen)) == 0


def test_acceptance_stats_counts_leading_correct_slots():
    correct = torch.tensor([[True, True, True, False], [True, False, True, True]])
    w = torch.tensor([[0, 1, 0.7, 0.5], [0, 1, 0.7, 0.5]])
    acc, tau, n = acceptance_stats(correct, w)
    assert acc == [0.5, 1.0, 0.5] and n == 2 and tau == (3 + 1) / 2


def test_decode_chain_follows_the_anchors_decoding_meets():
    # rows: blocks at consecutive generated positions; slot 0 is the anchor (no weight)
    correct = torch.tensor([[True, True, True, False],   # position 0: 2 accepted -> tau 3, next at 3
                            [True, True, True, True],    # position 1: never an anchor
                            [True, True, True, True],
                            [True, False, True, True],   # position 3: 0 accepted -> tau 1
                            [True, True, True, True],    # position 4: all in range accepted -> cut at the end
                            [True, True, True, True],
                            [True, False, False, False]])  # padding row (no weight)
    w = torch.tensor([[0, 1, 0.7, 0.5]] * 5 + [[0, 1, 0, 0], [0, 0, 0, 0]])
    assert decode_chain(correct, w) == [3, 1, 2]  # 6 valid anchors: 3 + 1 + 2 tokens after the first


def test_held_out_correctness_counts_only_what_decoding_can_propose():
    from types import SimpleNamespace

    from training.draft import proposals

    logits = torch.tensor([[0.1, 0.5, 0.2, 0.0, 0.9]])  # the best id (4) lies above a 3-id proposal vocabulary
    assert proposals(SimpleNamespace(proposal_vocab_size=None), logits).tolist() == [4]
    assert proposals(SimpleNamespace(proposal_vocab_size=3), logits).tolist() == [1]
    chosen = SimpleNamespace(proposal_vocab_size=None, proposal_ids=torch.tensor([0, 2, 3]))
    assert proposals(chosen, logits).tolist() == [2]  # the best of the ids it may propose, as an id


def test_decode_chain_on_a_greedy_reply_equals_what_decoding_measures():
    """The held-out `tau_decode` reads the acceptance lengths real DFlash decoding has: on the
    speed-demo pair's own greedy reply (a code completer: it writes the whole 48 tokens), cycle
    for cycle."""
    from engine.config import EngineConfig, SamplingConfig
    from engine.events import Finished
    from engine.runtime import LocalEngine
    from engine.shipped import SHIPPED_PAIRS, pair_dirs
    from training.draft import DraftTrainConfig, draft_batch_loss

    target, draft = pair_dirs(next(pair for pair in SHIPPED_PAIRS if pair.name == "tiny-coder-fast"))
    engine = LocalEngine.load(EngineConfig(target=str(target), draft=str(draft), threads=1))
    prompt = engine.encode("def parse(text):\n", raw=True)
    finished = [e for e in engine.generate(prompt, SamplingConfig(max_new_tokens=48)) if isinstance(e, Finished)][0]
    assert finished.reason == "length" and sum(finished.acceptance_lengths) == 47
    assert max(finished.acceptance_lengths) > 2  # drafts accepted: the chain is not trivially all ones
    seq = torch.tensor(prompt + list(finished.token_ids))
    models = engine.models
    cfg = DraftTrainConfig(block_size=models.draft.block_size)
    with torch.no_grad():
        _, correct, weight = draft_batch_loss(models.draft, models.target, [(seq, len(prompt))], cfg,
                                              loss_weights(cfg.block_size, cfg.decay_gamma()), None,
                                              torch.device("cpu"), eval_anchors=len(seq))
    assert decode_chain(correct[0], weight[0]) == list(finished.acceptance_lengths)


def test_warmup_stable_decay_holds_the_peak_and_cools_any_checkpoint():
    long_run = Budget(max_minutes=600)
    start = decay_start(long_run, 30)
    assert math.isclose(start, 0.95)
    assert decay_start(long_run, None) is None
    lrs = [cosine_lr(long_run.progress(0, 0, m * 60), 3e-4, 0.03, 0.1, start) for m in (100, 300, 569)]
    assert lrs == [3e-4] * 3  # after warmup the peak is held until the last 30 minutes
    assert cosine_lr(1.0, 3e-4, 0.03, 0.1, start) == pytest.approx(3e-5)
    # a checkpoint at minute 120, resumed with a budget of 120 + 30 minutes: the decay starts right there
    branch = Budget(max_minutes=150)
    at_checkpoint = branch.progress(0, 0, 120 * 60)
    assert cosine_lr(at_checkpoint, 3e-4, 0.03, 0.1, decay_start(branch, 30)) == pytest.approx(3e-4)
    halfway = cosine_lr(branch.progress(0, 0, 135 * 60), 3e-4, 0.03, 0.1, decay_start(branch, 30))
    assert halfway == pytest.approx(3e-4 * (0.1 + 0.9 * 0.5))
    with pytest.raises(InvalidRequestError, match="needs --max-minutes"):
        decay_start(Budget(max_steps=100), 30)


def test_budget_schedule_and_loop_detector():
    assert Budget(max_steps=10).progress(5, 0, 0) == 0.5
    assert Budget(max_steps=100, max_minutes=1).progress(5, 0, 45) == 0.75
    assert cosine_lr(0.0, 1.0, 0.1) < cosine_lr(0.1, 1.0, 0.1) == 1.0
    assert math.isclose(cosine_lr(1.0, 1.0, 0.1, 0.1), 0.1)
    gov = ThreadGovernor(2, period=2, probe_every=100)
    assert gov.current == 2
    for rate in (100, 100):  # 2 threads measured slow...
        gov.step(rate)
    assert gov.current == 1  # ...probe 1 thread
    for rate in (500, 500):
        gov.step(rate)
    assert gov.current == 1  # 1 thread is faster: stay
    torch.set_num_threads(2)
    assert is_loop(list(range(10)) * 5)
    assert not is_loop(list(range(60)))


def test_training_forward_matches_inference_view(tmp_path, tokenizer_dir):
    """A block trained among others, with the mask, must see exactly what the draft sees at
    inference: context features strictly before its anchor, and its own block."""
    from engine.draft import DFlashDraftModel, new_draft_config
    from engine.features import capture_hidden
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(str(tiny_target(tmp_path, tokenizer_dir))).eval()
    cfg = new_draft_config(target.config, 1, 4, mask_token_id=1, target_layer_ids=[0, 2])
    torch.manual_seed(0)
    draft = DFlashDraftModel(cfg).eval()
    seq = torch.randint(10, 200, (1, 16))
    with torch.no_grad(), capture_hidden(target, [0, 2]) as cap:
        target(input_ids=seq)
        feats = cap.take()
    anchors, B = torch.tensor([5, 9, 11]), 4
    ids, pos = block_inputs(seq[0], anchors, B, 1)
    mask = training_mask(anchors, torch.ones(3, dtype=torch.bool), 16, B)
    emb = draft.embed(target.get_input_embeddings(), ids[None])
    with torch.no_grad():
        h_train = draft(emb, feats, torch.cat([torch.arange(16), pos])[None], attention_mask=mask[None, None])
        for n, a in enumerate(anchors.tolist()):
            e = draft.embed(target.get_input_embeddings(), ids[None, n * B : (n + 1) * B])
            p = torch.cat([torch.arange(a), torch.arange(a, a + B)])[None]
            h_inf = draft(e, feats[:, :a], p)
            torch.testing.assert_close(h_train[:, n * B : (n + 1) * B], h_inf, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- draft: the command


DRAFT_ARGS = ["--layers", "1", "--block-size", "4", "--batch-size", "2", "--anchors", "4",
              "--num-sequences", "6", "--eval-sequences", "2", "--prompt-tokens", "24",
              "--new-tokens", "10", "--gen-batch", "4", "--no-progress", "--threads", "2"]


@pytest.mark.parametrize("arch,cache_gb", [("qwen3", "4"), ("llama", "0")])
def test_train_draft_smoke_resume_and_load(tmp_path, corpus, tokenizer_dir, arch, cache_gb):
    from engine.draft import load_draft

    target = tiny_target(tmp_path, tokenizer_dir, arch)
    out = tmp_path / "draft"
    args = ["train", "draft", "--target", str(target), "--out", str(out), "--corpus", str(corpus),
            "--cache-features-gb", cache_gb, *DRAFT_ARGS] + (["--trim-loops"] if arch == "llama" else [])
    assert cli(args + ["--max-steps", "2"]) == 0
    assert cli(args + ["--max-steps", "3"]) == 0
    log = [json.loads(line) for line in (out / "_train" / "log.jsonl").read_text().splitlines()]
    assert [e["step"] for e in log if e["event"] == "resume"] == [2]
    assert sum(e["event"] == "generate" for e in log) == 2  # generation ran once (held-out + train)
    final = [e for e in log if e["event"] == "eval"][-1]
    assert final["step"] == 3 and len(final["position_acc"]) == 3
    assert 1 <= final["tau_decode"] <= 4  # the held-out decode chain, at most a block per cycle
    draft = load_draft(out)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["block_size"] == 4
    tok_mask = 1  # <|mask|> is the second special token
    assert cfg["dflash_config"]["mask_token_id"] == tok_mask == draft.mask_token_id
    assert cfg["num_target_layers"] == 4 and len(draft.layers) == 1
    ids = cfg["dflash_config"]["target_layer_ids"]
    assert ids == sorted(set(ids)) and all(0 <= i < 4 for i in ids)
    if arch == "llama":  # --trim-loops: no continuation goes on past a second copy of a repeated span
        pool = SequencePool.load(out / "_train" / "train_sequences.pt")
        for seq, start in zip(pool.seqs, pool.prompt_lens):
            continuation = seq[start:].tolist()
            assert trim_repetition(continuation) == len(continuation)


def test_trim_repetition_keeps_two_copies_of_the_first_loop():
    assert trim_repetition(list(range(20))) == 20  # nothing repeats
    loop = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]  # a 10-token span, then copies of it
    assert trim_repetition([50, 51] + loop * 4) == 2 + 20
    assert trim_repetition([7] * 30) == 16  # period 1: the 8-token span, twice
    assert trim_repetition([1, 2] * 3 + [9] * 5) == 11  # short repeats (under 8 tokens) are kept
    assert trim_repetition([3, 4] * 10) == 16  # period 2: a whole-period span of 8, twice
    assert trim_repetition([]) == 0


def test_train_draft_init_starts_from_given_weights_and_rejects_a_mismatch(tmp_path, corpus, tokenizer_dir, capsys):
    from safetensors.torch import load_file

    target = tiny_target(tmp_path, tokenizer_dir)
    base = ["train", "draft", "--target", str(target), "--corpus", str(corpus), *DRAFT_ARGS]
    first = tmp_path / "first"
    assert cli(base + ["--out", str(first), "--max-steps", "2"]) == 0
    assert "regenerate" not in capsys.readouterr().err  # --no-progress: no bar in any phase
    start = load_file(str(first / "model.safetensors"))

    # zero training steps after --init: the saved draft is exactly the initial one
    tuned = tmp_path / "tuned"
    assert cli(base + ["--out", str(tuned), "--init", str(first), "--max-steps", "1", "--seed", "5",
                       "--lr", "0"]) == 0
    after = load_file(str(tuned / "model.safetensors"))
    assert after.keys() == start.keys()
    assert all(torch.equal(after[k], start[k]) for k in start)
    log = (tuned / "_train" / "log.jsonl").read_text()
    assert json.loads(log.splitlines()[0])["config"]["init_from"] == str(first)

    # a deeper --layers grows the draft: the first layer is the initial one, the new one adds nothing yet
    grown = tmp_path / "grown"
    deeper = base + ["--out", str(grown), "--init", str(first), "--max-steps", "1", "--lr", "0"]
    deeper[deeper.index("--layers") + 1] = "2"
    assert cli(deeper) == 0
    after = load_file(str(grown / "model.safetensors"))
    assert all(torch.equal(after[k], start[k]) for k in start)
    assert not after["layers.1.self_attn.o_proj.weight"].any() and not after["layers.1.mlp.down_proj.weight"].any()
    assert "1 more layers" in capsys.readouterr().out

    # --target-layer-ids adding a layer grows fc: the old features keep their weights, the new one starts unread
    ids = json.loads((first / "config.json").read_text())["dflash_config"]["target_layer_ids"]
    extra = next(i for i in range(4) if i not in ids)
    wider = base + ["--out", str(tmp_path / "wider"), "--init", str(first), "--max-steps", "1", "--lr", "0",
                    "--target-layer-ids", ",".join(map(str, ids + [extra]))]
    assert cli(wider) == 0
    fc, old_fc = load_file(str(tmp_path / "wider" / "model.safetensors"))["fc.weight"], start["fc.weight"]
    assert torch.equal(fc[:, :old_fc.shape[1]], old_fc) and not fc[:, old_fc.shape[1]:].any()
    dropped = base + ["--out", str(tmp_path / "dropped"), "--init", str(first), "--max-steps", "1",
                      "--target-layer-ids", str(extra)]
    assert cli(dropped) == 2
    assert f"it reads target layers {ids}" in capsys.readouterr().err

    # a draft of another block size cannot be fine-tuned as block 8
    bad = base + ["--out", str(tmp_path / "bad"), "--init", str(first), "--max-steps", "1"]
    bad[bad.index("--block-size") + 1] = "8"
    assert cli(bad) == 2
    assert "block size is 4, --block-size is 8" in capsys.readouterr().err


def test_grow_draft_adds_identity_layers_that_keep_the_proposals():
    from training.draft import grow_draft
    from tests.tiny_models import tiny_draft, tiny_target as tiny_memory_target

    target = tiny_memory_target()
    small = tiny_draft(target, seed=1, layers=2, target_layer_ids=[0, 2])
    deep = tiny_draft(target, seed=2, layers=4, target_layer_ids=[0, 1, 2, 3])  # also reads layers 1 and 3
    assert grow_draft(deep, small) == 2
    ctx, block = 6, 8
    noise = torch.randn(1, block, 64)
    per_layer = {i: torch.randn(1, ctx, 64) for i in range(4)}
    features = {d: torch.cat([per_layer[i] for i in d.target_layer_ids], -1) for d in (small, deep)}
    positions = torch.arange(ctx + block)[None]
    with torch.no_grad():
        assert torch.allclose(deep(noise, features[deep], positions), small(noise, features[small], positions),
                              atol=1e-6)
    new_layer = deep.layers[3]
    assert not new_layer.self_attn.o_proj.weight.any() and not new_layer.mlp.down_proj.weight.any()
    assert torch.equal(new_layer.self_attn.q_proj.weight, small.layers[1].self_attn.q_proj.weight)
    with pytest.raises(ValueError, match="cannot shrink"):
        grow_draft(small, deep)
    with pytest.raises(ValueError, match="still read target layers"):
        grow_draft(tiny_draft(target, layers=2, target_layer_ids=[1, 3]), small)


def test_line_aligned_prefixes_are_whole_lines_within_the_budget(tokenizer_dir):
    import random

    from transformers import AutoTokenizer

    from training.draft import line_aligned_prefix

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    lines = textwrap.dedent(FUNC.format(name="compute_sum", what="sum", cls="SumBox")).splitlines(keepends=True)
    rng = random.Random(0)
    seen_def = False
    for _ in range(40):
        ids = line_aligned_prefix(lines, tok, 40, 8, rng)
        if ids is None:
            continue
        text = tok.decode(ids)
        assert 8 <= len(ids) <= 40 and text.endswith("\n")
        assert any("".join(lines[i:]).startswith(text) for i in range(len(lines)))  # starts at a line
        seen_def |= text.lstrip().startswith(("def ", "class "))
    assert seen_def


@pytest.mark.parametrize("name, steps", [
    ("rebuild_tiny_coder.sh", ["tokenizer", "target", "draft", "draft", "target", "draft", "draft", "draft", "draft",
                               "target", "draft", "draft", "draft", "draft", "proposals", "eval"]),
    ("train_coder.sh", ["target", "target", "target", "draft", "proposals", "draft", "proposals", "draft", "proposals", "draft", "proposals",
                         "draft", "proposals", "draft", "proposals", "eval"]),
])
def test_the_training_scripts_are_valid_bash_and_every_command_parses(name, steps):
    """scripts/rebuild_tiny_coder.sh is the documented way to rebuild both shipped pairs (~28 h),
    and it runs scripts/train_coder.sh for the default pair's last steps: a renamed or removed flag
    must fail here, not hours into a rebuild."""
    from app.cli import build_parser

    script = Path(__file__).resolve().parents[1] / "scripts" / name
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text().replace("\\\n", " ")
    variables = dict(re.findall(r'^([A-Z_]+)="([^"]*)"$', text, flags=re.M))
    variables.update(re.findall(r'^([A-Z_0-9]+)=\$\{[A-Z_0-9]+:-([^}]*)\}$', text, flags=re.M))
    commands = [line.strip() for line in text.splitlines() if line.strip().startswith("dflash-studio ")]
    assert [c.split()[2] for c in commands if c.split()[1] == "train"] == steps
    if name == "rebuild_tiny_coder.sh":
        assert "bash scripts/train_coder.sh" in text
    parser = build_parser()
    for command in commands:
        for var, value in sorted(variables.items(), key=lambda kv: -len(kv[0])):
            command = command.replace(f'"${var}"', value).replace(f"${var}", value)
        command = re.sub(r'"\$\{[A-Z_0-9]+:-([^}]*)\}"', r"\1", command)
        argv = shlex.split(command.split("#")[0])[1:]
        parser.parse_args(argv)  # SystemExit(2) on an unknown or malformed flag


# ---------------------------------------------------------------- proposal ids


def test_most_written_ids_rank_by_count_break_ties_by_id_and_top_up_with_the_first_ids():
    from collections import Counter

    from training.proposal_vocab import coverage, most_written

    counts = Counter({40: 9, 7: 3, 12: 3, 90: 1})
    assert most_written(counts, 3, 100) == [7, 12, 40]  # 90 is rarer; 7 and 12 tie, both kept
    assert most_written(counts, 2, 100) == [7, 40]  # the tie goes to the earlier merge
    assert most_written(counts, 6, 100) == [0, 1, 7, 12, 40, 90]  # fewer written ids than asked
    assert coverage(counts, [7, 40]) == 12 / 16
    with pytest.raises(Exception, match="--size"):
        most_written(counts, 101, 100)


def test_train_proposals_counts_the_target_replies_and_the_draft_then_proposes_only_those_ids(
        tmp_path, corpus, tokenizer_dir, capsys):
    from transformers import AutoModelForCausalLM

    from engine.draft import DFlashDraftModel, load_draft, new_draft_config, save_draft
    from training.proposal_vocab import reply_token_counts

    target = tiny_target(tmp_path, tokenizer_dir)
    model = AutoModelForCausalLM.from_pretrained(str(target))
    draft_dir = save_draft(DFlashDraftModel(new_draft_config(model.config, 1, 4, mask_token_id=1)), tmp_path / "draft")
    config = json.loads((draft_dir / "config.json").read_text())
    config["dflash_config"]["proposal_vocab_size"] = 8  # replaced, not combined
    (draft_dir / "config.json").write_text(json.dumps(config))
    work = tmp_path / "work"
    args = ["train", "proposals", "--target", str(target), "--draft", str(draft_dir), "--size", "24",
            "--corpus", str(corpus), "--num-sequences", "6", "--new-tokens", "12", "--threads", "2", "--no-progress"]
    assert cli(args + ["--work", str(work)]) == 0
    assert "the 24 most written ids cover" in capsys.readouterr().out
    written = json.loads((draft_dir / "config.json").read_text())["dflash_config"]
    assert "proposal_vocab_size" not in written and len(written["proposal_ids"]) == 24
    pool = SequencePool.load(work / "proposal_sequences.pt")
    assert len(pool) == 6
    counts = reply_token_counts([pool])
    top = sorted(counts, key=lambda i: (-counts[i], i))[:5]
    assert set(top) <= set(written["proposal_ids"])
    assert load_draft(draft_dir).proposal_ids.tolist() == written["proposal_ids"]
    # counting an existing pool gives the same ids without generating anything
    (draft_dir / "config.json").write_text(json.dumps(config))
    assert cli(["train", "proposals", "--target", str(target), "--draft", str(draft_dir), "--size", "24",
                "--pool", str(work / "proposal_sequences.pt")]) == 0
    assert json.loads((draft_dir / "config.json").read_text())["dflash_config"]["proposal_ids"] == written["proposal_ids"]
    assert cli(["train", "proposals", "--target", str(target), "--draft", str(draft_dir)]) == 2
    assert "--pool" in capsys.readouterr().err
    assert cli(["train", "proposals", "--target", str(target), "--draft", str(draft_dir), "--size", "100000",
                "--pool", str(work / "proposal_sequences.pt")]) == 2


def test_own_replies_are_the_model_greedy_answers_kept_for_a_resume(tmp_path, tokenizer_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from training.own_replies import own_replies, reply_prompts
    from training.request_data import is_held
    from training.task_families import all_tasks

    target_dir = tiny_target(tmp_path, tokenizer_dir)
    model = AutoModelForCausalLM.from_pretrained(str(target_dir))
    tokenizer = AutoTokenizer.from_pretrained(str(target_dir))
    rows = reply_prompts(5, seed=3)
    held = {t.request for t in all_tasks() if is_held(t.code)}
    assert len(rows) == 5 and not held & {r["request"] for r in rows}  # training requests only
    path = tmp_path / "work" / "own_replies.jsonl"
    replies = own_replies(path, model, tokenizer, 5, seed=3)
    assert [r["user"] for r in replies] == [r["user"] for r in rows] and all(isinstance(r["reply"], str) for r in replies)
    assert own_replies(path, None, None, 5, seed=3) == replies  # read back, not generated again (no model given)


def test_own_replies_need_a_model_to_answer_and_the_coder_data(tmp_path, tokenizer_dir, capsys):
    args = ["train", "target", "--out", str(tmp_path / "t"), "--tokenizer", str(tokenizer_dir), "--data", "coder",
            "--own-replies", "10", "--max-steps", "1", "--no-progress"]
    assert cli(args) != 0
    assert "--own-replies needs --init" in capsys.readouterr().err


def test_a_decay_in_minutes_needs_a_time_budget(tmp_path, tokenizer_dir, capsys):
    args = ["train", "target", "--out", str(tmp_path / "t"), "--tokenizer", str(tokenizer_dir),
            "--decay-minutes", "30", "--max-steps", "1", "--no-progress"]
    assert cli(args) != 0
    assert "--decay-minutes needs --max-minutes" in capsys.readouterr().err
    assert not (tmp_path / "t").exists()  # refused before any work


TRAIN_REFUSALS = [  # (command after `train`, with {t}: a saved target, {tok}: a tokenizer, {x}: a missing path; says)
    ("tokenizer --corpus {x}", "--corpus not found: {x} (no such directory)"),
    ("target --tokenizer {x}", "--tokenizer not found: {x} (no such directory)"),
    ("target --tokenizer {empty}", "holds no tokenizer"),
    ("target --tokenizer {tok} --corpus {empty}", "--corpus {empty} holds no .py file"),
    ("target --init {x}", "--init not found"),
    ("target --init {t} --unlikelihood {x}", "--unlikelihood not found"),
    ("draft --target {x}", "target not found: {x} (no such directory)"),
    ("draft --target {t} --corpus {x}", "--corpus not found"),
    ("draft --target {t} --init {x}", "--init not found"),
    ("draft --target {t} --prompts {x}", "--prompts {x}: no such file (nor one of the mixes: requests"),
    ("draft --target {t} --prompts {bad}", "bad.jsonl:2: each line must be a JSON object with a 'prompt' string"),
    ("proposals --target {x} --draft {t}", "target not found"),
    ("proposals --target {t} --draft {x}", "--draft not found"),
    ("proposals --target {t} --draft {t} --pool {x}", "--pool: no such file: {x}"),
    ("target --tokenizer {tok} --device gpu", "--device 'gpu' is not a device torch knows"),
    ("target --tokenizer {tok} --device cuda:99", "--device cuda:99: "),
    ("draft --target {t} --device gpu", "--device 'gpu' is not a device torch knows"),
    ("target --tokenizer {tok} --heads 4 --kv-heads 3", "--heads 4 is not a multiple of --kv-heads 3"),
    ("target --tokenizer {tok} --heads 2 --kv-heads 4", "--heads 2 is not a multiple of --kv-heads 4"),
    ("target --tokenizer {tok} --head-dim 7", "--head-dim 7 must be even"),
    ("target --tokenizer {tok} --seq-len 2048 --max-positions 1024", "--seq-len 2048 is above the model's 1024 positions"),
    ("target --init {t} --seq-len 4096", "--seq-len 4096 is above the model's"),
    ("draft --target {t} --target-layer-ids 0,99", "target layers [0, 99] are out of range: the target has"),
]


@pytest.mark.parametrize("command, says", TRAIN_REFUSALS, ids=[c for c, _ in TRAIN_REFUSALS])
def test_a_wrong_path_is_refused_in_one_line_before_any_work(tmp_path, tokenizer_dir, capsys, command, says):
    paths = {"t": tiny_target(tmp_path, tokenizer_dir), "tok": tokenizer_dir, "x": tmp_path / "missing",
             "empty": tmp_path / "empty", "bad": tmp_path / "bad.jsonl"}
    paths["empty"].mkdir()
    paths["bad"].write_text('{"prompt": "def f(a):"}\n{"messages": "hi"}\n')
    words = [word.format(**paths) for word in command.split()]
    capsys.readouterr()  # what saving the target printed
    out = tmp_path / "out"
    extra = {"tokenizer": ["--out", str(out)], "proposals": ["--work", str(out), "--no-progress"]}.get(
        words[0], ["--out", str(out), "--max-steps", "1", "--no-progress"])
    assert cli(["train", *words, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"dflash-studio: error: {err.split('error: ', 1)[1]}" and "\n" not in err  # one line
    assert says.format(**paths) in err
    assert not out.exists()  # refused before any work


@pytest.mark.parametrize("command, says", [
    ("target --batch-size 0", "argument --batch-size: must be at least 1 (got 0)"),
    ("target --max-minutes -5", "argument --max-minutes: must be above 0 (got -5)"),
    ("target --seq-len x", "argument --seq-len: 'x' is not an integer"),
    ("target --chat-fraction 1.5", "argument --chat-fraction: must be between 0 and 1 (got 1.5)"),
    ("draft --target T --block-size 1", "argument --block-size: must be between 2 and 16 (got 1)"),
    ("draft --target T --gen-fraction 1", "argument --gen-fraction: must be between 0.01 and 0.99"),
    ("proposals --target T --draft D --size 0", "argument --size: must be at least 1 (got 0)"),
    ("eval --max-new-tokens 0", "argument --max-new-tokens: must be at least 1 (got 0)"),
    ("draft --target T --target-layer-ids 1,x", "argument --target-layer-ids: '1,x' is not a comma-separated list"),
    ("draft --target T --target-layer-ids -1", "argument --target-layer-ids: layer numbers start at 0 (got -1)"),
])
def test_a_number_out_of_range_is_refused_by_the_option_that_takes_it(tmp_path, capsys, command, says):
    with pytest.raises(SystemExit) as exit_:
        cli(["train", *command.split(), "--out", str(tmp_path / "out")] if command.split()[0] in ("target", "draft")
            else ["train", *command.split()])
    assert exit_.value.code == 2 and says in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command, option", [
    ("tokenizer --out {f}", "out"),
    ("target --tokenizer {tok} --out {f}", "out"),
    ("target --tokenizer {tok} --out {o} --work {f}", "work"),
    ("draft --target {t} --out {f}", "out"),
    ("proposals --target {t} --draft {t} --work {f}", "work"),
])
def test_an_output_folder_that_is_a_file_is_refused_before_any_work(tmp_path, tokenizer_dir, capsys, command, option):
    paths = {"t": tiny_target(tmp_path, tokenizer_dir), "tok": tokenizer_dir, "f": tmp_path / "a-file",
             "o": tmp_path / "out"}
    paths["f"].write_text("kept")
    capsys.readouterr()
    assert cli(["train", *[word.format(**paths) for word in command.split()]]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"dflash-studio: error: --{option} {paths['f']} is a file; give a directory (it is made when missing)"
    assert paths["f"].read_text() == "kept" and not paths["o"].exists()


@pytest.mark.parametrize("mode", [[], ["--pass1"]], ids=["held-out replies", "pass@1"])
def test_an_eval_report_path_that_is_a_directory_is_refused_before_the_evaluation(tmp_path, capsys, mode):
    assert cli(["train", "eval", *mode, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"dflash-studio: error: --out {tmp_path} is a directory; give a file, such as {tmp_path / 'report.json'}"


def test_a_vocabulary_with_no_room_for_merges_is_refused(tmp_path, corpus, capsys):
    assert cli(["train", "tokenizer", "--out", str(tmp_path / "tok"), "--corpus", str(corpus), "--vocab-size", "5"]) == 2
    assert "--vocab-size 5 leaves no room for merges" in capsys.readouterr().err
    assert not (tmp_path / "tok").exists()
