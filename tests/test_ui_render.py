"""The token view, chat text and figures: pure functions of engine events / stored cycles."""

from __future__ import annotations

import html
import json
import re

from engine.config import FallbackConfig, SamplingConfig
from engine.events import Cycle, Finished, Started, event_to_dict
from tests.fake_engine import FakeEngine, FakeReply
from ui.chat import charts
from ui.chat.render import assistant_markdown, chat_markdown, esc, render_token_view, stats_html, syntax_classes, user_markdown
from ui.chat.trace import ReplyTrace

XSS = "<img src=x onerror=alert(1)>"


def trace_of(reply: FakeReply, fallback: bool = True, block_size: int = 8) -> ReplyTrace:
    engine = FakeEngine(block_size=block_size)
    engine.enqueue(reply)
    trace = ReplyTrace()
    for event in engine.generate(engine.encode("x"), SamplingConfig(), FallbackConfig(enabled=fallback)):
        if isinstance(event, Started):
            trace.start(event.first_text, event.block_size, event.prefill_ms)
        elif isinstance(event, Cycle):
            trace.add_cycle(event)
        elif isinstance(event, Finished):
            trace.finished = event_to_dict(event)
    return trace


def spans(html_text: str) -> list[dict]:
    pattern = r'<span class="tok" data-origin="(\w+)" data-cycle="(\d+)" data-slot="(\d+)" title="([^"]*)">'
    return [dict(zip(("origin", "cycle", "slot", "title"), m)) for m in re.findall(pattern, html_text)]


def test_every_token_is_a_span_with_origin_cycle_and_tooltip_in_display_order():
    trace = trace_of(FakeReply("a b c d e f g h", accept=(2, 0), fallback_at={}))
    html_text = render_token_view(trace)
    got = [(s["origin"], s["cycle"], s["slot"]) for s in spans(html_text)]
    # prefill "a"; cycle 1: 2 accepted drafts, 5 rejected, bonus at slot 3; cycle 2: 0 accepted, 7 rejected, bonus slot 1
    assert got[:9] == [("bonus", "0", "0"), ("accepted", "1", "1"), ("accepted", "1", "2")] + [
        ("rejected", "1", str(j)) for j in range(3, 8)] + [("bonus", "1", "3")]
    assert got[9:17] == [("rejected", "2", str(j)) for j in range(1, 8)] + [("bonus", "2", "1")]
    first_accepted = spans(html_text)[1]["title"]
    assert "cycle 1" in first_accepted and "slot 1/7" in first_accepted and "draft p 0.90" in first_accepted


def test_text_of_the_view_is_the_reply_and_rejected_tokens_are_not_in_it():
    reply = FakeReply("def f(x):\n    return x\n", accept=(1, 3, 0))
    trace = trace_of(reply)
    assert trace.text == reply.text
    assert trace.new_tokens == sum(trace.taus) + 1  # every cycle's tau plus the prefill token


def test_model_text_is_escaped_in_the_token_view_and_tooltips():
    trace = trace_of(FakeReply(f'x {XSS} "q"', accept=(7,)))
    html_text = render_token_view(trace)
    assert "<img" not in html_text and "&lt;" in html_text
    visible = html.unescape(re.sub(r"<[^>]+>", "", html_text.split('<div class="tv-body">')[1]))
    assert XSS in visible  # shown as text
    assert '"q"' not in html_text  # quotes are escaped too (tooltips are attributes)


def test_syntax_colours_survive_inside_origin_spans_in_code_blocks_only():
    trace = trace_of(FakeReply("Use this:\n```python\ndef f():\n    return 1\n```\nok def", accept=(7,)))
    html_text = render_token_view(trace)
    assert re.search(r'data-origin="\w+"[^>]*><span class="k">def</span>', html_text)  # keyword colour kept
    assert syntax_classes("prose def\n")[6:9] == ["", "", ""]  # prose outside fences stays plain
    assert syntax_classes("def f(): pass", mode="complete")[:3] == ["k", "k", "k"]  # complete mode: all code


def test_fallback_changes_are_marked_inline_with_their_reason():
    trace = trace_of(FakeReply("a b c d e f g h i j k l m n o p q r", accept=(1,),
                               fallback_at={2: (4, "reduced", "τ 2.0 over last 2 cycles; block 8 → 4")}))
    html_text = render_token_view(trace)
    assert 'title="fallback: reduced, block → 4: τ 2.0 over last 2 cycles; block 8 → 4">⟨reduced → 4⟩</span>' in html_text
    assert trace.block_sizes[:3] == [8, 8, 4]
    assert trace.marks[0].after_cycle == 2


def test_a_stored_reply_renders_like_the_live_one():
    trace = trace_of(FakeReply("def f(x):\n    return x * 2\n", accept=(3, 0, 2)))
    cycles = [{k: v for k, v in dict_.items()} for dict_ in _cycle_dicts(trace)]
    stored = ReplyTrace.from_stored(trace.text, cycles, {"settings": {"block_size": 8}, "status": "complete"})
    assert render_token_view(stored) == render_token_view(trace)


def _cycle_dicts(trace: ReplyTrace):
    engine = FakeEngine()
    engine.enqueue(FakeReply("def f(x):\n    return x * 2\n", accept=(3, 0, 2)))
    return [event_to_dict(e) for e in engine.generate(engine.encode("x"), SamplingConfig(), FallbackConfig(enabled=True))
            if isinstance(e, Cycle)]


def test_figures_per_position_histogram_and_speedup():
    trace = trace_of(FakeReply(" ".join("abcdefghijklmnopqrstuvwxyz"), accept=(7, 0)), fallback=False)
    hist = trace.tau_histogram()
    assert sum(hist.values()) == trace.cycles and hist[8] == trace.taus.count(8) and hist[1] == trace.taus.count(1)
    rates = trace.per_position_acceptance()
    assert len(rates) == 7 and 0.4 < rates[0] <= 0.6 and rates == sorted(rates, reverse=True)
    assert trace.estimated_speedup() > 0
    assert "mean τ" in stats_html(trace) and "est. speedup" in stats_html(trace)


def test_chat_markdown_escapes_html_outside_code_and_keeps_code_literal():
    assert chat_markdown(XSS) == "&lt;img src=x onerror=alert(1)&gt;"
    assert chat_markdown("`<b>` and <b>") == "`<b>` and &lt;b&gt;"
    fenced = "```html\n<b>bold</b>\n```\nthen <i>"
    assert chat_markdown(fenced) == "```html\n<b>bold</b>\n```\nthen &lt;i&gt;"
    assert chat_markdown("```python\nx = 1") == "```python\nx = 1\n```"  # a fence still streaming is closed
    assert "&lt;img" in user_markdown(XSS)


def test_reply_markdown_carries_footer_and_end_state():
    trace = trace_of(FakeReply("a b c", accept=(7,)))
    assert "reply-footer" in assistant_markdown("a b c", "complete", trace)
    assert "stopped" in assistant_markdown("a b", "interrupted", trace)
    error = assistant_markdown("a", "error", trace, error="<boom>")
    assert "⚠ error: &lt;boom&gt;" in error


def test_a_chat_reply_of_bare_code_shows_as_a_code_block_and_prose_stays_prose():
    code = "def get(self, key):\n    return self._items[key]\n"
    assert assistant_markdown(code, "complete").startswith("```python\ndef get(self, key):")
    prose = "Use a dictionary: it maps each key to its value in constant time."
    assert assistant_markdown(prose, "complete") == prose
    fenced = "Here:\n```python\nx = 1\n```"
    assert assistant_markdown(fenced, "complete") == fenced  # already fenced: left as written
    risky = "x = '<img src=x onerror=alert(1)>'\nreturn x\n"
    assert assistant_markdown(risky, "complete").startswith("```python\n")  # literal inside the code block


def test_charts_are_plotly_figures_with_block_size_and_annotations():
    trace = trace_of(FakeReply(" ".join("abcdefghijklmnopqrstuvwxyz"), accept=(1,),
                               fallback_at={3: (4, "reduced", "why")}))
    fig = charts.acceptance_chart(trace)
    assert [t["name"] for t in fig["data"]] == ["τ (tokens this cycle)", "block size", "fallback change"]
    assert fig["data"][1]["y"][:5] == [8, 8, 8, 4, 4]
    assert fig["layout"]["annotations"][0]["hovertext"] == "why" and fig["layout"]["shapes"][0]["x0"] == 3.5
    assert charts.session_chart({"replies": [{"mean_tau": 2.0, "tokens_per_s": 10.0}]})["data"][0]["y"] == [2.0]
    assert charts.tau_histogram({"2": 3})["data"][0]["x"] == [2]
    assert charts.position_chart([0.5, 0.25])["data"][0]["y"] == [0.5, 0.25]
    assert charts.acceptance_chart(None)["data"][0]["x"] == []
    sent = charts.plot(fig)  # what gr.Plot gets: plotly JSON that plotly.js draws
    assert sent.type == "plotly" and json.loads(sent.plot) == fig
    import plotly.graph_objects as go

    go.Figure(fig)  # a valid Plotly figure (validated here, not on every streamed update)


def test_fenced_blocks_pair_fences_by_marker_and_run_an_open_block_to_the_end():
    from ui.chat.render import fenced_blocks

    text = "intro\n```python\nx = 1\n~~~\ny = 2\n```\nprose\n~~~\nstill streaming"
    first, second = fenced_blocks(text)
    assert (first.marker, first.language, first.closed) == ("```", "python", True)
    assert text[first.body_start:first.body_end] == "\nx = 1\n~~~\ny = 2\n"  # ~~~ does not close ```
    assert text[first.start:first.end] == "```python\nx = 1\n~~~\ny = 2\n```"
    assert (second.marker, second.closed, second.end) == ("~~~", False, len(text))
    assert list(fenced_blocks("no code here")) == []


def test_speed_estimate_is_tau_over_the_measured_cycle_cost_and_says_why():
    """With measured costs on the cycles (Cycle.cost_in_plain_steps), the estimate is mean τ ÷
    mean cycle cost in plain steps, and the stats strip says so in one line."""
    trace = ReplyTrace()
    trace.start("a", 8)
    cycles = [(7, 8, 2.0), (3, 8, 2.0), (0, 1, 1.0), (5, 4, 1.5)]  # (accepted, block, cost in plain steps)
    for index, (accepted, block, steps) in enumerate(cycles, 1):
        trace.add_cycle({"index": index, "block_size": block, "accepted": accepted, "emitted_pieces": ["x"] * (accepted + 1),
                         "draft_ms": 4.0, "verify_ms": 20.0, "cost_in_plain_steps": steps})
    mean_tau, mean_cost = (8 + 4 + 1 + 6) / 4, (2.0 + 2.0 + 1.0 + 1.5) / 4
    assert trace.cost_in_plain_steps() == mean_cost
    assert abs(trace.estimated_speedup() - mean_tau / mean_cost) < 1e-9
    line = trace.speed_explanation()
    assert line.startswith(f"τ {mean_tau:.2f} ÷ cycle cost {mean_cost:.2f} plain steps = {mean_tau / mean_cost:.2f}×")
    assert "speculation pays" in line and esc(line) in stats_html(trace)
    # a reply recorded without measured costs keeps the older estimate and shows no such line
    old = ReplyTrace()
    old.start("a", 8)
    old.add_cycle({"index": 1, "block_size": 8, "accepted": 1, "emitted_pieces": ["x", "y"], "draft_ms": 4.0, "verify_ms": 20.0})
    assert old.speed_explanation() is None and old.estimated_speedup() > 0
    slow = ReplyTrace()
    slow.start("a", 8)
    slow.add_cycle({"index": 1, "block_size": 8, "accepted": 0, "emitted_pieces": ["x"], "draft_ms": 4.0, "verify_ms": 20.0,
                    "cost_in_plain_steps": 2.0})
    assert "speculation loses" in slow.speed_explanation()


def test_bare_code_with_a_prose_docstring_is_one_code_block_in_chat_teach_and_analytics():
    """A bare-code reply whose docstring is a long sentence once rendered its def line and
    docstring as prose (indentation lost) and the rest as a code block."""
    from ui.teach.analytics import reply_kind
    from ui.chat.render import bare_code

    reply = ('def reverse_string(text):\n    """Return the string that you get when you read the given text\n'
             '    from its last character back to its first one, which is what reversing means.\n'
             '    It works for any text, including the empty string and very long ones.\n    """\n'
             '    return text[::-1]\n')
    assert bare_code(reply)
    markdown = assistant_markdown(reply, "complete")
    assert markdown.startswith("```python\ndef reverse_string(text):\n    \"\"\"Return")
    assert markdown.count("```") == 2  # one block, indentation kept inside it
    assert "\n    return text[::-1]\n" in markdown.split("```")[1]
    classes = syntax_classes(reply)  # teach mode colours the whole reply as code
    assert classes[:3] == ["k", "k", "k"] and classes[reply.index("return ")] == "k"
    assert reply_kind(reply) == "code"  # session analytics counts it as code
    assert not bare_code("Reverse it with slicing: that is the usual way to do it in Python today.\n")
    assert not bare_code("")


def test_a_nul_in_model_text_stays_visible_on_the_page_and_in_a_shared_replay():
    """An HTML parser drops a NUL from text, so a reply holding one would read shorter than it
    is: the page and the replay file (one escaping helper) show it as U+FFFD."""
    from storage import SessionStore
    from tests.share_helpers import store_fake_reply
    from ui.share.replay import load_share
    from ui.share.page import replay_html

    assert esc("a\x00<b>") == "a\ufffd&lt;b&gt;"
    with SessionStore(":memory:") as store:
        session_id, _ = store_fake_reply(store, title="nul\x00<here>", model="m\x00del")
        page = replay_html(load_share(store, session_id))
    assert "<h1 id=\"rp-title\">nul\ufffd&lt;here&gt;</h1>" in page and "m\ufffddel" in page
    assert "\x00" not in page  # in the data block too (JSON writes it as \u0000)
