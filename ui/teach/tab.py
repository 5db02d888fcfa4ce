"""The Teach tab: replay a stored reply block by block, compare it with plain decoding, and
look at a session's analytics.

``build_teach_tab(ctx, demo, tab, chat_session)`` is called inside ``with gr.Tab("Teach",
elem_id="teach") as tab`` in ``ui.layout``; it builds the tab and wires its own events (the tab's
``select`` or the page's ``load`` refresh it; it needs only the chat's remembered session). Everything shown comes
from the store; the comparison runs on the engine worker (``ctx.replies.run_job``).

Element ids: teach-session, teach-reply, teach-refresh, teach-prev, teach-play, teach-next,
teach-speed, teach-cycle, teach-step (holding teach-caption, teach-context, teach-block,
teach-slots, teach-heatmap, teach-text, teach-cost, teach-cache), teach-share, teach-gif, teach-gif-file,
teach-explain, compare, compare-stop,
compare-result,
compare-chart, analytics-summary, analytics-tau-time, analytics-tau-hist, analytics-position,
analytics-table, analytics-export, analytics-files.
"""

from __future__ import annotations

from functools import partial

import gradio as gr

from engine.interface import capabilities_of
from storage.records import number_replies, stored_model

from ..chat import charts
from ..chat.models import reply_model
from ..chat.reasoning_view import analytics_parts_html
from ..chat.render import esc
from ..chat.trace import ReplyTrace, engine_note
from ..context import STORE_ERRORS, UIContext
from ..named import Outputs, checked, refused
from ..share.buttons import build_share_controls, wire_share
from . import analytics as an
from .compare import (Comparison, comparison_record, rerun_settings, run_comparison,
                      sampling_from_settings, stored_run)
from .render import TEACH_CSS, compare_html, explainer_html, step_html
from .steps import TeachStep, build_steps, reply_numbers, reply_prompt

SPEEDS = (0.25, 4.0)  # cycles per second
PLAY, PAUSE = "▶ Play", "❚❚ Pause"
# Every component the tab's handlers change, by name (the order is the Gradio API's).
FULL_VIEW = ("session", "reply", "cycle", "step", "explainer", "compare_result", "compare_chart", "summary",
             "tau_time", "tau_hist", "position", "token_classes", "table", "files", "playing", "timer", "play")
REPLY_VIEW = ("cycle", "step", "explainer", "compare_result", "compare_chart")
PLAYBACK = ("cycle", "step", "playing", "timer", "play")
COMPARISON = ("compare_result", "compare_chart")
ENGINE_QUEUE = {"concurrency_limit": 1, "concurrency_id": "engine"}  # the chat's engine queue: one at a time


# ============================================================================ reading the store


def session_choices(ctx: UIContext) -> list[tuple[str, int]]:
    return [(f"{s['title']} ({s['message_count']} messages)", s["id"]) for s in ctx.store.list_sessions()]


def reply_choices(ctx: UIContext, session_id: int | None) -> list[tuple[str, int]]:
    """The session's replies, newest last: "reply 1 · text… · N cycles · τ x" (numbered as everywhere)."""
    if session_id is None:
        return []
    stats = {r["message_id"]: r for r in ctx.store.session_stats(session_id)["replies"]}
    choices = []
    messages = ctx.store.get_messages(session_id)
    numbers = number_replies(messages)
    for m in messages:
        if m["id"] not in numbers:
            continue
        r = stats.get(m["id"], {})
        preview = " ".join((m["content"] or "").split())[:40] or "(empty)"
        figures = f"{r.get('cycles') or 0} cycles" + (f" · τ {r['mean_tau']:.2f}" if r.get("mean_tau") else "")
        choices.append((f"reply {numbers[m['id']]} · {preview} · {figures}", m["id"]))
    return choices


def default_reply(ctx: UIContext, session_id: int | None) -> int | None:
    """The latest reply of the session that has cycles (else its latest reply)."""
    if session_id is None:
        return None
    replies = ctx.store.session_stats(session_id)["replies"]
    with_cycles = [r for r in replies if r["cycles"]]
    chosen = (with_cycles or replies)[-1:]
    return chosen[0]["message_id"] if chosen else None


def load_steps(ctx: UIContext, message_id: int | None) -> list[TeachStep]:
    if message_id is None:
        return []
    try:
        message = ctx.store.get_message(int(message_id))
        cycles = ctx.store.get_cycles(int(message_id))
    except STORE_ERRORS:
        return []
    return build_steps(message["content"] or "", cycles, engine_note((message.get("settings") or {}).get("engine")))


def _as_id(value) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _clamp(k, n: int) -> int:
    try:
        k = int(k)
    except (TypeError, ValueError):
        k = 1
    return max(1, min(n, k)) if n else 1


# ============================================================================ replay


def step_view(ctx: UIContext, message_id, k) -> str:
    steps = load_steps(ctx, message_id)
    if not steps:
        return step_html(None, "This reply has no stored cycles to replay." if message_id is not None else "")
    return step_html(steps[_clamp(k, len(steps)) - 1])


def move(ctx: UIContext, message_id, k, delta: int) -> dict:
    """Prev / Next: the new cycle number and its view."""
    steps = load_steps(ctx, message_id)
    k = _clamp(_clamp(k, len(steps)) + delta, len(steps))
    return {"cycle": k, "step": step_html(steps[k - 1]) if steps else step_html(None)}


def toggle_play(ctx: UIContext, message_id, k, playing: bool, speed) -> dict:
    """Play / Pause. Playing from the last cycle starts again at the first."""
    steps = load_steps(ctx, message_id)
    playing = not playing and len(steps) > 1
    k = _clamp(k, len(steps))
    restart = playing and k >= len(steps)
    if restart:
        k = 1
    interval = 1.0 / max(SPEEDS[0], min(SPEEDS[1], float(speed or 1.0)))
    view = {"playing": playing, "timer": gr.Timer(value=interval, active=playing),
            "play": gr.Button(PAUSE if playing else PLAY)}
    if restart:
        view.update(cycle=k, step=step_html(steps[0]))
    return view


def tick(ctx: UIContext, message_id, k, playing: bool) -> dict:
    """One Play step: the next cycle; at the last one, stop."""
    steps = load_steps(ctx, message_id)
    if not playing or not steps:  # paused meanwhile: leave everything as Pause set it
        return {"timer": gr.Timer(active=False)}
    k = _clamp(_clamp(k, len(steps)) + 1, len(steps))
    view = {"cycle": k, "step": step_html(steps[k - 1])}
    if k >= len(steps):
        view.update(playing=False, timer=gr.Timer(active=False), play=gr.Button(PLAY))
    return view


def stopped_playback() -> dict:
    return {"playing": False, "timer": gr.Timer(active=False), "play": gr.Button(PLAY)}


def set_speed(speed, playing: bool):
    interval = 1.0 / max(SPEEDS[0], min(SPEEDS[1], float(speed or 1.0)))
    return gr.Timer(value=interval, active=bool(playing))


# ============================================================================ whole view


def reply_view(ctx: UIContext, message_id) -> dict:
    """What changes with the reply: cycle slider, step, explainer, comparison (cleared)."""
    steps = load_steps(ctx, message_id)
    n = len(steps)
    slider = gr.Slider(minimum=1, maximum=max(n, 2), value=1, step=1, interactive=n > 1,
                       label=f"Cycle (of {n})" if n else "Cycle (no stored cycles)")
    note = "This reply has no stored cycles to replay." if message_id is not None else "No reply to replay yet: chat first."
    return {"cycle": slider, "step": step_html(steps[0]) if steps else step_html(None, note),
            "explainer": explainer_html(reply_numbers(steps) if steps else None),
            "compare_result": compare_html(None), "compare_chart": None}


def _empty_analytics(note: str) -> dict:
    return {"summary": f'<div id="analytics-empty">{note}</div>', "tau_time": None, "tau_hist": None,
            "position": None, "token_classes": None, "table": []}


def analytics_view(ctx: UIContext, session_id) -> dict:
    """Summary, four charts and the table of a session's replies."""
    if session_id is None:
        return _empty_analytics("No session yet.")
    try:
        data = an.session_analytics(ctx.store, int(session_id))
    except STORE_ERRORS:
        return _empty_analytics("That session no longer exists.")
    return {"summary": analytics_summary_html(data), "tau_time": charts.plot(an.tau_over_time_chart(data)),
            "tau_hist": charts.plot(an.tau_histogram_chart(data)), "position": charts.plot(an.position_chart(data)),
            "token_classes": charts.plot(an.token_class_chart(data)), "table": an.table_rows(data)}


def analytics_summary_html(data: an.SessionAnalytics) -> str:
    cells = []
    for kind in ("code", "prose", "all"):
        f = data.by_kind[kind]
        replies = sum(1 for r in data.replies if kind == "all" or r.kind == kind)
        mean = "–" if f.mean_tau is None else f"{f.mean_tau:.2f}"
        rate = "–" if f.acceptance_rate is None else f"{f.acceptance_rate:.0%}"
        cells.append(f'<div class="ex-col" data-kind="{kind}"><b>{kind}</b>: {counted(replies, "reply", "replies")} · '
                     f'{counted(f.cycles, "cycle")} · '
                     f'<span class="ex-num" data-stat="mean-tau">{mean}</span> mean τ · {rate} of drafts accepted</div>')
    regions = []
    for region, words in (("code", "in code"), ("prose", "in prose")):
        f = data.by_region.get(region)
        if f and f.cycles:
            regions.append(f'<span data-region="{region}">{words}: <b>{f.mean_tau:.2f}</b> mean τ over '
                           f'{counted(f.cycles, "cycle")} ({f.acceptance_rate or 0:.0%} of drafts accepted)</span>')
    by_region = (f'<p id="analytics-regions" style="font-size:13px">Cycle by cycle, wherever the reply: '
                 f'{" · ".join(regions)}</p>' if regions else "")
    counts = data.by_token_class
    ranked = sorted((c for c in counts.present() if counts.total[c] >= 5), key=counts.share, reverse=True)
    by_class = (f'<p id="analytics-token-classes-note" style="font-size:13px">The draft wrote '
                f'<b>{counts.share(ranked[0]):.0%}</b> of the {an.LABELS[ranked[0]]} but only '
                f'<b>{counts.share(ranked[-1]):.0%}</b> of the {an.LABELS[ranked[-1]]}; the target wrote the rest '
                '(the chart below has every kind of token).</p>' if len(ranked) >= 2 else "")
    return (f'<div id="analytics-kinds" class="ex-grid" style="display:grid;grid-template-columns:repeat(3,1fr);gap:8px">'
            f'{"".join(cells)}</div>{by_region}{analytics_parts_html(data.by_part)}{by_class}<p style="font-size:12px;opacity:.7">Session “{esc(data.title)}”. Kind is '
            'detected from each reply: code when at least half of its text is in code fences or looks like code '
            '(Complete-mode replies are code).</p>')


def counted(n: int, one: str, many: str | None = None) -> str:
    """"1 reply", "2 replies", "0 cycles"."""
    return f"{n} {one if n == 1 else (many or one + 's')}"


def full_view(ctx: UIContext, session_id=None, message_id=None) -> dict:
    """Sessions, replies, the replay of the chosen reply and the analytics of its session.
    Defaults: the most recently updated session and its latest reply with cycles."""
    sessions = session_choices(ctx)
    ids = [v for _, v in sessions]
    session_id = _as_id(session_id)
    message_id = _as_id(message_id)
    if session_id not in ids:
        session_id = None
    if session_id is None and sessions:
        session_id = sessions[0][1]
    replies = reply_choices(ctx, session_id)
    if message_id not in [v for _, v in replies]:
        message_id = default_reply(ctx, session_id)
    return {"session": gr.Dropdown(choices=sessions, value=session_id),
            "reply": gr.Dropdown(choices=replies, value=message_id),
            **reply_view(ctx, message_id), **analytics_view(ctx, session_id), **stopped_playback(),
            "files": gr.File(value=None, visible=False)}


def export_analytics(ctx: UIContext, session_id):
    if session_id is None:
        raise refused("No session to export.")
    try:
        data = an.session_analytics(ctx.store, int(session_id))
    except STORE_ERRORS as exc:
        raise refused(f"Cannot export: {exc}") from None
    try:
        return gr.File(value=an.export_files(data), visible=True)
    except an.ChartExportError as exc:
        raise refused(str(exc)) from None


# ============================================================================ comparison


def prepare_comparison(ctx: UIContext, message_id) -> tuple[dict, list[dict], object, bool]:
    """The reply, its cycles and the prompt it answered; ``gr.Error`` when it cannot be compared."""
    if message_id is None:
        raise refused("Pick a reply to compare first.")
    try:
        message = ctx.store.get_message(int(message_id))
        messages = ctx.store.get_messages(message["session_id"])
        cycles = ctx.store.get_cycles(int(message_id))
    except STORE_ERRORS as exc:
        raise refused(f"Cannot compare: {exc}") from None
    if message["role"] != "assistant":
        raise refused("Only a reply can be compared.")
    if message["status"] == "streaming":
        raise refused("This reply is still being generated.")
    try:
        prompt, raw = reply_prompt(messages, message, lambda name: ctx.engines.resolve(name) or name)
    except ValueError as exc:
        raise refused(f"Cannot compare: {exc}") from None
    return message, cycles, prompt, raw


def check_compare(ctx: UIContext, message_id) -> tuple[dict, list[dict], object, bool, dict, int | None]:
    """Everything that can refuse a comparison, run first as an event of its own (``checked``):
    the reply, its cycles, its prompt, the settings to rerun it with and the tokens it produced."""
    message, cycles, prompt, raw = prepare_comparison(ctx, message_id)
    settings, produced = rerun_settings(message, cycles)  # a stopped reply: compare the tokens it has
    try:
        sampling, _ = sampling_from_settings(settings)
        sampling.validate(max_block_size=ctx.defaults.max_block_size)
    except Exception as exc:  # noqa: BLE001 - a stored setting the engine would refuse
        raise refused(f"Cannot compare: the reply's settings are invalid ({exc})") from None
    if ctx.engines.engine is None and ctx.engines.status().state != "loading":
        raise refused("No model is loaded (see the model status).")
    return message, cycles, prompt, raw, settings, produced


def compare(ctx: UIContext, message_id, rerun_dflash: bool = True):
    """Re-run the reply's prompt with speculation off on the engine worker (then DFlash again,
    for a back-to-back speed ratio) and show identical/different, tokens/s, speedup, timelines."""
    message, cycles, prompt, raw, settings, produced = check_compare(ctx, message_id)
    stopped = message["status"] != "complete"
    engine = ctx.engines.engine
    how = f" Plain decoding runs on {capabilities_of(engine).plain_decoding}." if engine is not None else ""
    yield {"compare_result": compare_html(None, "Running plain decoding, then DFlash, on the engine worker… "
                                                f"(Stop ends it).{how}")}
    session_id = message["session_id"]

    def work(engine, cancel):  # cancel: the chat's Stop (and #compare-stop) end it within one cycle
        if engine is None:
            raise RuntimeError("no model is loaded")
        return (run_comparison(engine, prompt, raw, settings, rerun_dflash, cancel), getattr(engine, "name", ""),
                capabilities_of(engine).plain_decoding)

    try:
        made_by = ctx.engines.resolve(stored_model(message))  # the reply's own pair, loaded first if need be
        cancel, job = ctx.replies.run_job(session_id, work, model=made_by)
        (plain, dflash), engine_name, method = job.result()
    except Exception as exc:  # noqa: BLE001 - shown to the user with its reason
        gr.Warning(f"Comparison failed: {exc}")
        yield {"compare_result": compare_html(None, f"Comparison failed: {exc}")}
        return
    if cancel.is_set():
        yield {"compare_result": compare_html(None, "Comparison stopped before it finished: nothing to compare.")}
        return
    note = ""
    made_by = reply_model(ctx, message)  # a stored older name means the pair it meant
    if made_by and engine_name and made_by != (ctx.engines.resolve(engine_name) or engine_name):
        note = (f"This reply was made by {made_by}, which this Studio does not offer; {engine_name} ran the "
                "comparison, so the texts need not match.")
    if stopped and produced:
        note = " ".join(filter(None, [note, f"This reply was {message['status']} after {produced} tokens; "
                                             f"both runs were limited to {produced} tokens."]))
    comparison = Comparison(stored_run(message, cycles), plain, dflash, float(settings.get("temperature") or 0.0),
                            note, method)
    try:  # kept with the reply: a shared replay races the two runs
        ctx.store.save_comparison(message["id"], comparison_record(comparison, engine_name))
    except STORE_ERRORS:
        pass  # the reply was deleted meanwhile; the result is still shown
    estimate = ReplyTrace.from_stored(message["content"] or "", cycles, message).estimate()  # the reply's footer
    yield {"compare_result": compare_html(comparison, estimate=estimate),
           "compare_chart": charts.plot(timeline_chart(comparison))}


def stop_compare(ctx: UIContext, message_id) -> None:
    """Stop a running comparison (it listens to its session's cancel, like a chat reply)."""
    try:
        session_id = ctx.store.get_message(int(message_id))["session_id"]
    except (*STORE_ERRORS, TypeError):
        return
    ctx.replies.stop(session_id)


def timeline_chart(comparison: Comparison) -> dict:
    """Tokens over time for each run (cycle boundaries as steps)."""
    data = []
    styles = {"plain decoding": ("#d08a2e", "solid"), "stored reply": ("#999999", "dot")}
    for run in (comparison.plain, comparison.dflash, comparison.stored):
        if run is None or not run.timeline:
            continue
        color, dash = styles.get(run.label, ("#2e9e5b", "solid"))
        data.append({"type": "scatter", "x": [t for t, _ in run.timeline], "y": [n for _, n in run.timeline],
                     "mode": "lines", "name": run.label, "line": {"color": color, "dash": dash, "shape": "hv"},
                     "hovertemplate": f"{run.label}: %{{y}} tokens at %{{x:.0f}} ms<extra></extra>"})
    # The axes end a little after the longest run: autorange ended them at its last point, and the
    # line ran into the chart's right (and top) edge, as if cut off.
    end = max((x for trace in data for x in trace["x"]), default=0.0)
    top = max((y for trace in data for y in trace["y"]), default=0)
    xaxis = {"title": {"text": "ms"}, "range": [0, end * 1.04 or 1], "autorange": False}
    yaxis = {"title": {"text": "tokens"}, "range": [0, top * 1.08 or 1], "autorange": False}
    return {"data": data, "layout": {**charts.figure_layout(
        "Tokens over time (prefill, then one step per target pass)", xaxis, yaxis, height=260), "uirevision": None}}


# ============================================================================ the tab


def build_teach_tab(ctx: UIContext, demo: gr.Blocks, tab: gr.Tab | None = None,
                    chat_session: gr.components.Component | None = None) -> dict:
    """Build the tab's components and wire them. Inside ``tab``, selecting it refreshes the view
    (showing ``chat_session``, the chat's remembered session, when given); without a tab the view
    is filled when ``demo`` loads."""
    c: dict = {"chat_session": chat_session}
    gr.HTML(TEACH_CSS, elem_id="teach-style", padding=False)
    gr.Markdown("### Replay a reply, block by block\nEvery **cycle** the draft fills a block of MASK slots in one "
                "pass; the target checks the block in one pass, keeps the drafts up to the first mismatch and adds "
                "its own *bonus* token.", elem_id="teach-intro")
    with gr.Row():
        c["session"] = gr.Dropdown(choices=[], label="Session", elem_id="teach-session", scale=3)
        c["reply"] = gr.Dropdown(choices=[], label="Reply", elem_id="teach-reply", scale=4)
        c["refresh"] = gr.Button("↻ Latest", elem_id="teach-refresh", scale=1, min_width=80, size="sm")
    c["explainer"] = gr.HTML(explainer_html(None), elem_id="teach-explain")
    with gr.Row():
        with gr.Column(scale=3, min_width=300):
            with gr.Row():
                c["prev"] = gr.Button("◀ Prev", elem_id="teach-prev", min_width=70, size="sm")
                c["play"] = gr.Button(PLAY, elem_id="teach-play", variant="primary", min_width=70, size="sm")
                c["next"] = gr.Button("Next ▶", elem_id="teach-next", min_width=70, size="sm")
            c["cycle"] = gr.Slider(1, 2, value=1, step=1, label="Cycle", elem_id="teach-cycle")
        c["speed"] = gr.Slider(SPEEDS[0], SPEEDS[1], value=1.0, step=0.25, label="Play speed (cycles/s)",
                               elem_id="teach-speed", scale=1, min_width=160)
    c["step"] = gr.HTML(step_html(None), elem_id="teach-step")
    build_share_controls(c)
    with gr.Accordion("Compare with plain decoding (identical output, how much faster?)", open=True):
        with gr.Row():
            c["compare"] = gr.Button("Compare with plain decoding", elem_id="compare", variant="secondary", scale=4)
            c["compare_stop"] = gr.Button("Stop", elem_id="compare-stop", variant="stop", scale=1, min_width=70)
        c["compare_result"] = gr.HTML(compare_html(None), elem_id="compare-result")
        c["compare_chart"] = gr.Plot(elem_id="compare-chart", show_label=False)
    with gr.Accordion("Session analytics", open=True):
        c["summary"] = gr.HTML(elem_id="analytics-summary")
        with gr.Row():
            c["tau_time"] = gr.Plot(elem_id="analytics-tau-time", show_label=False)
            c["tau_hist"] = gr.Plot(elem_id="analytics-tau-hist", show_label=False)
            c["position"] = gr.Plot(elem_id="analytics-position", show_label=False)
        c["token_classes"] = gr.Plot(elem_id="analytics-token-classes", show_label=False)
        c["table"] = gr.Dataframe(headers=an.TABLE_HEADERS, value=[], interactive=False,
                                  elem_id="analytics-table", label="Replies")
        c["export"] = gr.Button("Export figures (CSV) and charts (PNG)", elem_id="analytics-export", size="sm")
        c["files"] = gr.File(label="Analytics export", file_count="multiple", visible=False, interactive=False,
                             elem_id="analytics-files")
    c["playing"] = gr.State(False)
    c["timer"] = gr.Timer(1.0, active=False)
    wire(ctx, c, tab, demo)
    return c


def wire(ctx: UIContext, c: dict, tab, demo) -> None:
    hidden = {"api_visibility": "undocumented"}
    full, playback = Outputs(c, FULL_VIEW), Outputs(c, PLAYBACK)
    replied, moved = Outputs(c, (*REPLY_VIEW, "playing", "timer", "play")), Outputs(c, ("cycle", "step"))
    latest = full.wrap(partial(full_view, ctx))
    chat_session = c.get("chat_session")

    def opened(session_id=None):  # the chat's session (else the latest), its latest reply
        return full_view(ctx, session_id, None)

    if tab is not None:
        tab.select(full.wrap(opened), [chat_session] if chat_session is not None else None, full.components, **hidden)
    elif demo is not None:  # not inside a tab: fill it when the page loads
        demo.load(latest, None, full.components, **hidden)
    c["refresh"].click(latest, None, full.components, **hidden)
    c["session"].input(full.wrap(lambda s: full_view(ctx, s, None)), [c["session"]], full.components,
                       api_name="teach_session")
    c["reply"].input(replied.wrap(lambda m: {**reply_view(ctx, m), **stopped_playback()}), [c["reply"]],
                     replied.components, api_name="teach_reply")
    c["cycle"].input(partial(step_view, ctx), [c["reply"], c["cycle"]], c["step"], trigger_mode="always_last",
                     api_name="teach_step")
    for button, delta in ((c["prev"], -1), (c["next"], +1)):
        button.click(moved.wrap(partial(move, ctx, delta=delta)), [c["reply"], c["cycle"]], moved.components, **hidden)
    ticked = c["timer"].tick(playback.wrap(partial(tick, ctx)), [c["reply"], c["cycle"], c["playing"]],
                             playback.components, **hidden)
    # a tick queued before Pause still carries playing=True: Pause cancels it, so the cycle stays put
    c["play"].click(playback.wrap(partial(toggle_play, ctx)), [c["reply"], c["cycle"], c["playing"], c["speed"]],
                    playback.components, cancels=[ticked], **hidden)
    c["speed"].input(set_speed, [c["speed"], c["playing"]], c["timer"], **hidden)
    comparison = Outputs(c, COMPARISON)
    checked([c["compare"].click], partial(check_compare, ctx), [c["reply"]]).success(
        comparison.wrap(partial(compare, ctx)), [c["reply"]], comparison.components, api_name="compare", **ENGINE_QUEUE)
    c["compare_stop"].click(partial(stop_compare, ctx), [c["reply"]], None, queue=False, api_name="stop_compare")
    c["export"].click(partial(export_analytics, ctx), [c["session"]], c["files"], api_name="export_analytics")
    wire_share(ctx, c)
