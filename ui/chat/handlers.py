"""Event handlers: plain functions of (ctx, component values) that return ``{name: value}`` for
the components they change (names as in ``ui.layout``; ``ui.named.Outputs`` maps them).

Everything shown comes from the store (sessions, messages, cycles); the browser keeps only the
id of the session it shows. Replies go through the reply service (``ctx.replies``, one engine worker).
Bad input raises ``gr.Error`` with a clear message before anything is stored or cleared.
"""

from __future__ import annotations

import html
import json
import re
import secrets
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import gradio as gr

from engine.config import FallbackConfig, SamplingConfig
from engine.errors import DFlashError, PromptTooLongError, check_prompt_text
from engine.interface import capabilities_of
from engine.prompts import heal_code_prompt
from service.settings import InvalidSettings, Settings
from storage.errors import ImportFormatError
from storage.records import stored_model
from storage.transfer import parse_export

from . import charts
from ..context import STORE_ERRORS, UIContext
from .generation import GenerationRequest, PageReply, stream_reply
from .models import model_status_html, model_view, prompt_for_model, reply_notices, session_model
from ..named import refused
from .render import assistant_markdown, esc, render_token_view, stats_html, user_markdown
from .thinking import save_thinking, thinking_setting
from .trace import ReplyTrace

SETTING_KEYS = Settings.keys()  # the setting controls, by name
TITLE_CHARS = 48
# What each kind of event may change, by component name (the order is the Gradio API's).
REPLY_FIGURES = ("token_view", "stats", "acceptance_chart", "tau_histogram", "position_chart")
SESSION_VIEW = ("session", "remembered", "chat", "msg_ids", "sessions", "title", "token_view", "stats",
                "acceptance_chart", "session_chart", "tau_histogram", "position_chart", *SETTING_KEYS, "settings", "streaming", "model",
                "model_status")
SENT = ("session", "remembered", "chat", "msg_ids", "chat_input", "sessions", "title", "reply_request")
COMPLETED = ("session", "remembered", "chat", "msg_ids", "sessions", "title", "reply_request")
STREAMED = ("chat", "msg_ids", "token_view", "stats", "acceptance_chart", "session_chart", "tau_histogram",
            "position_chart", "code", "streaming", "reply_request")
MODEL_STATUS = ("model_status", "timer", "block_size", "fallback", "show_rejected")  # the last three follow the engine
LIVE = ("sessions", "chat", "msg_ids", "token_view", "stats", "acceptance_chart", "session_chart", "tau_histogram",
        "position_chart", "live_seen")
LIVE_CHECKED = ("live_seen", "live_redraw")  # the tick itself changes only States, see live_check
LIVE_REDRAWN = tuple(name for name in LIVE if name != "live_seen")
PENDING = {"role": "assistant", "content": "…"}  # the reply bubble shown until the first block arrives


# ============================================================================ settings


DEFAULTS_PREFERENCE = "new_session_settings"  # the preferences row that holds the saved defaults


def startup_settings(ctx: UIContext) -> Settings:
    """The defaults the app was started with (``serve --max-new-tokens/--block-size/--fallback``;
    the block size is the draft's own unless given)."""
    d = ctx.defaults
    engine = ctx.engines.engine
    block = d.block_size or (engine.block_size if engine is not None else 8)
    return Settings(block_size=int(block), temperature=d.temperature, top_p=d.top_p,
                    max_new_tokens=d.max_new_tokens, fallback=d.fallback, show_rejected=d.show_rejected)


def saved_defaults(ctx: UIContext) -> Settings | None:
    """The defaults saved on the page (*Save as defaults*, a row in the session database), or None
    when none were saved or they no longer pass the checks (a smaller maximum block size now)."""
    try:
        settings = Settings.from_mapping(ctx.store.get_preference(DEFAULTS_PREFERENCE) or {})
        check_settings(ctx, settings)
    except (*STORE_ERRORS, KeyError, gr.Error):
        return None
    return settings


def default_settings(ctx: UIContext) -> Settings:
    """What a new session starts from: the saved defaults, else the start-up ones. Only the
    page's *Save as defaults* changes them: a session's settings (the page's or an API
    request's) stay with that session."""
    return saved_defaults(ctx) or startup_settings(ctx)


def defaults_note(ctx: UIContext) -> str:
    """Where a new session's settings come from, in one line under the settings."""
    d = default_settings(ctx)
    figures = (f"block {d.block_size} · temperature {d.temperature:g} · top-p {d.top_p:g} · "
               f"{d.max_new_tokens} new tokens · fallback {'on' if d.fallback else 'off'} · "
               f"rejected drafts {'shown' if d.show_rejected else 'hidden'}")
    source = ("saved on this page (*Save as defaults*; *Reset* goes back to the start-up options)"
              if saved_defaults(ctx) else
              "the start-up options (`serve --block-size`, `--max-new-tokens`, `--no-fallback`); "
              "*Save as defaults* keeps the settings shown instead")
    return f"New sessions start with {figures}: {source}."


def save_defaults(ctx: UIContext, settings: Settings) -> str:
    """*Save as defaults*: the settings shown become what new sessions start from."""
    check_settings(ctx, settings)
    try:
        # thinking is the session's own (its control starts at each model family's default)
        ctx.store.set_preference(DEFAULTS_PREFERENCE, settings.with_thinking(None).as_dict())
    except STORE_ERRORS as exc:
        raise refused(f"Cannot save the defaults: {exc}") from None
    gr.Info("Saved: new sessions start with these settings.")
    return defaults_note(ctx)


def reset_defaults(ctx: UIContext, session_id: int | None) -> dict:
    """*Reset*: forget the saved defaults (new sessions start from the start-up options again);
    a page that shows no session yet shows them at once."""
    try:
        ctx.store.set_preference(DEFAULTS_PREFERENCE, None)
    except STORE_ERRORS as exc:
        raise refused(f"Cannot reset the defaults: {exc}") from None
    view = {"defaults_note": defaults_note(ctx)}
    if session_id is None:
        view.update(settings_outputs(ctx, None))
    return view


def settings_from_controls(block_size, temperature, top_p, max_new_tokens, fallback, show_rejected) -> Settings:
    """The one place the six controls become a ``Settings`` (a value that is not a number is refused)."""
    try:
        return Settings.from_controls(block_size, temperature, top_p, max_new_tokens, fallback, show_rejected)
    except InvalidSettings as exc:
        raise refused(str(exc)) from None


def change_settings(ctx: UIContext, session_id: int | None, block_size, temperature, top_p, max_new_tokens,
                    fallback, show_rejected, current: Settings | None = None) -> dict:
    """The user changed a setting: the page's ``Settings`` (the State every send reads) and the
    session's stored settings follow (settings belong to the session). ``current``: the page's
    Settings until now, whose thinking choice stays (it has its own control: ``change_thinking``)."""
    settings = settings_from_controls(block_size, temperature, top_p, max_new_tokens, fallback, show_rejected)
    if isinstance(current, Settings):
        settings = settings.with_thinking(current.thinking)
    if session_id is not None:
        try:
            stored = {**settings.as_dict(), "model": stored_model(ctx.store.get_session(session_id))
                      or ctx.engines.current_key}  # its own model
            ctx.store.update_session_settings(session_id, stored)
        except STORE_ERRORS:
            pass  # the session was deleted meanwhile: nothing to save it into
    return {"settings": settings}


def change_thinking(ctx: UIContext, session_id: int | None, thinking, current: Settings | None) -> dict:
    """The user switched a reasoning model's thinking: the page's ``Settings`` take it, and the
    session keeps it (``ui.chat.thinking.save_thinking``: its other stored settings stay as they are)."""
    if not isinstance(current, Settings):  # a Gradio API caller's State holds what it was given
        raise refused("Invalid settings: set them first (the settings controls).")
    save_thinking(ctx, session_id, thinking)
    return {"settings": current.with_thinking(thinking)}


def check_settings(ctx: UIContext, settings: Settings | None, prompt=None, raw: bool = False) -> tuple[SamplingConfig, FallbackConfig]:
    """Server-side validation at the edge, before anything is stored (every event is an API
    too): the settings, and with a ``prompt`` and a loaded model, ``engine.check_request`` (the
    context window). The engine checks every request again itself when it generates."""
    if not isinstance(settings, Settings):  # a Gradio API caller's State holds what it was given
        raise refused("Invalid settings: set them first (the settings controls).")
    try:
        sampling = settings.sampling(max_block_size=ctx.defaults.max_block_size)
    except DFlashError as exc:
        raise refused(f"Invalid settings: {exc}") from None
    engine = ctx.engines.engine
    if prompt is not None and engine is not None:  # no model yet: the worker refuses it once loaded
        try:
            engine.check_request(engine.encode(prompt, raw=raw), sampling)
        except DFlashError as exc:
            raise refused(refusal_text(exc)) from None
    return sampling, settings.fallback_config()


def settings_outputs(ctx: UIContext, stored: dict | None) -> dict:
    """The setting controls and the page's ``Settings``: the session's settings over the defaults."""
    defaults = default_settings(ctx)
    merged = {**defaults.as_dict(), **{k: v for k, v in (stored or {}).items() if k in SETTING_KEYS}}
    try:
        settings = Settings.from_mapping(merged)
    except InvalidSettings:  # a stored value that is not a number (an edited export): the defaults
        settings = defaults
    thinking = (stored or {}).get("thinking")  # the session's own choice; a default never has one
    settings = settings.with_thinking(thinking if isinstance(thinking, bool) else None)
    return {**merged, "settings": settings}


# ============================================================================ views


SEARCH_MARKS = ("«", "»")  # a search's matched words in the sessions list (a radio label is plain text)


def session_choices(ctx: UIContext, query: str = "") -> list[tuple[str, int]]:
    """The sessions list; a search lists the best match first, each with its match in context."""
    if not (query and query.strip()):
        return distinct_labels([(s["title"], s["id"]) for s in ctx.store.list_sessions()])
    matches = ctx.store.search(query, marks=SEARCH_MARKS)
    labels = distinct_labels([(m.session.title, m.session.id) for m in matches])
    return [(m.snippet + label[len(m.session.title):] if m.field == "title" else f"{label} · {m.snippet}", session_id)
            for (label, session_id), m in zip(labels, matches)]  # label[len(title):]: distinct_labels' " (2)"


def distinct_labels(choices: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """Sessions that share a title are told apart by number, oldest first: "def add(a, b):",
    "def add(a, b): (2)" … (the same prompt sent twice made identical, indistinguishable rows)."""
    by_title: dict[str, list[int]] = {}
    for title, session_id in choices:
        by_title.setdefault(title, []).append(session_id)
    labels = []
    for title, session_id in choices:
        ids = sorted(by_title[title])
        n = ids.index(session_id) + 1
        labels.append((title if len(ids) == 1 or n == 1 else f"{title} ({n})", session_id))
    return labels


NEW_SESSION_ENTRY = ("✎ New session (saved when you send)", 0)  # 0 is never a session id


def session_list(ctx: UIContext, session_id: int | None, query: str = ""):
    """The sessions list; a page with no session yet ("+ New session", a first visit) shows a
    selected entry for it at the top, so the click visibly did something."""
    choices = session_choices(ctx, query)
    if session_id is None and not (query and query.strip()):
        return gr.Radio(choices=[NEW_SESSION_ENTRY, *choices], value=NEW_SESSION_ENTRY[1])
    value = session_id if any(v == session_id for _, v in choices) else None
    return gr.Radio(choices=choices, value=value)


def _light_trace(rows: list[dict]) -> ReplyTrace:
    """A trace for figures only (no token texts) from ``session_cycle_series`` rows."""
    trace = ReplyTrace()
    for row in rows:
        trace.add_cycle({**row, "fallback": {"state": row["fallback_state"], "changed": row["fallback_changed"],
                                             "next_block_size": row["next_block_size"]}})
    return trace


def chat_history(ctx: UIContext, session_id: int | None) -> tuple[list[dict], list[int]]:
    """The Chatbot value (escaped markdown) and the message id of each row."""
    if session_id is None:
        return [], []
    series: dict[int, list[dict]] = {}
    for row in ctx.store.session_cycle_series(session_id):
        series.setdefault(row["message_id"], []).append(row)
    rows, ids = [], []
    messages = ctx.store.get_messages(session_id)
    notices = reply_notices(ctx, messages)  # where the session's model changed
    for m in messages:
        if m["role"] == "user":
            rows.append({"role": "user", "content": user_markdown(m["content"], m["kind"])})
        elif m["role"] == "assistant":
            figures = _light_trace(series.get(m["id"], []))
            figures.finished = {"tokens_per_s": m["tokens_per_s"]}
            rows.append({"role": "assistant", "content": notices.get(m["id"], "") + assistant_markdown(
                m["content"], m["status"], figures, m["error"], m["kind"], tokens=m["new_tokens"],
                reasoning=m["reasoning"])})
        else:
            continue
        ids.append(m["id"])
    return rows, ids


def reply_outputs(trace: ReplyTrace | None, mode: str = "chat", model_line: str = "") -> dict:
    """One reply's figures (``REPLY_FIGURES``): token view, stats strip and its three charts."""
    t = trace or ReplyTrace()
    return {"token_view": render_token_view(trace, mode), "stats": stats_html(trace, model_line),
            **reply_charts(t)}


def reply_charts(trace: ReplyTrace) -> dict:
    return {"acceptance_chart": charts.plot(charts.acceptance_chart(trace)),
            "tau_histogram": charts.plot(charts.tau_histogram(trace.tau_histogram())),
            "position_chart": charts.plot(charts.position_chart(trace.per_position_acceptance()))}


def tab_figures(ctx: UIContext, session_id: int | None, page: str | None = None, mode: str = "chat") -> dict:
    """The figures under the conversation when a tab is shown (``REPLY_FIGURES``): that tab's
    latest reply in this session (a chat reply on Chat, a completion on Complete), else empty,
    so that the Complete tab never shows the last chat reply's tokens and stats as its own.

    Gradio also fires the first tab's select while the page loads, before ``on_load`` has set
    the session (``page`` is still None then): that one changes nothing, or its empty figures
    could arrive after ``on_load``'s and blank the reloaded session's."""
    if page is None:
        return {}
    replies = []
    if session_id is not None:
        try:
            replies = [m for m in ctx.store.get_messages(session_id) if m["role"] == "assistant" and m["kind"] == mode]
        except STORE_ERRORS:
            replies = []
    if replies:
        return reply_outputs(stored_trace(ctx, replies[-1]), mode)
    hint = ("Continue some code: every token the model writes appears here, coloured by what DFlash did to it."
            if mode == "complete" else "")
    return {**reply_outputs(None, mode), "token_view": render_token_view(None, mode, placeholder=hint)}


def stored_trace(ctx: UIContext, message: dict) -> ReplyTrace:
    return ReplyTrace.from_stored(message["content"], ctx.store.get_cycles(message["id"]), message)


def session_view(ctx: UIContext, session_id: int | None, query: str = "") -> dict:
    """Everything that changes when the page shows another session (``SESSION_VIEW``; the
    setting controls only when there is a session to take them from)."""
    session = None
    if session_id is not None:
        try:
            session = ctx.store.get_session(session_id)
        except STORE_ERRORS:
            session_id = None
    history, ids = chat_history(ctx, session_id)
    last_reply = None
    if session_id is not None:
        replies = [m for m in ctx.store.get_messages(session_id) if m["role"] == "assistant"]
        last_reply = replies[-1] if replies else None
    trace = stored_trace(ctx, last_reply) if last_reply else None
    mode = last_reply["kind"] if last_reply else "chat"
    session_stats = ctx.store.session_stats(session_id) if session_id is not None else None
    view = {"session": session_id, "remembered": session_id, "chat": history, "msg_ids": ids,
            "sessions": session_list(ctx, session_id, query), "title": session["title"] if session else "",
            **reply_outputs(trace, mode), "session_chart": charts.plot(charts.session_chart(session_stats)),
            "streaming": None, **model_view(ctx, session)}
    # a session's own settings; a page with no session yet (+ New session) starts from the defaults
    view.update(settings_outputs(ctx, session["settings"] if session else None))
    return view


def _live_view(ctx: UIContext, session_id: int, messages: list[dict]) -> dict:
    """The chat and the latest reply's figures of a session, as stored now."""
    history, ids = chat_history(ctx, session_id)
    replies = [m for m in messages if m["role"] == "assistant"]
    trace = stored_trace(ctx, replies[-1]) if replies else None
    return {"chat": history, "msg_ids": ids, **reply_outputs(trace, replies[-1]["kind"] if replies else "chat"),
            "session_chart": charts.plot(charts.session_chart(ctx.store.session_stats(session_id)))}


def live_refresh(ctx: UIContext, session_id: int | None, query: str, seen: dict | None,
                 streaming: int | None = None, page: str | None = None) -> dict:
    """Every second (``LIVE``): the session list when sessions came, went or were renamed (API
    requests add sessions by themselves), and the session shown when its latest message changed
    since the last look and is not the reply this page streams itself (``streaming``, see
    ``respond``): a reply through the API, or one that went on generating while the page showed
    another session. Nothing before the page has loaded (``page`` None): a list drawn for no
    session could land after ``on_load``'s and leave the restored session unticked."""
    if page is None:
        return {}
    session_id = ctx.shown_session(page, session_id)
    seen = dict(seen or {})
    update: dict = {}
    # Keyed on the session too: a tick's inputs are read when it fires, so a tick that fired just
    # before "+ New session" or a click on another session lands after it and draws the list for
    # the session left behind; the next tick sees the page's session differ from the one drawn.
    listing = [[list(choice) for choice in session_choices(ctx, query or "")], session_id]
    if listing != seen.get("listing"):
        update["sessions"] = session_list(ctx, session_id, query or "")
    seen["listing"] = listing
    if session_id is not None:
        try:
            messages = ctx.store.get_messages(session_id)
        except STORE_ERRORS:
            messages = []
        last = messages[-1] if messages else None
        stamp = [session_id, last["id"], last["status"], last["updated_at"]] if last else None
        before = seen.get("shown")
        same_session = bool(before) and before[0] == session_id  # else the switch drew it already
        if last and last["id"] != streaming and stamp != before and (same_session or last.from_api):
            update.update(_live_view(ctx, session_id, messages))
        seen["shown"] = stamp
    return {**update, "live_seen": seen}


def live_check(ctx: UIContext, session_id: int | None, query: str, seen: dict | None,
               streaming: int | None = None, page: str | None = None) -> dict:
    """``live_refresh`` split in two events: the tick writes only States (``LIVE_CHECKED``), and
    what changed goes to ``live_redraw``, whose change event (``live_redraw_apply``) draws it.
    A tick that returned "no change" for the chat and the figures every second would leave a
    stale copy of each of them in the page's Gradio session state whenever a reply then drew
    them (see ``_reply_views``); this way they are only ever given values."""
    update = live_refresh(ctx, session_id, query, seen, streaming, page)
    if not update:
        return {}
    seen = update.pop("live_seen")
    if not update:
        return {"live_seen": seen}
    seen["redraws"] = seen.get("redraws", 0) + 1  # two equal redraws in a row are still two changes
    return {"live_seen": seen, "live_redraw": {"n": seen["redraws"], "update": update}}


def live_redraw_apply(redraw: dict | None) -> dict:
    """What ``live_check`` found changed (``LIVE_REDRAWN``)."""
    return dict(redraw["update"]) if redraw else {}


def on_load(ctx: UIContext, remembered: int | None) -> dict:
    """A fresh page: the session this browser showed last if it still exists, else the latest one
    made on the page, else a new one; and the page's id (``page``, see ``respond``). A session an
    editor made through the API is never opened by itself: typing into the page would continue
    it with the editor's settings (its own, listed, one click away)."""
    session_id = None
    if remembered is not None:
        try:
            session_id = ctx.store.get_session(int(remembered))["id"]
        except (*STORE_ERRORS, TypeError, ValueError, OverflowError):  # the browser's state is client data
            session_id = None
    if session_id is None:
        session_id = next((s.id for s in ctx.store.list_sessions() if not s.from_api), None)
    return {**session_view(ctx, session_id), "page": secrets.token_hex(8)}


def select_session(ctx: UIContext, session_id, query: str = "", page: str | None = None) -> dict:
    ctx.leave_stream(page)
    chosen = int(session_id) if session_id not in (None, NEW_SESSION_ENTRY[1]) else None
    return session_view(ctx, chosen, query)


def new_session(ctx: UIContext, page: str | None = None) -> dict:
    """An empty page; the session is created with the first message (titled after it)."""
    ctx.leave_stream(page)
    return session_view(ctx, None)


def search(ctx: UIContext, query: str, session_id: int | None):
    return session_list(ctx, session_id, query)


def check_session_selected(session_id: int | None) -> None:
    """Rename, Delete and Export need a session (see ``check_send`` for why it is an event of its own)."""
    if session_id is None:
        raise refused("No session selected: send a message first.")


def check_rename(session_id: int | None, title: str) -> None:
    """What can refuse Rename: no session, or a blank title (see ``check_send``)."""
    check_session_selected(session_id)
    if not isinstance(title, str) or not title.strip():
        raise refused("A session title cannot be empty.")


def rename(ctx: UIContext, session_id: int | None, title: str, query: str = ""):
    check_rename(session_id, title)
    try:
        ctx.store.rename_session(session_id, title)
    except STORE_ERRORS as exc:
        raise refused(f"Cannot rename: {exc}") from None
    gr.Info("Session renamed.")
    return session_list(ctx, session_id, query)


def ask_delete(session_id: int | None):
    check_session_selected(session_id)
    return gr.Row(visible=True)


def confirm_delete(ctx: UIContext, session_id: int | None, page: str | None = None) -> dict:
    ctx.leave_stream(page)
    if session_id is not None:
        ctx.replies.stop(session_id)
        try:
            ctx.store.delete_session(session_id)
        except STORE_ERRORS as exc:
            raise refused(f"Cannot delete: {exc}") from None
        _note_pending_wipe(ctx)
    latest = ctx.store.list_sessions(limit=1)
    return {"confirm_row": gr.Row(visible=False), **session_view(ctx, latest[0]["id"] if latest else None)}


def _note_pending_wipe(ctx: UIContext) -> None:
    if getattr(ctx.store, "wipe_pending", False):
        gr.Info("Deleted. Another program is reading the session database (the CLI?), so the text stays in its "
                "write-ahead log until that read ends; it is wiped at the next delete or when the app closes.")


def cancel_delete():
    return gr.Row(visible=False)


def check_any_session(ctx: UIContext) -> int:
    count = ctx.store.count_sessions()
    if count == 0:
        raise refused("There are no sessions to delete.")
    return count


def ask_delete_all(ctx: UIContext) -> dict:
    count = check_any_session(ctx)
    return {"confirm_all_row": gr.Row(visible=True),
            "confirm_all_text": (("Delete **the only session** and its messages? " if count == 1 else
                                  f"Delete **all {count} sessions** and their messages? ")
                                 + "They cannot be recovered: *Export* first to keep a copy.")}


def confirm_delete_all(ctx: UIContext, page: str | None = None) -> dict:
    """Every session goes, unrecoverably (the store overwrites the deleted text); running replies stop."""
    ctx.leave_stream(page)
    for session in ctx.store.list_sessions(limit=None):
        ctx.replies.stop(session["id"])
    try:
        count = ctx.store.delete_all_sessions()
    except STORE_ERRORS as exc:
        raise refused(f"Cannot delete: {exc}") from None
    gr.Info(f"Deleted {count} session{'s' * (count != 1)}.")
    _note_pending_wipe(ctx)
    return {"confirm_all_row": gr.Row(visible=False), **session_view(ctx, None)}


def export(ctx: UIContext, session_id: int | None):
    check_session_selected(session_id)
    document = ctx.store.export_session(session_id)
    title = re.sub(r"[^\w-]+", "-", ctx.store.get_session(session_id)["title"]).strip("-")[:40] or "session"
    folder = Path(tempfile.mkdtemp(prefix="dflash-export-"))
    path = folder / f"dflash-session-{session_id}-{title}.json"
    path.write_text(json.dumps(document, ensure_ascii=False, indent=2), encoding="utf-8")
    return gr.File(value=str(path), visible=True)


def check_import(ctx: UIContext, upload) -> tuple[Path, dict]:
    """An import file is read and checked whole before anything is written (see ``check_send``)."""
    if upload is None:
        raise refused("Choose an exported .json file to import.")
    path = Path(upload if isinstance(upload, str) else getattr(upload, "name", upload))
    try:
        document = parse_export(path.read_bytes())  # the CLI's reader: a byte-order mark or UTF-16 is fine
    except OSError as exc:
        raise refused(f"{path.name} could not be read ({exc.strerror or exc}); nothing was imported.") from None
    except ImportFormatError as exc:
        raise refused(f"{path.name} {exc}; nothing was imported.") from None
    try:
        sessions = ctx.store.check_document(document)
    except STORE_ERRORS as exc:
        raise refused(f"{path.name} was not imported: {exc}") from None
    if not sessions:
        raise refused(f"{path.name} holds no sessions; nothing was imported.")
    return path, document


def import_sessions(ctx: UIContext, upload, page: str | None = None) -> dict:
    """Import an export file (one session or all): checked whole first, so a bad file writes
    nothing; a session already here gets the messages it lacks (``SessionStore.import_document``).
    Shows the first imported session."""
    path, document = check_import(ctx, upload)
    try:
        results = ctx.store.import_document(document)
    except STORE_ERRORS as exc:
        raise refused(f"{path.name} was not imported: {exc}") from None
    gr.Info(import_summary(results))
    ctx.leave_stream(page)
    return session_view(ctx, results[0].session_id)


def import_summary(results) -> str:
    """'Imported 2 sessions: 1 new (4 messages), 1 with 2 new messages.' (what each did)."""
    words = {"created": "new", "merged": "updated", "copied": "diverged, imported as a copy", "unchanged": "already up to date"}
    parts = []
    for outcome, word in words.items():
        chosen = [r for r in results if r.outcome == outcome]
        if chosen:
            added = sum(r.added for r in chosen)
            parts.append(f"{len(chosen)} {word}" + (f" (+{added} message{'s' * (added != 1)})" if outcome != "unchanged" else ""))
    return f"Imported {len(results)} session{'s' * (len(results) != 1)}: {', '.join(parts)}."


def show_reply(ctx: UIContext, message_ids: list[int], evt: gr.SelectData) -> dict:
    """Clicking a reply in the chat shows its tokens and figures (``REPLY_FIGURES``)."""
    index = evt.index if isinstance(evt.index, int) else evt.index[0]
    if not message_ids or not 0 <= index < len(message_ids):
        return {}
    try:
        message = ctx.store.get_message(message_ids[index])
    except STORE_ERRORS:
        return {}
    if message["role"] != "assistant":
        return {}
    return reply_outputs(stored_trace(ctx, message), message["kind"])


# ============================================================================ sending


def _title(text: str) -> str:
    line = " ".join(text.split())
    return (line[: TITLE_CHARS - 1] + "…") if len(line) > TITLE_CHARS else (line or "New session")


def refusal_text(exc: Exception) -> str:
    """A named engine refusal in words that fit the page."""
    if isinstance(exc, PromptTooLongError):
        return (f"{_sentence(str(exc))[:-1]}: the whole conversation is sent with each message. Shorten your "
                "message or start a new session.")
    return _sentence(str(exc))


def _store_prompt(ctx: UIContext, accepted: Accepted) -> tuple[int, str]:
    """Store the accepted message (committed before generation starts); returns its session and title."""
    session_id, model = accepted.session_id, accepted.model
    settings = {**accepted.settings.as_dict(), "model": model}
    try:
        session = ctx.store.get_session(session_id) if session_id is not None else None
        if session is None:
            title = _title(accepted.text)
            session_id = ctx.store.create_session(title, model=model, settings=settings)
        else:
            title = session["title"]
            ctx.store.update_session_settings(session_id, settings)
            if ctx.engines.resolve(session["model"]) != model:
                ctx.store.update_session_model(session_id, model)
        ctx.store.add_message(session_id, "user", accepted.text, kind=accepted.kind, settings=settings)
    except STORE_ERRORS as exc:
        raise refused(f"Could not save the message: {exc}") from None
    ctx.replies.mark_request(session_id)
    return session_id, title


def _prompt_text(text) -> str:
    """The one empty-prompt rule (engine.errors.check_prompt_text), with its shared message."""
    try:
        return check_prompt_text(text)
    except DFlashError as exc:
        raise refused(_sentence(str(exc))) from None


def _sentence(message: str) -> str:
    return message[:1].upper() + message[1:] + ("" if message.endswith((".", "!", "?")) else ".")


@dataclass(frozen=True)
class Accepted:
    """A message or some code that passed its check, with what the check worked out: the page
    keeps it in a State for the send, and the send stores exactly this."""

    session_id: int | None  # None: a new session, made by the send
    text: str
    kind: str  # "chat" | "complete"
    settings: Settings
    model: str  # the pair that answers: the session's, or the loaded one for a new session
    prompt: object  # what the model is asked: the chat so far and this message, or the code healed
    sampling: SamplingConfig
    fallback: FallbackConfig
    notice: str = ""  # the line atop the reply when the session's model changed


def check_send(ctx: UIContext, session_id: int | None, text: str, settings: Settings) -> Accepted:
    """Everything that can refuse a chat message, before anything is stored; returns what it accepted.
    The page runs it as an event of its own without outputs, so a refusal is one toast and leaves
    the page as it was (Gradio marks every output of an event that raises with an Error badge)."""
    text = _prompt_text(text)
    messages = _messages(ctx, session_id) if session_id is not None else []
    _check_no_reply_waiting(ctx, session_id, messages)
    model = session_model(ctx, _session(ctx, session_id))
    prompt = prompt_for_model(ctx, messages, model) + [{"role": "user", "content": text}]
    sampling, fallback = check_settings(ctx, settings, prompt)
    notice = reply_notices(ctx, messages, model).get(None, "")
    return Accepted(session_id, text, "chat", settings, model, prompt, sampling, fallback, notice)


def check_completion(ctx: UIContext, session_id: int | None, code: str, settings: Settings) -> Accepted:
    """Everything that can refuse a Complete-mode prompt (see ``check_send``): the model continues
    the code as raw text."""
    code = _prompt_text(code)
    sampling, fallback = check_settings(ctx, settings, code, raw=True)
    model = session_model(ctx, _session(ctx, session_id))
    return Accepted(session_id, code, "complete", settings, model, heal_code_prompt(code), sampling, fallback)


def _session(ctx: UIContext, session_id: int | None):
    if session_id is None:
        return None
    try:
        return ctx.store.get_session(session_id)
    except STORE_ERRORS:
        raise refused("This session was deleted (in another tab?); pick or start another one.") from None


def _check_no_reply_waiting(ctx: UIContext, session_id: int | None, messages: list[dict]) -> None:
    """A reply that waits for the engine (a model loading, another reply running) has no stored
    row yet: a message, regenerate or edit now would be stored before it and answered out of order."""
    if messages and messages[-1]["role"] == "user" and ctx.replies.reply_pending(session_id):
        raise refused("The last message is still waiting for the engine: wait until its reply starts "
                       "(or stop it) and try again.")


def _messages(ctx: UIContext, session_id: int) -> list[dict]:
    try:
        return ctx.store.get_messages(session_id)
    except STORE_ERRORS:
        raise refused("This session was deleted (in another tab?); pick or start another one.") from None


def submit_prompt(ctx: UIContext, session_id: int | None, text: str, settings: Settings,
                  accepted: Accepted | None = None, page: str | None = None) -> dict:
    """Store the user's message (committed before generation starts), show it (``SENT``) and
    hand ``respond`` the reply to make (``reply_request``).

    From the page, ``accepted`` is what ``check_send`` passed (session, message, settings, prompt)
    and ``text`` what the box holds now: the accepted message is sent, and the box is emptied
    only if it still holds it, so text typed since stays. Through the Gradio API there is no
    ``accepted``: the message is checked here."""
    if accepted is None:
        accepted = check_send(ctx, session_id, text, settings)
    view = _submit(ctx, accepted, page)
    view["chat"] = view["chat"] + [PENDING]
    if text == accepted.text:
        view["chat_input"] = ""
    return view


def submit_completion(ctx: UIContext, session_id: int | None, code: str, settings: Settings,
                      accepted: Accepted | None = None, page: str | None = None) -> dict:
    """Complete mode: store the code as a 'complete' prompt (``COMPLETED``); the model continues
    it as raw text. ``accepted``: what the page's check passed (see ``submit_prompt``)."""
    if accepted is None:
        accepted = check_completion(ctx, session_id, code, settings)
    return _submit(ctx, accepted, page)


def _submit(ctx: UIContext, accepted: Accepted, page: str | None = None) -> dict:
    """Store what was accepted; the session's view, and the reply ``respond`` makes."""
    session_id, title = _store_prompt(ctx, accepted)
    if session_id != accepted.session_id:
        ctx.sent_to_new_session(page, session_id)
    rows, ids = chat_history(ctx, session_id)
    request = _generation_request(ctx, session_id, accepted.prompt, accepted.kind, accepted.settings, accepted.model,
                                  accepted.sampling, accepted.fallback)
    return {"session": session_id, "remembered": session_id, "chat": rows, "msg_ids": ids,
            "sessions": session_list(ctx, session_id), "title": title,
            "reply_request": PageReply(request, rows, ids, accepted.notice)}


def _generation_request(ctx: UIContext, session_id: int, prompt, kind: str, settings: Settings, model: str,
                        sampling: SamplingConfig, fallback: FallbackConfig) -> GenerationRequest:
    """The request for the service; a sampled reply gets a stored seed, so that it can be
    replayed (Teach's comparison). A reasoning model's thinking on/off goes with it as the
    model can take it (``ui.chat.thinking``), read back when the service renders the prompt."""
    stored = {**settings.with_thinking(None).as_dict(), "model": model, **thinking_setting(ctx, settings.thinking)}
    if sampling.temperature > 0:
        stored["seed"] = secrets.randbelow(2**31)
        sampling = replace(sampling, seed=stored["seed"])
    return GenerationRequest(session_id, prompt, kind == "complete", kind, sampling, fallback, stored)


def respond(ctx: UIContext, reply: PageReply | None, page: str | None = None, *, to_editor: bool = False):
    """Stream the reply that the send (or Regenerate, or an edit) handed over: chat, token view,
    stats, charts (and, ``to_editor``, the code editor: for the Complete button, not for a
    Regenerate that may find other code typed there), once per verified block.

    ``page`` (the browser page's id): when that page shows another session, the stream stops
    drawing and the reply goes on generating and is saved (``UIContext.leave_stream``).
    ``streaming`` is the id of the reply this page streams (and has shown whole once it ends), so
    that ``live_refresh`` leaves it alone. The first update empties ``reply_request``: a reply is
    asked for once."""
    if reply is None:
        raise refused("Nothing to answer: send a message first.")
    stream = ctx.watch_stream(page) if page else None
    try:
        first = True
        for view in _reply_views(ctx, reply, to_editor):
            if stream is not None and stream.left.is_set():
                # Gradio ends a stream by sending its last values again: make them "no change"
                yield {}
                return
            yield {**view, "reply_request": None} if first else view
            first = False
    finally:
        if stream is not None:
            ctx.end_stream(page, stream)


def _reply_views(ctx: UIContext, reply: PageReply, to_editor: bool):
    """``respond``'s page updates (``STREAMED``) for one reply."""
    request = reply.request
    session_id, complete = request.session_id, request.raw
    base_rows, base_ids = reply.rows, reply.ids
    mode = "complete" if complete else "chat"
    last_chart = 0.0
    # Every update carries every figure, the charts as last drawn included: an output Gradio is
    # told to leave unchanged (gr.skip) and then given a value keeps a stale copy of that value in
    # the page's session state (gradio 6.31), one per skip, for as long as the page stays open.
    figures = {**reply_outputs(None, mode), **_session_chart(ctx, session_id)}
    for update in stream_reply(ctx, request):
        trace = update.trace
        if update.status == "refused":
            gr.Warning(f"Not generated: {update.note}")
            yield {**figures, "chat": base_rows, "msg_ids": base_ids,
                   "token_view": render_token_view(None, mode, placeholder=f"Not generated: {update.note}")}
            return
        if update.status == "waiting":
            yield {**figures, "chat": base_rows + [{"role": "assistant", "content": f"⏳ {esc(update.note)}"}],
                   "msg_ids": base_ids}
            continue
        content = reply.notice + assistant_markdown(trace.text, update.status, trace, trace.error, request.kind)
        view = {"chat": base_rows + [{"role": "assistant", "content": content}],
                "msg_ids": base_ids + ([update.message_id] if update.message_id is not None else []),
                "token_view": render_token_view(trace, mode), "stats": stats_html(trace),
                "streaming": update.message_id}
        if complete and to_editor:
            view["code"] = request.prompt + trace.text
        now = time.monotonic()
        if update.final or now - last_chart >= ctx.chart_interval_s:  # charts at most every chart_interval_s
            last_chart = now
            figures.update(reply_charts(trace))
            if update.final:
                figures.update(_session_chart(ctx, session_id))
        yield {**figures, **view}
        if update.final and update.status == "error" and _session_exists(ctx, session_id):  # a deleted one says why
            gr.Warning(f"Generation failed: {update.note}")


def _session_exists(ctx: UIContext, session_id: int) -> bool:
    try:
        ctx.store.get_session(session_id)
    except STORE_ERRORS:
        return False
    return True


def _session_chart(ctx: UIContext, session_id: int) -> dict:
    try:  # the session may have been deleted while its reply streamed (another tab, the API)
        return {"session_chart": charts.plot(charts.session_chart(ctx.store.session_stats(session_id)))}
    except STORE_ERRORS:
        return {}


def stop(ctx: UIContext, session_id: int | None) -> None:
    ctx.replies.stop(session_id)


def check_regenerate(ctx: UIContext, session_id: int | None, settings: Settings) -> tuple[list, SamplingConfig, FallbackConfig]:
    """What can refuse Regenerate (see ``check_send``); returns the session's messages up to its
    last user message, and the checked settings."""
    if session_id is None:
        raise refused("No session selected.")
    messages = _messages(ctx, session_id)
    users = [m for m in messages if m["role"] == "user"]
    if not users:
        raise refused("Nothing to regenerate yet.")
    if messages[-1]["role"] == "assistant" and messages[-1]["status"] == "streaming":
        raise refused("A reply is still being generated: stop it first.")
    _check_no_reply_waiting(ctx, session_id, messages)
    sampling, fallback = check_settings(ctx, settings)
    return [m for m in messages if m["seq"] <= users[-1]["seq"]], sampling, fallback


def regenerate(ctx: UIContext, session_id: int | None, settings: Settings) -> dict:
    """Drop the last reply and hand ``respond`` the last user message to answer again."""
    asked, sampling, fallback = check_regenerate(ctx, session_id, settings)
    ctx.store.delete_messages_after(session_id, asked[-1]["seq"])
    ctx.replies.mark_request(session_id)
    rows, ids = chat_history(ctx, session_id)
    return {"chat": rows + [PENDING], "msg_ids": ids,
            "reply_request": _answer_last(ctx, session_id, asked, settings, sampling, fallback, rows, ids)}


def _answer_last(ctx: UIContext, session_id: int, messages: list, settings: Settings, sampling: SamplingConfig,
                 fallback: FallbackConfig, rows: list, ids: list) -> PageReply:
    """The reply to a session's last message, a user's (Regenerate, an edit), as ``respond`` makes it."""
    model = session_model(ctx, _session(ctx, session_id))
    last = messages[-1]
    complete = last["kind"] == "complete"
    prompt = heal_code_prompt(last["content"]) if complete else prompt_for_model(ctx, messages, model)
    notice = "" if complete else reply_notices(ctx, messages, model).get(None, "")
    request = _generation_request(ctx, session_id, prompt, last["kind"], settings, model, sampling, fallback)
    return PageReply(request, rows, ids, notice)


def check_edit(ctx: UIContext, session_id: int | None, message_ids: list[int], evt: gr.EditData,
               settings: Settings) -> tuple:
    """What can refuse an edit (see ``check_send``): (user messages, the edited one, its new text,
    the checked sampling and fallback)."""
    index = evt.index if isinstance(evt.index, int) else evt.index[0]
    if session_id is None or not 0 <= index < len(message_ids):
        raise refused("That message is not in this session any more; reload the page.")
    messages = _messages(ctx, session_id)
    users = [m for m in messages if m["role"] == "user"]
    edited = next((m for m in users if m["id"] == message_ids[index]), None)
    if edited is None:
        raise refused("Only your own messages can be edited.")
    text = _prompt_text(edited_text(evt.value, edited["kind"]))
    if messages[-1]["role"] == "assistant" and messages[-1]["status"] == "streaming":
        raise refused("A reply is still being generated: stop it first.")
    _check_no_reply_waiting(ctx, session_id, messages)
    return users, edited, text, *check_settings(ctx, settings)


def edit_message(ctx: UIContext, session_id: int | None, message_ids: list[int], evt: gr.EditData,
                 settings: Settings) -> dict:
    """Edit-and-resend; returns the session view (``SESSION_VIEW``) with a pending reply, and the
    reply ``respond`` makes.

    The last user message is changed in place and answered again. An earlier one continues in a
    copy of the session up to that message (the original keeps everything after it: nothing a
    user typed is lost), and the page switches to the copy."""
    users, edited, text, sampling, fallback = check_edit(ctx, session_id, message_ids, evt, settings)
    try:
        if edited["id"] == users[-1]["id"]:
            ctx.store.update_message(edited["id"], content=text)
            ctx.store.delete_messages_after(session_id, edited["seq"])
        else:
            session_id = ctx.store.fork_session(session_id, edited["seq"])
            ctx.store.add_message(session_id, "user", text, kind=edited["kind"], settings=edited["settings"])
            gr.Info("You edited an earlier message: the conversation continues in a copy of this session "
                    "(the original keeps the later messages).")
        asked = ctx.store.get_messages(session_id)
    except STORE_ERRORS as exc:
        raise refused(f"Could not save the edit: {exc}") from None
    ctx.replies.mark_request(session_id)
    view = session_view(ctx, session_id)
    reply = _answer_last(ctx, session_id, asked, settings, sampling, fallback, view["chat"], view["msg_ids"])
    return {**view, "chat": view["chat"] + [PENDING], "reply_request": reply}


_CODE_FENCE = re.compile(r"```[a-z]*\n(.*)\n```\s*$", re.S)


def edited_text(value, kind: str) -> str:
    """The text of an edited Chatbot message: markdown parts joined, HTML entities decoded, and
    for a Complete-mode prompt the code inside its fence."""
    if isinstance(value, list):  # structured content parts
        value = "".join(part.get("text", "") for part in value if isinstance(part, dict))
    text = html.unescape(str(value or ""))
    if kind == "complete":
        fenced = _CODE_FENCE.search(text)
        text = fenced.group(1) if fenced else text
    return text


# ============================================================================ model


def poll_model(ctx: UIContext, page_model: str | None = None) -> dict:
    status = ctx.engines.status()
    return {"model_status": model_status_html(ctx, page_model), "timer": gr.Timer(active=status.state == "loading"),
            **engine_controls(ctx)}


def engine_controls(ctx: UIContext) -> dict:
    """Block size, fallback and show-rejected as the loaded engine can honour them: what it
    cannot do is shown disabled, with the reason (vLLM fixes the block size at server start,
    has no per-request fallback and never reports rejected drafts)."""
    engine = ctx.engines.engine
    if engine is None:
        return {}
    caps = capabilities_of(engine)
    block = gr.Slider(interactive=caps.block_size_choice, info=None if caps.block_size_choice else caps.block_size_note)
    fallback = (gr.Checkbox(interactive=True, info=None) if caps.fallback
                else gr.Checkbox(interactive=False, value=False, info=caps.fallback_note))
    rejected = gr.Checkbox(interactive=caps.rejected_drafts, info=None if caps.rejected_drafts else caps.rejected_note)
    return {"block_size": block, "fallback": fallback, "show_rejected": rejected}


def pick_model(ctx: UIContext, key: str, session_id: int | None = None) -> dict:
    """Load another pair on the engine worker, and make it the model of the session shown (its
    next reply comes from it; the chat says so). An incompatible draft is refused with the
    reason, and the menu goes back to the session's model.

    The session takes the new model before the load starts: the header says "ready" as soon as
    the worker has loaded it, and a Send from then on must ask for the new model, not for the
    one the session had (which the worker would load back to answer it)."""
    session = None
    if session_id is not None:
        try:
            session = ctx.store.get_session(session_id)
        except STORE_ERRORS:
            session = None
    key = ctx.engines.resolve(key) or key
    moved = session is not None and bool(key) and session_model(ctx, session) != key
    if moved:
        _store_session_model(ctx, session_id, key, key)
    if key and (key != ctx.engines.current_key or ctx.engines.status().state == "failed"):
        try:
            ctx.engines.switch(key).result()
        except Exception as exc:  # noqa: BLE001 - shown to the user with its reason
            if moved:  # the session keeps the model it had
                _store_session_model(ctx, session_id, (session["settings"] or {}).get("model"), session.get("model") or "")
            gr.Warning(f"Cannot use {key}: {exc}")
            return {**model_view(ctx, session), "timer": gr.Timer(active=False)}
        gr.Info(f"Model {key} loaded.")
    return {"model_status": model_status_html(ctx, key), "timer": gr.Timer(active=False), **engine_controls(ctx)}


def _store_session_model(ctx: UIContext, session_id: int, setting: str | None, column: str) -> None:
    """Record the model a session uses: ``setting`` in its settings (None: none there), on top of
    its settings as they are now (another setting may have changed during a load), and ``column``."""
    try:
        settings = dict(ctx.store.get_session(session_id)["settings"] or {})
        settings.pop("model", None)
        ctx.store.update_session_settings(session_id, settings if setting is None else {**settings, "model": setting})
        ctx.store.update_session_model(session_id, column)
    except STORE_ERRORS:
        pass  # the session was deleted meanwhile
