"""``ui.chat.generation.stream_reply`` when the engine worker never runs the request: the page's stream
must end with the reason instead of waiting for the engine forever."""

from __future__ import annotations

import threading

from engine.config import FallbackConfig, SamplingConfig
from ui.chat.generation import GenerationRequest, stream_reply


def request_on(model: str) -> GenerationRequest:
    return GenerationRequest(None, [{"role": "user", "content": "write add()"}], False, "chat", SamplingConfig(),
                             FallbackConfig(), {"model": model})


def updates_within(ctx, request, seconds: float = 10.0) -> list:
    updates: list = []
    reader = threading.Thread(target=lambda: updates.extend(stream_reply(ctx, request)), daemon=True)
    reader.start()
    reader.join(seconds)
    assert not reader.is_alive(), "the stream still says 'waiting for the engine' after the job failed"
    return updates


def test_a_request_for_a_model_the_studio_does_not_have_ends_with_why(ctx):
    last = updates_within(ctx, request_on("no-such-pair"))[-1]
    assert last.final and last.status == "error"
    assert "no-such-pair" in last.note

