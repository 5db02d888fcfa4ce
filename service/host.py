"""What the reply service needs from the engine host (``app.wiring.EngineHost`` is the one)."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, Callable, Protocol

from engine.events import LoadStatus


class EngineHost(Protocol):
    """Owns the engine and the ONE worker thread every engine call runs on."""

    def status(self) -> LoadStatus: ...

    @property
    def engine(self) -> Any | None: ...

    @property
    def current_key(self) -> str: ...

    def choices(self) -> list[tuple[str, str]]: ...  # (label, key) for the model picker

    def resolve(self, name: str | None) -> str | None: ...  # the key a (stored, older) model name means

    def submit(self, fn: Callable[[Any], Any], model: str | None = None) -> Future: ...  # fn(engine) on the worker,
    # after pending loads; with ``model``, on that model (loaded first when another one is loaded)

    def switch(self, key: str) -> Future: ...  # load another model; the old one stays on failure
