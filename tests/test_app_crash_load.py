"""The running app under kills, load and Stop presses (counts from the environment, so that CI
runs short versions and ``scripts/reliability.sh`` the long ones):

- ``DFLASH_KILLS`` (CI 3): the real app (tests/crash_app.py) is SIGKILLed at a random moment while
  clients send messages and replies stream; after each kill ``integrity_check`` is ok, no
  acknowledged message is lost or doubled, and the next start marks cut replies 'interrupted'.
- ``DFLASH_LOAD_S`` (CI 4 s): 4 clients stream in 4 sessions at once (and a reader polls the file
  like the CLI next to the app): every reply is stored exactly once, complete, and nothing says
  "database is locked".
- ``DFLASH_STOPS`` (CI 10): Stop pressed at a random moment of a reply ends it within one cycle;
  the worst latency is reported.

Each test appends its figure to ``$DFLASH_FIGURES`` (JSON lines) when set.
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from gradio_client import Client  # noqa: E402

from tests.crash_app import REPLY  # noqa: E402
from tests.fake_engine import FakeEngine, FakeReply, fake_studio, pieces  # noqa: E402
from tests.figures import record_figure  # noqa: E402
from tests.test_network import free_port  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
KILLS = int(os.environ.get("DFLASH_KILLS", "3"))
LOAD_S = float(os.environ.get("DFLASH_LOAD_S", "4"))
STOPS = int(os.environ.get("DFLASH_STOPS", "10"))
SETTINGS = dict(block_size=8, temperature=0.0, top_p=1.0, max_new_tokens=2048, fallback=False, show_rejected=True)

pytestmark = pytest.mark.slow


# ----------------------------------------------------------------------------- SIGKILL loop
class AppLauncher:
    """Starts the app (tests/crash_app.py) again and again: forked from one pre-imported process."""

    def __init__(self, log):
        self.zygote = subprocess.Popen([sys.executable, "-m", "tests.crash_app", "--zygote"], cwd=REPO_ROOT,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                                       env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
        assert self.zygote.stdout.readline().split() == ["zygote", "ready"]

    def start(self, db_path: Path) -> tuple[int, str, int]:
        self.zygote.stdin.write(f"{db_path} {free_port()}\n")
        self.zygote.stdin.flush()
        pid_line = self.zygote.stdout.readline().split()
        ready = self.zygote.stdout.readline().split()
        if pid_line[:1] != ["pid"] or ready[:1] != ["ready"]:
            raise AssertionError(f"the app did not start: {pid_line} {ready}")
        return int(pid_line[1]), ready[1], int(ready[2])

    @staticmethod
    def kill(pid: int) -> None:
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.01)
        raise AssertionError(f"app {pid} survived SIGKILL")

    def close(self) -> None:
        self.zygote.kill()
        self.zygote.wait(timeout=30)


def drive(url: str, acked: list, stop: threading.Event) -> None:
    """Send messages and read replies until killed; record each message once the app acknowledged it."""
    try:
        client = Client(url, verbose=False)
        client.predict(*SETTINGS.values(), api_name="/settings")
        while not stop.is_set():
            text = f"message {uuid.uuid4().hex}"
            client.predict(text, api_name="/send")
            acked.append(("user", text))
            client.predict(api_name="/respond")
            acked.append(("reply", text))  # the reply to ``text`` streamed to its end
    except Exception:  # noqa: BLE001 - the app was killed under us: expected
        pass


def check_file(db_path: Path) -> dict:
    with sqlite3.connect(db_path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert db.execute("PRAGMA foreign_key_check").fetchall() == []
        rows = db.execute("SELECT session_id, seq, role, content, status FROM messages ORDER BY session_id, seq").fetchall()
    return {"rows": rows}


def lost_messages(rows, acked) -> list[str]:
    """Acknowledged messages the file does not hold exactly once."""
    users = [content for _, _, role, content, _ in rows if role == "user"]
    return [f"{text!r} stored {users.count(text)} times" for _, text in acked if users.count(text) != 1]


def check_acknowledged(rows, acked) -> None:
    lost = lost_messages(rows, acked)
    assert not lost, f"acknowledged messages lost or doubled: {lost[:3]}"
    by_user = {}
    for i, (session, seq, role, content, status) in enumerate(rows):
        if role == "user":
            following = rows[i + 1] if i + 1 < len(rows) and rows[i + 1][0] == session else None
            by_user[content] = following
    full = "".join(pieces(REPLY))
    for kind, text in acked:
        reply = by_user.get(text)
        if kind == "reply":
            assert reply is not None and reply[2] == "assistant" and reply[4] == "complete" and reply[3] == full
        if reply is not None and reply[2] == "assistant":
            assert full.startswith(reply[3]), "a stored reply is not a prefix of what the model wrote"


def test_sigkill_of_the_running_app_mid_reply_loses_no_acknowledged_message(tmp_path):
    rng = random.Random(int(os.environ.get("DFLASH_SEED", "15")))
    db_path = tmp_path / "sessions.db"
    acked: list = []
    interrupted_seen = kills_done = integrity_ok = 0
    with open(tmp_path / "app.log", "w") as log:
        apps = AppLauncher(log)
        try:
            for _ in range(KILLS):
                pid, url, recovered = apps.start(db_path)
                interrupted_seen += recovered
                with sqlite3.connect(db_path) as db:
                    assert db.execute("SELECT count(*) FROM messages WHERE status = 'streaming'").fetchone()[0] == 0
                stop, before = threading.Event(), len(acked)
                driver = threading.Thread(target=drive, args=(url, acked, stop), daemon=True)
                driver.start()
                deadline = time.monotonic() + 60
                while len(acked) == before and driver.is_alive() and time.monotonic() < deadline:
                    time.sleep(0.01)  # the first message of this run is acknowledged: now kill at a random moment
                time.sleep(rng.uniform(0.0, 1.5))
                apps.kill(pid)
                stop.set()
                driver.join(timeout=30)
                rows = check_file(db_path)["rows"]  # asserts PRAGMA integrity_check is ok
                kills_done += 1
                integrity_ok += 1
                lost = len(lost_messages(rows, list(acked)))
                record_figure("sigkill_progress", kills=kills_done, integrity_ok=integrity_ok, acknowledged=len(acked),
                              lost=lost)  # a long run cut short still reports what it checked
                check_acknowledged(rows, list(acked))
            pid, url, recovered = apps.start(db_path)  # the start after the last kill recovers too
            interrupted_seen += recovered
            apps.kill(pid)
        finally:
            apps.close()
    rows = check_file(db_path)["rows"]
    record_figure("sigkill", kills=kills_done, integrity_ok=integrity_ok + 1, checks=kills_done + 1,
                  acknowledged=len(acked), lost=len(lost_messages(rows, acked)), interrupted_replies=interrupted_seen)
    check_acknowledged(rows, acked)
    assert not [r for r in rows if r[4] == "streaming"]
    assert sum(1 for kind, _ in acked if kind == "user") >= KILLS


# ----------------------------------------------------------------------------- load
class CountingFakeEngine(FakeEngine):
    """Records when each cycle is emitted and when a reply ended (for Stop latency)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.cycle_times: list[float] = []
        self.ended_at: list[float] = []

    def _events(self, *args, **kwargs):
        try:
            for event in super()._events(*args, **kwargs):
                if type(event).__name__ == "Cycle":
                    self.cycle_times.append(time.monotonic())
                yield event
        finally:
            self.ended_at.append(time.monotonic())


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    engine = CountingFakeEngine(delay_s=0.002, context_window=10**7,
                                default_reply=FakeReply("def f(x):\n    return x * 2\n" * 3, accept=(3, 7), fallback_at={}))
    studio = fake_studio(engine, db_path=tmp_path_factory.mktemp("load") / "sessions.db", flush_interval_s=0.2)
    studio.host.start().result(timeout=10)
    studio.demo.launch(**studio.launch_kwargs(server_port=free_port(), prevent_thread_lock=True, quiet=True,
                                              inbrowser=False))
    yield studio, engine, studio.demo.local_url
    studio.close()


def test_four_sessions_streaming_at_once_store_every_reply_exactly_once(served):
    studio, engine, url = served
    deadline = time.monotonic() + LOAD_S
    results: dict[int, list[str]] = {}
    errors: list[str] = []
    reader_stop = threading.Event()

    def client_loop(n: int) -> None:
        client = Client(url, verbose=False)
        sent = results.setdefault(n, [])
        try:
            client.predict(*SETTINGS.values(), api_name="/settings")
            while time.monotonic() < deadline:
                text = f"client {n} message {len(sent)} {uuid.uuid4().hex[:8]}"
                client.predict(text, api_name="/send")
                client.predict(api_name="/respond")
                sent.append(text)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(f"client {n}: {type(exc).__name__}: {exc}")

    def reader() -> None:  # the CLI reading next to the app
        while not reader_stop.is_set():
            try:
                with sqlite3.connect(studio.store.path, timeout=5) as db:
                    db.execute("SELECT count(*) FROM messages").fetchone()
                    db.execute("SELECT * FROM cycles ORDER BY id DESC LIMIT 50").fetchall()
            except sqlite3.Error as exc:
                errors.append(f"reader: {exc}")
            time.sleep(0.01)

    threads = [threading.Thread(target=client_loop, args=(n,)) for n in range(4)]
    reading = threading.Thread(target=reader)
    reading.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=LOAD_S + 120)
    reader_stop.set()
    reading.join(timeout=10)
    replies, lost, duplicated = 0, [], []
    expected = studio.store  # every reply of every client: stored exactly once, complete
    all_messages = [m for s in expected.list_sessions(limit=None) for m in expected.get_messages(s["id"])]
    for n, sent in results.items():
        for text in sent:
            matches = [i for i, m in enumerate(all_messages) if m["role"] == "user" and m["content"] == text]
            reply = all_messages[matches[0] + 1] if matches and matches[0] + 1 < len(all_messages) else None
            if len(matches) > 1:
                duplicated.append(text)
            elif reply is None or reply["role"] != "assistant" or reply["status"] != "complete":
                lost.append(text)
            elif sum(1 for m in all_messages if (m["session_id"], m["seq"]) == (reply["session_id"], reply["seq"])) > 1:
                duplicated.append(text)
            else:
                replies += 1
    locked = [e for e in errors if "locked" in e]
    record_figure("load", sessions=4, seconds=LOAD_S, replies=replies, lost=len(lost), duplicated=len(duplicated),
                  locked_errors=len(locked), other_errors=len(errors) - len(locked))
    assert not errors, errors[:3]
    assert not lost and not duplicated, (lost[:3], duplicated[:3])
    assert all(results.get(n) for n in range(4)), f"a client completed no reply in {LOAD_S} s"


# ----------------------------------------------------------------------------- Stop
def test_stop_ends_the_reply_within_one_cycle(served):
    studio, engine, url = served
    rng = random.Random(7)
    client = Client(url, verbose=False)
    latencies, cycles_after = [], []
    slow = FakeReply("x = 1\n" * 4000, accept=(1,), fallback_at={}, delay_s=0.05)  # 50 ms cycles
    told: list[float] = []  # when the server received each Stop
    original_stop = studio.replies.stop

    def timed_stop(session_id):
        told.append(time.monotonic())
        return original_stop(session_id)

    studio.replies.stop = timed_stop  # what the page's Stop calls
    client.predict(*SETTINGS.values(), api_name="/settings")
    round_trips = []
    for press in range(STOPS):
        engine.enqueue(slow)
        client.predict(f"stop test {press}", api_name="/send")
        ended_before = len(engine.ended_at)
        job = client.submit(api_name="/respond")
        while not engine.running.is_set():
            time.sleep(0.005)
        time.sleep(rng.uniform(0.05, 0.6))
        pressed = time.monotonic()
        client.predict(api_name="/stop")
        job.result(timeout=60)
        assert len(engine.ended_at) > ended_before
        ended, stopped = engine.ended_at[-1], told[-1]
        latencies.append(ended - stopped)  # the server got the Stop -> the engine loop ended
        round_trips.append(ended - pressed)  # the client pressed Stop -> the engine loop ended
        cycles_after.append(sum(1 for t in engine.cycle_times if stopped < t <= ended))
        reply = studio.store.get_messages(studio.store.list_sessions(limit=1)[0]["id"])[-1]
        assert reply["status"] == "interrupted" and reply["content"]  # the partial reply is kept
    del studio.replies.stop  # the method again
    worst = max(latencies)
    record_figure("stop", presses=STOPS, worst_latency_ms=round(worst * 1000, 1),
                  median_latency_ms=round(sorted(latencies)[len(latencies) // 2] * 1000, 1),
                  worst_round_trip_ms=round(max(round_trips) * 1000, 1),
                  max_cycles_after_stop=max(cycles_after), cycle_ms=50)
    assert max(cycles_after) <= 1, cycles_after  # the cycle under way finishes; no further cycle starts
