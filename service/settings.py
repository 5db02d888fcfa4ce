"""The settings a reply is asked for with, as one value: the page builds it from its controls and
keeps it in one ``gr.State``; the service turns it into the engine's configs. Six are the same for
every model; ``thinking`` (a reasoning model's thinking on or off, per session) has its own control
that follows the model, and None leaves it to the model's chat format (``engine.reasoning``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace

from engine.config import FallbackConfig, SamplingConfig


class InvalidSettings(ValueError):
    """A setting that is not even of the right kind (text where a number belongs)."""


@dataclass(frozen=True)
class Settings:
    block_size: int
    temperature: float
    top_p: float
    max_new_tokens: int
    fallback: bool  # dynamic fallback (engine.fallback)
    show_rejected: bool  # rejected drafts drawn in the token view: the page's, kept with the session
    thinking: bool | None = None  # the session's choice; None: the model's default (never a saved default)

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """The six controls' names, in their order (the page's component names too); ``thinking``
        is not among them: it is set apart (``with_thinking``), as its control depends on the model."""
        return tuple(f.name for f in fields(cls) if f.name != "thinking")

    @classmethod
    def from_controls(cls, block_size, temperature, top_p, max_new_tokens, fallback, show_rejected) -> "Settings":
        """The settings from what the controls (or a Gradio API caller) sent: numbers are cast,
        and a value that is not a number raises ``InvalidSettings`` naming the setting."""
        def number(value, cast, name):
            try:
                result = cast(value)
            except (TypeError, ValueError, OverflowError):
                raise InvalidSettings(f"{name} must be a number (got {value!r})") from None
            if not math.isfinite(result):  # NaN and infinity compare false with every range
                raise InvalidSettings(f"{name} must be a finite number (got {value!r})")
            return result

        return cls(block_size=number(block_size, int, "block size"),
                   temperature=number(temperature, float, "temperature"),
                   top_p=number(top_p, float, "top-p"),
                   max_new_tokens=number(max_new_tokens, int, "max new tokens"),
                   fallback=bool(fallback), show_rejected=bool(show_rejected))

    @classmethod
    def from_mapping(cls, values: Mapping) -> "Settings":
        """The settings a stored dict holds (a session's, the saved defaults); ``KeyError`` when
        one of the six is missing, ``InvalidSettings`` when one is not a number. A stored
        ``thinking`` that is not a bool (an edited export) counts as not chosen."""
        thinking = values.get("thinking")
        return cls.from_controls(*(values[key] for key in cls.keys())).with_thinking(
            thinking if isinstance(thinking, bool) else None)

    def with_thinking(self, thinking) -> "Settings":
        """The same settings with the session's thinking choice (None: the model's default)."""
        return replace(self, thinking=None if thinking is None else bool(thinking))

    def as_dict(self) -> dict:
        """As stored: ``thinking`` only when the session chose it."""
        values = asdict(self)
        if self.thinking is None:
            del values["thinking"]
        return values

    def sampling(self, max_block_size: int) -> SamplingConfig:
        """The engine's sampling config, checked (``DFlashError`` names what is out of range)."""
        config = SamplingConfig(max_new_tokens=self.max_new_tokens, block_size=self.block_size,
                                temperature=self.temperature, top_p=self.top_p)
        return config.validate(max_block_size=max_block_size)

    def fallback_config(self) -> FallbackConfig:
        return FallbackConfig(enabled=self.fallback)
