"""Reasoning apart from the answer, token by token, as a reply streams.

Reasoning models mark their reasoning with tokens: Qwen3, Qwen3.5/3.6 and MiMo write
``<think>…</think>`` before the answer; gpt-oss writes harmony messages,
``<|channel|>analysis<|message|>…<|end|>`` then ``<|start|>assistant<|channel|>final<|message|>…<|return|>``.
``ReasoningParser`` reads those markers from the token ids (never from text: harmony's markers
are special tokens that decoding drops, while its channel names decode as plain words), so it
works offline from the tokenizer alone. Every token gets a ``part`` ("reasoning" or "answer")
and is either text or scaffold (the markers and harmony headers, shown to nobody).

``with_reasoning`` wraps a generation's event stream, like ``engine.stops.with_stops``: each
``Cycle`` gains the part of every emitted and rejected token (rejected drafts are read as if
they had been accepted, from a copy of the parser) and scaffold pieces become "", and
``Finished.text`` keeps only the answer while ``Finished.reasoning`` holds the reasoning.
The parser starts in the state the prompt leaves it in: a template that opens ``<think>`` in
the generation prompt (Qwen3.5) has the reply start inside the reasoning.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from .chat_formats import HARMONY_MARKERS, THINK_CLOSE, THINK_OPEN, ChatFormat, ChatOptions
from .events import Cycle, Event, Finished, Part, Started

REASONING: Part = "reasoning"
ANSWER: Part = "answer"
CHANNEL = re.compile(r"<\|channel\|>\s*([A-Za-z_]+)")


class ThinkParser:
    """``<think>…</think>``: inside is reasoning, outside is the answer."""

    def __init__(self, open_id: int, close_id: int):
        self.open_id, self.close_id = open_id, close_id
        self.inside = False
        self.after_marker = False  # the newline(s) a template writes right after a marker are scaffold too

    def feed(self, token: int, text: str) -> tuple[Part, bool]:
        """(part, is scaffold) of the next token, ``text`` being what it decodes to."""
        if token in (self.open_id, self.close_id):
            self.inside, self.after_marker = token == self.open_id, True
            return REASONING, True
        part = REASONING if self.inside else ANSWER
        if self.after_marker and text and not text.strip("\n"):
            return part, True
        self.after_marker = self.after_marker and not text  # a text-less token does not end the run
        return part, False


class HarmonyParser:
    """Harmony messages: a header (role, ``<|channel|>`` name, …) up to ``<|message|>``, then the
    message up to ``<|end|>``, ``<|return|>`` or ``<|call|>``. Only the ``final`` channel is the
    answer; ``analysis`` (and ``commentary``, the tool preambles) is reasoning."""

    def __init__(self, marker_ids: dict[str, int], decode):
        self.ids = marker_ids
        self.decode = decode
        self.in_header = True  # the generation prompt ends with "<|start|>assistant"
        self.header: list[int] = []
        self.part: Part = REASONING

    def _header_part(self) -> Part:
        match = CHANNEL.search(self.decode(self.header))
        return ANSWER if match and match.group(1) == "final" else REASONING

    def feed(self, token: int, text: str) -> tuple[Part, bool]:
        ids = self.ids
        if token == ids.get("<|start|>"):
            self.in_header, self.header, self.part = True, [], REASONING
            return self.part, True
        if token == ids.get("<|message|>"):
            self.in_header = False
            self.part = self._header_part()
            return self.part, True
        if token in (ids.get("<|end|>"), ids.get("<|return|>"), ids.get("<|call|>")):
            self.in_header = False
            return self.part, True
        if self.in_header:
            self.header.append(token)
            self.part = self._header_part()
            return self.part, True
        return self.part, token in ids.values()


class ReasoningParser:
    """One of the parsers above, for one reply of a model with ``fmt``'s reasoning syntax."""

    def __init__(self, inner):
        self.inner = inner

    @classmethod
    def for_format(cls, fmt: ChatFormat, tokenizer) -> "ReasoningParser | None":
        if fmt.reasoning == "think":
            open_id, close_id = (int(tokenizer.convert_tokens_to_ids(t)) for t in (THINK_OPEN, THINK_CLOSE))
            return cls(ThinkParser(open_id, close_id))
        if fmt.reasoning == "harmony":
            vocab = tokenizer.get_vocab()
            ids = {name: int(vocab[name]) for name in HARMONY_MARKERS if name in vocab}
            return cls(HarmonyParser(ids, lambda t: tokenizer.decode(t, skip_special_tokens=False)))
        return None

    def after_prompt(self, prompt_ids: Sequence[int]) -> "ReasoningParser":
        """The parser in the state the prompt's end leaves it in (a think block opened there)."""
        inner = self.inner
        if isinstance(inner, ThinkParser):
            opened = max((i for i, t in enumerate(prompt_ids) if t == inner.open_id), default=-1)
            closed = max((i for i, t in enumerate(prompt_ids) if t == inner.close_id), default=-1)
            inner.inside = opened > closed
            # a prompt ending in "<think>" leaves the marker's newline to the reply (scaffold);
            # one ending in "<think>\n" (Qwen3.5) has written it already
            inner.after_marker = inner.inside and opened == len(prompt_ids) - 1
        elif isinstance(inner, HarmonyParser):
            start = inner.ids.get("<|start|>")
            last = max((i for i, t in enumerate(prompt_ids) if t == start), default=None)
            if last is not None:
                inner.in_header, inner.header = True, []
                for token in prompt_ids[last + 1:]:
                    inner.feed(token, "")
        return self

    def feed(self, token: int, text: str) -> tuple[Part, bool]:
        return self.inner.feed(int(token), text)

    def copy(self) -> "ReasoningParser":
        return ReasoningParser(copy.deepcopy(self.inner))


def _read(parser: ReasoningParser, tokens: Sequence[int], pieces: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(parts, pieces with the scaffold emptied) of ``tokens``, advancing ``parser``."""
    parts, shown = [], []
    for token, piece in zip(tokens, pieces):
        part, scaffold = parser.feed(token, piece)
        parts.append(part)
        shown.append("" if scaffold else piece)
    return tuple(parts), tuple(shown)


def with_reasoning(events: Iterable[Event], parser: ReasoningParser | None) -> Iterator[Event]:
    """``events`` with every token's part (see the module's doc); unchanged without a parser."""
    if parser is None:
        yield from events
        return
    texts: dict[str, list[str]] = {REASONING: [], ANSWER: []}
    reasoning_tokens = 0
    for event in events:
        if isinstance(event, Started):
            (part,), (text,) = _read(parser, [event.first_token], [event.first_text])
            texts[part].append(text)
            reasoning_tokens += part == REASONING
            event = replace(event, first_text=text, first_part=part)
        elif isinstance(event, Cycle):
            rejected_parts, rejected_pieces = _read(parser.copy(), event.rejected, event.rejected_pieces)
            parts, pieces = _read(parser, event.emitted, event.emitted_pieces)
            for part, piece in zip(parts, pieces):
                texts[part].append(piece)
            reasoning_tokens += parts.count(REASONING)
            event = replace(event, emitted_pieces=pieces, emitted_parts=parts,
                            rejected_pieces=rejected_pieces, rejected_parts=rejected_parts)
        elif isinstance(event, Finished):
            event = replace(event, text="".join(texts[ANSWER]), reasoning="".join(texts[REASONING]),
                            reasoning_tokens=reasoning_tokens)
        yield event


def chat_options(settings: dict) -> ChatOptions:
    """A reply's thinking and reasoning effort, from the settings it is stored with."""
    thinking = settings.get("thinking")
    return ChatOptions(None if thinking is None else bool(thinking), settings.get("reasoning_effort"))


def encode_chat(engine, prompt, raw: bool, options: ChatOptions) -> list[int]:
    """``engine.encode`` with the request's chat options. An engine without a chat format (a
    scripted one) answers as before; asking it for a reasoning effort is refused all the same."""
    fmt = getattr(engine, "chat_format", None)
    if fmt is None:
        if options.reasoning_effort is not None:
            options.template_kwargs(ChatFormat("none", "none", False, False))  # raises, in the one wording
        return engine.encode(prompt, raw=raw)
    if raw:
        return engine.encode(prompt, raw=True)
    return engine.encode(prompt, raw=False, chat=options)


def reasoning_events(engine, prompt_ids: Sequence[int], raw: bool, events: Iterable[Event]) -> Iterable[Event]:
    """``events`` with each token's part, for a chat reply of an engine whose format reasons."""
    fmt = getattr(engine, "chat_format", None)
    tokenizer = getattr(engine, "tokenizer", None)
    if raw or fmt is None or tokenizer is None or not fmt.reasons:
        return events
    parser = ReasoningParser.for_format(fmt, tokenizer)
    return with_reasoning(events, parser.after_prompt(prompt_ids) if parser is not None else None)
