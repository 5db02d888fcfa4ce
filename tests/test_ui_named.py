"""``ui.named.Outputs``: handlers return ``{name: value}``; Gradio gets the values in order."""

import inspect

import gradio as gr
import pytest

from ui.named import Outputs, components_of


def test_named_values_become_positional_with_skips_for_what_a_handler_leaves_alone():
    outputs = Outputs({"chat": "C", "stats": "S", "code": "K"}, ("chat", "stats", "code"))
    assert outputs.components == ["C", "S", "K"]
    assert outputs.positional({"code": 3, "chat": 1}) == (1, gr.skip(), 3)
    assert outputs.positional({}) == (gr.skip(),) * 3
    assert Outputs({"chat": "C"}, ("chat",)).positional({"chat": 1}) == 1  # one output: the value itself


def test_a_name_the_event_does_not_output_is_an_error_not_a_silent_drop():
    outputs = Outputs({"chat": "C", "stats": "S"}, ("chat",))
    with pytest.raises(KeyError, match="stats"):
        outputs.positional({"stats": 1})
    with pytest.raises(KeyError, match="nowhere"):
        Outputs({"chat": "C"}, ("nowhere",))


def test_wrapped_handlers_keep_their_signature_and_stream_when_they_are_generators():
    outputs = Outputs({"a": 1, "b": 2}, ("a", "b"))

    def handler(x, evt: gr.SelectData):
        return {"b": x}

    def streaming(x):
        yield {"a": x}
        yield {"b": x + 1}

    wrapped = outputs.wrap(handler)
    assert list(inspect.signature(wrapped).parameters) == ["x", "evt"] and wrapped.__name__ == "handler"
    assert wrapped(5, None) == (gr.skip(), 5)
    stream = outputs.wrap(streaming)
    assert inspect.isgeneratorfunction(stream)
    assert list(stream(1)) == [(1, gr.skip()), (gr.skip(), 2)]


def test_components_of_reads_a_namespace_or_a_dict():
    from types import SimpleNamespace

    assert components_of(SimpleNamespace(chat=1)) == {"chat": 1} == components_of({"chat": 1})
