"""Every published draft form loads with its architecture and decodes losslessly: z-lab v1 (b8, b16,
sliding + full layers, yarn), DFlash2, MiMo's dflash/ drafts, and drafts with their own vocabulary.
The forward passes are checked against a naive reference written here with loops (one vector, one
head, one key at a time), so that a vectorised shortcut in the engine cannot hide a wrong layout."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.config import SamplingConfig
from engine.decode import generate
from engine.draft import DFlash2DraftModel, DFlashDraftModel, load_draft
from engine.draft_config import IGNORED, classify_keys, config_from_dict, key_handlers
from engine.errors import CheckpointError, IncompatibleDraftError
from engine.events import Cycle, Finished
from engine.features import FeatureCapture
from engine.loading import check_compatible
from tests.published_drafts import MASK, PUBLISHED, all_keys, write_draft
from tests.published_twins import CATALOG_CONFIGS, read_config, shrink_draft
from tests.published_twins import write_draft as write_twin_draft
from tests.tiny_models import VOCAB, tiny_target

PROMPT = [5, 17, 33, 2, 9, 41, 8, 60, 12, 3, 77, 21]
FORMS = sorted(PUBLISHED)
DEFAULT_ROPE = [name for name in FORMS if "yarn" not in name]  # the naive reference rotates without yarn


@pytest.fixture(scope="module")
def target():
    return tiny_target()


@pytest.fixture(scope="module")
def drafts(tmp_path_factory):
    root = tmp_path_factory.mktemp("published")
    return {name: write_draft(root / f"form{i}", raw, seed=i) for i, (name, raw) in enumerate(PUBLISHED.items())}


# ----------------------------------------------------------------------------- every key honoured, ignored or refused

# Every published draft config: the forms above (scaled copies) and each catalog pair's draft as
# published (tests/published_configs), its sizes shrunk to the tiny target's.
CATALOG_DRAFTS = {f"{name} (published)": shrink_draft(read_config(folders[1]), VOCAB, read_config(folders[0])[
    "num_hidden_layers"]) for name, folders in CATALOG_CONFIGS.items()}
ALL_DRAFTS = {**PUBLISHED, **CATALOG_DRAFTS}


def write_any_draft(directory, raw, seed=0):
    if any(raw is published for published in PUBLISHED.values()):
        return write_draft(directory, raw, seed=seed)
    write_twin_draft(raw, directory, seed=seed)
    return directory


@pytest.fixture(scope="module")
def every_draft(tmp_path_factory):
    root = tmp_path_factory.mktemp("every")
    return {name: write_any_draft(root / f"d{i}", raw, seed=i) for i, (name, raw) in enumerate(ALL_DRAFTS.items())}


def fingerprint(source, raw, target, scratch):
    """What a draft does, from its config ``raw`` and the weights in ``source``: the refusal it
    meets (loading, or pairing with ``target``), or its block's hidden states and its proposal
    logits on fixed inputs, in float64."""
    import shutil

    if scratch.exists():
        shutil.rmtree(scratch)
    shutil.copytree(source, scratch)
    (scratch / "config.json").write_text(json.dumps(raw))
    try:
        draft = load_draft(scratch, dtype=torch.float64)
        check_compatible(draft, target)
    except (CheckpointError, IncompatibleDraftError) as exc:
        return ("refused", str(exc))
    ids = torch.full((1, draft.block_size), draft.mask_token_id)
    ids[0, 0] = 7
    capture = FeatureCapture(target, draft.target_layer_ids).attach()  # the layers it names, tapped
    try:
        with torch.no_grad():
            target(input_ids=torch.tensor([PROMPT]))
        features = capture.take().double()
    finally:
        capture.detach()
    embeddings = torch.nn.Embedding(VOCAB, 64).double()
    embeddings.weight.data = target.get_input_embeddings().weight.data.double()
    head = torch.nn.Linear(64, VOCAB, bias=False).double()
    head.weight.data = target.get_output_embeddings().weight.data.double()
    with torch.no_grad():
        hidden = draft(draft.embed(embeddings, ids), features, torch.arange(12 + draft.block_size)[None])
        tokens, logits = draft.draft_tokens(hidden[0, 1:], 7, head)
    return ("ran", hidden, logits, torch.tensor(tokens))


def same(a, b) -> bool:
    if a[0] != b[0]:
        return False
    if a[0] == "refused":
        return a[1] == b[1]
    return all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(a[1:], b[1:]))


OTHER_FORM = {"DFlashDraftModel": "DFlash2DraftModel", "DFlash2DraftModel": "DFlashDraftModel"}


# where doubling is too small a change to show: the selector's top-1 is each slot's argmax
CHANGES = {"selector_top_k": 1}


def changed(value, key=""):
    """Another value of the same kind: what a key is checked to react to (or not)."""
    if key in CHANGES:
        return CHANGES[key]
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value * 2 if value > 1 else value + 1
    if isinstance(value, float):
        return value * 0.5 if value else 0.5
    if isinstance(value, str):
        return {"silu": "gelu", "bfloat16": "float16"}.get(value, value + "-changed")
    if isinstance(value, list) and value and isinstance(value[0], str):
        if value[0] in OTHER_FORM:
            return [OTHER_FORM[value[0]]]
        flip = {"sliding_attention": "full_attention", "full_attention": "sliding_attention"}
        return [flip.get(value[0], value[0])] + value[1:]
    if isinstance(value, list) and value:
        return [(value[0] + 1) % 4] + value[1:]
    if isinstance(value, dict):
        if "rope_theta" in value:
            return {**value, "rope_theta": value["rope_theta"] * 0.5}
        if "factor" in value:
            return {**value, "factor": value["factor"] * 2}
        return {**value, "changed": True}
    raise AssertionError(f"no change known for {value!r}")


def with_key(raw, name, value):
    edited = copy.deepcopy(raw)
    where, key = (edited["dflash_config"], name.split(".", 1)[1]) if name.startswith("dflash_config.") else (edited, name)
    if value is REMOVE:
        where.pop(key)
    else:
        where[key] = value
    return edited


REMOVE = object()
KEY_CASES = [(form, name) for form, raw in ALL_DRAFTS.items() for name in all_keys(raw) if name != "dflash_config"]


@pytest.mark.parametrize("form, name", KEY_CASES, ids=[f"{form}: {name}" for form, name in KEY_CASES])
def test_each_key_does_what_its_class_says(every_draft, target, tmp_path, form, name):
    """Honoured: changing the key changes the draft (its output, its proposals, its loading or its
    pairing). Ignored: changing it changes nothing. Refused: a value that cannot be honoured is
    refused naming the key. A key whose value is null is the key absent."""
    raw = ALL_DRAFTS[form]
    weights = set(load_file(str(every_draft[form] / "model.safetensors")))
    kind, why = classify_keys(raw, weights)[name]
    assert why
    base = fingerprint(every_draft[form], raw, target, tmp_path / "base")
    assert base[0] == "ran", base
    key = name.removeprefix("dflash_config.")
    value = (raw["dflash_config"] if name.startswith("dflash_config.") else raw)[key]
    if value is None:
        assert same(fingerprint(every_draft[form], with_key(raw, name, REMOVE), target, tmp_path / "x"), base)
        return
    after = fingerprint(every_draft[form], with_key(raw, name, changed(value, key)), target, tmp_path / "x")
    if after[0] == "refused" and key in after[1]:
        return  # a value this engine cannot honour, refused by the key's name (v_head_dim, hidden_act, ...)
    if kind == IGNORED:
        assert same(after, base), f"{name} is said to be ignored ({why}) but changing it changed the draft"
    else:
        assert not same(after, base), f"{name} is said to be honoured ({why}) but changing it changed nothing"


def test_every_published_draft_config_loads_as_published():
    """The full-size files, every key as published: each one parses (MiMo-V2.5-Pro's dflash/ config
    with v_head_dim, num_anchors and loss_decay_gamma included)."""
    for name, (_, draft_folder) in CATALOG_CONFIGS.items():
        raw = read_config(draft_folder)
        classes = classify_keys(raw)
        assert set(classes) == all_keys(raw), name
        config, form = config_from_dict(copy.deepcopy(raw))
        assert form == "dflash" and config.num_hidden_layers == raw["num_hidden_layers"], name


def test_training_only_keys_are_ignored_and_say_why():
    raw = read_config("XiaomiMiMo__MiMo-V2.5-Pro-FP4-DFlash__dflash")
    classes = classify_keys(raw)
    for name in ("dflash_config.num_anchors", "dflash_config.loss_decay_gamma"):
        assert classes[name][0] == IGNORED and "training" in classes[name][1]


@pytest.mark.parametrize("v_head_dim, refused", [(128, False), (64, True), (192, True)])
def test_v_head_dim_other_than_head_dim_is_refused_by_name(v_head_dim, refused):
    raw = {**read_config("XiaomiMiMo__MiMo-V2.5-Pro-FP4-DFlash__dflash"), "v_head_dim": v_head_dim}
    if refused:
        with pytest.raises(CheckpointError, match=f"v_head_dim {v_head_dim} differs from head_dim 128"):
            config_from_dict(raw)
    else:
        config_from_dict(raw)


def test_an_unknown_key_is_refused_by_its_name():
    raw = copy.deepcopy(PUBLISHED["z-lab Qwen3-8B b16"])
    raw["frobnicate_heads"] = True
    raw["dflash_config"]["draft_temperature"] = 0.7
    with pytest.raises(CheckpointError, match="frobnicate_heads.*dflash_config.draft_temperature"):
        key_handlers(raw)


@pytest.mark.parametrize("change, named", [
    ({"quantization_config": {"quant_method": "gptq", "bits": 4}}, "quantization_config"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"is_neox_style": False}, "is_neox_style"),
    ({"layer_types": ["chunked_attention", "full_attention"]}, "layer_types"),
])
def test_values_this_engine_cannot_honour_are_refused_by_name(change, named):
    raw = {**copy.deepcopy(PUBLISHED["z-lab Qwen3-8B b16"]), **change}
    with pytest.raises(CheckpointError, match=named):
        config_from_dict(raw)


def test_use_sliding_window_is_read_as_transformers_and_vllm_read_it():
    # z-lab/Qwen3.5-122B-A10B-DFlash's config (as a public C++ port's test fixture trims it): use_sliding_window
    # and a window, no layer_types, six layers below max_window_layers' default (28): no layer slides.
    raw = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "dtype": "bfloat16", "hidden_size": 64,
           "num_hidden_layers": 2, "vocab_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 16, "intermediate_size": 128, "rms_norm_eps": 1e-6,
           "rope_parameters": {"rope_type": "default", "rope_theta": 10000000}, "max_position_embeddings": 262144,
           "use_sliding_window": True, "sliding_window": 4096, "tie_word_embeddings": False,
           "dflash_config": {"block_size": 16, "mask_token_id": MASK, "target_layer_ids": [1, 2]}}
    assert set(key_handlers(raw)) == all_keys(raw)
    draft = DFlashDraftModel(config_from_dict(raw)[0])
    assert [(l.self_attn.sliding_window, l.self_attn.is_causal) for l in draft.layers] == [(None, False)] * 2


def test_a_qwen2_style_window_without_layer_types_is_honoured():
    raw = {**copy.deepcopy(PUBLISHED["z-lab Qwen3-8B b16"]), "use_sliding_window": True, "sliding_window": 5,
           "max_window_layers": 1}
    raw.pop("layer_types")
    config, _ = config_from_dict(raw)
    draft = DFlashDraftModel(config)
    assert [(l.self_attn.sliding_window, l.self_attn.is_causal) for l in draft.layers] == [(None, False), (5, True)]


# ----------------------------------------------------------------------------- the right architecture


def test_each_published_form_loads_with_its_architecture(drafts):
    b16 = load_draft(drafts["z-lab Qwen3-8B b16"])
    assert type(b16) is DFlashDraftModel and b16.block_size == 16 and b16.target_layer_ids == [0, 2]
    assert b16.embed_tokens is None and b16.lm_head is None  # the target's are used

    oss = load_draft(drafts["z-lab gpt-oss-20b b8 (yarn)"])
    assert oss.block_size == 8 and oss.config.rope_parameters["rope_type"] == "yarn"
    assert oss.rotary_emb.attention_scaling > 1.0  # yarn's scaled attention, not plain RoPE
    assert oss.layers[0].self_attn.q_proj.bias is not None and oss.layers[0].self_attn.o_proj.bias is not None

    q36 = load_draft(drafts["z-lab Qwen3.6-27B (sliding + full)"])  # block_size inside dflash_config
    assert q36.block_size == 8
    assert [(l.self_attn.sliding_window, l.self_attn.is_causal) for l in q36.layers] == [(6, True)] * 4 + [(None, False)]

    d2 = load_draft(drafts["DFlash2 Qwen3.6-27B"])
    assert type(d2) is DFlash2DraftModel
    assert all(layer.attention_conv.taps == 2 and layer.mlp_conv.groups == 4 for layer in d2.layers)
    assert d2.candidate_selector.top_k == 16 and d2.candidate_selector.predecessor_codebook.shape == (96, 8)
    assert [(l.self_attn.sliding_window, l.self_attn.is_causal) for l in d2.layers] == [(6, False)] * 3

    mimo = load_draft(drafts["MiMo-V2.5 dflash/"])
    attn = mimo.layers[0].self_attn
    assert attn.attention_sink_bias is not None and attn.value_scale == pytest.approx(0.612)
    assert [(l.self_attn.sliding_window, l.self_attn.is_causal) for l in mimo.layers] == [(6, False)] * 2
    cos, _ = mimo.rotary_emb(torch.zeros(1, 1, 64), torch.zeros(1, 1, dtype=torch.long))
    assert cos.shape[-1] == 8  # half of each 16-wide head rotates
    saved = torch.load(drafts["MiMo-V2.5 dflash/"] / "mask_embedding.pt", weights_only=True)
    torch.testing.assert_close(mimo.mask_embedding.data, saved["embedding"])

    own = load_draft(drafts["own vocabulary (d2t, vLLM / EAGLE-3 layout)"])
    assert own.embed_tokens.weight.shape == (96, 32) and own.lm_head.weight.shape == (48, 32)
    assert own.fc.in_features == 2 * 64 and own.target_layer_ids == [1, 3]
    assert own.d2t.dtype == torch.long


def test_own_embeddings_and_head_are_used_instead_of_the_targets(drafts, target):
    own = load_draft(drafts["own vocabulary (d2t, vLLM / EAGLE-3 layout)"])
    check_compatible(own, target)  # narrower than the target: fine, it brings its own table and head
    ids = torch.tensor([[3, MASK, MASK]])
    torch.testing.assert_close(own.embed(target.get_input_embeddings(), ids), own.embed_tokens(ids))
    hidden = torch.randn(2, 32)
    logits = own.proposal_logits(hidden, target.get_output_embeddings())
    targets = own.target_ids()
    assert logits.shape == (2, 96)
    assert torch.isfinite(logits[:, targets]).all() and torch.isinf(logits).sum() == 2 * (96 - 48)
    torch.testing.assert_close(logits[:, targets], own.lm_head(hidden))  # draft id i scores target id i + d2t[i]

    mimo = load_draft(drafts["MiMo-V2.5 dflash/"])
    embedded = mimo.embed(target.get_input_embeddings(), ids)
    torch.testing.assert_close(embedded[0, 1], mimo.mask_embedding.data)  # the mask slots: mask_embedding.pt
    torch.testing.assert_close(embedded[0, 0], target.get_input_embeddings().weight[3])


def test_a_draft_narrower_than_its_target_needs_its_own_embeddings_and_head(drafts, target, tmp_path):
    raw = copy.deepcopy(PUBLISHED["own vocabulary (d2t, vLLM / EAGLE-3 layout)"])
    raw.pop("draft_vocab_size")
    path = write_draft(tmp_path / "narrow", raw)
    weights = load_file(str(path / "model.safetensors"))
    save_file({k: v for k, v in weights.items() if not k.startswith(("embed_tokens", "lm_head"))},
              str(path / "model.safetensors"))
    with pytest.raises(IncompatibleDraftError, match="no own embed_tokens and lm_head"):
        check_compatible(load_draft(path), target)


def test_d2t_and_t2d_are_checked(drafts, tmp_path):
    source = drafts["own vocabulary (d2t, vLLM / EAGLE-3 layout)"]
    weights = load_file(str(source / "model.safetensors"))
    draft = load_draft(source)
    t2d = torch.zeros(96, dtype=torch.bool)
    t2d[draft.target_ids()] = True
    for name, edit, error in [
        ("t2d-ok", {"t2d": t2d}, None),
        ("t2d-wrong", {"t2d": ~t2d}, "t2d does not mark"),
        ("d2t-collides", {"d2t": torch.zeros(48, dtype=torch.long) - torch.arange(48)}, "two onto one"),
    ]:
        path = tmp_path / name
        path.mkdir()
        (path / "config.json").write_text((source / "config.json").read_text())
        save_file({**weights, **edit}, str(path / "model.safetensors"))
        if error is None:
            load_draft(path)
        else:
            with pytest.raises(CheckpointError, match=error):
                load_draft(path)
    raw = copy.deepcopy(PUBLISHED["own vocabulary (d2t, vLLM / EAGLE-3 layout)"])
    raw["eagle_aux_hidden_state_layer_ids"] = [1, 2]  # layers 0 and 1, target_layer_ids says 1 and 3
    (tmp_path / "t2d-ok" / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match="name different target layers"):
        load_draft(tmp_path / "t2d-ok")


class RunsCode:
    def __reduce__(self):
        return (print, ("this ran while loading",))


def test_mask_embedding_pt_is_read_without_running_code(drafts, tmp_path, capsys):
    import shutil

    bad = tmp_path / "mimo"
    shutil.copytree(drafts["MiMo-V2.5 dflash/"], bad)
    torch.save({"mask_token_id": MASK, "embedding": RunsCode()}, bad / "mask_embedding.pt")
    with pytest.raises(CheckpointError, match="refused: it is not a plain tensor file"):
        load_draft(bad)
    assert "this ran" not in capsys.readouterr().out
    torch.save({"mask_token_id": MASK - 1, "embedding": torch.zeros(64)}, bad / "mask_embedding.pt")
    with pytest.raises(CheckpointError, match="mask_token_id 94"):
        load_draft(bad)
    torch.save(torch.zeros(63), bad / "mask_embedding.pt")
    with pytest.raises(CheckpointError, match="one embedding of 64 floats"):
        load_draft(bad)


# ----------------------------------------------------------------------------- lossless decoding


def hf_greedy(target, prompt, n):
    out = target.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="module")
def reference(target):
    return hf_greedy(target, PROMPT, 28)


@pytest.mark.parametrize("block_size", [1, 4, 8, 16])
@pytest.mark.parametrize("name", FORMS)
def test_greedy_dflash_equals_plain_greedy_for_every_published_form(target, drafts, reference, name, block_size):
    draft = load_draft(drafts[name])
    check_compatible(draft, target)
    events = list(generate(target, draft, PROMPT, SamplingConfig(max_new_tokens=28, block_size=block_size)))
    assert isinstance(events[-1], Finished), events[-1]
    assert list(events[-1].token_ids) == reference
    cycles = [e for e in events if isinstance(e, Cycle)]
    assert all(len(c.draft_tokens) == min(block_size, 28) - 1 for c in cycles[:1])


@pytest.mark.parametrize("proposal", ["sample", "argmax"])
@pytest.mark.parametrize("name", FORMS)
def test_sampled_replies_run_with_every_published_form(target, drafts, name, proposal):
    draft = load_draft(drafts[name])
    sampling = SamplingConfig(max_new_tokens=20, temperature=0.8, seed=1, proposal=proposal)
    events = list(generate(target, draft, PROMPT, sampling))
    assert isinstance(events[-1], Finished) and len(events[-1].token_ids) == 20
    assert all(0 <= t < 96 for e in events if isinstance(e, Cycle) for t in e.draft_tokens)


# ----------------------------------------------------------------------------- naive reference (loops)


def rms(x, weight, eps):
    return x / torch.sqrt((x * x).mean() + eps) * weight


def linear(layer, x):
    y = layer.weight @ x
    return y + layer.bias if layer.bias is not None else y


def rope(vector, position, theta, rotated):
    """Rotate pairs (i, i + rotated/2) of the first ``rotated`` channels by position * theta^(-2i/rotated)."""
    out = vector.clone()
    half = rotated // 2
    for i in range(half):
        angle = position * theta ** (-2 * i / rotated)
        a, b = vector[i], vector[i + half]
        out[i] = a * math.cos(angle) - b * math.sin(angle)
        out[i + half] = b * math.cos(angle) + a * math.sin(angle)
    return out


def naive_conv(conv, xs, deltas, side):
    """out[j][c] = sum over taps t with j - t >= 0 of (base[side][t][c] + delta[j][t][c's group]) * x[j - t][c]."""
    outs = []
    for j in range(len(xs)):
        out = torch.zeros_like(xs[j])
        for t in range(conv.taps):
            if j - t < 0:
                continue
            for c in range(xs[j].shape[0]):
                weight = conv.base_kernel[side, t, c] + deltas[j][t][c // conv.group_size]
                out[c] += weight * xs[j - t][c]
        outs.append(out)
    return outs


def naive_conv_prepare(conv, xs):
    deltas = [linear(conv.kernel_projection, x).view(2, conv.taps, conv.groups) for x in xs]
    return naive_conv(conv, xs, [d[0] for d in deltas], 0), [d[1] for d in deltas]


def visible(attn, q_pos, k_pos):
    if attn.is_causal and k_pos > q_pos:
        return False
    window = attn.sliding_window
    if window is not None and (q_pos - k_pos >= window or (not attn.is_causal and k_pos - q_pos >= window)):
        return False
    return True


def naive_attention(attn, xs, ctx, ctx_pos, blk_pos, theta, rotated, eps):
    d = attn.head_dim
    per_kv = attn.num_heads // attn.num_kv_heads
    keys = [(x, p) for x, p in zip(ctx, ctx_pos)] + [(x, p) for x, p in zip(xs, blk_pos)]
    outs = []
    for j, x in enumerate(xs):
        heads = []
        for n in range(attn.num_heads):
            g = n // per_kv
            q = rope(rms(linear(attn.q_proj, x)[n * d:(n + 1) * d], attn.q_norm.weight, eps), blk_pos[j], theta, rotated)
            weights, values = [], []
            for source, pos in keys:
                if not visible(attn, blk_pos[j], pos):
                    continue
                k = rope(rms(linear(attn.k_proj, source)[g * d:(g + 1) * d], attn.k_norm.weight, eps), pos, theta, rotated)
                weights.append(torch.exp(q @ k / math.sqrt(d)))
                values.append(linear(attn.v_proj, source)[g * d:(g + 1) * d] * attn.value_scale)
            total = sum(weights)
            if attn.attention_sink_bias is not None:  # the sink joins the denominator and adds no value
                total = total + torch.exp(attn.attention_sink_bias[n])
            heads.append(sum(w * v for w, v in zip(weights, values)) / total)
        outs.append(linear(attn.o_proj, torch.cat(heads)))
    return outs


def naive_mlp(mlp, x):
    gate = linear(mlp.gate_proj, x)
    return linear(mlp.down_proj, gate * torch.sigmoid(gate) * linear(mlp.up_proj, x))


def naive_forward(draft, noise, features, ctx_pos, blk_pos):
    config = draft.config
    eps = config.rms_norm_eps
    theta = config.rope_parameters["rope_theta"]
    rotated = int(draft.layers[0].self_attn.head_dim * config.rope_parameters.get("partial_rotary_factor", 1.0))
    ctx = [rms(linear(draft.fc, f), draft.hidden_norm.weight, eps) for f in features]
    h = list(noise)
    for layer in draft.layers:
        conv = getattr(layer, "attention_conv", None)
        x = [rms(v, layer.input_layernorm.weight, eps) for v in h]
        if conv is not None:
            x, deltas = naive_conv_prepare(conv, x)
        a = naive_attention(layer.self_attn, x, ctx, ctx_pos, blk_pos, theta, rotated, eps)
        if conv is not None:
            a = naive_conv(conv, a, deltas, 1)
        h = [hj + aj for hj, aj in zip(h, a)]
        conv = getattr(layer, "mlp_conv", None)
        x = [rms(v, layer.post_attention_layernorm.weight, eps) for v in h]
        if conv is not None:
            x, deltas = naive_conv_prepare(conv, x)
        m = [naive_mlp(layer.mlp, v) for v in x]
        if conv is not None:
            m = naive_conv(conv, m, deltas, 1)
        h = [hj + mj for hj, mj in zip(h, m)]
    return torch.stack([rms(v, draft.norm.weight, eps) for v in h])


def naive_select(selector, hidden, logits, anchor):
    """Each slot: its top_k tokens by logit, each scored logit + sum_r pred[previous][r] * proj[r] * succ[token][r];
    the best one is the draft and the next slot's predecessor."""
    path, previous = [], anchor
    for slot in range(hidden.shape[0]):
        row = logits[slot].tolist()
        candidates = sorted(range(len(row)), key=lambda t: -row[t])[: selector.top_k]
        projected = selector.hidden_projection.weight @ hidden[slot]
        best, best_score = None, None
        for token in candidates:
            score = row[token] + sum(float(selector.predecessor_codebook[previous, r] * projected[r]
                                           * selector.successor_codebook[token, r]) for r in range(projected.shape[0]))
            if best_score is None or score > best_score:
                best, best_score = token, score
        path.append(best)
        previous = best
    return path


@pytest.mark.parametrize("name", DEFAULT_ROPE)
def test_draft_forward_matches_the_naive_reference(drafts, name):
    draft = load_draft(drafts[name], dtype=torch.float64)
    torch.manual_seed(3)
    context, block = 11, draft.block_size
    noise = torch.randn(block, draft.config.hidden_size, dtype=torch.float64)
    features = torch.randn(context, draft.fc.in_features, dtype=torch.float64)
    positions = torch.arange(context + block)
    with torch.no_grad():
        fast = draft(noise[None], features[None], positions[None])[0]
        slow = naive_forward(draft, noise, features, positions[:context].tolist(), positions[context:].tolist())
    # float64 throughout, except RoPE's angles, which transformers computes in float32 (~1e-5 here);
    # a wrong layout (a tap, a mask, the sink, a scale) differs by far more than that
    torch.testing.assert_close(fast, slow, rtol=1e-3, atol=1e-3)


def test_the_candidate_selector_matches_the_naive_reference(drafts, target):
    draft = load_draft(drafts["DFlash2 Qwen3.6-27B"], dtype=torch.float64)
    head = torch.nn.Linear(64, 96, bias=False).double()
    head.weight.data = target.lm_head.weight.data.double() / 8  # near ties among the top-k, so the scorer decides
    torch.manual_seed(4)
    chosen_differently = 0
    for anchor in range(0, 90, 7):
        hidden = torch.randn(7, 64, dtype=torch.float64)
        with torch.no_grad():
            tokens, logits = draft.draft_tokens(hidden, anchor, head)
            assert tokens == naive_select(draft.candidate_selector, hidden, logits, anchor)
        chosen_differently += tokens != logits.argmax(-1).tolist()
    assert chosen_differently > 0  # the selector's path is not just each slot's argmax


# ----------------------------------------------------------------------------- keys change what they should


def forward_with(path, raw, edit):
    changed = copy.deepcopy(raw)
    edit(changed)
    (path / "config.json").write_text(json.dumps(changed))
    draft = load_draft(path, dtype=torch.float64)
    torch.manual_seed(5)
    table = torch.nn.Embedding(draft.config.vocab_size, draft.config.hidden_size).double()
    ids = torch.full((1, draft.block_size), MASK)
    ids[0, 0] = 7
    features = torch.randn(1, 12, draft.fc.in_features, dtype=torch.float64)
    with torch.no_grad():
        return draft(draft.embed(table, ids), features, torch.arange(12 + draft.block_size)[None])


@pytest.mark.parametrize("name, key, edit", [
    ("MiMo-V2.5 dflash/", "attention_value_scale", lambda c: c["dflash_config"].update(attention_value_scale=1.0)),
    ("MiMo-V2.5 dflash/", "partial_rotary_factor", lambda c: c.update(partial_rotary_factor=1.0)),
    ("MiMo-V2.5 dflash/", "swa_window_size", lambda c: c["dflash_config"].update(swa_window_size=4)),
    ("MiMo-V2.5 dflash/", "use_swa", lambda c: c["dflash_config"].update(use_swa=False)),
    ("MiMo-V2.5 dflash/", "causal", lambda c: c["dflash_config"].update(causal=True)),
    ("z-lab Qwen3.6-27B (sliding + full)", "sliding_window", lambda c: c.update(sliding_window=3)),
    ("z-lab Qwen3.6-27B (sliding + full)", "is_causal", lambda c: c.update(is_causal=False)),
    ("z-lab gpt-oss-20b b8 (yarn)", "rope_scaling", lambda c: c.pop("rope_scaling")),
    ("z-lab Qwen3-8B b16", "input_embedding_scale", lambda c: c["dflash_config"].update(input_embedding_scale=2.0)),
])
def test_architecture_keys_change_the_drafts_output(drafts, tmp_path, name, key, edit):
    import shutil

    path = tmp_path / "draft"
    shutil.copytree(drafts[name], path)
    raw = PUBLISHED[name]
    same = forward_with(path, raw, lambda c: None)
    changed = forward_with(path, raw, edit)
    assert not torch.allclose(same, changed), f"{key} made no difference"


@pytest.mark.parametrize("name", FORMS)
def test_a_saved_draft_loads_back_as_the_same_form_with_the_same_outputs(drafts, tmp_path, target, name):
    from engine.draft import save_draft

    draft = load_draft(drafts[name])
    again = load_draft(save_draft(draft, tmp_path / "saved"))
    assert type(again) is type(draft)
    for key, tensor in draft.state_dict().items():
        torch.testing.assert_close(again.state_dict()[key], tensor, rtol=0, atol=0)
    torch.manual_seed(6)
    ids = torch.full((1, draft.block_size), MASK)
    features = torch.randn(1, 9, draft.fc.in_features)
    positions = torch.arange(9 + draft.block_size)[None]
    with torch.no_grad():
        outputs = [m(m.embed(target.get_input_embeddings(), ids), features, positions) for m in (draft, again)]
        proposals = [m.draft_tokens(h[0, 1:], 3, target.get_output_embeddings())[0] for m, h in zip((draft, again), outputs)]
    torch.testing.assert_close(outputs[0], outputs[1], rtol=0, atol=0)
    assert proposals[0] == proposals[1]
