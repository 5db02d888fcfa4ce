"""Named handler outputs, and refusals checked before a handler with outputs runs (``checked``).

A handler returns ``{name: value}`` for exactly what it changes, and
the layout, the one place that knows the components, turns that into what Gradio expects.

    outputs = Outputs(components, ("chat", "token_view", "stats"))
    button.click(outputs.wrap(handler), inputs, outputs.components)

Names a handler leaves out stay as they are (``gr.skip()``); a name the event does not list is
a programming error and raises at once. The wire format stays positional in ``names`` order, so
the Gradio API (``gradio_client``) sees the same outputs as before.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gradio as gr


class Outputs:
    """The outputs of one event, by name, in the order Gradio (and its API) sees them."""

    def __init__(self, components: Mapping[str, Any], names: Sequence[str]):
        missing = [name for name in names if name not in components]
        if missing:
            raise KeyError(f"no component named {missing}")
        self.names = tuple(names)
        self.components = [components[name] for name in self.names]

    def positional(self, values: Mapping[str, Any]) -> Any:
        """``{name: value}`` -> the values in ``names`` order, ``gr.skip()`` where not given."""
        unknown = sorted(set(values) - set(self.names))
        if unknown:
            raise KeyError(f"the handler returned {unknown}, which this event does not output ({self.names})")
        ordered = tuple(values[name] if name in values else gr.skip() for name in self.names)
        return ordered[0] if len(ordered) == 1 else ordered

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` returning (or yielding) ``{name: value}``, as a Gradio handler. The signature
        stays ``fn``'s (Gradio finds ``gr.EditData`` and friends by annotation)."""
        if inspect.isgeneratorfunction(fn):
            def handler(*args, **kwargs):
                for values in fn(*args, **kwargs):
                    yield self.positional(values)
        else:
            def handler(*args, **kwargs):
                return self.positional(fn(*args, **kwargs))
        functools.update_wrapper(handler, fn)
        target = fn.func if isinstance(fn, functools.partial) else fn
        handler.__name__ = getattr(target, "__name__", "handler")
        return handler


def refused(message: str) -> gr.Error:
    """A refusal (bad input, nothing to do): one toast on the page and one line on the server's
    console, ``dflash-studio: refused: …``. Gradio prints a whole traceback for an error unless
    told not to, and a refusal is not a fault of the server."""
    print(f"dflash-studio: refused: {message}", file=sys.stderr, flush=True)
    return gr.Error(message, print_exception=False)


def components_of(namespace: Any) -> dict[str, Any]:
    """The named components of a layout namespace (a ``SimpleNamespace`` or a dict)."""
    return dict(namespace) if isinstance(namespace, Mapping) else vars(namespace)


def checked(triggers: list, check, inputs, accepted: gr.State | None = None, **event):
    """Run ``check`` first, as an event without outputs; chain the real handler with ``.success``.
    A refusal is then one toast and the page stays exactly as it was: Gradio marks every output of
    an event that raises with a red Error badge (the chat, the session list, the input box...).

    With ``accepted``, the check's result goes to that State (a State shows no badge), so that the
    chained handler acts on exactly what was checked: the inputs may have changed in between.
    ``event``: more of ``gr.on``'s options (a concurrency group)."""
    if accepted is not None:
        return gr.on(triggers, check, inputs, accepted, api_visibility="undocumented", **event)

    @functools.wraps(check)  # keeps the signature: Gradio finds gr.EditData and friends by annotation
    def run_check(*values):
        check(*values)

    return gr.on(triggers, run_check, inputs, None, api_visibility="undocumented", **event)
