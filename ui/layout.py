"""The page: layout in one ``gr.Blocks``, then every event wired in one place (``wire``).

Stable element ids (docs/architecture.md) for tests and users' scripts: chat, chat-input, send, stop,
regenerate, token-view, stats, acceptance-chart, session-chart, tau-histogram, position-chart,
session-list, session-search, session-title, new-session, rename-session, delete-session,
confirm-delete, cancel-delete, export-session, import-session, export-file, model-picker, model-status, block-size,
temperature, top-p, max-new-tokens, fallback-toggle, show-rejected, thinking, code-editor, complete,
complete-stop, teach.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from types import SimpleNamespace

import gradio as gr

from .chat import handlers as h
from .chat.render import render_token_view, stats_html, syntax_css
from .chat.thinking import thinking_args, thinking_control
from .context import UIContext
from .named import Outputs, checked, components_of
from .teach.tab import build_teach_tab

HERE = Path(__file__).resolve().parent
BROWSER_KEY = "dflash-studio-session"
# Offered on an empty chat (a click sends one): requests the default pair answers with a fitting
# function (tests/test_embedded_model.py checks that it still does).
EXAMPLE_REQUESTS = ("Write a function that checks if a number is prime.",
                    "Write a function that counts the vowels in a string.",
                    "Write a function that reverses a string.")
# Esc stops the reply being generated (as in text-generation-webui).
KEYBOARD_JS = """
() => {
  document.addEventListener('keydown', (event) => {
    if (event.key === 'Escape') { document.querySelector('#stop')?.click(); }
  });
}
"""
# Rejected drafts are hidden unless the box is ticked (studio.css): code reads as the target wrote it.
SHOW_REJECTED_JS = """
(show) => {
  const view = document.getElementById('token-view');
  if (view) { view.classList.toggle('show-rejected', !!show); }
  return [];
}
"""


def launch_options() -> dict:
    """What goes to ``demo.launch`` (Gradio 6 moved theme/css/js there)."""
    css = (HERE / "studio.css").read_text(encoding="utf-8") + "\n" + syntax_css()
    return {"css": css, "js": KEYBOARD_JS, "theme": gr.themes.Soft(primary_hue="blue", neutral_hue="slate")}


def build_ui(ctx: UIContext) -> gr.Blocks:
    with gr.Blocks(title="DFlash Studio", fill_width=True) as demo:
        c = layout(ctx, demo)
        wire(ctx, demo, c)
    demo.queue(default_concurrency_limit=8, max_size=64)
    return demo


def layout(ctx: UIContext, demo: gr.Blocks) -> SimpleNamespace:
    """Every component, named on one namespace: sessions | chat, complete, teach | settings, charts."""
    c = SimpleNamespace()
    c.session = gr.State(None)
    c.msg_ids = gr.State([])
    c.pending_edit = gr.State(None)  # an edit of a chat message that passed its checks
    c.pending_send = gr.State(None)  # the chat message (and settings) that passed them
    c.pending_code = gr.State(None)  # the Complete-mode code (and settings) that passed them
    c.reply_request = gr.State(None)  # the reply a send, Regenerate or edit hands respond (handlers.PageReply)
    c.settings = gr.State(h.default_settings(ctx))  # the setting controls (thinking too) as one Settings value
    c.streaming = gr.State(None)  # the reply this page streams (see handlers.respond)
    c.page = gr.State(None)  # this page's id, set on load: a reply stream stops drawing when the page moves on
    c.remembered = gr.BrowserState(None, storage_key=BROWSER_KEY)
    with gr.Row(equal_height=False):
        with gr.Column(scale=1, min_width=220):
            _sessions_column(c)
        with gr.Column(scale=3, min_width=480):
            _conversation_column(ctx, demo, c)
        with gr.Column(scale=2, min_width=340):
            _settings_column(ctx, c)
    c.timer = gr.Timer(0.5, active=True)
    c.live = gr.Timer(1.0, active=True)  # sessions and replies that arrive through the API
    c.live_seen = gr.State(None)
    c.live_redraw = gr.State(None)
    c.controls = [c.block_size, c.temperature, c.top_p, c.max_new_tokens, c.fallback, c.show_rejected]
    return c


def _sessions_column(c: SimpleNamespace) -> None:
    gr.Markdown("# DFlash Studio\nspeculative decoding you can see", elem_id="app-title")
    c.new_session = gr.Button("+ New session", elem_id="new-session")
    c.search = gr.Textbox(placeholder="Search sessions…", show_label=False, elem_id="session-search",
                          container=False)
    c.sessions = gr.Radio(choices=[], label="Sessions", elem_id="session-list")
    c.title = gr.Textbox(label="Session title", elem_id="session-title", max_lines=1)
    with gr.Row():
        c.rename = gr.Button("Rename", size="sm", elem_id="rename-session")
        c.export = gr.Button("Export", size="sm", elem_id="export-session")
        c.import_file = gr.UploadButton("Import", size="sm", file_types=[".json"], file_count="single",
                                        elem_id="import-session")
        c.delete = gr.Button("Delete", size="sm", variant="stop", elem_id="delete-session")
    with gr.Row(visible=False, elem_id="confirm-row") as c.confirm_row:
        gr.Markdown("Delete this session and all its messages?")
        c.confirm = gr.Button("Delete", size="sm", variant="stop", elem_id="confirm-delete")
        c.cancel = gr.Button("Keep", size="sm", elem_id="cancel-delete")
    c.export_file = gr.File(label="Export (JSON)", visible=False, elem_id="export-file", interactive=False)
    c.delete_all = gr.Button("Delete all sessions…", size="sm", variant="secondary", elem_id="delete-all-sessions")
    with gr.Row(visible=False, elem_id="confirm-all-row") as c.confirm_all_row:
        c.confirm_all_text = gr.Markdown(elem_id="confirm-all-text")
        c.confirm_all = gr.Button("Delete all", size="sm", variant="stop", elem_id="confirm-delete-all")
        c.cancel_all = gr.Button("Keep", size="sm", elem_id="cancel-delete-all")


def _conversation_column(ctx: UIContext, demo: gr.Blocks, c: SimpleNamespace) -> None:
    with gr.Tabs():
        with gr.Tab("Chat", elem_id="chat-tab") as c.chat_tab:
            c.chat = gr.Chatbot(elem_id="chat", height=430, editable="user", buttons=["copy", "copy_all"],
                                show_label=False, feedback_options=None,
                                examples=[{"text": text} for text in EXAMPLE_REQUESTS],
                                placeholder="Ask the local coder for some code. Replies stream one verified block at a time.")
            with gr.Row(equal_height=True):
                c.chat_input = gr.Textbox(placeholder="Ask for code…  (Enter sends, Shift+Enter adds a line)",
                                          lines=1, max_lines=10, show_label=False, elem_id="chat-input",
                                          scale=8, autofocus=True, container=False,
                                          interactive=False)  # enabled once the page has its session
                c.send = gr.Button("Send", variant="primary", elem_id="send", scale=1, min_width=70)
                c.stop = gr.Button("Stop", variant="stop", elem_id="stop", scale=1, min_width=70)
            c.regenerate = gr.Button("↻ Regenerate last reply", size="sm", elem_id="regenerate")
        with gr.Tab("Complete", elem_id="complete-tab") as c.complete_tab:
            # Empty: the grey example in it is a placeholder drawn by studio.css, not text.
            c.code = gr.Code(value="", language="python", lines=14, interactive=True,
                             elem_id="code-editor", label="Code: the model continues it as raw text")
            with gr.Row():
                c.complete = gr.Button("Continue the code", variant="primary", elem_id="complete")
                c.complete_stop = gr.Button("Stop", variant="stop", elem_id="complete-stop")
        with gr.Tab("Teach", elem_id="teach") as c.teach_tab:
            c.teach = build_teach_tab(ctx, demo, c.teach_tab, chat_session=c.remembered)
    # The figures of the tab shown (Chat or Complete); Teach has its own, so they hide there.
    with gr.Column(elem_id="reply-figures") as c.reply_figures:
        c.stats = gr.HTML(stats_html(None), elem_id="stats")
        c.token_view = gr.HTML(render_token_view(None), elem_id="token-view")


def _settings_column(ctx: UIContext, c: SimpleNamespace) -> None:
    defaults = h.default_settings(ctx)
    c.model_status = gr.HTML(h.model_status_html(ctx), elem_id="model-status")
    with gr.Accordion("Settings (saved with the session)", open=True):
        c.model = gr.Dropdown(choices=ctx.engines.choices(), value=ctx.engines.current_key or None,
                              label="Model (target + DFlash draft): the session's, it answers on Send",
                              elem_id="model-picker")
        c.block_size = gr.Slider(1, ctx.defaults.max_block_size, value=defaults.block_size, step=1,
                                 label="Block size (1 = no speculation)", elem_id="block-size")
        c.temperature = gr.Slider(0.0, 2.0, value=defaults.temperature, step=0.05, label="Temperature",
                                  elem_id="temperature")
        c.top_p = gr.Slider(0.05, 1.0, value=defaults.top_p, step=0.05, label="Top-p", elem_id="top-p")
        c.max_new_tokens = gr.Slider(1, max(2048, defaults.max_new_tokens), value=defaults.max_new_tokens, step=1,
                                     label="Max new tokens", elem_id="max-new-tokens")
        with gr.Row():
            c.fallback = gr.Checkbox(value=defaults.fallback, label="Dynamic fallback",
                                     elem_id="fallback-toggle")
            c.show_rejected = gr.Checkbox(value=defaults.show_rejected, label="Show rejected drafts",
                                          elem_id="show-rejected")
        c.thinking = gr.Checkbox(label="Thinking (reasoning models)", elem_id="thinking",
                                 **thinking_args(ctx))
        c.defaults_note = gr.Markdown(h.defaults_note(ctx), elem_id="defaults-note")
        with gr.Row():
            c.save_defaults = gr.Button("Save as defaults", size="sm", elem_id="save-defaults")
            c.reset_defaults = gr.Button("Reset defaults", size="sm", elem_id="reset-defaults")
    c.acceptance_chart = gr.Plot(elem_id="acceptance-chart", show_label=False)
    c.session_chart = gr.Plot(elem_id="session-chart", show_label=False)
    with gr.Row():
        c.tau_histogram = gr.Plot(elem_id="tau-histogram", show_label=False)
        c.position_chart = gr.Plot(elem_id="position-chart", show_label=False)


# The page's Settings State is written by the settings event and read by the checks that start a
# send, a completion, a Regenerate, an edit or *Save as defaults*. Gradio runs events of one
# concurrency id one at a time, in the order they arrived: a setting changed just before Send is
# in the State by the time Send's check reads it.
SETTINGS_ORDER = {"concurrency_limit": 1, "concurrency_id": "settings-order"}
ENGINE_QUEUE = {"concurrency_limit": 1, "concurrency_id": "engine"}  # one engine: others wait, see their position


def wire(ctx: UIContext, demo: gr.Blocks, c: SimpleNamespace) -> None:
    components = components_of(c)

    def outputs(*names: str) -> Outputs:
        return Outputs(components, names)

    view = outputs(*h.SESSION_VIEW)

    # -- page load: restore the session this browser showed (or the latest) from the database
    def on_load(remembered):
        return {**h.on_load(ctx, remembered), "chat_input": gr.Textbox(interactive=True)}

    loaded = outputs(*h.SESSION_VIEW, "chat_input", "page")
    demo.load(loaded.wrap(on_load), [c.remembered], loaded.components, api_name="load_session")
    _wire_model(ctx, demo, c, outputs)
    checked, redrawn = outputs(*h.LIVE_CHECKED), outputs(*h.LIVE_REDRAWN)
    c.live.tick(checked.wrap(partial(h.live_check, ctx)), [c.session, c.search, c.live_seen, c.streaming, c.page],
                checked.components, api_visibility="undocumented", show_progress="hidden")
    c.live_redraw.change(redrawn.wrap(h.live_redraw_apply), [c.live_redraw], redrawn.components,
                         api_visibility="undocumented", show_progress="hidden")
    _wire_replies(ctx, c, outputs)
    _wire_sessions(ctx, c, outputs, view)

    # -- settings: one Settings value in a State, saved with the session on every user change;
    # show-rejected is also a class toggle
    # (every change is sent at once, "multiple": "always_last" or "once" would hold a change back, or
    # drop it, while the one before runs, and a Send clicked meanwhile would overtake it)
    changed = outputs("settings")
    gr.on([control.input for control in c.controls], changed.wrap(partial(h.change_settings, ctx)),
          [c.session, *c.controls, c.settings], changed.components, api_name="settings", trigger_mode="multiple",
          **SETTINGS_ORDER)
    # thinking on/off is a setting too (Settings.thinking), with a control of its own: it follows the
    # model shown (_wire_model), and a change goes in the same ordered group as the checks that read it
    c.thinking.input(changed.wrap(partial(h.change_thinking, ctx)), [c.session, c.thinking, c.settings],
                     changed.components, api_visibility="undocumented", trigger_mode="multiple", **SETTINGS_ORDER)
    c.show_rejected.change(None, [c.show_rejected], None, js=SHOW_REJECTED_JS)
    _wire_defaults_and_tabs(ctx, c, outputs)


def _wire_replies(ctx: UIContext, c: SimpleNamespace, outputs) -> None:
    """Send, Complete, Regenerate and edits: each is checked (reading the Settings State), stored,
    and hands ``respond`` the reply to make in ``reply_request``."""
    streamed = outputs(*h.STREAMED)

    def then_respond(event, api_name=None, to_editor=False):
        return event.success(streamed.wrap(partial(h.respond, ctx, to_editor=to_editor)), [c.reply_request, c.page],
                             streamed.components, api_name=api_name, api_visibility="public" if api_name else "undocumented",
                             **ENGINE_QUEUE)

    sent = outputs(*h.SENT)
    sent_event = checked([c.chat_input.submit, c.send.click], partial(h.check_send, ctx),
                         [c.session, c.chat_input, c.settings], accepted=c.pending_send, **SETTINGS_ORDER).success(
        sent.wrap(partial(h.submit_prompt, ctx)), [c.session, c.chat_input, c.settings, c.pending_send, c.page],
        sent.components, api_name="send")
    then_respond(sent_event, api_name="respond")
    c.chat.example_select(use_example, None, c.chat_input, queue=False, api_visibility="undocumented").then(
        None, None, None, js="() => { document.querySelector('#send')?.click(); }")  # sent as if typed
    gr.on([c.stop.click, c.complete_stop.click], partial(h.stop, ctx), [c.session], None, queue=False,
          api_name="stop")
    pending = outputs("chat", "msg_ids", "reply_request")
    regenerated = checked([c.regenerate.click, c.chat.retry], partial(h.check_regenerate, ctx),
                          [c.session, c.settings], **SETTINGS_ORDER).success(
        pending.wrap(partial(h.regenerate, ctx)), [c.session, c.settings], pending.components, api_name="regenerate")
    then_respond(regenerated)

    def edit_message(edit):  # the edit the check accepted, in the session it was made in (see check_edit)
        return h.edit_message(ctx, edit["session"], edit["message_ids"], SimpleNamespace(**edit["event"]),
                              edit["settings"])

    def show_reply(message_ids, evt: gr.SelectData):
        return h.show_reply(ctx, message_ids, evt)

    def check_edit(session_id, message_ids, settings, evt: gr.EditData):  # Gradio finds EditData by annotation
        h.check_edit(ctx, session_id, message_ids, evt, settings)
        return {"session": session_id, "message_ids": list(message_ids), "settings": settings,
                "event": {"index": evt.index, "value": evt.value}}

    # A chained event gets no gr.EditData: the check hands the accepted edit on in a State.
    edit_view = outputs(*h.SESSION_VIEW, "reply_request")
    edited = checked([c.chat.edit], check_edit, [c.session, c.msg_ids, c.settings], accepted=c.pending_edit,
                     **SETTINGS_ORDER).success(
        edit_view.wrap(edit_message), [c.pending_edit], edit_view.components, api_visibility="undocumented")
    then_respond(edited)
    figures = outputs(*h.REPLY_FIGURES)
    c.chat.select(figures.wrap(show_reply), [c.msg_ids], figures.components, api_visibility="undocumented")

    # -- complete mode: the chat's send, with the code editor's text
    completed = outputs(*h.COMPLETED)
    completed_event = checked([c.complete.click], partial(h.check_completion, ctx), [c.session, c.code, c.settings],
                              accepted=c.pending_code, **SETTINGS_ORDER).success(
        completed.wrap(partial(h.submit_completion, ctx)), [c.session, c.code, c.settings, c.pending_code, c.page],
        completed.components, api_name="complete")
    then_respond(completed_event, to_editor=True)


def use_example(evt: gr.SelectData) -> str:
    """The text of the example request clicked in the empty chat."""
    return evt.value.get("text", "") if isinstance(evt.value, dict) else str(evt.value or "")


def _wire_model(ctx: UIContext, demo: gr.Blocks, c: SimpleNamespace, outputs) -> None:
    """The model menu and the header above the settings: both name the model of the session shown."""
    model_status = outputs(*h.MODEL_STATUS)
    for trigger in (demo.load, c.timer.tick):
        trigger(model_status.wrap(partial(h.poll_model, ctx)), [c.model], model_status.components,
                api_visibility="undocumented")
    # the header follows the engine (a model an API request switched to, a load that Send queued)
    c.live.tick(partial(h.model_status_html, ctx), [c.model], c.model_status, api_visibility="undocumented",
                show_progress="hidden")
    picked = outputs("model", *h.MODEL_STATUS)
    # .select, not .input: the menu's .input fires again when it loses focus, with the inputs read
    # then, so picking a model and then clicking another session in the list moved that session to
    # the picked model. One pick at a time: a second waits for the first's load.
    c.model.select(picked.wrap(partial(h.pick_model, ctx)), [c.model, c.session], picked.components, api_name="pick_model",
                  concurrency_limit=1, concurrency_id="model-pick")
    # the thinking control follows the model (its family's default, or why it has none) and the session
    for trigger in (demo.load, c.model.change, c.session.change):
        trigger(partial(thinking_control, ctx), [c.session], c.thinking, api_visibility="undocumented")


def _wire_defaults_and_tabs(ctx: UIContext, c: SimpleNamespace, outputs) -> None:
    """*Save as defaults* / *Reset defaults* (what new sessions start from), and the figures under
    the conversation when a tab is shown: that tab's own latest reply."""
    c.save_defaults.click(partial(h.save_defaults, ctx), [c.settings], c.defaults_note, api_name="save_defaults",
                          **SETTINGS_ORDER)
    reset = outputs("defaults_note", *h.SETTING_KEYS, "settings")
    c.reset_defaults.click(reset.wrap(partial(h.reset_defaults, ctx)), [c.session], reset.components,
                           api_name="reset_defaults")
    figures = outputs(*h.REPLY_FIGURES)
    for tab, mode in ((c.chat_tab, "chat"), (c.complete_tab, "complete")):
        tab.select(figures.wrap(partial(h.tab_figures, ctx, mode=mode)), [c.session, c.page], figures.components,
                   api_visibility="undocumented")
    # Teach draws its own reply; the panel of the tab shown before it would sit under it, unrelated
    for tab, shown in ((c.chat_tab, True), (c.complete_tab, True), (c.teach_tab, False)):
        tab.select(partial(shown_or_hidden, shown), None, c.reply_figures, queue=False, api_visibility="undocumented")


def shown_or_hidden(shown: bool):
    return gr.update(visible=shown)


def _wire_sessions(ctx: UIContext, c: SimpleNamespace, outputs, view: Outputs) -> None:
    """Sessions panel. What shows another session stops the page's reply stream (``c.page``): the
    reply goes on generating and is saved, and shows again, growing, when its session is picked."""
    c.sessions.input(view.wrap(partial(h.select_session, ctx)), [c.sessions, c.search, c.page], view.components,
                     api_name="select_session")
    c.new_session.click(view.wrap(partial(h.new_session, ctx)), [c.page], view.components, api_name="new_session")
    c.search.change(partial(h.search, ctx), [c.search, c.session], c.sessions, api_name="search_sessions")
    checked([c.rename.click, c.title.submit], h.check_rename, [c.session, c.title]).success(
        partial(h.rename, ctx), [c.session, c.title, c.search], c.sessions, api_name="rename_session")
    checked([c.delete.click], h.check_session_selected, [c.session]).success(
        h.ask_delete, [c.session], c.confirm_row, api_visibility="undocumented")
    deleted = outputs("confirm_row", *h.SESSION_VIEW)
    c.confirm.click(deleted.wrap(partial(h.confirm_delete, ctx)), [c.session, c.page], deleted.components,
                    api_name="delete_session")
    c.cancel.click(h.cancel_delete, None, c.confirm_row, api_visibility="undocumented")
    asked = outputs("confirm_all_row", "confirm_all_text")
    checked([c.delete_all.click], partial(h.check_any_session, ctx), None).success(
        asked.wrap(partial(h.ask_delete_all, ctx)), None, asked.components, api_visibility="undocumented")
    all_deleted = outputs("confirm_all_row", *h.SESSION_VIEW)
    c.confirm_all.click(all_deleted.wrap(partial(h.confirm_delete_all, ctx)), [c.page], all_deleted.components,
                        api_name="delete_all_sessions")
    c.cancel_all.click(h.cancel_delete, None, c.confirm_all_row, api_visibility="undocumented")
    checked([c.export.click], h.check_session_selected, [c.session]).success(
        partial(h.export, ctx), [c.session], c.export_file, api_name="export_session")
    checked([c.import_file.upload], partial(h.check_import, ctx), [c.import_file]).success(
        view.wrap(partial(h.import_sessions, ctx)), [c.import_file, c.page], view.components, api_name="import_sessions")
