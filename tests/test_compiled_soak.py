"""The compiled path under a long load: the real app (``dflash-studio serve --compile``) in its
own process, four streams at once for ``DFLASH_SOAK_S`` seconds after its compile is ready:
two from the page (Gradio's client: ``/send`` then ``/respond``, a new chat every few messages so
that the context stays short) and two from ``/v1`` (openai's client, streaming).

- ``DFLASH_SOAK_S`` (CI 20; ``scripts/reliability.sh`` 1800): how long the four streams run.
- ``DFLASH_SOAK_PAIR``: ``tiny`` (CI: a tiny random pair, compiled in seconds) or ``embedded``
  (the shipped tiny coder; a cold compile takes minutes).

Checked: no reply lost (every page message stored once, followed by its complete reply; every
API stream ends with a finish reason), no recompile after warm-up (the model card's
``decode_path``, read from ``/v1/models``), and resident memory grows less than 10 % from the
end of the first tenth of the run to its end. The figure goes to ``$DFLASH_FIGURES``.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from gradio_client import Client  # noqa: E402

from tests.figures import record_figure  # noqa: E402
from tests.test_network import end_process, free_port  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
SOAK_S = float(os.environ.get("DFLASH_SOAK_S", "20"))
PAIR = os.environ.get("DFLASH_SOAK_PAIR", "tiny")
NEW_TOKENS = 48
PAGE_SETTINGS = dict(block_size=8, temperature=0.0, top_p=1.0, max_new_tokens=NEW_TOKENS, fallback=False,
                     show_rejected=True)
REQUESTS = ["Write a function that reverses a list.", "Write a function that counts the vowels in a string.",
            "Write a function that returns the largest of three numbers.", "Sort a list of words by length.",
            "Write a function that checks whether a year is a leap year.", "Merge two dictionaries."]
MESSAGES_PER_CHAT = 3

pytestmark = pytest.mark.slow


def resident_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def loaded_card(url: str) -> dict:
    cards = httpx.get(f"{url}/v1/models", timeout=30).json()["data"]
    return next(card for card in cards if card["dflash"]["loaded"])["dflash"]


@pytest.fixture
def app(tmp_path):
    """The app in its own process on a free port, its compile finished; yields (url, pid, db)."""
    model = []
    if PAIR == "tiny":
        from tests.tiny_models import save_tiny_pair

        target_dir, draft_dir, *_ = save_tiny_pair(tmp_path / "pair")
        model = ["--target", str(target_dir), "--draft", str(draft_dir)]
    port, db = free_port(), tmp_path / "sessions.db"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "DFLASH_STUDIO_COMPILE": "1"}
    command = [sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--db", str(db), "--no-browser",
               "--compile", "--no-fallback", "--max-new-tokens", str(NEW_TOKENS), *model]
    with open(tmp_path / "app.log", "w") as log:
        process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + (1200 if PAIR == "embedded" else 600)
        path: dict = {}
        while time.monotonic() < deadline:
            assert process.poll() is None, (tmp_path / "app.log").read_text()[-3000:]
            try:
                path = loaded_card(url).get("decode_path") or {}
            except (httpx.HTTPError, StopIteration, KeyError, ValueError):
                path = {}
            assert path.get("compile_state") != "failed", path
            if path.get("path") == "compiled":
                break
            time.sleep(1)
        assert path.get("path") == "compiled", f"not compiled in time: {path}"
        yield url, process.pid, db
    finally:
        end_process(process)


def page_stream(url: str, n: int, deadline: float, sent: list[str], errors: list[str]) -> None:
    try:
        client = Client(url, verbose=False)
        client.predict(*PAGE_SETTINGS.values(), api_name="/settings")
        while time.monotonic() < deadline:
            if sent and len(sent) % MESSAGES_PER_CHAT == 0:
                client.predict(api_name="/new_session")
                client.predict(*PAGE_SETTINGS.values(), api_name="/settings")
            text = f"{REQUESTS[len(sent) % len(REQUESTS)]} (page {n}, {uuid.uuid4().hex[:8]})"
            client.predict(text, api_name="/send")
            client.predict(api_name="/respond")
            sent.append(text)
    except Exception as exc:  # noqa: BLE001 - reported by the test
        errors.append(f"page {n}: {type(exc).__name__}: {exc}")


def api_stream(url: str, n: int, deadline: float, finished: list[str], errors: list[str]) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="local", timeout=300, max_retries=0)
    i = 0
    while time.monotonic() < deadline:
        request = f"{REQUESTS[i % len(REQUESTS)]} (api {n}, {uuid.uuid4().hex[:8]})"
        i += 1
        try:
            reasons, text = [], []
            for chunk in client.chat.completions.create(model=None, messages=[{"role": "user", "content": request}],
                                                        max_tokens=NEW_TOKENS, temperature=0, stream=True):
                for choice in chunk.choices:
                    text.append(choice.delta.content or "")
                    if choice.finish_reason:
                        reasons.append(choice.finish_reason)
            if reasons not in (["stop"], ["length"]) or not "".join(text):
                errors.append(f"api {n}: {request!r} ended with {reasons} after {len(''.join(text))} characters")
            else:
                finished.append(request)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            errors.append(f"api {n}: {type(exc).__name__}: {exc}")


def stored_replies(db: Path, sent: list[str]) -> tuple[int, list[str]]:
    """(complete replies to ``sent``, the messages not stored exactly once with one)."""
    with sqlite3.connect(db) as connection:
        rows = connection.execute("SELECT session_id, seq, role, content, status FROM messages "
                                  "ORDER BY session_id, seq").fetchall()
    lost, complete = [], 0
    for text in sent:
        at = [i for i, row in enumerate(rows) if row[2] == "user" and row[3] == text]
        reply = rows[at[0] + 1] if len(at) == 1 and at[0] + 1 < len(rows) else None
        if reply is None or reply[0] != rows[at[0]][0] or reply[2] != "assistant" or reply[4] != "complete":
            lost.append(text)
        else:
            complete += 1
    return complete, lost


def by_tenth(samples: list[tuple[float, float]], seconds: float) -> list[float]:
    """Resident memory at the start of each tenth of the run, then at its end (the curve's shape
    tells a leak, which keeps climbing, from a heap settling after its warm-up)."""
    marks = [next((mb for t, mb in samples if t >= seconds * k / 10), samples[-1][1]) for k in range(10)]
    return [round(mb, 1) for mb in marks + [samples[-1][1]]]


def test_four_streams_on_the_compiled_path_lose_nothing_recompile_nothing_and_hold_memory(app):
    url, pid, db = app
    graphs_before = loaded_card(url)["decode_path"]["compile"]["graphs"]
    start = time.monotonic()
    deadline = start + SOAK_S
    page_sent: list[list[str]] = [[], []]
    api_done: list[list[str]] = [[], []]
    errors: list[str] = []
    streams = [threading.Thread(target=page_stream, args=(url, n, deadline, page_sent[n], errors)) for n in range(2)]
    streams += [threading.Thread(target=api_stream, args=(url, n, deadline, api_done[n], errors)) for n in range(2)]
    for stream in streams:
        stream.start()
    samples: list[tuple[float, float]] = []
    while any(stream.is_alive() for stream in streams):
        samples.append((time.monotonic() - start, resident_mb(pid)))
        time.sleep(1)
    for stream in streams:
        stream.join()
    card = loaded_card(url)["decode_path"]
    curve = by_tenth(samples, SOAK_S)
    baseline, final = curve[1], curve[-1]  # from the end of the first tenth (the warm-up) to the end
    growth = (final - baseline) / baseline
    sent = page_sent[0] + page_sent[1]
    page_complete, lost = stored_replies(db, sent)
    api_complete = len(api_done[0]) + len(api_done[1])
    record_figure("soak", seconds=round(time.monotonic() - start), pair=PAIR, streams=4,
                  page_replies=page_complete, api_replies=api_complete, lost=len(lost) + len(errors),
                  recompiles=card["recompiles"], graphs_after=card["compile"]["graphs"] - graphs_before,
                  rss_start_mb=round(baseline, 1), rss_end_mb=round(final, 1), rss_peak_mb=round(max(mb for _, mb in samples), 1),
                  rss_growth_pct=round(100 * growth, 2), rss_by_tenth_mb=curve)
    assert not errors, errors[:3]
    assert not lost, f"page messages without their complete reply: {lost[:3]}"
    assert all(page_sent) and all(api_done), "a stream completed no reply"
    assert card["path"] == "compiled" and card["recompiles"] == 0, card
    assert card["compile"]["graphs"] == graphs_before, card
    assert growth < 0.10, f"resident memory grew {100 * growth:.1f} % ({baseline:.0f} -> {final:.0f} MB)"
