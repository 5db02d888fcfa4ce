"""The replay page: one HTML file that plays a stored reply's decoding cycle by cycle, with
everything inline (style, script, data) so that it opens from ``file://`` with no network.

``replay_html(share)`` returns the page, rendered from the Jinja template
``templates/replay.html`` with the style and script of ``templates/replay.css`` and
``templates/replay.js`` put inline. Safety: every piece of text the page shows reaches it either
escaped by Jinja's autoescape (what the template writes) or through ``textContent`` (what the
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
from dataclasses import dataclass
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup

from .replay import ShareReply, replay_document

TEMPLATES = Path(__file__).resolve().parent / "templates"
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


def _no_nul(value):
    """A NUL (which an HTML parser drops from text) shows as U+FFFD, as everywhere in the app."""
    return value.replace("\x00", "\ufffd") if isinstance(value, str) and not isinstance(value, Markup) else value


def _environment() -> Environment:
    """Made per page (a page is rendered now and then, on a click or a command): no state kept between pages."""
    return Environment(loader=FileSystemLoader(TEMPLATES), autoescape=True, undefined=StrictUndefined,
                       finalize=_no_nul, keep_trailing_newline=True)


def page_assets() -> tuple[str, str]:
    """The page's style and script, as the files hold them (their hashes go into the policy)."""
    return ((TEMPLATES / "replay.css").read_text(encoding="utf-8"),
            (TEMPLATES / "replay.js").read_text(encoding="utf-8"))


@dataclass(frozen=True)
class ChartBar:
    i: int
    tau: int
    b: int
    x: str
    y: str
    width: str
    height: str


def tau_chart(frames: list[dict], max_block: int) -> dict:
    """τ per cycle as bars in a ``CHART_WIDTH`` × ``CHART_HEIGHT`` box, and the block size's line."""
    cycles = [f for f in frames if f["i"] > 0]
    top = max(max_block, *(f["tau"] for f in cycles), 1) if cycles else 1
    step = CHART_WIDTH / max(len(cycles), 1)
    width = max(step * 0.8, 0.6)
    scale = (CHART_HEIGHT - 14) / top
    bars = [ChartBar(f["i"], f["tau"], f["b"], f"{(f['i'] - 1) * step:.2f}", f"{CHART_HEIGHT - f['tau'] * scale:.2f}",
                     f"{width:.2f}", f"{f['tau'] * scale:.2f}") for f in cycles]
    return {"bars": bars, "width": CHART_WIDTH, "height": CHART_HEIGHT,
            "block_y": f"{CHART_HEIGHT - max_block * scale:.2f}"}


def lane_finish(race: dict | None) -> dict[str, float]:
    """When each lane's run produced its last token (ms since its request started)."""
    if race is None:
        return {}
    return {name: (race[name]["steps"][-1][0] if race[name]["steps"] else 0.0) for name in ("plain", "dflash")}


def page_from_document(doc: dict) -> str:
    style, script = page_assets()
    finish = lane_finish(doc["race"])
    return _environment().get_template("replay.html").render(
        doc=doc, cycles=len(doc["frames"]) - 1, chart=tau_chart(doc["frames"], doc["max_block"]),
        lane_finish=finish, race_end_ms=repr(max(finish.values())) if finish else "0",  # exact: the race ends on its last step
        policy=content_security_policy(script, style), style=Markup(style), script=Markup(script),
        data=Markup(script_json(doc)))  # safe inside <script>: script_json leaves no <, > or &


def replay_html(share: ShareReply) -> str:
    """The whole page for one reply (under ``PAGE_BUDGET`` bytes for a reply of a few hundred tokens)."""
    page = page_from_document(replay_document(share))
    if len(page.encode("utf-8")) > PAGE_BUDGET:
        page = page_from_document(replay_document(share, keep_top=False))
    return page
