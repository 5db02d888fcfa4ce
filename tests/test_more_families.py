"""Targets beyond the families real drafts are published for: the other decoder-only
architectures a user may load as a target (GPT-2 and its descendants, Falcon, MPT, Phi, Mistral,
Gemma 2, Llama 4, latent attention, ...) decode exactly as plain greedy decoding, eagerly and on
the static caches. The few whose own forward would break that are kept from it with the reason:
a target whose block forward after its cache is not its one-token-at-a-time forward is refused
when the pair loads, and one that computes otherwise on a static cache stays on the eager path."""

from __future__ import annotations

import pytest
import torch

from engine import compiled as compiled_module
from engine import decode as decode_module
from engine.backends import StaticBackend, static_disagreement
from engine.compiled import CompiledPath
from engine.config import EngineConfig, SamplingConfig
from engine.decode import generate
from engine.errors import UnsupportedTargetError
from engine.events import Failed, Finished
from engine.target_cache import check_verify_contract
from tests.family_twins import any_family_twin
from tests.test_families import NEW_TOKENS, PROMPT, oracle_propose, plain_greedy
from tests.tiny_models import tiny_draft

BLOCK = 8

# Their decoder stacks live under other names (GPT-2's transformer.h, MPT's blocks, Llama 4's
# model.layers below a causal LM that is its own decoder), their norms are LayerNorms, their
# positions rotary, learned or ALiBi (MPT), their attention multi-query, latent or sliding.
MORE_FAMILIES = ["codegen", "cohere2", "deepseek_v2", "falcon", "gemma2", "gemma4_text", "glm4", "gpt2",
                 "gpt_bigcode", "gpt_neox", "gptj", "granite", "llama4_text", "minicpm3", "mllama", "mistral",
                 "mixtral", "mpt", "olmo2", "opt", "phi", "phi3", "stablelm", "starcoder2"]
# The rest of transformers' decoder-only families whose shrunk default config builds and generates:
# Llama-likes with their own twists (Cohere's parallel block, DiffLlama's differential attention,
# Persimmon's partial rotary, learned or sinusoidal positions in BioGPT and XGLM, sliding windows in
# Granite-SWA and Ministral, MoE routers of a dozen shapes, latent attention in AXK1, GLM-4-MoE-Lite
# and Youtu), which a user may load with a draft they distilled.
MORE_FAMILIES += ["afmoe", "apertus", "arcee", "aria_text", "axk1", "biogpt", "bitnet", "cohere", "cohere2_moe",
                  "ctrl", "cwm", "diffllama", "dots1", "ernie4_5", "ernie4_5_moe", "exaone4", "exaone_moe",
                  "flex_olmo", "gemma", "gemma3_text", "glm", "glm4_moe", "glm4_moe_lite", "gpt_neox_japanese",
                  "granite_swa", "granitemoe", "granitemoe_swa", "granitemoeshared", "helium", "hunyuan_v1_dense",
                  "hunyuan_v1_moe", "hy_v3", "hyperclovax", "jais2", "jetmoe", "laguna", "mellum", "minimax_m2",
                  "ministral", "ministral3", "nanochat", "nemotron", "olmo", "olmo3", "olmoe", "persimmon", "phimoe",
                  "qwen2", "qwen2_moe", "seed_oss", "smollm3", "solar_open", "vaultgemma", "xglm", "youtu"]
# layers that attend with an earlier layer's keys and values and keep no cache (Gemma 3n, which
# also passes four copies of the hidden state between layers, and Gemma 4's E models)
MORE_FAMILIES += ["gemma3n_text", "gemma4_text (shared KV)"]


@pytest.fixture(scope="module", params=MORE_FAMILIES)
def family(request):
    target = any_family_twin(request.param)
    return request.param, target, plain_greedy(target, PROMPT, NEW_TOKENS)


def decode(target, draft, backend=None):
    events = list(generate(target, draft, PROMPT, SamplingConfig(block_size=BLOCK, max_new_tokens=NEW_TOKENS),
                           backend=backend))
    assert isinstance(events[-1], Finished), events[-1]
    return list(events[-1].token_ids)


def test_greedy_dflash_equals_plain_greedy_eagerly_and_on_static_caches(family, monkeypatch):
    name, target, reference = family
    draft = tiny_draft(target, block_size=BLOCK)
    check_verify_contract(target)  # what loading a pair checks
    assert decode(target, draft) == reference, name
    backend = StaticBackend(target, draft)
    try:
        assert static_disagreement(backend) is None, name
        # the stand-in draft that accepts 0..B-1 tokens: every rollback length, past every window
        vocab = target.config.get_text_config().vocab_size
        monkeypatch.setattr(decode_module, "propose", oracle_propose(reference, vocab))
        assert decode(target, draft) == reference, name
        assert decode(target, draft, backend) == reference, name
    finally:
        backend.close()


# transformers' own forward of these reads a static cache's mask otherwise than the eager path's:
# Doge adds a learned bias to any mask it is given (and attends both ways with none), GPT-Neo
# checks the cache's length against its own causal buffer, BLOOM builds ALiBi from the mask
STATIC_MISFITS = {"doge": "differ from the eager path's", "gpt_neo": "fails on a static cache",
                  "bloom": "fails on a static cache"}


@pytest.mark.parametrize("name", sorted(STATIC_MISFITS))
def test_a_target_the_static_caches_would_change_stays_on_the_eager_path(name, monkeypatch):
    target = any_family_twin(name)
    reference = plain_greedy(target, PROMPT, NEW_TOKENS)
    draft = tiny_draft(target, block_size=BLOCK)
    check_verify_contract(target)
    monkeypatch.setattr(compiled_module.torch, "compile",
                        lambda *a, **k: pytest.fail("compiled a target the static caches change"))
    # the first bucket, 512 positions, as a reply of the app would take it (GPT-Neo's causal buffer
    # is as long as its context, 512 here, and the static cache holds a padded verify more)
    path = CompiledPath(target, draft, BLOCK).start(max_length=512)
    try:
        assert not path.wait(timeout=60)
        assert path.state == "unsupported" and path.label == "eager", path.state
        assert STATIC_MISFITS[name] in path.error and "\n" not in path.error, path.error
        assert decode(target, draft, path) == reference
    finally:
        path.close()


# transformers' Moshi text model attends a block of new tokens after its cache otherwise than the
# same tokens one at a time; RecurrentGemma keeps its recurrent state in its layers, out of a
# rollback's reach, and its block forward already differs from its steps
VERIFY_MISFITS = {"moshi": r"MoshiForCausalLM \(moshi\): its logits for a block of tokens after its cache differ",
                  "recurrent_gemma": r"RecurrentGemmaForCausalLM \(recurrent_gemma\): its logits for a block"}


@pytest.mark.parametrize("name", sorted(VERIFY_MISFITS))
def test_a_target_a_verify_would_not_decode_exactly_is_refused_when_the_pair_loads(name, tmp_path):
    from engine.draft import DFlashDraftModel, new_draft_config, save_draft
    from engine.loading import load_models
    from tests.tiny_models import tiny_tokenizer

    target = any_family_twin(name)
    with pytest.raises(UnsupportedTargetError, match=VERIFY_MISFITS[name]) as refused:
        check_verify_contract(target)
    assert "\n" not in str(refused.value)
    target.save_pretrained(tmp_path / "target", safe_serialization=True)
    tiny_tokenizer().save_pretrained(tmp_path / "target")
    torch.manual_seed(2)
    save_draft(DFlashDraftModel(new_draft_config(target.config, 1, BLOCK, 95)).eval(), tmp_path / "draft")
    with pytest.raises(UnsupportedTargetError, match=VERIFY_MISFITS[name]):
        load_models(EngineConfig(target=str(tmp_path / "target"), draft=str(tmp_path / "draft"), device="cpu"))
    # alone, without a draft, it decodes as it always did: plain decoding feeds one token at a time
    load_models(EngineConfig(target=str(tmp_path / "target"), device="cpu", speculative=False))


def test_a_target_that_keeps_nothing_in_the_cache_it_is_given_is_refused_before_its_first_token():
    """GPT-1 has no cache at all: each forward would see only the tokens fed to it."""
    target = any_family_twin("openai-gpt")
    events = list(generate(target, tiny_draft(target, block_size=BLOCK), PROMPT,
                           SamplingConfig(block_size=BLOCK, max_new_tokens=NEW_TOKENS)))
    assert len(events) == 1 and isinstance(events[0], Failed) and events[0].kind == "UnsupportedTargetError"
    assert "OpenAIGPTLMHeadModel (openai-gpt): its forward kept 0 of 7 positions" in events[0].message


def test_the_load_check_catches_a_rollback_that_leaves_the_rejected_drafts_behind(monkeypatch):
    """The second half of the check: a cache that kept the rejected drafts (here the crop is
    switched off) gives other logits for the next token than plain decoding."""
    from engine.target_cache import TargetCache

    target = any_family_twin("mistral")
    check_verify_contract(target)
    monkeypatch.setattr(TargetCache, "keep_attention", lambda self, length, remove: None)
    with pytest.raises(UnsupportedTargetError, match="after a verify is rolled back, its next logits differ"):
        check_verify_contract(target)


def test_a_float32_matmul_precision_below_highest_is_named_when_it_breaks_the_verify(monkeypatch):
    """torch.set_float32_matmul_precision("medium"), which tuning guides suggest, rounds float32
    products to bfloat16 on a CPU with AMX (TF32 on a GPU): a block and single tokens then round
    differently and the load check refuses the pair. The refusal names that setting, not the
    architecture. A CPU without such units ignores the setting, and the check passes; the drift
    is then forced, so that the refusal's wording is checked on every machine."""
    from engine import target_cache
    from engine.target_cache import reduced_matmul_precision

    target = any_family_twin("qwen3")
    check_verify_contract(target)
    default = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    try:
        try:
            check_verify_contract(target)
        except UnsupportedTargetError as refused:
            assert "float32 matmul precision is 'medium'" in str(refused) and "\n" not in str(refused)
        assert "'highest'" in reduced_matmul_precision(torch.float32)
        assert reduced_matmul_precision(torch.bfloat16) is None
        monkeypatch.setattr(target_cache, "logit_drift", lambda got, want: 0.01)
        with pytest.raises(UnsupportedTargetError, match=r"by 1% of their scale\) because torch's float32 matmul "
                                                         r"precision is 'medium'"):
            check_verify_contract(target)
    finally:
        torch.set_float32_matmul_precision(default)
    assert reduced_matmul_precision(torch.float32) is None
    with pytest.raises(UnsupportedTargetError, match="DFlash's verify would not give plain decoding's tokens$"):
        check_verify_contract(target)  # the drift still forced: at the default precision, the general reason


# Mamba mixers beside attention (Jamba, Bamba, Zamba 2, Nemotron-H), both in one layer (Falcon-H1),
# lightning attention (MiniMax): no rollback is known for them. Sparse attention (DeepSeek-V3.2,
# GLM-MoE-DSA) crops like attention, but transformers' indexer keeps other keys for a block than
# for single tokens once the context passes index_topk (the load check sees it on twins whose
# index_topk is 8; real ones keep 2048 keys, past a short check's reach). Each is named and
# refused before a token is decoded.
REFUSED = {"bamba": "keeps a recurrent state in a mixer", "deepseek_v32": "uses sparse attention",
           "glm_moe_dsa": "uses sparse attention",
           "falcon_h1": "uses a LinearAttentionAndFullAttentionLayer cache", "jamba": "keeps a recurrent state",
           "minimax": "keeps a recurrent state", "nemotron_h": "keeps a recurrent state",
           "zamba2": "keeps a recurrent state"}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_hybrid_or_indexed_cache_is_refused_in_one_line(name):
    from engine.target_cache import check_rollback

    target = any_family_twin(name)
    with pytest.raises(UnsupportedTargetError) as refused:
        check_rollback(target)
    message = str(refused.value)
    assert REFUSED[name] in message and f"({name})" in message and "\n" not in message, message


def test_a_new_draft_takes_the_targets_settings_under_the_names_its_config_uses():
    """GPT-2 says n_inner (None: its own MLP is 4x) and layer_norm_epsilon, OPT ffn_dim, an MoE
    has no dense width at all (the draft, a Qwen3 stack, gets 3 x hidden, as the published
    drafts), Gemma 4 a head_dim per layer kind."""
    import transformers as tf

    from engine.draft import new_draft_config

    def shape(config):
        draft = new_draft_config(config, 1, BLOCK, 5)
        return (draft.hidden_size, draft.intermediate_size, draft.num_key_value_heads, draft.rms_norm_eps,
                draft.max_position_embeddings)

    assert shape(tf.GPT2Config()) == (768, 3 * 768, 12, 1e-5, 1024)
    assert shape(tf.OPTConfig()) == (768, 3072, 12, 1e-6, 2048)
    # Gemma 4 sets head_dim per layer kind: the draft's layers are full attention, and take theirs
    assert new_draft_config(any_family_twin("gemma4_text").config, 1, BLOCK, 5).head_dim == 32
    moe = tf.Qwen3_5MoeTextConfig()
    assert shape(moe) == (moe.hidden_size, 3 * moe.hidden_size, moe.num_key_value_heads, moe.rms_norm_eps,
                          moe.max_position_embeddings)
