"""Reasoning models through the OpenAI-compatible API, with the official ``openai`` client on a
real server: ``reasoning_content`` on the message and on stream deltas (vLLM's and DeepSeek's
form), ``usage.completion_tokens_details.reasoning_tokens``, thinking switched by
``chat_template_kwargs`` (vLLM's form), and ``reasoning_effort`` honoured for a harmony model and
refused in one line for the others. The engines render prompts with the published templates and
reply with scripted token streams (tests/chat_twins.py)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import openai  # noqa: E402

from tests.chat_twins import ScriptedChatEngine  # noqa: E402
from tests.fake_engine import fake_studio  # noqa: E402
from tests.test_api import launch  # noqa: E402

ASK = [{"role": "user", "content": "Write add in Python."}]
QWEN_REPLY = "<think>\nThe user wants a function. Let me plan it.\n</think>\n\ndef add(a, b):\n    return a + b\n<|im_end|>"
HARMONY_REPLY = ("<|channel|>analysis<|message|>The user wants a function. Let me plan it.<|end|>"
                 "<|start|>assistant<|channel|>final<|message|>def add(a, b):\n    return a + b\n<|return|>")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    qwen = ScriptedChatEngine("qwen3", name="qwen3-twin")
    oss = ScriptedChatEngine("gpt_oss", name="gpt-oss-twin")
    studio = fake_studio(qwen, db_path=tmp_path_factory.mktemp("db") / "sessions.db", others=(oss,))
    url = launch(studio)
    yield studio, qwen, oss, openai.OpenAI(base_url=url + "/v1", api_key="unused-on-loopback", max_retries=0)
    studio.close()


def test_reasoning_content_is_apart_from_the_content_and_counted(served):
    studio, qwen, _, client = served
    qwen.enqueue(QWEN_REPLY)
    reply = client.chat.completions.create(model="qwen3-twin", messages=ASK, max_tokens=200)
    message = reply.choices[0].message
    assert message.content == "def add(a, b):\n    return a + b\n"
    assert message.reasoning_content.strip() == "The user wants a function. Let me plan it."
    reasoning_ids = qwen.reply_ids("<think>\nThe user wants a function. Let me plan it.\n</think>")
    assert reply.usage.completion_tokens_details.reasoning_tokens == len(reasoning_ids)
    assert qwen.prompts[-1].endswith("<|im_start|>assistant\n")  # thinking on: Qwen3's default
    stored = studio.store.get_messages(studio.store.list_sessions(limit=1)[0]["id"])[-1]
    assert (stored["content"], stored["reasoning"].strip()) == (message.content, message.reasoning_content.strip())


def test_stream_deltas_carry_reasoning_content_then_content(served):
    _, qwen, _, client = served
    qwen.enqueue(QWEN_REPLY)
    chunks = list(client.chat.completions.create(model="qwen3-twin", messages=ASK, max_tokens=200, stream=True,
                                                 stream_options={"include_usage": True}))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
    content = "".join(d.content or "" for d in deltas)
    assert reasoning.strip() == "The user wants a function. Let me plan it." and "think>" not in reasoning + content
    assert content == "def add(a, b):\n    return a + b\n"
    first_content = next(i for i, d in enumerate(deltas) if d.content)
    assert all(not getattr(d, "reasoning_content", None) for d in deltas[first_content + 1:])  # reasoning came first
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens > 0


def test_thinking_off_through_chat_template_kwargs(served):
    _, qwen, _, client = served
    qwen.enqueue("def add(a, b):\n    return a + b\n<|im_end|>")
    reply = client.chat.completions.create(model="qwen3-twin", messages=ASK, max_tokens=200,
                                           extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert qwen.prompts[-1].endswith("<think>\n\n</think>\n\n")  # as Qwen3's template renders "off"
    assert getattr(reply.choices[0].message, "reasoning_content", None) is None
    assert reply.usage.completion_tokens_details.reasoning_tokens == 0


def test_reasoning_effort_is_refused_in_one_line_for_a_model_without_it(served):
    _, qwen, _, client = served
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="qwen3-twin", messages=ASK, max_tokens=20, reasoning_effort="low")
    message = caught.value.body["message"]
    assert "reasoning_effort is not a setting of this model" in message and "\n" not in message


def test_gpt_oss_takes_reasoning_effort_and_keeps_its_analysis_out_of_the_content(served):
    _, _, oss, client = served
    oss.enqueue(HARMONY_REPLY)
    reply = client.chat.completions.create(model="gpt-oss-twin", messages=ASK, max_tokens=200, reasoning_effort="low")
    assert "Reasoning: low\n" in oss.prompts[-1]
    message = reply.choices[0].message
    assert message.content == "def add(a, b):\n    return a + b\n"
    assert message.reasoning_content == "The user wants a function. Let me plan it."
    assert reply.choices[0].finish_reason == "stop"
