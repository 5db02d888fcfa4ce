"""Stop strings on an event stream (engine.stops): the cut, the cancel flag, the final event."""

from __future__ import annotations

import threading

import pytest

from engine.config import FallbackConfig, SamplingConfig
from engine.events import Cycle, Finished, Started
from engine.stops import find_stop, unsafe_tail, with_stops
from tests.fake_engine import FakeEngine, FakeReply


def run(text: str, stops, accept=(2,)):
    engine = FakeEngine()
    engine.enqueue(FakeReply(text, accept=accept, fallback_at={}))
    cancel = threading.Event()
    events = list(with_stops(engine.generate([1, 2], SamplingConfig(max_new_tokens=500), FallbackConfig(False),
                                             cancel), stops, cancel))
    return events, cancel


def streamed_text(events) -> str:
    return "".join([e.first_text for e in events if isinstance(e, Started)]
                   + [e.emitted_text for e in events if isinstance(e, Cycle)])


def test_find_stop_and_unsafe_tail():
    assert find_stop("abc\nclass X", ["\nclass", "X"]) == 3
    assert find_stop("abc", ["zz", ""]) is None
    assert unsafe_tail("return 1\n", ["\nclass"]) == 1
    assert unsafe_tail("return 1\ncla", ["\nclass", "```"]) == 4
    assert unsafe_tail("return 1", ["\nclass"]) == 0
    assert unsafe_tail("x``", ["```"]) == 2


def test_the_reply_ends_before_the_stop_and_the_engine_is_told():
    events, cancel = run("one two three\nclass Four:\n    five six seven eight nine", ["\nclass"])
    finished = events[-1]
    assert isinstance(finished, Finished) and finished.reason == "stop" and finished.text == "one two three"
    assert cancel.is_set()
    assert streamed_text(events).startswith("one two three")
    assert len(finished.token_ids) == 1 + sum(len(e.emitted) for e in events if isinstance(e, Cycle))
    assert list(finished.acceptance_lengths) == [e.tau for e in events if isinstance(e, Cycle)]


def test_a_stop_split_over_two_cycles_cuts_the_earlier_text():
    events, _ = run("alpha beta\n\nclass Gamma", ["\nclass"], accept=(0,))  # one token per cycle
    assert events[-1].text == "alpha beta\n"
    assert events[-1].reason == "stop"


def test_no_stop_found_changes_nothing():
    events, cancel = run("def f():\n    return 1\n", ["zzz"])
    plain, _ = run("def f():\n    return 1\n", [])
    assert events[:-1] == plain[:-1] and not cancel.is_set()  # (the last differs in its timings only)
    assert events[-1].reason == "stop" and events[-1].text == "def f():\n    return 1\n"


def test_a_stop_in_the_first_token():
    events, cancel = run("STOP here", ["STOP"])
    assert cancel.is_set() and events[0].first_text == "" and events[-1].text == ""


def test_code_to_continue_leaves_the_line_break_after_a_block_opener_to_the_model():
    from engine.prompts import heal_code_prompt

    assert heal_code_prompt("def f(a):\n") == "def f(a):"
    assert heal_code_prompt("def f(a):\n    ") == "def f(a):"  # the indentation too
    assert heal_code_prompt('def f(a):\n    """Doc."""\n') == 'def f(a):\n    """Doc."""'
    assert heal_code_prompt("x = 1\n") == "x = 1\n"  # the model could go on with "x = 10"
    assert heal_code_prompt("def f(a):") == "def f(a):" and heal_code_prompt("\n\n") == "\n\n"


def test_healing_matches_how_the_tokenizer_merges_a_line_break_with_indentation():
    """Why it exists: in the embedded tokenizer "\\n   " is one token, so "):\\n" ends on a token
    that training text follows with a new top-level line, never a body."""
    from transformers import AutoTokenizer

    from engine.loading import embedded_pair

    target_dir, _ = embedded_pair()
    tok = AutoTokenizer.from_pretrained(str(target_dir))
    pieces = [tok.decode([i]) for i in tok("def f(a):\n    return a")["input_ids"]]
    assert "\n" not in pieces and any(p.startswith("\n ") for p in pieces)


def test_messages_a_chat_template_refuses_are_a_named_request_error():
    """Strict templates ("roles must alternate") raise while rendering: that is the user's input,
    so a clear InvalidRequestError (a 400 from the API, a toast in the app), never a server error."""
    from transformers import AutoTokenizer

    from engine.errors import InvalidRequestError
    from engine.loading import embedded_pair
    from engine.prompts import encode_prompt

    tok = AutoTokenizer.from_pretrained(str(embedded_pair()[0]))
    tok.chat_template = ("{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
                         "{{ raise_exception('Conversation roles must alternate user/assistant') }}{% endif %}"
                         "{{ m['content'] }}{% endfor %}")
    assert encode_prompt(tok, [{"role": "user", "content": "hi"}])
    with pytest.raises(InvalidRequestError, match="roles must alternate"):
        encode_prompt(tok, [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
