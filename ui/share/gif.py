"""The replay as an animated GIF (Pillow), for slides, chat apps and READMEs that run no HTML.

``replay_gif(doc)`` draws one frame per cycle of a ``replay_document``: the block's slots with
the target's verdicts, the reply so far with each token's origin, τ per cycle and the speed so
far, and the caption (rejected drafts struck through in the cycle shown); the last frame holds. Origins show by shape as well as colour (accepted
underlined, the target's own tokens boxed, rejected struck through). At most ``MAX_WIDTH``
pixels wide; a reply whose GIF would pass ``MAX_BYTES`` keeps every n-th cycle (the text is
cumulative, so no token is lost, only in-between frames).
"""

from __future__ import annotations

import io
from dataclasses import dataclass

from PIL import Image, ImageDraw, ImageFont

from ..teach.render import VERDICT_MARK
from ..teach.steps import show_token

MAX_WIDTH = 1280
MAX_BYTES = 8 * 1024 * 1024
WIDTH, HEIGHT = 960, 600
MARGIN = 16
CAPTION_LINES = 4  # a cycle's caption: a rejection, the bonus and the reply's end fit; longer ones end in "…"
CYCLE_MS, FIRST_MS, HOLD_MS = 900, 1500, 5000
FONT_FILES = ("DejaVuSansMono.ttf", "LiberationMono-Regular.ttf", "Menlo.ttc", "consola.ttf", "cour.ttf")
SANS_FILES = ("DejaVuSans.ttf", "LiberationSans-Regular.ttf", "Arial.ttf", "arial.ttf", "Helvetica.ttc")

# Okabe-Ito colours (colour-blind safe), on a light page.
BG, FG, MUTED, CARD, LINE = (255, 255, 255), (29, 29, 34), (93, 93, 106), (245, 245, 248), (213, 213, 221)
ACC, ACC_BG = (0, 121, 90), (214, 240, 231)
BON, BON_BG = (0, 97, 160), (218, 233, 245)
REJ, REJ_BG = (179, 71, 0), (250, 229, 214)
NOW = (230, 159, 0)


@dataclass(frozen=True)
class Fonts:
    mono: ImageFont.FreeTypeFont | ImageFont.ImageFont
    small: ImageFont.FreeTypeFont | ImageFont.ImageFont
    text: ImageFont.FreeTypeFont | ImageFont.ImageFont
    title: ImageFont.FreeTypeFont | ImageFont.ImageFont
    small_sans: ImageFont.FreeTypeFont | ImageFont.ImageFont


def _font(files: tuple[str, ...], size: int):
    for name in files:
        try:
            return ImageFont.truetype(name, size)
        except OSError:
            continue
    return ImageFont.load_default(size)  # Pillow's own font: legible, not monospaced


def load_fonts() -> Fonts:
    return Fonts(_font(FONT_FILES, 15), _font(FONT_FILES, 12), _font(SANS_FILES, 15), _font(SANS_FILES, 20),
                 _font(SANS_FILES, 13))


def _fit(draw: ImageDraw.ImageDraw, text: str, font, width: float) -> str:
    if draw.textlength(text, font=font) <= width:
        return text
    while text and draw.textlength(text + "…", font=font) > width:
        text = text[:-1]
    return text + "…"


def _wrap(draw: ImageDraw.ImageDraw, text: str, font, width: float, lines: int) -> list[str]:
    out, line = [], ""
    for word in text.split():
        trial = f"{line} {word}".strip()
        if draw.textlength(trial, font=font) <= width:
            line = trial
            continue
        if line:
            out.append(line)
        line = word
    if line:
        out.append(line)
    if len(out) > lines:
        out = out[:lines]
        out[-1] = _fit(draw, out[-1] + " …", font, width)
    return out


# ============================================================================ parts of a frame


def _slots(draw, fonts: Fonts, frame: dict, top: int) -> int:
    """The block: the anchor, the draft's proposals with their verdicts, the bonus. Returns the bottom."""
    x = MARGIN
    draw.text((x, top), "the draft's proposals and the target's verdicts", font=fonts.small, fill=MUTED)
    top += 18
    if frame["i"] == 0:
        draw.text((x, top + 10), "prefill: the target reads the prompt and writes the first token", font=fonts.text,
                  fill=MUTED)
        return top + 52
    cells = [("anchor", frame["anchor"], "anchor")]
    cells += [(f"slot {k + 1}", s[0], s[1]) for k, s in enumerate(frame["slots"])]
    if frame["bonus"] is not None:
        cells.append((f"bonus @{frame['a'] + 1}", frame["bonus"], "bonus"))
    width = min(110.0, (WIDTH - 2 * MARGIN) / max(len(cells), 1) - 6)
    for label, text, verdict in cells:
        box = (x, top, x + width, top + 48)
        fill, edge = {"accepted": (ACC_BG, ACC), "rejected": (REJ_BG, REJ), "bonus": (BON_BG, BON),
                      "anchor": (BG, BON)}.get(verdict, (CARD, MUTED))
        draw.rounded_rectangle(box, 6, fill=fill, outline=edge, width=2)
        if verdict == "bonus":
            draw.rounded_rectangle((x + 3, top + 3, x + width - 3, top + 45), 4, outline=edge, width=1)
        if verdict == "rejected":  # dashed edge: a gap every few pixels along the top and bottom
            for dx in range(6, int(width) - 4, 10):
                draw.line((x + dx, top, x + dx + 4, top), fill=fill, width=2)
                draw.line((x + dx, top + 48, x + dx + 4, top + 48), fill=fill, width=2)
        draw.text((x + 5, top + 2), _fit(draw, label, fonts.small, width - 10), font=fonts.small, fill=MUTED)
        token = _fit(draw, show_token(text), fonts.mono, width - 26)
        colour = MUTED if verdict == "unverified" else FG
        draw.text((x + 5, top + 20), token, font=fonts.mono, fill=colour)
        length = draw.textlength(token, font=fonts.mono)
        if verdict == "rejected":
            draw.line((x + 5, top + 30, x + 5 + length, top + 30), fill=REJ, width=2)
        if verdict == "accepted":
            draw.line((x + 5, top + 39, x + 5 + length, top + 39), fill=ACC, width=2)
        draw.text((x + width - 17, top + 20), VERDICT_MARK[verdict], font=fonts.mono, fill=edge)
        x += width + 6
    return top + 56


def _layout(draw, fonts: Fonts, tokens: list[tuple[str, str, bool]], width: float):
    """Each character's place: (line, x, token index); tokens wrap at ``width`` and at newlines."""
    places, line, x = [], 0, 0.0
    for index, (text, _, _) in enumerate(tokens):
        for ch in text:
            if ch == "\n":
                places.append((line, x, index, "⏎"))
                line, x = line + 1, 0.0
                continue
            glyph = "→" if ch == "\t" else ch
            w = draw.textlength(glyph, font=fonts.mono)
            if x + w > width:
                line, x = line + 1, 0.0
            places.append((line, x, index, glyph))
            x += w
    return places, line + 1


def _reply_text(draw, fonts: Fonts, tokens: list[tuple[str, str, bool]], box: tuple[int, int, int, int]) -> None:
    """The reply so far, its last lines when it does not fit; each token marked by its origin."""
    left, top, right, bottom = box
    draw.rounded_rectangle(box, 6, fill=BG, outline=LINE)
    places, lines = _layout(draw, fonts, tokens, right - left - 16)
    height = 21
    shown = max(1, (bottom - top - 10) // height)
    first = max(0, lines - shown)
    for line, x, index, glyph in places:
        if line < first:
            continue
        text, origin, now = tokens[index]
        px, py = left + 8 + x, top + 6 + (line - first) * height
        w = draw.textlength(glyph, font=fonts.mono)
        if origin == "accepted":
            draw.rectangle((px, py, px + w, py + height - 3), fill=ACC_BG)
            draw.line((px, py + height - 4, px + w, py + height - 4), fill=ACC, width=2)
        elif origin == "bonus":
            draw.rectangle((px, py, px + w, py + height - 3), fill=BON_BG)
            draw.line((px, py, px + w, py), fill=BON, width=1)
            draw.line((px, py + height - 3, px + w, py + height - 3), fill=BON, width=1)
        else:
            draw.rectangle((px, py, px + w, py + height - 3), fill=REJ_BG)
        if now:
            draw.line((px, py + height - 1, px + w, py + height - 1), fill=NOW, width=2)
        colour = REJ if origin == "rejected" else (MUTED if glyph in "⏎→" else FG)
        draw.text((px, py + 1), glyph, font=fonts.mono, fill=colour)
        if origin == "rejected":
            draw.line((px, py + 10, px + w, py + 10), fill=REJ, width=2)


def _chart(draw, fonts: Fonts, frames: list[dict], shown: int, box: tuple[int, int, int, int], top_value: int) -> None:
    left, top, right, bottom = box
    draw.rectangle(box, fill=BG, outline=LINE)
    cycles = frames[1:]
    if not cycles:
        return
    step = (right - left - 4) / len(cycles)
    scale = (bottom - top - 6) / max(top_value, 1)
    limit = bottom - 2 - top_value * scale
    for x in range(left + 2, right - 2, 8):
        draw.line((x, limit, x + 4, limit), fill=MUTED)
    for f in cycles:
        x = left + 2 + (f["i"] - 1) * step
        colour = NOW if f["i"] == shown else (ACC if f["i"] < shown else LINE)
        draw.rectangle((x, bottom - 2 - f["tau"] * scale, x + max(step * 0.8, 1), bottom - 2), fill=colour)


def _frame_tokens(frames: list[dict], shown: int) -> list[tuple[str, str, bool]]:
    """The reply so far; rejected drafts only for the cycle shown (a GIF cannot hide them on demand,
    and earlier ones would bury the text the target kept)."""
    return [(t[0], t[1], k == shown and k > 0) for k in range(shown + 1) for t in frames[k]["tok"]
            if t[1] != "rejected" or k == shown]


def _count(n: int, word: str, plural: str | None = None) -> str:
    return f"{n} {word if n == 1 else plural or word + 's'}"


def frame_figures(frame: dict, shown: int) -> str:
    """The frame's count in words, as the page's speed line says it: the prefill writes the first
    token on its own; each cycle after it is one target pass, where plain decoding needs one per token."""
    if shown == 0:
        return f"{_count(frame['n'], 'token')} so far, from the prefill pass (plain decoding starts the same way)"
    speed = "" if frame["speed"] is None else f" · {frame['speed']:.2f}× its speed so far"
    return (f"{_count(frame['n'], 'token')} in {_count(shown, 'DFlash cycle')} (a target pass each) after the "
            f"prefill; plain decoding: {_count(frame['n'] - 1, 'pass', 'passes')}{speed}")


def draw_frame(doc: dict, shown: int, fonts: Fonts) -> Image.Image:
    frames = doc["frames"]
    frame = frames[shown]
    image = Image.new("RGB", (WIDTH, HEIGHT), BG)
    draw = ImageDraw.Draw(image)
    last = len(frames) - 1
    title = _fit(draw, doc["title"] or "A reply", fonts.title, WIDTH - 2 * MARGIN - 260)
    draw.text((MARGIN, 10), title, font=fonts.title, fill=FG)
    where = "prefill" if shown == 0 else f"cycle {shown} of {last} · τ {frame['tau']} of block {frame['b']}"
    draw.text((WIDTH - MARGIN, 14), where, font=fonts.text, fill=FG, anchor="ra")
    model = f"{doc['model'] or 'model'} · DFlash: one draft pass proposes a block, one target pass checks it"
    draw.text((MARGIN, 38), _fit(draw, model, fonts.small, WIDTH - 2 * MARGIN), font=fonts.small, fill=MUTED)
    bottom = _slots(draw, fonts, frame, 60)
    caption = _wrap(draw, frame["cap"], fonts.text, WIDTH - 2 * MARGIN, CAPTION_LINES)
    for k, line in enumerate(caption):
        draw.text((MARGIN, bottom + k * 20), line, font=fonts.text, fill=FG)
    text_top = bottom + CAPTION_LINES * 20 + 8
    _reply_text(draw, fonts, _frame_tokens(frames, shown), (MARGIN, text_top, WIDTH - MARGIN, HEIGHT - 92))
    _chart(draw, fonts, frames, shown, (MARGIN, HEIGHT - 84, WIDTH // 2, HEIGHT - 30), doc["max_block"])
    figures = frame_figures(frame, shown)
    legend = "underlined: accepted draft · boxed: the target's own token · struck through: rejected draft"
    right = WIDTH // 2 + 12
    lines = _wrap(draw, figures, fonts.small_sans, WIDTH - right - MARGIN, 2)
    lines += _wrap(draw, legend, fonts.small_sans, WIDTH - right - MARGIN, 2)
    for k, line in enumerate(lines):
        draw.text((right, HEIGHT - 84 + k * 16), line, font=fonts.small_sans, fill=FG if k < 2 else MUTED)
    draw.text((MARGIN, HEIGHT - 24), "τ per cycle (bar height) · dashed: the block size", font=fonts.small, fill=MUTED)
    draw.text((WIDTH - MARGIN, HEIGHT - 24), "DFlash Studio replay", font=fonts.small, fill=MUTED, anchor="ra")
    return image


# ============================================================================ the GIF


def _palette() -> Image.Image:
    """One fixed palette for every frame: the page's colours and blends between them (anti-aliased text)."""
    colours = [BG, FG, MUTED, CARD, LINE, ACC, ACC_BG, BON, BON_BG, REJ, REJ_BG, NOW]
    blends = []
    for back in (BG, ACC_BG, BON_BG, REJ_BG, CARD):
        for ink in (FG, MUTED, ACC, BON, REJ, NOW):
            for t in (0.25, 0.5, 0.75):
                blends.append(tuple(round(b + (i - b) * t) for b, i in zip(back, ink)))
    entries = list(dict.fromkeys(colours + blends))[:256]
    flat = [v for colour in entries for v in colour]
    image = Image.new("P", (1, 1))
    image.putpalette(flat + [0] * (768 - len(flat)))
    return image


def render_gif(doc: dict, every: int = 1) -> bytes:
    fonts, palette = load_fonts(), _palette()
    last = len(doc["frames"]) - 1
    chosen = sorted(set(range(0, last + 1, every)) | {last})
    images, durations = [], []
    for k in chosen:
        images.append(draw_frame(doc, k, fonts).quantize(palette=palette, dither=Image.Dither.NONE))
        durations.append(FIRST_MS if k == 0 else (HOLD_MS if k == last else CYCLE_MS))
    buffer = io.BytesIO()
    images[0].save(buffer, format="GIF", save_all=True, append_images=images[1:], duration=durations, loop=0,
                   optimize=True, disposal=1)
    return buffer.getvalue()


def replay_gif(doc: dict, max_bytes: int = MAX_BYTES) -> bytes:
    """The GIF of a ``replay_document``; fewer frames (every n-th cycle) when it would pass ``max_bytes``."""
    every = 1
    while True:
        data = render_gif(doc, every)
        if len(data) <= max_bytes or every >= len(doc["frames"]):
            return data
        every *= 2
