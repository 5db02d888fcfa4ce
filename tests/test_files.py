"""engine.files: a file is written whole or not at all (exports, checkpoints, run summaries)."""

import json

import pytest
import torch

from engine.files import write_atomically, write_text_atomically
from engine.training.common import load_checkpoint, save_checkpoint, write_json


def test_a_write_replaces_the_file_whole(tmp_path):
    path = tmp_path / "deep" / "out.json"
    write_text_atomically(path, "first")
    write_text_atomically(path, "second")
    assert path.read_text() == "second" and [p.name for p in path.parent.iterdir()] == ["out.json"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "out.txt"
    path.write_text("good")

    def half_then_fail(temporary):
        temporary.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomically(path, half_then_fail)
    assert path.read_text() == "good" and [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_training_checkpoints_and_summaries_use_it(tmp_path):
    checkpoint = tmp_path / "ckpt.pt"
    save_checkpoint(checkpoint, {"step": 1, "w": torch.ones(2)})
    with pytest.raises(Exception):  # a lambda cannot be pickled: torch.save fails half way
        save_checkpoint(checkpoint, {"step": 2, "f": lambda: 0})
    assert load_checkpoint(checkpoint)["step"] == 1
    write_json(tmp_path / "summary.json", {"tau": 3.2})
    assert json.loads((tmp_path / "summary.json").read_text()) == {"tau": 3.2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt", "summary.json"]
