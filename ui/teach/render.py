"""HTML for the Teach tab: one cycle (``TeachStep``), the explainer, the comparison result.

Every piece of model or user text goes through ``esc`` (``html.escape``) before it becomes HTML;
the only markup is our own. Element ids inside ``#teach-step``: ``teach-caption``,
``teach-context``, ``teach-block``, ``teach-slots`` (one ``.ts-slot`` per block slot with
``data-verdict`` in anchor|accepted|rejected|unverified|bonus, then the bonus), ``teach-heatmap``,
``teach-text``, ``teach-cache``.
"""

from __future__ import annotations

from ..chat.render import esc
from ..chat.speed import compare_story
from .compare import Comparison, Run, why_different
from .steps import ReplyNumbers, TeachStep, caption, show_token

CONTEXT_CHARS = 320
TEXT_CHARS = 2400
VERDICT_MARK = {"anchor": "⚓", "accepted": "✓", "rejected": "✗", "unverified": "·", "bonus": "★"}
VERDICT_WORDS = {
    "anchor": "anchor: the last token already kept (the draft's slot 0)",
    "accepted": "accepted: the target chose the same token",
    "rejected": "rejected: the first mismatch; the target's own token replaces it",
    "unverified": "discarded unverified: it came after a mismatch",
    "bonus": "bonus: the target's own token, free with the verify pass",
}

TEACH_CSS = """
<style>
#teach .teach-card { border: 1px solid var(--border-color-primary, #ddd); border-radius: 8px; padding: 8px 10px;
  margin: 6px 0; background: var(--background-fill-secondary, #fafafa); }
#teach .teach-h { font-size: 12px; text-transform: uppercase; letter-spacing: .04em; opacity: .7; margin-bottom: 4px; }
#teach .mono, #teach .ts-tok, #teach .tb-cell, #teach .hm-tok { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
#teach .teach-title { font-size: 15px; font-weight: 600; }
#teach-caption { font-size: 14px; line-height: 1.5; }
#teach-block, #teach-slots { display: flex; flex-wrap: wrap; gap: 4px; align-items: stretch; }
#teach .tb-cell { min-width: 44px; padding: 4px 6px; border-radius: 5px; border: 1px dashed #999; text-align: center; font-size: 12px; }
#teach .tb-cell[data-role="anchor"] { border-style: solid; border-color: #2f6fd6; background: rgba(47,111,214,.12); }
#teach .tb-cell[data-role="mask"] { color: #777; background: repeating-linear-gradient(45deg, #f0f0f0, #f0f0f0 4px, #e4e4e4 4px, #e4e4e4 8px); }
#teach .ts-slot { display: flex; flex-direction: column; align-items: center; min-width: 54px; padding: 4px 6px;
  border-radius: 6px; border: 1px solid #ccc; font-size: 12px; background: var(--background-fill-primary, white); }
#teach .ts-slot .ts-n { font-size: 10px; opacity: .6; }
#teach .ts-slot .ts-tok { font-size: 13px; white-space: pre; }
#teach .ts-slot .ts-mark { font-weight: 700; }
#teach .ts-slot .ts-p { font-size: 10px; opacity: .75; }
#teach .ts-slot[data-verdict="anchor"] { border-color: #2f6fd6; background: rgba(47,111,214,.10); }
#teach .ts-slot[data-verdict="accepted"] { border-color: #2e9e5b; background: rgba(46,158,91,.16); }
#teach .ts-slot[data-verdict="accepted"] .ts-mark { color: #2e9e5b; }
#teach .ts-slot[data-verdict="rejected"] { border-color: #d04a4a; background: rgba(208,74,74,.12); }
#teach .ts-slot[data-verdict="rejected"] .ts-mark { color: #d04a4a; }
#teach .ts-slot[data-verdict="rejected"] .ts-tok { text-decoration: line-through; }
#teach .ts-slot[data-verdict="unverified"] { opacity: .45; border-style: dashed; }
#teach .ts-slot[data-verdict="bonus"] { border-color: #2f6fd6; border-width: 2px; background: rgba(47,111,214,.16); }
#teach .ts-slot[data-verdict="bonus"] .ts-mark { color: #2f6fd6; }
#teach .ts-sep { align-self: center; font-size: 18px; opacity: .5; padding: 0 2px; }
#teach-heatmap table { border-collapse: collapse; font-size: 11px; }
#teach-heatmap td, #teach-heatmap th { border: 1px solid #e2e2e2; padding: 2px 5px; text-align: center; }
#teach-heatmap th { font-weight: 500; opacity: .7; }
#teach-heatmap td.hm-target { outline: 2px solid #2f6fd6; outline-offset: -2px; }
#teach-heatmap td.hm-unverified { opacity: .45; }
#teach .hm-p { display: block; font-size: 10px; opacity: .75; }
#teach-text, #teach-context { white-space: pre-wrap; word-break: break-word; font-size: 13px; line-height: 1.6;
  max-height: 260px; overflow-y: auto; }
#teach .tt-accepted { background: rgba(46,158,91,.22); box-shadow: inset 0 -2px 0 #2e9e5b; }
#teach .tt-bonus { background: rgba(47,111,214,.2); box-shadow: inset 0 -2px 0 #2f6fd6; }
#teach .tt-rejected { color: #c0392b; text-decoration: line-through; opacity: .55; }
#teach .tt-anchor { background: rgba(47,111,214,.2); outline: 1px solid #2f6fd6; }
#teach .tt-old { opacity: .8; }
#teach-cache { font-size: 13px; margin-top: 4px; }
#teach .lane { display: flex; align-items: center; gap: 8px; font-size: 12px; margin: 2px 0; }
#teach .lane-name { width: 90px; font-weight: 600; }
#teach .lane-boxes { display: inline-flex; gap: 2px; min-width: 140px; }
#teach .lane-d, #teach .lane-t { display: inline-block; width: 10px; height: 12px; border-radius: 2px; vertical-align: middle; }
#teach .lane-d { background: #8a63d2; opacity: .55; width: 6px; }
#teach .lane-t { background: #2f6fd6; }
#teach .lane-note { opacity: .75; }
#teach-explainer .ex-grid { display: grid; grid-template-columns: repeat(auto-fit, minmax(200px, 1fr)); gap: 8px; }
#teach-explainer .ex-col { border: 1px solid var(--border-color-primary, #ddd); border-radius: 8px; padding: 6px 10px; font-size: 13px; }
#teach-explainer .ex-num { font-size: 18px; font-weight: 700; }
#compare-result .cr-badge { display: inline-block; padding: 2px 10px; border-radius: 12px; font-weight: 700; }
#compare-result .cr-badge[data-identical="true"] { background: rgba(46,158,91,.2); color: #1d6b3c; }
#compare-result .cr-badge[data-identical="false"] { background: rgba(208,74,74,.16); color: #a03020; }
#compare-result table { border-collapse: collapse; margin-top: 6px; font-size: 13px; }
#compare-result td, #compare-result th { border-bottom: 1px solid #e6e6e6; padding: 3px 10px; text-align: left; }
#compare-result .cr-texts { display: grid; grid-template-columns: 1fr 1fr; gap: 8px; margin-top: 6px; }
#compare-result pre { white-space: pre-wrap; word-break: break-word; max-height: 220px; overflow-y: auto; font-size: 12px;
  background: var(--background-fill-secondary, #fafafa); padding: 6px; border-radius: 6px; margin: 0; }
</style>
"""


def _tok(text: str | None) -> str:
    return esc(show_token(text))


def _tail(text: str, chars: int) -> str:
    return text if len(text) <= chars else "…" + text[-chars:]


def empty_step_html(note: str) -> str:
    return f'<div class="teach-empty" id="teach-empty">{esc(note)}</div>'


def slot_html(slot) -> str:
    details = [VERDICT_WORDS[slot.verdict]]
    probability = ""
    if slot.draft_top:
        details.append(f"draft p {slot.draft_top[0][2]:.2f}")
        probability = f"q {slot.draft_top[0][2]:.2f}"
    if slot.target_prob is not None and slot.verdict != "bonus":
        details.append(f"target p {float(slot.target_prob):.2f}")
        probability += f" · p {float(slot.target_prob):.2f}"
    if slot.verdict == "rejected" and slot.target_text is not None:
        details.append(f"the target chose {show_token(slot.target_text)}")
    label = {"anchor": "anchor", "bonus": f"bonus @{slot.slot}"}.get(slot.verdict, f"slot {slot.slot}")
    return (f'<div class="ts-slot" data-verdict="{slot.verdict}" data-slot="{slot.slot}" title="{esc(" · ".join(details))}">'
            f'<span class="ts-n">{esc(label)}</span><span class="ts-tok">{_tok(slot.text)}</span>'
            f'<span class="ts-mark">{VERDICT_MARK[slot.verdict]}</span>'
            f'<span class="ts-p">{esc(probability)}</span></div>')


def slots_html(step: TeachStep) -> str:
    parts = []
    for slot in step.slots:
        if slot.verdict == "bonus":
            parts.append('<span class="ts-sep">→</span>')
        parts.append(slot_html(slot))
    return f'<div id="teach-slots" data-cycle="{step.index}" data-block-size="{step.block_size}">{"".join(parts)}</div>'


def block_html(step: TeachStep) -> str:
    cells = []
    for j, token in enumerate(step.draft_view):
        role = "anchor" if j == 0 else "mask"
        cells.append(f'<span class="tb-cell" data-role="{role}" title="position {j}">{_tok(token) if j == 0 else "MASK"}</span>')
    return f'<div id="teach-block">{"".join(cells)}</div>'


def heatmap_html(step: TeachStep) -> str:
    """The draft's top-3 per slot: a cell's green is its probability; the target's choice is outlined."""
    slots = step.draft_slots
    if not slots:
        return '<div id="teach-heatmap"><em>No draft this cycle (block size 1): the target decoded one token on its own.</em></div>'
    if not any(s.draft_top for s in slots):
        return '<div id="teach-heatmap"><em>This reply was stored without the draft\'s probabilities.</em></div>'
    depth = max(len(s.draft_top) for s in slots)
    head = "".join(f"<th>slot {s.slot}</th>" for s in slots)
    rows = []
    for rank in range(depth):
        cells = []
        for s in slots:
            if rank >= len(s.draft_top):
                cells.append("<td></td>")
                continue
            token, text, p = s.draft_top[rank]
            classes = []
            if s.verdict != "unverified" and s.target_token is not None and token == s.target_token:
                classes.append("hm-target")
            if s.verdict == "unverified":
                classes.append("hm-unverified")
            alpha = max(0.0, min(1.0, float(p)))
            cells.append(
                f'<td class="{" ".join(classes)}" style="background: rgba(46,158,91,{alpha * 0.85:.3f})" '
                f'title="{esc(f"slot {s.slot}, draft choice {rank + 1}: {show_token(text)} p={p:.3f}")}">'
                f'<span class="hm-tok">{_tok(text)}</span><span class="hm-p">{p:.2f}</span></td>')
        rows.append(f"<tr><th>top {rank + 1}</th>{''.join(cells)}</tr>")
    return (f'<div id="teach-heatmap"><table><tr><th></th>{head}</tr>{"".join(rows)}</table>'
            '<div class="ts-p">green = the draft\'s probability · outlined = the token the target chose there</div></div>')


def text_html(step: TeachStep) -> str:
    """The reply so far: earlier text, then this cycle's accepted drafts, rejected drafts, bonus."""
    before = esc(_tail(step.text_before, TEXT_CHARS))
    accepted = "".join(step.emitted_pieces[: step.accepted])
    rest = "".join(step.emitted_pieces[step.accepted:])
    rejected = "".join(step.rejected_pieces)
    parts = [f'<span class="tt-old">{before}</span>']
    if accepted:
        parts.append(f'<span class="tt-accepted" title="accepted drafts">{esc(accepted)}</span>')
    if rejected:
        parts.append(f'<span class="tt-rejected" title="rejected drafts (discarded)">{esc(rejected)}</span>')
    if rest:
        css = "tt-bonus" if step.bonus_text is not None else "tt-accepted"
        parts.append(f'<span class="{css}" title="the target\'s own token">{esc(rest)}</span>')
    return f'<div id="teach-text" class="mono">{"".join(parts)}</div>'


def context_html(step: TeachStep) -> str:
    anchor = step.anchor_text
    before = step.text_before[: len(step.text_before) - len(anchor)] if anchor and step.text_before.endswith(anchor) else step.text_before
    if not (anchor and step.text_before.endswith(anchor)):
        anchor = ""
    return (f'<div id="teach-context" class="mono">{esc(_tail(before, CONTEXT_CHARS))}'
            f'<span class="tt-anchor" title="the anchor">{esc(anchor)}</span></div>')


def _lane(name: str, draft: int, target: int, note: str) -> str:
    boxes = '<span class="lane-d" title="draft pass"></span>' * draft + '<span class="lane-t" title="target pass"></span>' * target
    return (f'<div class="lane"><span class="lane-name">{esc(name)}</span><span class="lane-boxes">{boxes}</span>'
            f'<span class="lane-note">{esc(note)}</span></div>')


def cost_html(step: TeachStep) -> str:
    """Passes needed for this cycle's tokens: DFlash, an EAGLE-style drafter, plain decoding."""
    tokens = f"{step.tau} token{'s' if step.tau != 1 else ''}"
    if step.block_size <= 1:
        return f'<div id="teach-cost">{_lane("plain step", 0, 1, f"1 target pass → {tokens}")}</div>'
    drafts = step.block_size - 1
    return ('<div id="teach-cost">'
            + _lane("DFlash", 1, 1, f"1 draft pass + 1 target pass → {tokens}")
            + _lane("EAGLE-style", drafts, 1, f"{drafts} sequential draft passes + 1 target pass, same block")
            + _lane("plain", 0, step.tau, f"{step.tau} target pass{'es' if step.tau != 1 else ''} → {tokens}")
            + '<div class="ts-p"><span class="lane-d"></span> draft pass (small network) · '
              '<span class="lane-t"></span> target pass (the big model)</div></div>')


def step_html(step: TeachStep | None, note: str = "") -> str:
    if step is None:
        return empty_step_html(note or "Pick a reply with stored cycles to replay it.")
    position = f" · anchor at position {step.anchor_position}" if step.anchor_position is not None else ""
    timing = f"draft {step.draft_ms:.1f} ms · verify {step.verify_ms:.1f} ms"
    title = (f"Cycle {step.index} of {step.total} · block {step.block_size} · τ {step.tau} "
             f"({step.accepted} accepted{' + bonus' if step.bonus_text is not None else ''}){position}")
    return (
        f'<div class="teach-step" data-cycle="{step.index}">'
        f'<div class="teach-title" id="teach-title">{esc(title)}</div>'
        f'<div class="teach-card"><div id="teach-caption">{esc(caption(step))}</div></div>'
        + (f'<div class="teach-card teach-engine-note">ℹ {esc(step.engine_note)}</div>' if step.engine_note else '')
        + f'<div class="teach-card"><div class="teach-h">1 · context tail (the anchor outlined): what the draft is conditioned on</div>{context_html(step)}</div>'
        f'<div class="teach-card"><div class="teach-h">2 · the block as the draft sees it: one forward pass fills every MASK</div>{block_html(step)}</div>'
        f'<div class="teach-card"><div class="teach-h">3 · the draft\'s proposals and the target\'s verdicts (✓ accepted · ✗ first mismatch · greyed: discarded · ★ bonus)</div>{slots_html(step)}</div>'
        f'<div class="teach-card"><div class="teach-h">4 · the draft\'s top-3 per slot</div>{heatmap_html(step)}</div>'
        f'<div class="teach-card"><div class="teach-h">5 · the text so far (this cycle highlighted)</div>{text_html(step)}</div>'
        f'<div class="teach-card"><div class="teach-h">6 · what this cycle cost</div>{cost_html(step)}'
        f'<div id="teach-cache">{esc(step.cache_line or "no cache figures stored")} · {esc(timing)}</div></div>'
        '</div>'
    )


def explainer_html(numbers: ReplyNumbers | None) -> str:
    this = ""
    if numbers is not None and numbers.cycles:
        this = (
            f'<p id="teach-numbers"><b>This reply:</b> {numbers.tokens} tokens after the first one. Plain decoding would have '
            f'needed <b>{numbers.plain_passes}</b> target passes; DFlash used <b>{numbers.verify_passes}</b> '
            f'(mean τ {numbers.mean_tau:.2f}), plus {numbers.draft_passes} draft passes of a small network. An '
            f'EAGLE-style drafter would have needed {numbers.autoregressive_draft_passes} sequential draft passes for '
            f'the same blocks.</p>')
    return (
        '<div id="teach-explainer">'
        '<div class="ex-grid">'
        '<div class="ex-col"><b>Autoregressive (plain)</b><br>One target forward pass per token. Each pass reads all '
        'the model\'s weights to produce a single token, so speed is bound by memory bandwidth, not arithmetic.</div>'
        '<div class="ex-col"><b>EAGLE-style drafting</b><br>A small drafter guesses the next k tokens <i>one after '
        'another</i> (k sequential draft passes), then the target verifies them in one pass. Drafting cost grows '
        'with k, so blocks stay short (≈ 3 accepted).</div>'
        '<div class="ex-col"><b>DFlash (block diffusion)</b><br>The drafter fills a whole block of MASK slots in '
        '<i>one</i> forward pass, conditioned on the target\'s own hidden features (KV injection). The target '
        'verifies the block in one pass, keeps the drafts up to the first mismatch, and adds its own bonus token. '
        'Greedy output is identical to plain decoding.</div>'
        f'</div>{this}</div>'
    )


def _fmt(value, spec=".1f", unit=""):
    return "–" if value is None else f"{value:{spec}}{unit}"


def _run_row(run: Run, with_error: bool) -> str:
    error = f"<td>{esc(run.error or '')}</td>" if with_error else ""  # the column only when a run failed
    return (f"<tr><td>{esc(run.label)}</td><td>{run.new_tokens}</td><td>{_fmt(run.tokens_per_s)}</td>"
            f"<td>{run.cycles}</td><td>{_fmt(run.mean_tau, '.2f')}</td>{error}</tr>")


def compare_html(comparison: Comparison | None, note: str = "", estimate: dict | None = None) -> str:
    """The comparison's verdict, speed, texts and table; ``estimate`` (the stored reply's
    {"speedup", "tau", "steps"}) adds how the measurement relates to the reply's estimate."""
    if comparison is None:
        return f'<div class="cr-note">{esc(note or "Press Compare to re-run this reply with speculation off.")}</div>'
    c = comparison
    identical = c.identical
    word = "identical" if identical else "different"
    speedup = c.speedup
    badge = (f'<span class="cr-badge" data-identical="{str(identical).lower()}" id="compare-verdict">'
             f'{"✓ identical output" if identical else "≠ different output"}</span>')
    speed = ""
    if speedup and speedup >= 1:
        speed = f" · DFlash was <b id=\"compare-speedup\">{speedup:.2f}×</b> faster than plain decoding"
    elif speedup:
        speed = (f" · DFlash ran at <b id=\"compare-speedup\">{speedup:.2f}×</b> the speed of plain decoding "
                 "(slower here: too few drafts were accepted to pay for the draft and verify passes)")
    summary = (f'<p id="compare-summary">{badge} Plain decoding and the stored reply are <b>{word}</b>{speed}. '
               f'Plain {_fmt(c.plain.tokens_per_s)} tok/s; DFlash '
               f'{_fmt((c.dflash or c.stored).tokens_per_s)} tok/s'
               f'{" (re-run right after the plain run)" if c.dflash is not None else " (as stored)"}.</p>')
    extra = []
    story = compare_story(estimate, c)
    if story:
        extra.append(f'<p class="cr-estimate" id="compare-estimate">{esc(story)}</p>')
    if c.method:
        extra.append(f'<p class="cr-method" id="compare-method">Plain decoding measured with {esc(c.method)}.</p>')
    if c.model_note:
        extra.append(f'<p class="cr-warn">⚠ {esc(c.model_note)}</p>')
    if c.dflash_identical is False:
        extra.append('<p class="cr-warn">The DFlash re-run also differs from plain decoding.</p>')
    if not identical:
        where = c.first_difference()
        if where is not None:
            extra.append(f'<p>First difference at character {where}: stored '
                         f'<code>{esc(show_token(c.stored.text[where:where + 12]))}</code> vs plain '
                         f'<code>{esc(show_token(c.plain.text[where:where + 12]))}</code>.</p>')
        extra.append(f'<p id="compare-why">{esc(why_different(c))}</p>')
    runs = [r for r in (c.stored, c.dflash, c.plain) if r is not None]
    with_error = any(r.error for r in runs)
    table = ('<table><tr><th>run</th><th>tokens</th><th>tok/s</th><th>target passes</th><th>mean τ</th>'
             + ("<th>error</th>" if with_error else "") + "</tr>"
             + "".join(_run_row(r, with_error) for r in runs) + "</table>")
    texts = (f'<details class="cr-details"{" open" if not identical else ""}><summary>both texts, side by side</summary>'
             f'<div class="cr-texts"><div><b>stored reply (DFlash)</b><pre>{esc(c.stored.text)}</pre></div>'
             f'<div><b>plain decoding</b><pre>{esc(c.plain.text)}</pre></div></div></details>')
    return f'<div class="cr" data-identical="{str(identical).lower()}">{summary}{"".join(extra)}{table}{texts}</div>'
