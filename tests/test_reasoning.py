"""Reasoning models chat in the format their published template defines: thinking on/off where
the template takes ``enable_thinking`` (Qwen3, Qwen3.5), harmony's reasoning effort for gpt-oss,
the end tokens of each format, and the reasoning kept apart from the answer token by token
(``engine.reasoning``), every token keeping its origin. Prompts go through the published
templates stored in tests/data/chat_templates; the replies whose reasoning is followed are token
streams built from the tokenizer (a random twin writes no markers by itself)."""

from __future__ import annotations

import threading

import pytest

from engine.chat_formats import ChatOptions, chat_format
from engine.config import FallbackConfig, SamplingConfig
from engine.errors import InvalidRequestError
from engine.events import Cycle, Finished, Started
from engine.reasoning import ReasoningParser, chat_options, encode_chat, reasoning_events, with_reasoning
from tests.chat_twins import ScriptedChatEngine, chat_tokenizer, chat_twin_engine

ASK = [{"role": "user", "content": "Write add in Python."}]


def run(engine, messages=ASK, options=ChatOptions(), block=4, max_new_tokens=200):
    ids = encode_chat(engine, messages, False, options)
    events = engine.generate(ids, SamplingConfig(max_new_tokens=max_new_tokens, block_size=block),
                             FallbackConfig(enabled=False), threading.Event())
    return list(reasoning_events(engine, ids, False, events))


def tokens_of(events):
    """(text, part, origin) of every token in display order, the rejected drafts included."""
    out = []
    for event in events:
        if isinstance(event, Started):
            out.append((event.first_text, event.first_part, "prefill"))
        elif isinstance(event, Cycle):
            parts = event.parts()
            for j, origin in enumerate(event.origins()):
                out.append((event.emitted_pieces[j], parts[j], origin))
            out.extend((p, part, "rejected") for p, part in zip(event.rejected_pieces, event.rejected_parts))
    return out


# ---------------------------------------------------------------------------- the formats


@pytest.mark.parametrize("family, reasoning, switch, ends", [
    ("qwen3", "think", True, ["<|im_end|>", "<|endoftext|>"]),
    ("qwen3_5", "think", True, ["<|im_end|>", "<|endoftext|>"]),
    ("qwen3_coder", "none", False, ["<|im_end|>", "<|endoftext|>"]),
    ("gpt_oss", "harmony", False, ["<|return|>", "<|call|>"]),
    ("llama", "none", False, ["<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"]),
])
def test_each_published_template_defines_its_format_and_end_tokens(family, reasoning, switch, ends):
    tokenizer = chat_tokenizer(family)
    fmt = chat_format(tokenizer)
    assert (fmt.reasoning, fmt.thinking_switch, list(fmt.end_tokens)) == (reasoning, switch, ends)
    assert fmt.thinking_default == (reasoning != "none")  # Qwen3's template thinks unless told not to


def test_the_twins_stop_at_their_formats_end_tokens():
    qwen = chat_twin_engine("qwen3", "qwen3")
    oss = chat_twin_engine("gpt_oss", "gpt_oss")
    ids = lambda engine, names: {engine.tokenizer.convert_tokens_to_ids(n) for n in names}  # noqa: E731
    assert ids(qwen, ["<|im_end|>"]) <= set(qwen.models.stop_token_ids)
    assert ids(oss, ["<|return|>", "<|call|>"]) <= set(oss.models.stop_token_ids)
    assert ids(oss, ["<|end|>"]).isdisjoint(oss.models.stop_token_ids)  # ends one message, not the reply


def test_qwen3_thinking_on_and_off_as_its_template_renders_them():
    engine = chat_twin_engine("qwen3", "qwen3")
    text = lambda options: engine.tokenizer.decode(engine.encode(ASK, chat=options), skip_special_tokens=False)  # noqa: E731
    default, on, off = text(ChatOptions()), text(ChatOptions(thinking=True)), text(ChatOptions(thinking=False))
    assert default == on and on.endswith("<|im_start|>assistant\n")  # the model opens <think> itself
    assert off == on + "<think>\n\n</think>\n\n"  # the template closes an empty block: no thinking


def test_gpt_oss_reasoning_effort_goes_into_the_system_message_as_harmony_specifies():
    engine = chat_twin_engine("gpt_oss", "gpt_oss")
    text = lambda options: engine.tokenizer.decode(engine.encode(ASK, chat=options), skip_special_tokens=False)  # noqa: E731
    assert "Reasoning: medium\n" in text(ChatOptions())  # the template's default
    for effort in ("low", "high"):
        rendered = text(ChatOptions(reasoning_effort=effort))
        assert "<|start|>system<|message|>" in rendered and f"Reasoning: {effort}\n" in rendered
        assert rendered.endswith("<|start|>assistant")
    with pytest.raises(InvalidRequestError, match="low, medium, high"):
        engine.encode(ASK, chat=ChatOptions(reasoning_effort="extreme"))


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_a_reasoning_effort_is_refused_for_models_without_it(family):
    with pytest.raises(InvalidRequestError, match="reasoning_effort is not a setting of this model"):
        ScriptedChatEngine(family).encode(ASK, chat=ChatOptions(reasoning_effort="low"))


# ---------------------------------------------------------------------------- the parser


def test_qwen3_reasoning_streams_apart_from_the_answer_with_every_origin_kept():
    engine = ScriptedChatEngine("qwen3", accept=(2, 0, 3, 1))
    engine.enqueue("<think>\nThe user wants a function. Let me plan it.\n</think>\n\ndef add(a, b):\n"
                   "    return a + b\n<|im_end|>")
    events = run(engine)
    finished = events[-1]
    assert finished.reasoning.strip() == "The user wants a function. Let me plan it."
    assert finished.text == "def add(a, b):\n    return a + b\n"  # no marker, no reasoning
    tokens = tokens_of(events)
    shown = [(text, part) for text, part, origin in tokens if origin != "rejected"]
    assert "".join(t for t, part in shown if part == "answer") == finished.text
    assert "".join(t for t, part in shown if part == "reasoning") == finished.reasoning
    assert all("<think>" not in t and "</think>" not in t for t, _, _ in tokens)
    origins = {(part, origin) for _, part, origin in tokens}  # both parts saw drafts accepted and refused
    assert {("reasoning", "accepted"), ("answer", "accepted"), ("reasoning", "rejected"),
            ("answer", "rejected"), ("answer", "bonus")} <= origins
    assert finished.reasoning_tokens == sum(1 for _, part, origin in tokens if part == "reasoning" and origin != "rejected")


def test_thinking_off_leaves_every_token_in_the_answer():
    engine = ScriptedChatEngine("qwen3")
    engine.enqueue("def add(a, b):\n    return a + b\n<|im_end|>")
    events = run(engine, options=ChatOptions(thinking=False))
    assert engine.prompts[-1].endswith("<think>\n\n</think>\n\n")
    assert events[-1].reasoning == "" and events[-1].reasoning_tokens == 0
    assert events[-1].text == "def add(a, b):\n    return a + b\n"


def test_qwen3_5_opens_the_block_in_the_prompt_so_the_reply_starts_inside_it():
    engine = ScriptedChatEngine("qwen3_5")
    engine.enqueue("Let me plan it.\n</think>\n\nHere it is.<|im_end|>")
    events = run(engine)
    assert engine.prompts[-1].endswith("<|im_start|>assistant\n<think>\n")
    assert events[0].first_part == "reasoning"
    assert events[-1].reasoning.strip() == "Let me plan it." and events[-1].text == "Here it is."


HARMONY_REPLY = ("<|channel|>analysis<|message|>The user wants a function. Let me plan it.<|end|>"
                 "<|start|>assistant<|channel|>final<|message|>def add(a, b):\n    return a + b\n<|return|>")


def test_gpt_oss_analysis_channel_is_kept_out_of_the_content():
    engine = ScriptedChatEngine("gpt_oss", accept=(3, 1, 0, 2))
    engine.enqueue(HARMONY_REPLY)
    events = run(engine, options=ChatOptions(reasoning_effort="high"))
    assert "Reasoning: high" in engine.prompts[-1]
    finished = events[-1]
    assert finished.reasoning == "The user wants a function. Let me plan it."
    assert finished.text == "def add(a, b):\n    return a + b\n"
    # what a plain decode of the ids shows (channel names as words) is what the parser removes
    assert "analysis" in engine.decode(finished.token_ids) and "analysis" not in finished.text + finished.reasoning
    parts = [part for _, part, origin in tokens_of(events) if origin != "rejected"]
    assert parts == sorted(parts, key=lambda p: p != "reasoning")  # reasoning first, then the answer


def test_a_harmony_header_split_across_cycles_still_names_its_channel():
    tokenizer = chat_tokenizer("gpt_oss")
    ids = list(tokenizer(HARMONY_REPLY, add_special_tokens=False)["input_ids"])
    parser = ReasoningParser.for_format(chat_format(tokenizer), tokenizer)
    parts = [parser.feed(t, tokenizer.decode([t]))[0] for t in ids]
    message = tokenizer.convert_tokens_to_ids("<|message|>")
    final_at = max(i for i, t in enumerate(ids) if t == message)  # the final message's body starts after it
    assert set(parts[final_at + 1:]) == {"answer"}
    assert set(parts[:ids.index(message) + 1]) == {"reasoning"}


def test_a_real_gpt_oss_twin_decodes_identically_through_the_reasoning_reader():
    """The reader changes no token: greedy DFlash through it equals plain greedy decoding."""
    engine = chat_twin_engine("gpt_oss", "gpt_oss", block_size=4)
    dflash = run(engine, block=4, max_new_tokens=24)
    plain = run(engine, block=1, max_new_tokens=24)
    assert dflash[-1].token_ids == plain[-1].token_ids and isinstance(dflash[-1], Finished)
    # a random twin never writes "<|message|>": all it says stays in the header after
    # "<|start|>assistant", which is scaffold, counted with the reasoning and shown to nobody
    assert dflash[-1].text == dflash[-1].reasoning == "" and len(dflash[-1].token_ids) == 24
    assert dflash[-1].reasoning_tokens == 24


def test_chat_options_come_from_the_stored_settings():
    assert chat_options({"thinking": False, "reasoning_effort": "low"}) == ChatOptions(False, "low")
    assert chat_options({}) == ChatOptions()


def test_without_a_parser_the_stream_is_untouched():
    events = [object(), object()]
    assert list(with_reasoning(iter(events), None)) == events


def test_generate_prints_the_answer_and_the_reasoning_apart(capsys):
    import argparse
    import json

    from app.cmd_generate import generate_with

    engine = ScriptedChatEngine("gpt_oss")
    engine.enqueue(HARMONY_REPLY)
    args = argparse.Namespace(raw=False, json=True, events=False, color="never", hide_rejected=False, thinking=None,
                              reasoning_effort="high", fallback=False, fallback_preset=None)
    assert generate_with(engine, args, "Write add in Python.", SamplingConfig(max_new_tokens=200, block_size=4)) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["text"] == "def add(a, b):\n    return a + b\n"
    assert out["reasoning"] == "The user wants a function. Let me plan it." and out["reasoning_tokens"] > 0
    assert "Reasoning: high" in engine.prompts[-1]
