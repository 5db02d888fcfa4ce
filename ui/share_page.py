"""The replay page: one HTML file that plays a stored reply's decoding cycle by cycle, with
everything inline (style, script, data) so that it opens from ``file://`` with no network.

``replay_html(share)`` returns the page. Safety: every piece of text the page shows reaches it
either escaped by ``html.escape`` (what Python writes) or through ``textContent`` (what the
script draws from the data); the data sits in a ``<script type="application/json">`` block with
``<``, ``>`` and ``&`` written as ``\\u003c``, ``\\u003e``, ``\\u0026``, so no text can close it; a
Content-Security-Policy allows only this page's own script and style (by hash) and nothing
from anywhere else, so the page fetches nothing.

Contract (tests and outside checks rely on it): the root element carries ``data-dflash-replay``,
``data-cycles`` (the reply's stored cycles) and ``data-cycle`` (the frame shown: 0 is the prefill,
k the state after cycle k); every token of the reply text (``#rp-text``) carries ``data-origin``
= accepted | bonus | rejected; ArrowRight shows the next cycle; End shows the last, whose
accepted + bonus tokens read exactly as the stored reply. The block's slots carry
``data-verdict`` instead (they are proposals, not the reply's text).
"""

from __future__ import annotations

import base64
import hashlib
import json

from .render import esc
from .share import ShareReply, replay_document
from .share_assets import REPLAY_CSS, REPLAY_JS

PAGE_BUDGET = 950_000  # bytes: the draft's top-3 per slot are left out of a page that would be larger
CHART_WIDTH, CHART_HEIGHT = 720, 120


def script_json(value) -> str:
    """JSON that can sit inside a ``<script>`` element: no ``<``, ``>`` or ``&`` left in it."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def csp_hash(source: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(source.encode("utf-8")).digest()).decode("ascii") + "'"


def content_security_policy(script: str, style: str) -> str:
    """Nothing from anywhere: only this page's own script and style, recognised by their hashes."""
    return (f"default-src 'none'; script-src {csp_hash(script)}; style-src {csp_hash(style)}; "
            "img-src 'none'; font-src 'none'; connect-src 'none'; media-src 'none'; object-src 'none'; "
            "frame-src 'none'; worker-src 'none'; manifest-src 'none'; base-uri 'none'; form-action 'none'")


# ============================================================================ static parts


def _rows(pairs: list[list[str]], table_id: str) -> str:
    cells = "".join(f"<tr><th scope=\"row\">{esc(name)}</th><td>{esc(value)}</td></tr>" for name, value in pairs)
    return f'<table id="{table_id}">{cells}</table>'


def tau_chart(frames: list[dict], max_block: int) -> str:
    """τ per cycle as bars (the block size as a dashed line); the script marks the cycle shown."""
    cycles = [f for f in frames if f["i"] > 0]
    if not cycles:
        return '<p class="muted">No cycles: this reply has no decoding cycles to chart.</p>'
    top = max(max_block, max(f["tau"] for f in cycles), 1)
    step = CHART_WIDTH / len(cycles)
    bar = max(step * 0.8, 0.6)
    scale = (CHART_HEIGHT - 14) / top
    rects = []
    for f in cycles:
        h = f["tau"] * scale
        x = (f["i"] - 1) * step
        rects.append(f'<rect class="bar" data-i="{f["i"]}" x="{x:.2f}" y="{CHART_HEIGHT - h:.2f}" width="{bar:.2f}" '
                     f'height="{h:.2f}"><title>cycle {f["i"]}: τ {f["tau"]} of block {f["b"]}</title></rect>')
    block_y = CHART_HEIGHT - max_block * scale
    return (f'<svg id="rp-chart" viewBox="0 0 {CHART_WIDTH} {CHART_HEIGHT}" preserveAspectRatio="none" role="img" '
            f'aria-label="τ per cycle, {len(cycles)} cycles">'
            f'<line class="limit" x1="0" x2="{CHART_WIDTH}" y1="{block_y:.2f}" y2="{block_y:.2f}"></line>'
            f'{"".join(rects)}</svg>'
            f'<div class="chart-axis"><span>cycle 1</span><span>dashed line: block size {max_block} '
            f'(the most a cycle can produce) · bar height: τ, tokens the cycle produced</span>'
            f'<span>cycle {len(cycles)}</span></div>')


def race_html(race: dict | None) -> str:
    if race is None:
        return ('<section id="rp-race" class="card" data-race="none"><h2>Race against plain decoding</h2>'
                '<p class="muted">No comparison with plain decoding was stored for this reply (press '
                '<i>Compare with plain decoding</i> in Teach, or share with <code>--race</code>).</p></section>')
    finish = {name: (race[name]["steps"][-1][0] if race[name]["steps"] else 0.0) for name in ("plain", "dflash")}
    ident = race["identical"]
    verdict = ("Identical output: plain decoding wrote exactly the stored reply, token for token."
               if ident else "Different output: plain decoding did not write the stored reply. " + race["why"])
    if race["note"]:
        verdict += " " + race["note"]
    speed = f"DFlash {race['speedup']:.2f}× plain decoding's tokens/s" if race["speedup"] else ""
    method = f" Plain decoding ran on {race['method']}." if race["method"] else ""
    lanes = "".join(
        f'<div class="lane" id="race-{name}" data-lane="{name}" data-done="false">'
        f'<div class="lane-head"><b>{esc(race[name]["label"])}</b> <span class="lane-count">0 tokens</span>'
        f' <span class="lane-finish muted">finishes at {finish[name] / 1000:.2f} s</span></div>'
        f'<div class="lane-bar"><span class="lane-fill"></span></div>'
        f'<pre class="lane-text mono"></pre></div>'
        for name in ("plain", "dflash"))
    return (
        f'<section id="rp-race" class="card" data-race="ready" data-race-state="ready" data-race-ms="0" '
        f'data-identical="{str(bool(ident)).lower()}" data-end-ms="{max(finish.values()):.1f}">'
        '<h2>Race against plain decoding, on one clock</h2>'
        '<p class="muted">Both runs answered the same prompt on the same machine; each lane shows its text at the '
        f'moments the run produced it (measured, ms since the request started).{esc(method)}</p>'
        '<div class="controls"><button type="button" id="race-play">▶ Start race</button>'
        '<button type="button" id="race-reset">« Reset</button>'
        '<button type="button" id="race-end">Finish »</button>'
        '<label>pace <select id="race-pace"><option value="1">real time</option><option value="0.5">½×</option>'
        '<option value="0.25">¼×</option><option value="0.1">1/10×</option></select></label>'
        '<input type="range" id="race-slider" min="0" max="1000" value="0" aria-label="race clock">'
        '<span id="race-clock" class="mono">0.00 s</span></div>'
        f'<div class="lanes">{lanes}</div>'
        f'<p id="race-verdict" data-identical="{str(bool(ident)).lower()}"><b>{"✓" if ident else "≠"}</b> '
        f'{esc(verdict)} {esc(speed)}</p></section>')


def legend_html() -> str:
    return ('<p class="legend"><span class="tok" data-legend="accepted">accepted</span> a draft token the target '
            'confirmed (underlined) · <span class="tok" data-legend="bonus">bonus</span> the target\'s own token '
            '(boxed) · <span class="tok" data-legend="rejected">rejected</span> a draft token the target refused '
            '(struck through) · the cycle shown is highlighted</p>')


def _body(doc: dict, chart: str) -> str:
    frames = doc["frames"]
    cycles = len(frames) - 1
    model = doc["model"] or "an unnamed model"
    note = f'<p class="card note">ℹ {esc(doc["engine_note"])}</p>' if doc["engine_note"] else ""
    prompt = (f'<details id="rp-prompt" class="card"><summary>The prompt this reply answered</summary>'
              f'<pre class="mono">{esc(doc["prompt"])}</pre></details>') if doc["prompt"] else ""
    return (
        f'<main id="replay" data-dflash-replay="1" data-cycles="{cycles}" data-cycle="0" data-playing="false">'
        '<header><div><h1 id="rp-title">' + esc(doc["title"]) + '</h1>'
        f'<p class="sub">Reply #{esc(doc["seq"])} by <b id="rp-model">{esc(model)}</b>, decoded with DFlash: a small '
        'draft network proposes a whole block of tokens in one pass and the target model checks the block in one '
        'pass.</p></div>'
        '<button type="button" id="rp-theme" aria-label="colour theme">◐ theme: auto</button></header>'
        f'<div class="about"><div class="card"><h2>Settings</h2>{_rows(doc["settings"], "rp-settings")}</div>'
        f'<div class="card"><h2>Measured</h2>{_rows(doc["figures"], "rp-figures")}</div></div>'
        f'{prompt}{note}'
        '<nav class="controls card" aria-label="replay controls">'
        '<button type="button" id="rp-home" title="first frame (Home)">« First</button>'
        '<button type="button" id="rp-prev" title="previous cycle (←)">◀ Prev</button>'
        '<button type="button" id="rp-play" title="play / pause (space)">▶ Play</button>'
        '<button type="button" id="rp-next" title="next cycle (→)">Next ▶</button>'
        '<button type="button" id="rp-end" title="last cycle (End)">Last »</button>'
        f'<input type="range" id="rp-slider" min="0" max="{cycles}" value="0" aria-label="cycle">'
        '<label>speed <select id="rp-speed"><option value="0.5">0.5</option><option value="1">1</option>'
        '<option value="2" selected>2</option><option value="4">4</option><option value="8">8</option>'
        '</select> cycles/s</label><span id="rp-where" class="mono"></span>'
        '<span class="muted keys">keys: ← → one cycle · space play/pause · Home / End</span></nav>'
        '<section class="card"><div id="rp-caption" aria-live="polite"></div></section>'
        '<section class="card"><h2>1 · The block as the draft sees it: one forward pass fills every MASK</h2>'
        '<div id="rp-draftview" class="row"></div>'
        '<h2>2 · The draft\'s proposals and the target\'s verdicts</h2>'
        '<p class="muted small">✓ accepted (solid) · ✗ first mismatch (dashed, struck through) · · discarded unverified '
        '(dotted, faded) · ★ bonus, the target\'s own token (double border)</p>'
        '<div id="rp-slots" class="row"></div><p id="rp-cost" class="muted small mono"></p></section>'
        f'<section class="card"><h2>3 · The reply so far</h2>{legend_html()}'
        '<div id="rp-text" class="mono"></div></section>'
        f'<section class="card"><h2>4 · τ per cycle, and the speed so far</h2>{chart}'
        f'<p id="rp-speed-now"></p><p class="muted small">Speed against plain decoding from '
        f'{esc(doc["speed_source"] or "no timings (this engine does not time its cycles)")}.</p></section>'
        f'{race_html(doc["race"])}'
        '<footer class="muted small">Replay made by DFlash Studio from the reply\'s stored cycles; figures were '
        'measured on the machine that made the reply. Everything is in this one file: it needs no network.</footer>'
        '</main>'
        f'<noscript><pre class="mono">{esc(doc["text"])}</pre></noscript>'
    )


# ============================================================================ the page


def page_from_document(doc: dict) -> str:
    style, script = REPLAY_CSS, REPLAY_JS
    chart = tau_chart(doc["frames"], doc["max_block"])
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{esc(content_security_policy(script, style))}">'
        '<meta name="referrer" content="no-referrer">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta name="color-scheme" content="light dark">'
        f'<title>DFlash replay · {esc(doc["title"])}</title><style>{style}</style></head><body>'
        f'{_body(doc, chart)}'
        f'<script type="application/json" id="replay-data">{script_json(doc)}</script>'
        f'<script>{script}</script></body></html>\n'
    )


def replay_html(share: ShareReply) -> str:
    """The whole page for one reply (under ``PAGE_BUDGET`` bytes for a reply of a few hundred tokens)."""
    page = page_from_document(replay_document(share))
    if len(page.encode("utf-8")) > PAGE_BUDGET:
        page = page_from_document(replay_document(share, keep_top=False))
    return page
