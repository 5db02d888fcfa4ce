"""SIGKILL while a reply streams: nothing committed is lost, nothing is half-written, and the next
start marks the reply 'interrupted' with its text kept (the SQLite crash-test loop, in miniature).

The child (tests/storage_crash_writer.py) prints a line only after each commit returned; the
parent kills it at a random moment after a random number of flushes, then checks the file.
"""

from __future__ import annotations

import os
import random
import selectors
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from storage import SessionStore
from tests.storage_crash_writer import PROMPT
from tests.storage_helpers import expected_reply_text

REPO_ROOT = Path(__file__).resolve().parents[1]
KILLS = 3
CHILD_TIMEOUT_S = 30.0

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")


def read_lines_until(process: subprocess.Popen, enough, timeout_s: float) -> list[list[str]]:
    """Lines the child printed, split into fields, read until ``enough(lines)`` or the deadline."""
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout_s
    buffer, lines = b"", []
    while not enough(lines):
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not selector.select(timeout=remaining):
            raise AssertionError(f"the writer printed only {lines} in {timeout_s} s")
        chunk = os.read(process.stdout.fileno(), 65536)
        if not chunk:
            raise AssertionError(f"the writer exited early ({process.wait(timeout=5)}) after {lines}")
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        lines.extend(line.decode().split() for line in complete)
    selector.close()
    return lines


def kill_writer_mid_stream(db_path: Path, label: str, rng: random.Random, stderr_path: Path) -> dict:
    """Run the writer, SIGKILL it after a few flushes, return what it reported as committed."""
    flushes_wanted = rng.randint(2, 6)
    with open(stderr_path, "wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.storage_crash_writer", str(db_path), label],
            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=stderr,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        )
        try:
            lines = read_lines_until(
                process, lambda seen: sum(line[0] == "flushed" for line in seen) >= flushes_wanted, CHILD_TIMEOUT_S
            )
            time.sleep(rng.uniform(0, 0.03))  # land somewhere inside a later write
            process.send_signal(signal.SIGKILL)
            assert process.wait(timeout=10) == -signal.SIGKILL
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)
            process.stdout.close()
    reported = {line[0]: int(line[1]) for line in lines if line[0] in ("session", "user", "reply")}
    reported["cycles"] = max(int(line[2]) for line in lines if line[0] == "flushed")
    return reported


def test_sigkill_while_streaming_loses_no_committed_row_and_reopening_interrupts_the_reply(tmp_path):
    db_path = tmp_path / "sessions.db"
    rng = random.Random(20260509)
    survivors: list[dict] = []
    for attempt in range(KILLS):
        reported = kill_writer_mid_stream(db_path, f"#{attempt}", rng, tmp_path / f"stderr-{attempt}.txt")

        with sqlite3.connect(db_path) as raw:  # a fresh process's view, before any recovery
            assert raw.execute("PRAGMA integrity_check").fetchone() == ("ok",)
            assert raw.execute("PRAGMA foreign_key_check").fetchall() == []
            assert raw.execute("SELECT content, status FROM messages WHERE id = ?", [reported["user"]]).fetchone() == (
                PROMPT, "complete")
            content, status = raw.execute(
                "SELECT content, status FROM messages WHERE id = ?", [reported["reply"]]).fetchone()
            indexes = [row[0] for row in raw.execute(
                "SELECT idx FROM cycles WHERE message_id = ? ORDER BY idx", [reported["reply"]])]
        assert status == "streaming"
        # every reported flush is there, and text and cycles were saved together (never one without the other)
        assert len(indexes) >= reported["cycles"]
        assert indexes == list(range(1, len(indexes) + 1))
        assert content == expected_reply_text(len(indexes))

        with SessionStore(db_path) as reopened:
            assert reopened.recovered == 1
            reply = reopened.get_message(reported["reply"])
            assert (reply["status"], reply["content"]) == ("interrupted", content)
            assert len(reopened.get_cycles(reported["reply"])) == len(indexes)
            survivors.append({"reply": reported["reply"], "content": content, "cycles": len(indexes)})
            for earlier in survivors:  # earlier crashes' replies are untouched by later ones
                assert reopened.get_message(earlier["reply"])["content"] == earlier["content"]
                assert len(reopened.get_cycles(earlier["reply"])) == earlier["cycles"]
            assert reopened.count_sessions() == attempt + 1
