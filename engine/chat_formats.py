"""Each model family's chat format, read from its own published chat template: how a reply
marks its reasoning (``<think>…</think>``, harmony's channels, or not at all), whether thinking
can be switched and what it defaults to, and the tokens that end a reply.

The template is the authority: a family is recognised by the markers its template writes, not
by the model's name, so a fine-tune that keeps its base model's template keeps its format. No
torch here; the tokenizer is only asked for its template text and for the ids of marker tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .errors import InvalidRequestError

ReasoningSyntax = Literal["think", "harmony", "none"]
EFFORTS = ("low", "medium", "high")  # harmony's reasoning levels, written as "Reasoning: <level>"
HARMONY_DEFAULT_EFFORT = "medium"  # what the published gpt-oss template writes when none is given

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
HARMONY_MARKERS = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>")

# family -> (what the template writes to recognise it, the tokens that end a reply in that format)
END_TOKENS = {
    "harmony": ("<|return|>", "<|call|>"),  # <|end|> only ends one message: the final channel follows
    "chatml": ("<|im_end|>", "<|endoftext|>"),
    "llama3": ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"),
    "gemma": ("<end_of_turn>", "<eos>"),
}
FAMILY_LABELS = {
    "harmony": "harmony (gpt-oss)",
    "chatml": "ChatML (Qwen, MiMo)",
    "llama3": "Llama 3",
    "gemma": "Gemma",
    "plain": "its own",
    "none": "none (raw text)",
}


@dataclass(frozen=True)
class ChatFormat:
    """What a model's template says about chatting with it."""

    family: str  # a key of FAMILY_LABELS
    reasoning: ReasoningSyntax
    thinking_default: bool  # what the template does when the caller says nothing
    thinking_switch: bool  # the template takes ``enable_thinking`` (Qwen3, Qwen3.5/3.6, MiMo)
    efforts: tuple[str, ...] = ()  # harmony: the reasoning levels the system message can state
    end_tokens: tuple[str, ...] = ()  # the ones this tokenizer has

    @property
    def label(self) -> str:
        return FAMILY_LABELS.get(self.family, self.family)

    @property
    def reasons(self) -> bool:
        return self.reasoning != "none"

    def thinking_note(self) -> str:
        """One line for the page's thinking control: the default, or why there is no control."""
        if self.reasoning == "harmony":
            return ("gpt-oss always reasons (its analysis channel); the effort is set with reasoning_effort "
                    f"(low, medium, high; default {HARMONY_DEFAULT_EFFORT})")
        if self.reasoning == "think" and self.thinking_switch:
            return f"{self.label}: thinking is {'on' if self.thinking_default else 'off'} by default"
        if self.reasoning == "think":
            return f"{self.label}: this template always opens a <think> block"
        return f"this model has no thinking mode (chat format: {self.label})"


@dataclass(frozen=True)
class ChatOptions:
    """What one request asks of the chat template: thinking on/off (None: the family's default)
    and, for harmony, the reasoning effort (None: the template's default)."""

    thinking: bool | None = None
    reasoning_effort: str | None = None

    def template_kwargs(self, fmt: ChatFormat) -> dict:
        """The keyword arguments the template is rendered with; refuses what the format lacks."""
        kwargs: dict = {}
        if self.reasoning_effort is not None:
            if not fmt.efforts:
                raise InvalidRequestError(
                    f"reasoning_effort is not a setting of this model (chat format: {fmt.label}); "
                    "only harmony models (gpt-oss) take one")
            if self.reasoning_effort not in fmt.efforts:
                raise InvalidRequestError(f"reasoning_effort must be one of {', '.join(fmt.efforts)}, "
                                          f"got {self.reasoning_effort!r}")
            kwargs["reasoning_effort"] = self.reasoning_effort
        if fmt.thinking_switch:
            kwargs["enable_thinking"] = fmt.thinking_default if self.thinking is None else bool(self.thinking)
        elif fmt.reasoning == "none" and fmt.family != "none":
            # templates without a switch ignore it; passing False keeps any template that reads it
            # without saying so in its text (a custom fine-tune's) answering directly, as before
            kwargs["enable_thinking"] = False
        return kwargs

    def thinking_on(self, fmt: ChatFormat) -> bool:
        """Whether this request's reply reasons, as the template will render it."""
        if fmt.reasoning == "harmony" or (fmt.reasoning == "think" and not fmt.thinking_switch):
            return True
        if fmt.reasoning == "think":
            return fmt.thinking_default if self.thinking is None else bool(self.thinking)
        return False


def _family(template: str) -> str:
    if "<|channel|>" in template and "<|start|>" in template:
        return "harmony"
    if "<|im_start|>" in template:
        return "chatml"
    if "<|start_header_id|>" in template:
        return "llama3"
    if "<start_of_turn>" in template:
        return "gemma"
    return "plain"


def _known_tokens(tokenizer, names: tuple[str, ...]) -> tuple[str, ...]:
    """Those of ``names`` that are single tokens of this tokenizer."""
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    return tuple(name for name in names if name in vocab)


def chat_format(tokenizer) -> ChatFormat:
    """The chat format the tokenizer's template defines (``none`` without a template)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):  # several named templates: the default one speaks for the model
        template = template.get("default") or next(iter(template.values()), "")
    if not template:
        return ChatFormat("none", "none", False, False)
    family = _family(template)
    ends = _known_tokens(tokenizer, END_TOKENS.get(family, ()))
    if family == "harmony":
        return ChatFormat(family, "harmony", True, False, EFFORTS, ends)
    if THINK_OPEN in template and THINK_CLOSE in template and _known_tokens(tokenizer, (THINK_OPEN, THINK_CLOSE)) == (
            THINK_OPEN, THINK_CLOSE):
        switch = "enable_thinking" in template
        # Qwen3's and Qwen3.5's templates write the empty think block only when enable_thinking is
        # false: undefined means thinking
        return ChatFormat(family, "think", True, switch, (), ends)
    return ChatFormat(family, "none", False, False, (), ends)


def end_token_ids(tokenizer) -> list[int]:
    """Ids of the tokens that end a reply in this tokenizer's chat format (stop tokens)."""
    fmt = chat_format(tokenizer)
    return [int(tokenizer.convert_tokens_to_ids(name)) for name in fmt.end_tokens]
