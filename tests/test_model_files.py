"""Hostile and broken model files, and a model that misbehaves while it runs:

- a crafted pickle is refused without being unpickled (an audit hook sees no ``pickle.find_class``
  and the payload's sentinel file never appears), also when safetensors sit next to it;
- truncated or inconsistent safetensors are refused with a message naming the file;
- NaN logits end the reply with an error (the text so far kept), and the next request works;
- an out-of-memory error mid-reply ends it with advice, and the next request works.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import struct
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.config import EngineConfig, SamplingConfig
from engine.draft import load_draft
from engine.errors import CheckpointError
from engine.events import Failed, Finished
from engine.runtime import Engine
from engine.weights import OOM_ADVICE, check_safetensors_file
from tests.tiny_models import save_tiny_pair

PICKLE_EVENTS: list[tuple] = []
_RECORDING = [False]


def _audit(event: str, args) -> None:
    if _RECORDING[0] and event in ("pickle.find_class", "torch.load"):
        PICKLE_EVENTS.append((event, args))


sys.addaudithook(_audit)  # cannot be removed: it records only while a test asks it to


class Payload:
    """Unpickling this runs ``os.system`` and creates the sentinel file."""

    def __init__(self, sentinel):
        self.sentinel = str(sentinel)

    def __reduce__(self):
        return (os.system, (f"touch {self.sentinel}",))


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return save_tiny_pair(tmp_path_factory.mktemp("pair"))


@pytest.fixture
def recording():
    PICKLE_EVENTS.clear()
    _RECORDING[0] = True
    yield PICKLE_EVENTS
    _RECORDING[0] = False


def write_pickle(path, sentinel) -> None:
    with path.open("wb") as handle:
        pickle.dump({"model.embed_tokens.weight": Payload(sentinel)}, handle)


def test_the_audit_hook_would_see_an_unpickling(tmp_path, recording):
    sentinel = tmp_path / "pwned"
    write_pickle(tmp_path / "x.bin", sentinel)
    with (tmp_path / "x.bin").open("rb") as handle:
        pickle.load(handle)  # the control: this is what loading must never do
    assert sentinel.exists() and any(event == "pickle.find_class" for event, _ in recording)


@pytest.mark.parametrize("name", ["pytorch_model.bin", "model.pt", "weights.ckpt", "model.pth"])
def test_a_crafted_pickle_target_is_refused_without_unpickling(pair, tmp_path, recording, name):
    target = tmp_path / "target"
    shutil.copytree(pair[0], target)
    (target / "model.safetensors").unlink()
    sentinel = tmp_path / "pwned"
    write_pickle(target / name, sentinel)
    with pytest.raises(CheckpointError, match="pickle"):
        Engine.load(EngineConfig(target=str(target), speculative=False))
    assert not sentinel.exists() and recording == []


def test_a_crafted_pickle_draft_is_refused_and_safetensors_win_over_a_pickle(pair, tmp_path, recording):
    sentinel = tmp_path / "pwned"
    draft = tmp_path / "draft"
    shutil.copytree(pair[1], draft)
    (draft / "model.safetensors").unlink()
    write_pickle(draft / "pytorch_model.bin", sentinel)
    with pytest.raises(CheckpointError, match="pickle"):
        load_draft(draft)
    both = tmp_path / "both"
    shutil.copytree(pair[0], both)
    write_pickle(both / "pytorch_model.bin", sentinel)  # next to good safetensors: never read
    engine = Engine.load(EngineConfig(target=str(both), draft=str(pair[1])))
    assert engine.info()["target_parameters"] > 0
    assert not sentinel.exists() and recording == []


# ----------------------------------------------------------------------------- broken safetensors
def corrupted(tmp_path, pair, damage) -> "os.PathLike":
    target = tmp_path / "target"
    shutil.copytree(pair[0], target)
    damage(target / "model.safetensors")
    return target


def truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])


def lie_about_header(path):
    data = path.read_bytes()
    path.write_bytes(struct.pack("<Q", 10**12) + data[8:])


def garble_header(path):
    data = bytearray(path.read_bytes())
    data[8:20] = b"not json at!"
    path.write_bytes(bytes(data))


def wrong_shape(path):
    state = load_file(str(path))
    name = next(k for k in state if k.endswith("mlp.up_proj.weight"))
    state[name] = torch.zeros(state[name].shape[0] + 3, state[name].shape[1])
    save_file(state, str(path), metadata={"format": "pt"})


def missing_tensor(path):
    state = load_file(str(path))
    del state[next(k for k in state if k.endswith("layers.1.self_attn.q_proj.weight"))]
    save_file(state, str(path), metadata={"format": "pt"})


def empty(path):
    path.write_bytes(b"")


@pytest.mark.parametrize("damage, words", [
    (truncate, "truncated"), (lie_about_header, "header"), (garble_header, "not valid JSON"),
    (wrong_shape, "cannot load target"), (missing_tensor, "missing"), (empty, "too short"),
])
def test_broken_target_weights_are_refused_with_a_clear_message(pair, tmp_path, damage, words):
    target = corrupted(tmp_path, pair, damage)
    with pytest.raises(CheckpointError) as caught:
        Engine.load(EngineConfig(target=str(target), speculative=False))
    assert words in str(caught.value) and str(target) in str(caught.value)


def test_inconsistent_byte_ranges_are_refused(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"a": torch.zeros(4), "b": torch.ones(4)}, str(path))
    check_safetensors_file(path)  # the good file passes
    data = path.read_bytes()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + header_len])
    header["b"]["data_offsets"] = [0, 16]  # overlaps "a"
    text = json.dumps(header, separators=(",", ":")).encode().ljust(header_len)
    assert len(text) == header_len
    path.write_bytes(data[:8] + text + data[8 + header_len:])
    with pytest.raises(CheckpointError, match="overlapping or leaving gaps"):
        check_safetensors_file(path)
    path.write_bytes(data + b"stray")  # bytes after the last tensor
    with pytest.raises(CheckpointError, match="bytes no tensor accounts for"):
        check_safetensors_file(path)


def test_a_truncated_draft_is_refused(pair, tmp_path):
    draft = tmp_path / "draft"
    shutil.copytree(pair[1], draft)
    truncate(draft / "model.safetensors")
    with pytest.raises(CheckpointError, match="truncated"):
        load_draft(draft)


# ----------------------------------------------------------------------------- while running
@pytest.fixture(scope="module")
def engine(pair):
    return Engine.load(EngineConfig(target=str(pair[0]), draft=str(pair[1])))


def run(engine, n=24):
    return list(engine.generate(engine.encode("def add(a, b):", raw=True), SamplingConfig(max_new_tokens=n)))


def fail_on_call(module, call: int, exc: BaseException):
    calls = [0]

    def hook(mod, args, output):
        calls[0] += 1
        if calls[0] == call:
            if isinstance(exc, BaseException) and not isinstance(exc, str):
                raise exc
        return output

    return module.register_forward_hook(hook)


def test_nan_logits_end_the_reply_with_an_error_and_the_next_request_works(engine):
    head = engine.models.target.get_output_embeddings()

    def poison(module, args, output):
        poison.calls += 1
        return output * float("nan") if poison.calls == 7 else output

    poison.calls = 0
    handle = head.register_forward_hook(poison, prepend=True)  # before the guard sees the output
    try:
        events = run(engine)
    finally:
        handle.remove()
    assert isinstance(events[-1], Failed) and "NaN/inf logits" in events[-1].message
    assert "--dtype float32" in events[-1].message
    assert sum(1 for e in events if type(e).__name__ == "Cycle") >= 1  # the text so far came out first
    assert isinstance(run(engine)[-1], Finished)


def test_out_of_memory_ends_the_reply_with_advice_and_the_next_request_works(engine):
    layer = engine.models.target.model.layers[0]
    handle = fail_on_call(layer, 4, torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    try:
        events = run(engine)
    finally:
        handle.remove()
    assert isinstance(events[-1], Failed) and events[-1].message.startswith(OOM_ADVICE)
    assert "Tried to allocate 2.00 GiB" in events[-1].message
    assert isinstance(run(engine)[-1], Finished)
