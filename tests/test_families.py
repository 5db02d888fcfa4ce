"""Every target family decodes losslessly: greedy DFlash equals plain greedy decoding, token for
token, on tiny random twins of the real architectures (transformers' own classes), at every
block size and past every sliding window; the rollback leaves the target's cache exactly as
plain decoding leaves it; sampling keeps the target's distribution; a target whose cache cannot
be rolled back is refused in one line."""

from __future__ import annotations

import pytest
import torch
import transformers as tf

from engine import decode as decode_module
from engine.config import SamplingConfig
from engine.decode import generate
from engine.errors import UnsupportedTargetError
from engine.events import Failed, Finished
from engine.features import FeatureCapture
from engine.target_cache import TargetCache, check_rollback
from tests.family_twins import FAMILIES, WINDOW, family_twin
from tests.tiny_models import tiny_draft

PROMPT = [5, 17, 33, 2, 9, 41, 8]
NEW_TOKENS = 40  # the context reaches 47 tokens: past a 12-token window three times over


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    target = family_twin(request.param)
    return request.param, target, plain_greedy(target, PROMPT, NEW_TOKENS)


def plain_greedy(target, prompt, n):
    """transformers' own greedy generate(): the reference every DFlash run must equal."""
    out = target.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, len(prompt):].tolist()


def oracle_propose(reference, vocab):
    """A stand-in draft that knows the true continuation and gets a different number of leading
    proposals right in each cycle (0 .. B-1), so every accept count, every rollback length and
    full blocks with a bonus all happen within one reply."""

    cycles = []

    def propose(draft, target, draft_cache, pending, anchor, start, block):
        offset = start - len(PROMPT)  # reference[offset] is the anchor
        truth = reference[offset + 1: offset + block]
        truth += [0] * (block - 1 - len(truth))
        cycles.append(start)
        # a full block first (accept all, bonus), then 3 is prime to 4, 8 and 16: the counts come round
        correct = block - 1 if len(cycles) == 1 else (len(cycles) * 3) % block
        proposals = [t if j < correct else (t + 1) % vocab for j, t in enumerate(truth)]
        return proposals, torch.zeros(block - 1, vocab)

    return propose


def decode(target, draft, block, **sampling):
    events = list(generate(target, draft, PROMPT, SamplingConfig(block_size=block, **sampling)))
    assert isinstance(events[-1], Finished), events[-1]
    return events


@pytest.mark.parametrize("block", [1, 4, 8, 16])
def test_greedy_dflash_equals_plain_greedy_on_every_family(family, block, monkeypatch):
    name, target, reference = family
    draft = tiny_draft(target, block_size=max(block, 2))
    # the real (random) draft network: features tapped from the twin's layers, mostly rejected
    events = decode(target, draft, block, max_new_tokens=NEW_TOKENS)
    assert list(events[-1].token_ids) == reference, name
    # the stand-in that accepts 0..B-1 drafts: every rollback length, past every window
    monkeypatch.setattr(decode_module, "propose", oracle_propose(reference, target.config.vocab_size))
    events = decode(target, draft, block, max_new_tokens=NEW_TOKENS)
    assert list(events[-1].token_ids) == reference, name
    if block > 1:
        accepted = {cycle.accepted for cycle in events[1:-1]}
        assert len(accepted) >= min(block, 4) and max(accepted) == block - 1, accepted


@pytest.mark.parametrize("name", ["gemma3", "qwen3_5", "qwen3_next", "gpt_oss"])
def test_after_every_verify_the_cache_holds_what_plain_decoding_holds(name):
    """The rollback contract itself: after each verify (whatever was accepted), every layer's
    state (sliding K/V within the window, full K/V, conv and recurrent states) equals the state a
    plain one-token-at-a-time decode of the same tokens leaves."""
    target = family_twin(name)
    reference = plain_greedy(target, PROMPT, 30)
    tokens = PROMPT + reference
    dflash, plain = TargetCache(target), TargetCache(target)
    try:
        with torch.inference_mode():
            for cache in (dflash, plain):
                target(input_ids=torch.tensor([PROMPT]), past_key_values=cache.cache, use_cache=True)
                cache.commit(len(PROMPT))
            position, block, step = len(PROMPT), 6, 0
            while position + block < len(tokens):
                keep = 1 + step % block  # anchor + (0 .. B-1) accepted drafts
                wrong = [(t + 1) % target.config.vocab_size for t in tokens[position + keep: position + block]]
                dflash.before_verify()
                target(input_ids=torch.tensor([tokens[position: position + keep] + wrong]),
                       position_ids=torch.arange(position, position + block)[None],
                       past_key_values=dflash.cache, use_cache=True)
                dflash.commit(position + keep)
                for offset in range(keep):
                    target(input_ids=torch.tensor([[tokens[position + offset]]]),
                           position_ids=torch.tensor([[position + offset]]), past_key_values=plain.cache,
                           use_cache=True)
                    plain.commit(position + offset + 1)
                assert_same_state(dflash.cache, plain.cache, (name, position, keep))
                position, step = position + keep, step + 1
    finally:
        dflash.close()
        plain.close()


def assert_same_state(cache, reference, where):
    for index, (layer, ref) in enumerate(zip(cache.layers, reference.layers)):
        if getattr(ref, "keys", None) is not None:
            assert layer.keys.shape == ref.keys.shape, (where, index)
            torch.testing.assert_close(layer.keys, ref.keys, atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(layer.values, ref.values, atol=1e-5, rtol=1e-4)
            if hasattr(ref, "sliding_window"):
                assert layer.keys.shape[-2] <= WINDOW - 1, (where, index)
        for states, ref_states in ((getattr(layer, "conv_states", {}), getattr(ref, "conv_states", {})),
                                   (getattr(layer, "recurrent_states", {}), getattr(ref, "recurrent_states", {}))):
            for i, state in ref_states.items():
                torch.testing.assert_close(states[i], state, atol=1e-5, rtol=1e-4, msg=lambda m: f"{where} {index}: {m}")


def test_feature_taps_read_the_outputs_of_the_chosen_layers(family):
    """``target_layer_ids`` tap the OUTPUT of decoder layer l (transformers' hidden_states[l + 1]),
    the last layer after the final norm, as transformers reports it."""
    name, target, _ = family
    layers = target.config.num_hidden_layers
    ids = [0, layers // 2, layers - 1]
    capture = FeatureCapture(target, ids).attach()
    try:
        with torch.no_grad():
            out = target(input_ids=torch.tensor([PROMPT]), output_hidden_states=True)
        tapped = capture.take()
    finally:
        capture.detach()
    expected = torch.cat([out.hidden_states[i + 1] for i in ids], dim=-1)
    torch.testing.assert_close(tapped, expected, msg=lambda m: f"{name}: {m}")


def sampling_setup(name: str, monkeypatch):
    """(target twin, exact marginals of its first four tokens at T = 1, a block-3 draft) for the
    chi-square test, with the draft's proposals drawn from a stand-in that disagrees with the
    target (its logits doubled), on a twin whose sliding window (3) the context passes."""
    from tests import test_engine_sampling as sampling_tests

    window = {"sliding_window": 3} if "sliding_window" in FAMILIES[name][3] else {}
    target = family_twin(name, vocab_size=sampling_tests.VOCAB, sharpness=40.0, **window)
    marginals = sampling_tests.exact_marginals(target, 4, 1.0)
    proposal_logits = torch.stack([m.clamp_min(1e-9).log() * 2.0 for m in marginals[1:]])
    monkeypatch.setattr(decode_module, "propose", sampling_tests.stand_in_draft(target, proposal_logits, 1.0))
    return target, marginals, tiny_draft(target, block_size=3)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_speculative_sampling_keeps_each_familys_distribution(name, monkeypatch):
    """At T > 0 every emitted token is the target's own sample: chi-square on the first four
    tokens' marginals (block 3, so the second cycle starts from a rolled-back state), on a twin
    whose sliding window (3) the seven-token context passes."""
    from tests import test_engine_sampling as sampling_tests

    target, marginals, draft = sampling_setup(name, monkeypatch)
    n = 400
    counts = [torch.zeros(sampling_tests.VOCAB) for _ in marginals]
    accepted = 0
    for seed in range(n):
        events = list(generate(target, draft, sampling_tests.PROMPT,
                               SamplingConfig(max_new_tokens=4, block_size=3, temperature=1.0, seed=seed,
                                              proposal="sample")))
        assert isinstance(events[-1], Finished), events[-1]
        for k, counter in enumerate(counts):
            counter[events[-1].token_ids[k]] += 1
        accepted += events[1].accepted
    assert accepted > n * 0.2, accepted  # the accept paths ran
    for k, (counter, probs) in enumerate(zip(counts, marginals), 1):
        stat, dof = sampling_tests.chi_square(counter, probs, n)
        assert stat < 31.3, (name, k, stat, dof, counter / n, probs)  # p = 0.001 for <= 11 dof


# Families whose recurrent state lives in a mixer DFlash does not recompute (Mamba-style and
# short-convolution layers): refused by name at load, never decoded wrongly.
UNSUPPORTED = {
    "lfm2": (tf.Lfm2Config, tf.Lfm2ForCausalLM,
             dict(layer_types=["conv", "full_attention"], num_hidden_layers=2)),
    "falcon_h1": (tf.FalconH1Config, tf.FalconH1ForCausalLM, dict(num_hidden_layers=2)),
}


def unsupported_twin(name):
    config_class, model_class, settings = UNSUPPORTED[name]
    torch.manual_seed(0)
    config = config_class(vocab_size=96, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                          num_key_value_heads=2, **settings)
    return model_class(config).eval()


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_a_target_whose_cache_cannot_be_rolled_back_is_refused_in_one_line(name):
    target = unsupported_twin(name)
    with pytest.raises(UnsupportedTargetError) as refused:
        check_rollback(target)
    message = str(refused.value)
    assert "\n" not in message and type(target).__name__ in message and ("roll back" in message or "recompute" in message)
    # the decode loop refuses it the same way, as an event, before any token is produced
    events = list(generate(target, None, PROMPT, SamplingConfig(max_new_tokens=4, block_size=1)))
    assert len(events) == 1 and isinstance(events[0], Failed) and events[0].kind == "UnsupportedTargetError"


def test_loading_refuses_such_a_target_before_reading_its_weights(tmp_path, monkeypatch):
    from engine import loading
    from tests.tiny_models import tiny_tokenizer

    unsupported_twin("lfm2").save_pretrained(tmp_path, safe_serialization=True)
    tiny_tokenizer().save_pretrained(tmp_path)
    monkeypatch.setattr("transformers.AutoModelForCausalLM.from_pretrained",
                        lambda *a, **k: pytest.fail("weights were read before the refusal"))
    with pytest.raises(UnsupportedTargetError, match="Lfm2ForCausalLM"):
        loading.load_target(tmp_path, torch.device("cpu"), torch.float32)


def test_a_supported_family_loads_from_disk_and_decodes_like_plain(tmp_path):
    """The loader takes a saved twin (here Qwen3.5: linear attention) as a user's checkpoint."""
    from engine import loading
    from tests.tiny_models import tiny_tokenizer

    family_twin("qwen3_5").save_pretrained(tmp_path, safe_serialization=True)
    tiny_tokenizer().save_pretrained(tmp_path)
    target, _ = loading.load_target(tmp_path, torch.device("cpu"), torch.float32)
    reference = plain_greedy(target, PROMPT, 20)
    events = decode(target, tiny_draft(target, block_size=8), 8, max_new_tokens=20)
    assert list(events[-1].token_ids) == reference


@pytest.mark.parametrize("name", ["gemma3", "mimo_v2_flash"])
def test_a_draft_made_for_a_target_with_rope_per_layer_kind_takes_the_full_layers_rope(name):
    """Gemma 3 and MiMo give RoPE per layer kind; draft layers are full attention, so a draft
    config made for them takes the full layers' parameters (flat, as vLLM and z-lab read them)
    rather than a nested dict that Qwen3's RoPE would read as the default base."""
    from engine.draft import new_draft_config

    target = family_twin(name)
    rope = new_draft_config(target.config, 1, 8, target.config.vocab_size - 1).rope_parameters
    assert rope["rope_theta"] == target.config.rope_parameters["full_attention"]["rope_theta"]
    assert not any(isinstance(value, dict) for value in rope.values())


def multimodal_packaging(name):
    """Qwen3.5 / 3.6, Gemma 3 and Gemma 4 checkpoints are published as vision-language models (a
    text config inside a composite one): a twin saved that way, with a one-layer vision tower.
    The Gemma 4 one is an E model's: its last layers share earlier layers' keys and values."""
    torch.manual_seed(0)
    if name == "gemma4 (shared KV)":
        from tests.family_twins import _gemma4_shared_kv_config

        vision = tf.Gemma4VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                       num_attention_heads=2, num_key_value_heads=2, head_dim=16)
        return tf.Gemma4ForConditionalGeneration(tf.Gemma4Config(text_config=_gemma4_shared_kv_config().to_dict(),
                                                                 vision_config=vision.to_dict()))
    text = {**FAMILIES[name][3]}
    if name == "qwen3_5":
        vision = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64)
        return tf.Qwen3_5ForConditionalGeneration(tf.Qwen3_5Config(text_config=text, vision_config=vision))
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    return tf.Gemma3ForConditionalGeneration(tf.Gemma3Config(text_config=text, vision_config=vision,
                                                             mm_tokens_per_image=4))


@pytest.mark.parametrize("name", ["qwen3_5", "gemma3", "gemma4 (shared KV)"])
def test_a_target_published_as_a_vision_language_checkpoint_loads_and_decodes_like_plain(name, tmp_path):
    from engine import loading
    from tests.tiny_models import tiny_tokenizer

    multimodal_packaging(name).eval().save_pretrained(tmp_path, safe_serialization=True)
    tiny_tokenizer().save_pretrained(tmp_path)
    target, _ = loading.load_target(tmp_path, torch.device("cpu"), torch.float32)
    with torch.no_grad():
        target.get_output_embeddings().weight.mul_(8.0)  # clear greedy winners, as family_twin does
    reference = plain_greedy(target, PROMPT, 24)
    draft = tiny_draft(target, block_size=8)
    events = decode(target, draft, 8, max_new_tokens=24)
    assert list(events[-1].token_ids) == reference
