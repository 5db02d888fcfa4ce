"""Targets whose rotary frequencies change with the furthest position of a forward (longrope:
Phi-3 / Phi-3.5 / Phi-4-mini, PhiMoE; dynamic NTK) decode as plain decoding does past the
boundary: every logit a reply chose from equals plain decoding's, at every block size and every
accept count, because no verify reaches across the boundary and a dynamic-NTK module starts
every reply from its own frequencies (engine/rope_limits.py). They stay on the eager path.

The twins' boundary is 16 positions, so a 7-token prompt and 40 new tokens cross it early."""

from __future__ import annotations

import pytest
import torch
import transformers as tf

from engine import decode as decode_module
from engine.compiled import CompiledPath
from engine.config import SamplingConfig
from engine.decode import generate
from engine.events import Finished
from engine.rope_limits import VerifyLimit, VerifyLimits, verify_limits
from tests.family_twins import FAMILIES, VOCAB, _common
from tests.test_families import NEW_TOKENS, PROMPT, oracle_propose
from tests.tiny_models import tiny_draft

BOUNDARY = 16
_FACTORS = dict(short_factor=[1.0] * 8, long_factor=[3.0] * 8, rope_theta=10000.0)

# name -> (config class, model class, settings); seed 2 is a twin whose tokens change when a
# verify crosses the boundary (other seeds change only the logits)
TWINS = {
    "phi3_longrope": (tf.Phi3Config, tf.Phi3ForCausalLM,
                      _common(max_position_embeddings=64, original_max_position_embeddings=BOUNDARY,
                              rope_parameters=dict(rope_type="longrope", **_FACTORS))),
    "llama_longrope": (tf.LlamaConfig, tf.LlamaForCausalLM,
                       _common(max_position_embeddings=64,
                               rope_parameters=dict(rope_type="longrope", original_max_position_embeddings=BOUNDARY,
                                                    **_FACTORS))),
    "llama_dynamic": (tf.LlamaConfig, tf.LlamaForCausalLM,
                      _common(max_position_embeddings=BOUNDARY,
                              rope_parameters=dict(rope_type="dynamic", factor=8.0, rope_theta=10000.0))),
    # one rope per layer kind: dynamic NTK on the full-attention layers only, sliding windows beside
    "gemma3_dynamic": (tf.Gemma3TextConfig, tf.Gemma3ForCausalLM,
                       {**FAMILIES["gemma3"][3], "max_position_embeddings": BOUNDARY, "rope_parameters": {
                           "full_attention": dict(rope_type="dynamic", factor=8.0, rope_theta=10000.0),
                           "sliding_attention": dict(rope_type="default", rope_theta=10000.0)}}),
}


def twin(name: str, seed: int = 2):
    config_class, model_class, settings = TWINS[name]
    torch.manual_seed(seed)
    model = model_class(config_class(**settings)).float().eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model


@torch.no_grad()
def reference(target, n: int = NEW_TOKENS, prompt=PROMPT) -> tuple[list[int], torch.Tensor]:
    """Plain greedy decoding's tokens and the logits [n, V] each was chosen from.

    Phi-3's reference is the uncached forward of each prefix: its own generate() means to compute
    the whole sequence again when it first passes the boundary (so that every position has the
    long factors), which is what an uncached forward computes. transformers 5.15's generate()
    drops the cache there but then feeds one token with no context, so it is no reference.
    The others' reference is transformers' own cached greedy generate(), one token per forward."""
    if target.config.model_type == "phi3":
        ids, rows = list(prompt), []
        for _ in range(n):
            rows.append(target(torch.tensor([ids]), use_cache=False).logits[0, -1])
            ids.append(int(rows[-1].argmax()))
        return ids[len(prompt):], torch.stack(rows)
    out = target.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          max_new_tokens=n, min_new_tokens=n, do_sample=False, output_logits=True,
                          return_dict_in_generate=True)
    return out.sequences[0, len(prompt):].tolist(), torch.cat(out.logits)


class ForwardLog:
    """Every forward of the target in a reply: the positions it ran and the logits it gave."""

    def __init__(self, target):
        self.forwards: list[tuple[list[int], torch.Tensor]] = []
        self.handle = target.register_forward_hook(self.record, with_kwargs=True)

    def record(self, _module, args, kwargs, output):
        ids = kwargs.get("input_ids")
        positions = kwargs.get("position_ids")
        positions = positions[0].tolist() if positions is not None else list(range(ids.shape[1]))
        logits = output.logits[0]
        self.forwards.append((positions, logits.detach().clone()))

    def logits_at(self, positions) -> torch.Tensor:
        """The logits the reply chose from at ``positions``: the last forward that ran each
        position (a rejected draft's position is run again by the next cycle)."""
        latest = {}
        for ran, logits in self.forwards:  # logits for a forward's last positions only (a prefill's last)
            latest.update({p: row for p, row in zip(ran[-logits.shape[0]:], logits)})
        return torch.stack([latest[p] for p in positions])

    def close(self):
        self.handle.remove()


def decode(target, block: int, backend=None, prompt=PROMPT) -> tuple[list[int], torch.Tensor, list]:
    draft = tiny_draft(target, block_size=max(block, 2)) if block > 1 else None
    log = ForwardLog(target)
    try:
        events = list(generate(target, draft, prompt, SamplingConfig(block_size=block, max_new_tokens=NEW_TOKENS),
                               backend=backend))
    finally:
        log.close()
    assert isinstance(events[-1], Finished), events[-1]
    chosen_at = range(len(prompt) - 1, len(prompt) + NEW_TOKENS - 1)
    return list(events[-1].token_ids), log.logits_at(chosen_at), log.forwards


def assert_same_logits(got: torch.Tensor, want: torch.Tensor):
    drift = ((got - want).abs().max() / want.abs().max()).item()
    assert drift < 1e-4, f"logits differ from plain decoding's by {drift:.1e} of their scale"


@pytest.fixture(scope="module", params=sorted(TWINS))
def case(request):
    target = twin(request.param)
    return request.param, target, *reference(target)


@pytest.mark.parametrize("block", [1, 4, 8, 16])
def test_every_logit_a_reply_chose_from_is_plain_decodings_past_the_boundary(case, block, monkeypatch):
    name, target, tokens, logits = case
    got, got_logits, _ = decode(target, block)  # the random draft: mostly rejected
    assert got == tokens, name
    assert_same_logits(got_logits, logits)
    if block > 1:  # every accept count, blocks that would straddle the boundary at every offset
        monkeypatch.setattr(decode_module, "propose", oracle_propose(tokens, VOCAB))
        got, got_logits, _ = decode(target, block)
        assert got == tokens, name
        assert_same_logits(got_logits, logits)


@pytest.mark.parametrize("name", sorted(TWINS))
@pytest.mark.parametrize("prompt_length", [BOUNDARY - 1, BOUNDARY, BOUNDARY + 5])
def test_a_prompt_that_ends_at_or_past_the_boundary(name, prompt_length):
    """The first verify starts at the boundary or past it: Phi-3 computes the sequence again
    only when its cache ends exactly at the boundary, as its own generate() does. The reference
    ran first on the same twin, so a dynamic-NTK module has seen a longer length before the
    reply: the reply still starts from the module's own frequencies, as a fresh model does
    (a prompt this long would not reset them)."""
    target = twin(name)
    prompt = [(7 * i + 3) % (VOCAB - 1) for i in range(prompt_length)]
    tokens, logits = reference(target, prompt=prompt)
    for block in (1, 8):
        got, got_logits, forwards = decode(target, block, prompt=prompt)
        assert got == tokens, (name, block)
        assert_same_logits(got_logits, logits)
        recomputes = [positions for positions, _ in forwards[1:] if positions[0] == 0]
        assert len(recomputes) == (name == "phi3_longrope" and prompt_length <= BOUNDARY), recomputes


@pytest.mark.parametrize("name", sorted(TWINS))
def test_no_verify_reaches_across_the_boundary(name, monkeypatch):
    target = twin(name)
    tokens, _ = reference(target)
    monkeypatch.setattr(decode_module, "propose", oracle_propose(tokens, VOCAB))
    _, _, forwards = decode(target, 8)
    verifies = [positions for positions, _ in forwards[1:]]  # after the prefill
    for positions in verifies:
        if positions[0] == 0:  # Phi-3's recompute: the whole sequence, once, at the boundary
            assert name == "phi3_longrope" and positions[-1] >= BOUNDARY
        else:
            assert positions[-1] < BOUNDARY or positions[0] >= BOUNDARY, positions
        if name.endswith("_dynamic") and positions[-1] >= BOUNDARY:
            assert len(positions) == 1, positions  # past a dynamic-NTK boundary, one token at a time
    recomputes = [p for p in verifies if p[0] == 0]
    assert len(recomputes) == (1 if name == "phi3_longrope" else 0)
    if name.endswith("_longrope"):  # past a longrope boundary, whole blocks again
        assert max(len(p) for p in verifies if p[0] >= BOUNDARY) == 8


def test_without_the_limits_a_verify_across_the_boundary_changes_the_reply(monkeypatch):
    """What the limits are for: the same run with them off drifts from plain decoding."""
    for name in ("llama_longrope", "llama_dynamic"):
        target = twin(name)
        tokens, logits = reference(target)
        monkeypatch.setattr(decode_module, "verify_limits", lambda config: VerifyLimits())
        monkeypatch.setattr(decode_module, "propose", oracle_propose(tokens, VOCAB))
        got, got_logits, _ = decode(target, 16)
        assert got != tokens, name
        with pytest.raises(AssertionError, match="logits differ"):
            assert_same_logits(got_logits, logits)
        monkeypatch.undo()


def test_a_target_with_such_a_rotary_embedding_stays_on_the_eager_path():
    """A static verify is padded past its real tokens: the padding's positions would decide the
    frequencies. The compiled path says why and the reply is still plain decoding's."""
    target = twin("phi3_longrope")
    tokens, _ = reference(target)
    path = CompiledPath(target, tiny_draft(target, block_size=8), 8)
    try:
        assert path.state == "unsupported" and path.label == "eager"
        assert path.error == ("its longrope rotary embedding changes with the furthest position of a forward, "
                              "padding included")
        assert decode(target, 8, backend=path)[0] == tokens
    finally:
        path.close()


def test_limits_are_read_from_the_configs_real_checkpoints_ship():
    # Phi-3-mini-128k-instruct / Phi-3.5-mini-instruct / Phi-4-mini-instruct: longrope past 4,096
    phi3 = tf.Phi3Config(hidden_size=3072, num_attention_heads=32, max_position_embeddings=131072,
                         original_max_position_embeddings=4096,
                         rope_scaling={"type": "longrope", "short_factor": [1.0] * 48, "long_factor": [2.0] * 48})
    assert verify_limits(phi3).limits == (VerifyLimit("longrope", 4096, recompute=True),)
    # a Llama fine-tune with dynamic NTK scaling
    dynamic = tf.LlamaConfig(max_position_embeddings=4096, rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    assert verify_limits(dynamic).limits == (VerifyLimit("dynamic", 4096),)
    # fixed frequencies for any forward: Llama 3.1's, Qwen3's YaRN, linear, none
    fixed = [tf.LlamaConfig(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
             tf.Qwen3Config(rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                          "original_max_position_embeddings": 32768}),
             tf.LlamaConfig(rope_scaling={"rope_type": "linear", "factor": 2.0}), tf.Qwen3Config()]
    assert all(not verify_limits(config).limits for config in fixed)
    # one rope per layer kind (Gemma 3): the kind that has a boundary is found
    gemma = tf.Gemma3TextConfig(max_position_embeddings=2048, rope_parameters={
        "full_attention": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
    assert verify_limits(gemma).limits == (VerifyLimit("dynamic", 2048),)


@pytest.mark.parametrize("start, block, room", [
    (0, 8, 8), (8, 8, 8), (9, 8, 7), (15, 8, 1), (16, 8, 8), (40, 16, 16)])
def test_a_block_is_shortened_to_end_at_the_boundary(start, block, room):
    assert VerifyLimit("longrope", 16).block_room(start, block) == room
    assert VerifyLimit("dynamic", 16).block_room(start, block) == (room if start < 16 else 1)
    assert VerifyLimits().block_room(start, block) == block
    assert VerifyLimit("longrope", 16, recompute=True).recompute_at(start) == (start == 16)
