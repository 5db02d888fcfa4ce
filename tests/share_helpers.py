"""Stored replies for the share tests: a FakeEngine reply recorded the way the app records one
(``service.replies``: the prefill token, one cycle dict per cycle, the Finished text), with
Compare's result kept beside it when asked."""

from __future__ import annotations

from engine.config import FallbackConfig, SamplingConfig
from engine.events import Cycle, Finished, Started, event_to_dict
from tests.fake_engine import DEFAULT_TEXT, FakeEngine, FakeReply
from ui.teach.compare import compare_stored_reply, comparison_record


def store_fake_reply(store, *, title: str = "Fibonacci", model: str = "fake-coder", prompt: str = "write fib",
                     text: str = DEFAULT_TEXT, accept: tuple[int, ...] = (3, 1, 6, 0, 2, 4), block: int = 8,
                     compare: bool = True, final_text: str | None = None) -> tuple[int, int]:
    """A session holding ``prompt`` and its reply ``text``; returns (session id, reply id).
    ``final_text`` stores another final text than the cycles' (a stop string cut the reply)."""
    engine = FakeEngine(name=model, block_size=block, context_window=10**8,
                        default_reply=FakeReply(text, accept=accept, fallback_at={}))
    session_id = store.create_session(title, model=model)
    store.add_message(session_id, "user", prompt)
    settings = {"block_size": block, "temperature": 0.0, "top_p": 1.0, "max_new_tokens": 32768, "fallback": False,
                "engine": "local", "model": model}
    message_id = store.start_reply(session_id, model=model, settings=settings)
    sampling = SamplingConfig(max_new_tokens=32768, block_size=block)
    record_events(store, message_id, engine.generate(engine.encode(prompt), sampling, FallbackConfig(enabled=False)),
                  final_text)
    if compare:
        message = store.get_message(message_id)
        comparison = compare_stored_reply(engine, message, store.get_messages(session_id), store.get_cycles(message_id))
        store.save_comparison(message_id, comparison_record(comparison, model))
    return session_id, message_id


def record_events(store, message_id: int, events, final_text: str | None = None) -> None:
    """Save one generation's events into a started reply, as the app does."""
    with store.reply_writer(message_id) as writer:
        so_far = ""
        for event in events:
            if isinstance(event, Started):
                so_far = event.first_text
            elif isinstance(event, Cycle):
                so_far += event.emitted_text
                writer.add_cycle(event_to_dict(event))
            elif isinstance(event, Finished):
                writer.set_content(event.text if final_text is None else final_text)
                writer.finish("complete", stats=event_to_dict(event))
                continue
            writer.set_content(so_far)
