"""engine.files: a file is written whole or not at all (exports, checkpoints, run summaries)."""

import json
from pathlib import Path

import pytest
import torch

from engine.files import write_atomically, write_text_atomically
from training.common import load_checkpoint, save_checkpoint, write_json


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


def test_a_new_file_gets_the_usual_permissions_and_a_replaced_one_keeps_its_own(tmp_path):
    """A shared replay or an export is read by others (a web server, a colleague): a new file is
    made as ``open()`` makes it (0666 less the umask), not private like a temporary file."""
    import os
    import stat

    before = os.umask(0o022)
    try:
        fresh = tmp_path / "replay.html"
        write_text_atomically(fresh, "<!DOCTYPE html>")
        assert stat.S_IMODE(fresh.stat().st_mode) == 0o644
        kept = tmp_path / "private.json"
        kept.write_text("{}")
        kept.chmod(0o600)
        write_text_atomically(kept, "[]")
        assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    finally:
        os.umask(before)


def test_a_directory_in_place_of_the_file_is_refused_by_its_own_name(tmp_path):
    target = tmp_path / "exports"
    target.mkdir()
    with pytest.raises(IsADirectoryError) as caught:
        write_text_atomically(target, "text")
    assert caught.value.filename == str(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exports"]  # no temporary file left beside it


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc, where no file can be made")
def test_a_folder_where_no_file_can_be_made_is_named_by_the_file_asked_for():
    with pytest.raises(OSError) as caught:
        write_text_atomically(Path("/proc/replay.html"), "text")
    assert caught.value.filename == "/proc/replay.html"  # not the temporary file's name
