"""Stop strings (OpenAI's ``stop``) applied to a generation's event stream.

The engine stops on stop TOKENS; a client may also name stop STRINGS ("\\nclass ", "```"). They
are matched on the decoded text, which only a consumer sees whole, so this wraps the engine's
event iterator: when the text first contains a stop string, the cycle that completed it is cut
just before the match, the cancel flag is set (the engine ends at its next cycle boundary,
which is immediately: the consumer pulls events on the engine's own thread), and the closing
``Finished`` says ``reason="stop"`` with the cut text. Pure Python; no torch.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace

from .events import Cycle, Event, Finished, Started


def find_stop(text: str, stops: Sequence[str]) -> int | None:
    """Index in ``text`` where the earliest stop string starts, or None."""
    hits = [i for i in (text.find(stop) for stop in stops if stop) if i >= 0]
    return min(hits) if hits else None


def unsafe_tail(text: str, stops: Sequence[str]) -> int:
    """Length of the longest end of ``text`` that could still grow into a stop string: a
    streaming consumer holds those characters back until the next piece decides."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if stop.startswith(text[len(text) - size:]):
                longest = size
                break
    return longest


def _cut_pieces(pieces: Sequence[str], keep_chars: int) -> tuple[str, ...]:
    """The leading pieces holding the first ``keep_chars`` characters (the last one shortened)."""
    kept, used = [], 0
    for piece in pieces:
        if used >= keep_chars:
            break
        kept.append(piece[: keep_chars - used])
        used += len(kept[-1])
    return tuple(kept)


def _cut_cycle(cycle: Cycle, keep_chars: int) -> Cycle:
    pieces = _cut_pieces(cycle.emitted_pieces, keep_chars)
    cut = len(pieces) < len(cycle.emitted)  # then the bonus (the last emitted token) is gone
    return replace(cycle, emitted=cycle.emitted[: len(pieces)], emitted_pieces=pieces,
                   bonus=None if cut else cycle.bonus)


def with_stops(events: Iterable[Event], stops: Sequence[str], cancel: threading.Event) -> Iterator[Event]:
    """``events`` with generation ended at the first stop string (which is not part of the text).

    A stop string can begin in text an earlier event already carried (a cycle ending in "\n",
    the next starting "class "): the final ``Finished.text`` is then shorter than the events'
    pieces. A streaming consumer that holds back ``unsafe_tail`` characters never shows them."""
    stops = [stop for stop in stops if stop]
    text, kept_tokens, taus, cut_at = "", 0, [], None
    for event in events:
        if cut_at is not None and not isinstance(event, Finished):
            continue  # a cycle the engine finished before it saw the flag: past the stop, dropped
        if isinstance(event, Started):
            cut_at = find_stop(event.first_text, stops)
            if cut_at is not None:
                event = replace(event, first_text=event.first_text[:cut_at])
            text, kept_tokens = event.first_text, 1
        elif isinstance(event, Cycle):
            cut_at = find_stop(text + event.emitted_text, stops)
            if cut_at is not None:
                event = _cut_cycle(event, max(cut_at - len(text), 0))
                if not event.emitted:  # the stop began before this cycle's text: nothing of it is kept
                    cancel.set()
                    continue
            text += event.emitted_text
            kept_tokens += len(event.emitted)
            taus.append(event.tau)
        elif isinstance(event, Finished) and cut_at is not None:
            event = replace(event, reason="stop", text=text[:cut_at], token_ids=event.token_ids[:kept_tokens],
                            acceptance_lengths=tuple(taus), cycles=len(taus))
        if cut_at is not None:
            cancel.set()
        yield event
