"""Teach's Share buttons: the replay of the reply shown, as one HTML file (``#teach-share``, ready
to download in one click: it is written whenever the reply or its comparison changes) and as an
animated GIF (``#teach-gif`` draws it, ``#teach-gif-file`` downloads it). The same files as
``dflash-studio sessions share``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import gradio as gr

from engine.files import write_atomically, write_text_atomically

from ..context import STORE_ERRORS, UIContext
from .gif import replay_gif
from .page import replay_html
from .replay import ShareError, load_share, replay_document

SHARE_LABEL = "⤓ Share this replay (HTML)"
GIF_LABEL = "⤓ Download the GIF"


def build_share_controls(c: dict) -> None:
    """The buttons, inside the Teach tab's layout (``c`` is the tab's component dict)."""
    c["share_dir"] = Path(tempfile.mkdtemp(prefix="dflash-share-"))
    with gr.Row():
        c["share"] = gr.DownloadButton(SHARE_LABEL, value=None, elem_id="teach-share", size="sm", interactive=False)
        c["gif"] = gr.Button("Make a GIF of this replay", elem_id="teach-gif", size="sm")
        c["gif_file"] = gr.DownloadButton(GIF_LABEL, value=None, elem_id="teach-gif-file", size="sm", visible=False)


def _share(ctx: UIContext, message_id):
    try:
        message = ctx.store.get_message(int(message_id))
        return load_share(ctx.store, message["session_id"], message_id=message["id"])
    except (*STORE_ERRORS, TypeError):
        return None


def _stem(share) -> str:
    return f"dflash-replay-session{share.message['session_id']}-reply{share.reply_number}"


def share_file(ctx: UIContext, folder: Path, message_id) -> tuple:
    """The HTML replay of the reply shown, ready in the Share button (and the GIF button reset)."""
    share = _share(ctx, message_id) if message_id is not None else None
    hidden_gif = gr.DownloadButton(value=None, visible=False)
    if share is None:
        return gr.DownloadButton(value=None, interactive=False), hidden_gif
    path = folder / f"{_stem(share)}.html"
    write_text_atomically(path, replay_html(share))  # another tab may be downloading the same file
    return gr.DownloadButton(value=str(path), interactive=True), hidden_gif


def gif_file(ctx: UIContext, folder: Path, message_id):
    """Draw the GIF of the reply shown (seconds for a long reply) and offer it for download."""
    share = _share(ctx, message_id) if message_id is not None else None
    if share is None:
        raise gr.Error("Pick a reply to make a GIF of.")
    try:
        data = replay_gif(replay_document(share))
    except ShareError as exc:
        raise gr.Error(str(exc)) from None
    path = folder / f"{_stem(share)}.gif"
    write_atomically(path, lambda temp: temp.write_bytes(data))
    return gr.DownloadButton(GIF_LABEL + f" ({len(data) / 1e6:.1f} MB)", value=str(path), visible=True)


def wire_share(ctx: UIContext, c: dict) -> None:
    """The reply's file follows the reply picked and its comparison (a Compare run adds the race)."""
    hidden = {"api_visibility": "undocumented"}
    folder = c["share_dir"]
    refresh = lambda message_id: share_file(ctx, folder, message_id)  # noqa: E731 - one line, named by its use
    c["reply"].change(refresh, [c["reply"]], [c["share"], c["gif_file"]], **hidden)
    c["compare_result"].change(refresh, [c["reply"]], [c["share"], c["gif_file"]], **hidden)
    c["gif"].click(lambda message_id: gif_file(ctx, folder, message_id), [c["reply"]], c["gif_file"],
                   api_name="teach_gif")
