"""The Teach tab: block-by-block replay of how DFlash drafts and verifies.

PLACEHOLDER owned by the teaching-view engineer, who replaces this module. Contract:
``build_teach_tab(ctx)`` is called inside ``with gr.Tab("Teach", elem_id="teach"):`` in
``ui.layout.build_ui`` and builds that tab's content; it gets the same ``UIContext`` as the rest
of the UI (``ctx.store`` for stored cycles with their ``slots``, ``ctx.engines.submit`` for engine
work on the one worker). It may return a dict of named components for wiring; it returns None now.
"""

from __future__ import annotations

import gradio as gr

from .context import UIContext


def build_teach_tab(ctx: UIContext) -> dict | None:
    gr.Markdown(
        "### How DFlash works, block by block\n"
        "Each **cycle** the small draft network fills a whole block of mask slots in *one* forward pass; "
        "the target model checks the block in *one* forward pass and keeps the drafts up to the first "
        "disagreement, then adds its own token (the *bonus*). In the token view, hover a block to see "
        "its boundary and a token to see its slot and probabilities.\n\n"
        "*A step-by-step replay of stored cycles is coming to this tab.*",
        elem_id="teach-placeholder",
    )
    return None
