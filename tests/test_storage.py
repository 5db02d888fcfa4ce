"""SessionStore: schema, whole rows, the durability contract, cycles, statistics, export/import.

Every store here gets a FakeClock, so rows are asserted whole, timestamps included.
"""

from __future__ import annotations

import ast
import json
import random
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from storage import (
    EXPORT_FORMAT,
    EXPORT_VERSION,
    ImportFormatError,
    MessageNotFound,
    SaveFailed,
    SessionNotFound,
    SessionStore,
    StaleSessionError,
    default_db_path,
)
from storage.migrations import MIGRATIONS
from tests.storage_helpers import FakeClock, make_cycle

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(clock):
    """An in-memory store."""
    with SessionStore(":memory:", now=clock) as memory_store:
        clock.calls = 0  # startup recovery read the clock once
        yield memory_store


@pytest.fixture
def disk_store(tmp_path, clock):
    """An on-disk store (WAL, synchronous=FULL) in a fresh directory."""
    with SessionStore(tmp_path / "data" / "sessions.db", now=clock) as file_store:
        clock.calls = 0
        yield file_store


@pytest.fixture(params=["memory", "disk"])
def any_store(request, tmp_path, clock):
    path = ":memory:" if request.param == "memory" else tmp_path / "sessions.db"
    with SessionStore(path, now=clock) as parametrized_store:
        clock.calls = 0
        yield parametrized_store


# -- schema --

EXPECTED_COLUMNS = {
    "sessions": {
        "id": int, "uuid": str, "title": str, "created_at": str, "updated_at": str, "model": str, "settings": str,
    },
    "messages": {
        "id": int, "session_id": int, "seq": int, "role": str, "content": str, "status": str, "error": str,
        "kind": str, "model": str, "settings": str, "created_at": str, "updated_at": str,
        "prompt_tokens": int, "new_tokens": int, "tokens_per_s": float, "mean_tau": float,
        "prefill_ms": float, "decode_ms": float, "total_ms": float, "finish_reason": str,
        "reasoning": str, "reasoning_tokens": int,
    },
    "cycles": {
        "id": int, "message_id": int, "idx": int, "block_size": int, "accepted": int, "tau": int, "bonus": int,
        "anchor": int, "anchor_position": int, "draft_ms": float, "verify_ms": float,
        "fallback_state": str, "fallback_reason": str, "fallback_changed": int, "next_block_size": int,
        "context_length": int, "new_context_features": int, "draft_tokens": str, "emitted": str,
        "emitted_pieces": str, "rejected": str, "rejected_pieces": str, "slots": str, "extra": str,
    },
    "comparisons": {"message_id": int, "created_at": str, "data": str},
    "preferences": {"name": str, "value": str, "updated_at": str},
    "_migrations": {"name": str, "applied_at": str},
}


SEARCH_INDEXES = {"sessions_fts": ["title"], "messages_fts": ["content"]}  # FTS5, with their shadow tables


def test_schema_has_exactly_the_expected_tables_columns_keys_and_indexes(any_store):
    db = any_store.database
    fts = {name for name in db.table_names() if "_fts" in name and name.split("_fts")[0] + "_fts" in SEARCH_INDEXES}
    assert set(db.table_names()) - fts == set(EXPECTED_COLUMNS)
    for name, columns in SEARCH_INDEXES.items():
        assert db[name].columns_dict.keys() == set(columns) and "USING FTS5" in db[name].schema, name
        assert {t.name for t in db[name.removesuffix("_fts")].triggers} == {
            name.removesuffix("_fts") + suffix for suffix in ("_ai", "_ad", "_au")}
    for table, columns in EXPECTED_COLUMNS.items():
        assert db[table].columns_dict == columns, table
    assert [(fk.column, fk.other_table, fk.other_column) for fk in db["messages"].foreign_keys] == [
        ("session_id", "sessions", "id")
    ]
    assert [(fk.column, fk.other_table, fk.other_column) for fk in db["cycles"].foreign_keys] == [
        ("message_id", "messages", "id")
    ]
    assert [(fk.column, fk.other_table, fk.other_column) for fk in db["comparisons"].foreign_keys] == [
        ("message_id", "messages", "id")
    ]
    on_delete = {(table, row[2]): row[6] for table in ("messages", "cycles", "comparisons")
                 for row in db.execute(f"PRAGMA foreign_key_list({table})").fetchall()}
    assert on_delete == {("messages", "sessions"): "CASCADE", ("cycles", "messages"): "CASCADE",
                         ("comparisons", "messages"): "CASCADE"}
    indexes = {(index.name, tuple(index.columns), bool(index.unique))
               for table in ("sessions", "messages", "cycles") for index in db[table].indexes}
    assert indexes == {
        ("sqlite_autoindex_sessions_1", ("uuid",), True),
        ("idx_sessions_updated_at", ("updated_at",), False),
        ("sqlite_autoindex_messages_1", ("session_id", "seq"), True),
        ("idx_messages_status", ("status",), False),
        ("sqlite_autoindex_cycles_1", ("message_id", "idx"), True),
    }
    assert any_store.applied_migrations() == [name for name, _ in MIGRATIONS]  # all of them, in order


def test_on_disk_store_uses_wal_full_sync_busy_timeout_and_foreign_keys(disk_store):
    db = disk_store.database
    assert db.journal_mode == "wal"
    assert db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert db.execute("PRAGMA busy_timeout").fetchone()[0] == 5000
    assert db.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert disk_store.path.parent.is_dir()  # the store made data/


def test_schema_rejects_roles_and_statuses_outside_the_contract(store):
    import sqlite3

    session_id = store.create_session()
    with pytest.raises(ValueError, match="role must be one of user, assistant, system"):
        store.add_message(session_id, "bot", "hi")
    with pytest.raises(ValueError, match="status must be one of"):
        store.add_message(session_id, "user", "hi", status="done")
    with pytest.raises(sqlite3.IntegrityError):  # the CHECK constraints hold even below the API
        store.database.execute(
            "INSERT INTO messages (session_id, seq, role, created_at, updated_at) VALUES (?, 1, 'bot', '', '')",
            [session_id],
        )


# -- sessions and messages: whole rows --


def test_create_and_add_message_write_exactly_these_rows(store, clock):
    session_id = store.create_session("Fibonacci", model="tiny-coder", settings={"temperature": 0.0})
    user_id = store.add_message(session_id, "user", "Write fib in Python.")
    reply_id = store.start_reply(session_id, model="tiny-coder", settings={"block_size": 8})

    [session_row] = list(store.database["sessions"].rows)
    assert session_row == {
        "id": session_id, "uuid": session_row["uuid"], "title": "Fibonacci", "created_at": clock.at(1),
        "updated_at": clock.at(3), "model": "tiny-coder", "settings": '{"temperature":0.0}',
    }
    assert len(session_row["uuid"]) == 32
    assert list(store.database["messages"].rows) == [
        {"id": user_id, "session_id": session_id, "seq": 1, "role": "user", "content": "Write fib in Python.",
         "status": "complete", "error": None, "kind": "chat", "model": "", "settings": "{}",
         "created_at": clock.at(2), "updated_at": clock.at(2), "prompt_tokens": None, "new_tokens": None,
         "tokens_per_s": None, "mean_tau": None, "prefill_ms": None, "decode_ms": None, "total_ms": None,
         "finish_reason": None, "reasoning": "", "reasoning_tokens": None},
        {"id": reply_id, "session_id": session_id, "seq": 2, "role": "assistant", "content": "",
         "status": "streaming", "error": None, "kind": "chat", "model": "tiny-coder",
         "settings": '{"block_size":8}', "created_at": clock.at(3), "updated_at": clock.at(3),
         "prompt_tokens": None, "new_tokens": None, "tokens_per_s": None, "mean_tau": None, "prefill_ms": None,
         "decode_ms": None, "total_ms": None, "finish_reason": None, "reasoning": "", "reasoning_tokens": None},
    ]
    assert store.get_session(session_id) == {
        "id": session_id, "uuid": session_row["uuid"], "title": "Fibonacci", "created_at": clock.at(1),
        "updated_at": clock.at(3), "model": "tiny-coder", "settings": {"temperature": 0.0}, "message_count": 2,
    }
    assert store.get_message(reply_id)["settings"] == {"block_size": 8}
    assert [m["id"] for m in store.get_messages(session_id)] == [user_id, reply_id]


def test_update_message_changes_fields_and_bumps_both_timestamps(store, clock):
    session_id = store.create_session()
    reply_id = store.start_reply(session_id)
    store.update_message(reply_id, content="def fib", status="error", error="OOM", new_tokens=3, tokens_per_s=9)
    message = store.get_message(reply_id)
    changed = {key: message[key] for key in ("content", "status", "error", "new_tokens", "tokens_per_s")}
    assert changed == {"content": "def fib", "status": "error", "error": "OOM", "new_tokens": 3, "tokens_per_s": 9.0}
    assert message["updated_at"] == clock.at(3) == store.get_session(session_id)["updated_at"]
    with pytest.raises(ValueError, match="unknown message field"):
        store.update_message(reply_id, colour="red")
    with pytest.raises(ValueError, match="new_tokens must be an integer"):
        store.update_message(reply_id, new_tokens="many")
    with pytest.raises(MessageNotFound, match="message 999 does not exist"):
        store.update_message(999, content="x")


def test_list_orders_by_last_update_and_counts_messages(store):
    first = store.create_session("first")
    second = store.create_session("second")
    third = store.create_session("third")
    store.add_message(first, "user", "bump first")
    assert [(s["id"], s["message_count"]) for s in store.list_sessions()] == [(first, 1), (third, 0), (second, 0)]
    assert [s["id"] for s in store.list_sessions(limit=2)] == [first, third]
    store.rename_session(second, "  renamed  ")
    assert [(s["id"], s["title"]) for s in store.list_sessions()][0] == (second, "renamed")
    store.update_session_settings(third, {"fallback": True})
    assert store.list_sessions()[0]["settings"] == {"fallback": True}
    assert store.count_sessions() == 3
    with pytest.raises(ValueError, match="non-empty"):
        store.rename_session(first, "   ")


def test_search_matches_words_of_titles_and_messages_ranked_and_highlighted(store):
    by_title = store.create_session("Quicksort in Rust")
    by_content = store.create_session("untitled")
    store.add_message(by_content, "user", "explain QUICKSORT please, and how quicksort picks its pivot")
    percent = store.create_session("100% coverage")
    vowels = store.create_session("strings")
    store.add_message(vowels, "assistant", "def count_vowels(text):\n    return sum(c in 'aeiou' for c in text)")
    store.create_session("nothing here")
    assert {s["id"] for s in store.search_sessions("quicksort")} == {by_content, by_title}
    assert {s["id"] for s in store.search_sessions("QUICK")} == {by_content, by_title}  # the start of a word
    assert [s["id"] for s in store.search_sessions("quicksort rust")] == [by_title]  # every word must match
    assert [s["id"] for s in store.search_sessions("100%")] == [percent]
    assert [s["id"] for s in store.search_sessions("count_vowels(")] == [vowels]  # code as typed: no FTS syntax
    for junk in ("_", '"', "(*)", "^", "*"):
        assert store.search_sessions(junk) == [], junk  # nothing to search for
    for syntax in ("NOT", "a OR", "title:x", "NEAR(", "x AND"):
        store.search_sessions(syntax)  # FTS5's own syntax is searched for as words, never an error
    assert [s.id for s in store.search_sessions("NOT")] == [store.list_sessions()[0].id]  # "nothing here"
    assert len(store.search_sessions("  ")) == 5
    found = {m.session.id: m for m in store.search("quicksort", marks=("<<", ">>"))}
    assert found[by_title].field == "title" and found[by_title].snippet == "<<Quicksort>> in Rust"
    assert found[by_content].field == "message" and "<<QUICKSORT>>" in found[by_content].snippet
    assert "def count_[vowels](text)" in store.search("vowels")[0].snippet  # the word inside the identifier


def test_search_ranks_the_session_that_is_more_about_the_words_first(store):
    passing = store.create_session("one")
    store.add_message(passing, "user", "write a parser for dates, then format them, and by the way the heap "
                                       "should stay small while you sort the list of dates by year")
    about = store.create_session("two")
    store.add_message(about, "user", "heap sort: build the heap, then pop the heap")
    store.add_message(passing, "assistant", "done")  # the later update does not outrank the better match
    assert [s.id for s in store.search_sessions("heap")] == [about, passing]


def test_the_search_index_follows_every_change(store):
    session = store.create_session("alpha")
    message = store.add_message(session, "user", "bravo")
    assert [s.id for s in store.search_sessions("alpha")] == [session]
    store.rename_session(session, "charlie")
    store.update_message(message, content="delta")
    assert store.search_sessions("alpha") == store.search_sessions("bravo") == []
    assert [s.id for s in store.search_sessions("charlie delta")] == []  # one field must hold every word
    assert [s.id for s in store.search_sessions("delta")] == [session]
    store.delete_session(session)  # its messages go by cascade: the index forgets them too
    assert store.search_sessions("delta") == store.search_sessions("charlie") == []
    assert store.database.execute("SELECT count(*) FROM messages_fts").fetchone()[0] == 0


def test_missing_sessions_raise_session_not_found(store):
    for call in (lambda: store.get_session(7), lambda: store.rename_session(7, "x"),
                 lambda: store.delete_session(7), lambda: store.add_message(7, "user", "hi"),
                 lambda: store.get_messages(7), lambda: store.session_stats(7), lambda: store.export_session(7),
                 lambda: store.update_session_settings(7, {})):
        with pytest.raises(SessionNotFound, match="session 7 does not exist"):
            call()
    assert list(store.database["messages"].rows) == []


@pytest.mark.parametrize("bad", [2**63, -(2**63) - 1, 10**30])
def test_ids_sqlite_cannot_hold_are_missing_rows_not_crashes(store, bad):
    # found by the long fuzz run: a page's remembered session id of 10**30 raised OverflowError
    for call in (lambda: store.get_session(bad), lambda: store.rename_session(bad, "x"),
                 lambda: store.delete_session(bad), lambda: store.add_message(bad, "user", "hi"),
                 lambda: store.get_messages(bad), lambda: store.session_stats(bad), lambda: store.export_session(bad),
                 lambda: store.update_session_settings(bad, {})):
        with pytest.raises(SessionNotFound):
            call()
    with pytest.raises(MessageNotFound):
        store.get_message(bad)


def test_add_message_with_a_stale_last_seq_is_refused_and_writes_nothing(store):
    session_id = store.create_session()
    store.add_message(session_id, "user", "one", expected_last_seq=0)
    store.add_message(session_id, "assistant", "two", expected_last_seq=1)
    with pytest.raises(StaleSessionError, match="last message is #2, this view expected #1"):
        store.add_message(session_id, "user", "from a stale tab", expected_last_seq=1)
    assert [m["content"] for m in store.get_messages(session_id)] == ["one", "two"]


def test_delete_session_cascades_to_messages_and_cycles(any_store):
    kept = any_store.create_session("kept")
    kept_reply = any_store.start_reply(kept)
    any_store.append_cycles(kept_reply, [make_cycle(1)])
    doomed = any_store.create_session("doomed")
    any_store.add_message(doomed, "user", "hi")
    reply = any_store.start_reply(doomed)
    any_store.append_cycles(reply, [make_cycle(1), make_cycle(2)])
    any_store.delete_session(doomed)
    db = any_store.database
    assert [row["id"] for row in db["sessions"].rows] == [kept]
    assert [row["id"] for row in db["messages"].rows] == [kept_reply]
    assert [row["message_id"] for row in db["cycles"].rows] == [kept_reply]
    assert db.execute("PRAGMA foreign_key_check").fetchall() == []


def test_delete_messages_after_removes_later_messages_and_their_cycles_and_reuses_seq(store):
    session_id = store.create_session()
    store.add_message(session_id, "user", "q1")
    first_reply = store.start_reply(session_id)
    store.add_message(session_id, "user", "q2")
    second_reply = store.start_reply(session_id)
    store.append_cycles(first_reply, [make_cycle(1)])
    store.append_cycles(second_reply, [make_cycle(1), make_cycle(2)])
    assert store.delete_messages_after(session_id, 2) == 2
    assert [(m["seq"], m["role"]) for m in store.get_messages(session_id)] == [(1, "user"), (2, "assistant")]
    assert [row["message_id"] for row in store.database["cycles"].rows] == [first_reply]
    assert store.get_message(store.add_message(session_id, "user", "q2 edited"))["seq"] == 3


def test_fork_copies_the_messages_before_a_point_with_cycles_and_leaves_the_original(store):
    session_id = store.create_session("Sorting", settings={"block_size": 4})
    store.add_message(session_id, "user", "q1", kind="chat")
    first_reply = store.start_reply(session_id)
    store.save_reply(first_reply, content="a1", status="complete", cycles=[make_cycle(1), make_cycle(2, 8, 0)])
    store.add_message(session_id, "user", "q2")
    before = store.export_session(session_id)["sessions"]
    copy = store.fork_session(session_id, 3)
    assert store.export_session(session_id)["sessions"] == before
    forked = store.get_session(copy)
    assert forked["title"] == "Sorting (edited)" and forked["settings"] == {"block_size": 4}
    kept = store.get_messages(copy)
    assert [(m["seq"], m["role"], m["content"]) for m in kept] == [(1, "user", "q1"), (2, "assistant", "a1")]
    assert store.get_cycles(kept[1]["id"]) == store.get_cycles(first_reply)
    assert store.get_session(store.fork_session(copy, 2))["title"] == "Sorting (edited)"  # marked once
    assert store.fork_session(session_id, 1, title="Empty copy") != copy
    with pytest.raises(SessionNotFound):
        store.fork_session(10_000, 1)


def _file_bytes(path: Path) -> bytes:
    return b"".join(f.read_bytes() for f in (path, path.with_name(path.name + "-wal")) if f.exists())


def test_deleted_text_is_gone_from_the_database_file_and_its_log(tmp_path):
    path = tmp_path / "sessions.db"
    secret, kept = "my-secret-token-7f3a9c", "a-message-to-keep-51e2"
    with SessionStore(path) as store:
        doomed = store.create_session("Private")
        store.add_message(doomed, "user", secret * 20)
        reply = store.start_reply(doomed)
        store.save_reply(reply, content=secret, status="complete", cycles=[make_cycle(1)])
        store.add_message(store.create_session("Keep"), "user", kept)
        assert secret.encode() in _file_bytes(path)
        store.delete_session(doomed)
        assert secret.encode() not in _file_bytes(path)  # not in free pages, not in the WAL
        assert kept.encode() in _file_bytes(path)
        store.add_message(store.create_session("Another"), "user", secret)
        assert store.delete_all_sessions() == 2
        assert secret.encode() not in _file_bytes(path) and kept.encode() not in _file_bytes(path)
        assert store.count_sessions() == 0


# -- cycles --


def test_cycles_round_trip_equal_to_the_engine_dicts(any_store):
    reply = any_store.start_reply(any_store.create_session())
    cycles = [make_cycle(1, 8, 7), make_cycle(2, 8, 0), make_cycle(3, 4, 2, fallback_state="reduced", changed=True,
              next_block_size=1), make_cycle(4, 1, 0, fallback_state="off"), make_cycle(5, 8, 3, cut=True)]
    any_store.append_cycles(reply, cycles[:2])
    any_store.append_cycles(reply, cycles[2:])
    assert any_store.get_cycles(reply) == cycles
    row = any_store.database.execute(
        "SELECT idx, block_size, accepted, tau, bonus, fallback_state, fallback_changed, next_block_size, "
        "fallback_reason, extra FROM cycles WHERE idx = 3").fetchone()
    # a key the columns do not hold (Cycle.cost_in_plain_steps) lives in ``extra``
    assert row == (3, 4, 2, 3, 905, "reduced", 1, 1, "τ 2.1 over the last 8 cycles", '{"cost_in_plain_steps":null}')


def test_cycle_keys_storage_does_not_know_come_back_unchanged(store):
    reply = store.start_reply(store.create_session())
    cycle = make_cycle(1) | {"entropy": [0.5, 0.25]}
    cycle["fallback"] = cycle["fallback"] | {"expected_speedup": 1.6}
    store.append_cycles(reply, [cycle])
    assert store.get_cycles(reply) == [cycle]


def test_bad_cycles_are_refused_before_anything_is_written(store):
    reply = store.start_reply(store.create_session())
    with pytest.raises(ValueError, match="cycle is missing accepted"):
        store.append_cycles(reply, [make_cycle(1), {"index": 2, "block_size": 8}])
    with pytest.raises(ValueError, match="cycle accepted must be an integer"):
        store.append_cycles(reply, [make_cycle(1) | {"accepted": "3"}])
    store.append_cycles(reply, [make_cycle(1)])
    with pytest.raises(ValueError, match="already has a cycle"):
        store.append_cycles(reply, [make_cycle(2), make_cycle(1)])
    assert [c["index"] for c in store.get_cycles(reply)] == [1]
    with pytest.raises(MessageNotFound):
        store.append_cycles(404, [make_cycle(1)])


# -- statistics: SQL against a plain Python computation --


def python_stats(cycles: list[dict]) -> dict:
    """The reference: the same statistics, computed naively in Python from the cycle dicts."""
    if not cycles:
        return {"cycles": 0, "tokens": 0, "mean_tau": None}
    return {
        "cycles": len(cycles),
        "tokens": sum(c["tau"] for c in cycles),
        "mean_tau": sum(c["tau"] for c in cycles) / len(cycles),
        "draft_ms": sum(c["draft_ms"] for c in cycles),
        "verify_ms": sum(c["verify_ms"] for c in cycles),
    }


def random_cycles(rng: random.Random, count: int) -> list[dict]:
    cycles = []
    for index in range(1, count + 1):
        block_size = rng.choice([1, 4, 8, 8, 16])
        accepted = rng.randint(0, block_size - 1)
        cycles.append(make_cycle(index, block_size, accepted, cut=rng.random() < 0.1 and accepted > 0))
    return cycles


def assert_stats_match(actual: dict, expected: dict) -> None:
    for key, value in expected.items():
        if isinstance(value, float):
            assert actual[key] == pytest.approx(value), key
        else:
            assert actual[key] == value, key


def test_message_and_session_stats_in_sql_equal_the_python_reference(store):
    rng = random.Random(1234)
    session_id = store.create_session()
    replies = []
    for _ in range(3):
        store.add_message(session_id, "user", "go")
        reply = store.start_reply(session_id)
        cycles = random_cycles(rng, rng.randint(5, 40))
        store.append_cycles(reply, cycles)
        store.update_message(reply, status="complete", new_tokens=sum(c["tau"] for c in cycles) + 1,
                             total_ms=10.0 * len(cycles), tokens_per_s=123.5)
        replies.append((reply, cycles))
    empty_reply = store.start_reply(session_id)

    for reply, cycles in replies:
        stats = store.message_stats(reply)
        assert_stats_match(stats, python_stats(cycles))
        assert stats["tokens_per_s"] == 123.5
        assert stats["acceptance_rate"] == pytest.approx(
            sum(c["accepted"] for c in cycles) / sum(c["block_size"] - 1 for c in cycles))
    assert_stats_match(store.message_stats(empty_reply), python_stats([]))

    every_cycle = [cycle for _, cycles in replies for cycle in cycles]
    session = store.session_stats(session_id)
    assert_stats_match(session, python_stats(every_cycle))
    all_new_tokens = sum(sum(c["tau"] for c in cycles) + 1 for _, cycles in replies)
    assert session["tokens_per_s"] == pytest.approx(all_new_tokens / (10.0 * len(every_cycle) / 1000))
    assert [(r["message_id"], r["cycles"], r["tokens"]) for r in session["replies"]] == [
        (reply, len(cycles), sum(c["tau"] for c in cycles)) for reply, cycles in replies
    ] + [(empty_reply, 0, 0)]
    for summary, (_, cycles) in zip(session["replies"], replies, strict=False):
        assert summary["mean_tau"] == pytest.approx(python_stats(cycles)["mean_tau"])
        assert summary["max_block_size"] == max(c["block_size"] for c in cycles)
    assert len(store.session_cycle_series(session_id)) == len(every_cycle)


def test_stats_on_a_hand_worked_example(store):
    reply = store.start_reply(store.create_session())
    # block 4 accepting 3, block 4 accepting 1, block 2 accepting 0, block 1 (no drafts)
    store.append_cycles(reply, [make_cycle(1, 4, 3), make_cycle(2, 4, 1), make_cycle(3, 2, 0), make_cycle(4, 1, 0)])
    stats = store.message_stats(reply)
    assert (stats["cycles"], stats["tokens"], stats["mean_tau"]) == (4, 8, 2.0)
    assert stats["acceptance_rate"] == pytest.approx(4 / 7)
    assert "per_position_acceptance" not in stats  # one home: engine.acceptance (tests/test_acceptance.py)


# -- the reply writer and the durability contract --


class ManualClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_reply_writer_flushes_at_most_once_per_interval(store):
    from storage import ReplyWriter

    reply = store.start_reply(store.create_session())
    monotonic = ManualClock()
    writer = ReplyWriter(store, reply, flush_interval_s=1.0, clock=monotonic)
    writer.add_cycle(make_cycle(1))
    writer.set_content("def")
    assert writer.maybe_flush() is False
    assert store.get_message(reply)["content"] == "" and store.get_cycles(reply) == []
    monotonic.now = 1.0
    assert writer.maybe_flush() is True
    assert store.get_message(reply)["content"] == "def" and len(store.get_cycles(reply)) == 1
    monotonic.now = 5.0
    assert writer.maybe_flush() is False  # nothing new to save
    writer.set_content("def fib")
    assert writer.maybe_flush() is True
    assert store.get_message(reply)["status"] == "streaming"


def test_finish_saves_text_cycles_status_and_stats_in_one_transaction(store):
    reply = store.start_reply(store.create_session())
    writer = store.reply_writer(reply, flush_interval_s=60)
    for index in (1, 2):
        writer.add_cycle(make_cycle(index))
    writer.set_content("def fib(n):")
    finished = {"type": "Finished", "reason": "stop", "token_ids": list(range(9)), "text": "def fib(n):",
                "acceptance_lengths": [4, 4], "prompt_tokens": 12, "prefill_ms": 5.0, "decode_ms": 20.0,
                "total_ms": 25.0, "cycles": 2, "per_position_acceptance": [1.0, 1.0, 1.0, 0.0],
                "mean_acceptance_length": 4.0, "tokens_per_s": 360.0}
    statements = []
    with store.database.tracer(lambda sql, params: statements.append(sql)):
        writer.finish("complete", finished)
    assert statements.count("BEGIN IMMEDIATE") == 1 and statements.count("COMMIT") == 1
    message = store.get_message(reply)
    assert {key: message[key] for key in ("content", "status", "prompt_tokens", "new_tokens", "tokens_per_s",
                                          "mean_tau", "prefill_ms", "decode_ms", "total_ms", "finish_reason")} == {
        "content": "def fib(n):", "status": "complete", "prompt_tokens": 12, "new_tokens": 9, "tokens_per_s": 360.0,
        "mean_tau": 4.0, "prefill_ms": 5.0, "decode_ms": 20.0, "total_ms": 25.0, "finish_reason": "stop"}
    assert [c["index"] for c in store.get_cycles(reply)] == [1, 2]
    with pytest.raises(ValueError, match="already finished"):
        writer.add_cycle(make_cycle(3))
    with pytest.raises(ValueError, match="unknown stat 'speed'"):
        store.reply_writer(reply).finish("complete", {"speed": 3})


def test_writer_used_as_context_manager_records_interruption_or_error(store):
    session_id = store.create_session()
    stopped = store.start_reply(session_id)
    with store.reply_writer(stopped) as writer:
        writer.set_content("partial")
    crashed = store.start_reply(session_id)
    with pytest.raises(RuntimeError), store.reply_writer(crashed) as writer:
        writer.set_content("half")
        raise RuntimeError("CUDA out of memory")
    assert [(m["content"], m["status"], m["error"]) for m in store.get_messages(session_id)] == [
        ("partial", "interrupted", None), ("half", "error", "RuntimeError: CUDA out of memory")]


def test_a_failed_flush_keeps_everything_pending_and_a_retry_saves_it(disk_store):
    db = disk_store.database
    reply = disk_store.start_reply(disk_store.create_session())
    writer = disk_store.reply_writer(reply, flush_interval_s=0)
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    db.execute(f"PRAGMA max_page_count = {pages}")  # the disk is "full"
    writer.add_cycle(make_cycle(1))
    writer.set_content("x" * 100_000)
    with pytest.raises(SaveFailed, match="could not save .*full"):
        writer.maybe_flush()
    assert disk_store.get_message(reply)["content"] == "" and disk_store.get_cycles(reply) == []
    db.execute("PRAGMA max_page_count = 1000000")
    writer.finish("complete")
    assert disk_store.get_message(reply)["content"] == "x" * 100_000
    assert len(disk_store.get_cycles(reply)) == 1
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_reopening_marks_streaming_replies_interrupted_and_keeps_their_text(tmp_path):
    path = tmp_path / "sessions.db"
    first = SessionStore(path)
    session_id = first.create_session()
    user = first.add_message(session_id, "user", "prompt")
    reply = first.start_reply(session_id)
    first.save_reply(reply, content="half an answer", cycles=[make_cycle(1)])
    first.close()

    with SessionStore(path, recover=False) as cli_view:  # a tool next to a running app changes nothing
        assert cli_view.recovered == 0 and cli_view.get_message(reply)["status"] == "streaming"
    with SessionStore(path) as reopened:
        assert reopened.recovered == 1
        assert [(m["id"], m["content"], m["status"]) for m in reopened.get_messages(session_id)] == [
            (user, "prompt", "complete"), (reply, "half an answer", "interrupted")]
        assert len(reopened.get_cycles(reply)) == 1
    with SessionStore(path) as again:
        assert again.recovered == 0


def test_every_write_is_visible_to_a_fresh_connection_when_it_returns(disk_store):
    import sqlite3

    session_id = disk_store.create_session()
    user = disk_store.add_message(session_id, "user", "durable prompt")
    with sqlite3.connect(disk_store.path) as other:
        assert other.execute("SELECT content FROM messages WHERE id = ?", [user]).fetchone() == ("durable prompt",)


# -- concurrency --


def test_eight_threads_writing_through_one_store_never_fail_and_lose_nothing(any_store):
    session_id = any_store.create_session("shared")
    errors: list[BaseException] = []
    start = threading.Barrier(10)

    def write(thread: int) -> None:
        try:
            start.wait()
            own_session = any_store.create_session(f"thread {thread}")
            for i in range(50):
                any_store.add_message(session_id, "user", f"{thread}:{i}")
                if i % 10 == 0:
                    reply = any_store.start_reply(own_session)
                    any_store.append_cycles(reply, [make_cycle(1), make_cycle(2)])
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    def read() -> None:
        try:
            start.wait()
            for _ in range(30):
                any_store.list_sessions()
                any_store.session_stats(session_id)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(t,)) for t in range(8)] + [
        threading.Thread(target=read) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == []
    messages = any_store.get_messages(session_id)
    assert [m["seq"] for m in messages] == list(range(1, 401))
    assert sorted(m["content"] for m in messages) == sorted(f"{t}:{i}" for t in range(8) for i in range(50))
    assert any_store.database.execute("SELECT count(*) FROM cycles").fetchone()[0] == 8 * 5 * 2


def test_two_stores_on_one_file_take_turns_instead_of_failing(tmp_path):
    path = tmp_path / "sessions.db"
    stores = [SessionStore(path), SessionStore(path, recover=False)]
    session_id = stores[0].create_session()
    errors: list[BaseException] = []

    def write(store: SessionStore, thread: int) -> None:
        try:
            for i in range(25):
                store.add_message(session_id, "user", f"{thread}:{i}")
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(stores[t % 2], t)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert [m["seq"] for m in stores[1].get_messages(session_id)] == list(range(1, 101))
    for store in stores:
        store.close()


# -- export and import --


def populate(store: SessionStore) -> list[int]:
    rng = random.Random(7)
    first = store.create_session("Fibonacci", model="tiny-coder", settings={"temperature": 0.0, "block_size": 8})
    store.add_message(first, "system", "You are a coder.")
    store.add_message(first, "user", "fib ✓ please")
    reply = store.start_reply(first, model="tiny-coder", settings={"block_size": 8})
    writer = store.reply_writer(reply, flush_interval_s=0)
    for cycle in random_cycles(rng, 12):
        writer.add_cycle(cycle)
    writer.set_content("def fib(n):\n    return n")
    writer.finish("complete", {"reason": "stop", "total_ms": 40.0, "tokens_per_s": 300.0})
    store.save_comparison(reply, {"identical": True, "plain": {"tokens_per_s": 120.0, "token_times_ms": [3.0, 6.5]}})
    second = store.create_session("Stopped")
    store.add_message(second, "user", "long one")
    store.start_reply(second, kind="complete")  # left streaming
    store.create_session("Empty")
    return [first, second]


def test_export_import_round_trip_is_equal_in_a_fresh_database(disk_store, tmp_path):
    populate(disk_store)
    document = disk_store.export_all()
    assert (document["format"], document["version"]) == (EXPORT_FORMAT, EXPORT_VERSION)
    assert [len(s["messages"]) for s in document["sessions"]] == [3, 2, 0]
    json_text = json.dumps(document)  # JSON-ready
    with SessionStore(tmp_path / "fresh.db") as fresh:
        ids = fresh.import_data(json.loads(json_text))
        assert len(ids) == 3
        exported_again = fresh.export_all()
    expected = json.loads(json_text)["sessions"]
    expected[1]["messages"][1]["status"] = "interrupted"  # a streaming reply cannot stay streaming elsewhere
    assert exported_again["sessions"] == expected


def test_a_reply_carries_its_comparison_through_export_and_import_and_old_documents_still_import(store):
    first, _ = populate(store)
    reply = store.get_messages(first)[2]["id"]
    document = store.export_session(first)
    assert document["sessions"][0]["messages"][2]["comparison"] == store.get_comparison(reply)
    with SessionStore(":memory:") as other:
        [copy] = other.import_data(document)
        assert other.get_comparison(other.get_messages(copy)[2]["id"]) == store.get_comparison(reply)
    old = json.loads(json.dumps(document))
    old["version"] = 1
    del old["sessions"][0]["messages"][2]["comparison"]
    with SessionStore(":memory:") as other:
        [copy] = other.import_data(old)
        assert other.get_comparison(other.get_messages(copy)[2]["id"]) is None
    document["sessions"][0]["messages"][2]["comparison"] = ["not", "a", "dict"]
    with SessionStore(":memory:") as other, pytest.raises(ImportFormatError, match=r"messages\[2\]\.comparison: expected dict"):
        other.import_data(document)


def test_export_session_holds_one_session_with_cycles(store):
    first, _ = populate(store)
    document = store.export_session(first)
    [session] = document["sessions"]
    assert session["title"] == "Fibonacci"
    assert len(session["messages"][2]["cycles"]) == 12
    assert session["messages"][2]["cycles"] == store.get_cycles(store.get_messages(first)[2]["id"])


def test_importing_twice_creates_no_duplicates(store):
    populate(store)
    document = store.export_all()
    with SessionStore(":memory:") as other:
        first_ids = other.import_data(document)
        counts = {table: other.database[table].count for table in ("sessions", "messages", "cycles")}
        assert other.import_data(document) == first_ids
        assert {table: other.database[table].count for table in ("sessions", "messages", "cycles")} == counts
    assert store.import_data(document) == [s["id"] for s in sorted(store.list_sessions(), key=lambda s: s["id"])]


def broken_documents(valid: dict) -> list[tuple[str, dict | list | str]]:
    def changed(edit) -> dict:
        document = json.loads(json.dumps(valid))
        edit(document)
        return document

    return [
        ("expected a JSON object", ["not", "an", "object"]),
        ("format: expected 'dflash-studio-sessions'", changed(lambda d: d.update(format="other-app"))),
        ("version: 99 is newer", changed(lambda d: d.update(version=99))),
        ("missing 'sessions'", changed(lambda d: d.pop("sessions"))),
        ("sessions\\[1\\].uuid: '.*' appears twice",
         changed(lambda d: d["sessions"][1].update(uuid=d["sessions"][0]["uuid"]))),
        ("sessions\\[0\\].messages\\[1\\]: role must be one of",
         changed(lambda d: d["sessions"][0]["messages"][1].update(role="bot"))),
        ("sessions\\[0\\].messages\\[2\\].cycles\\[3\\]: cycle is missing accepted",
         changed(lambda d: d["sessions"][0]["messages"][2]["cycles"][3].pop("accepted"))),
        ("sessions\\[2\\]: unknown key\\(s\\) 'colour'", changed(lambda d: d["sessions"][2].update(colour="red"))),
        ("sessions\\[0\\].messages\\[0\\].seq", changed(lambda d: d["sessions"][0]["messages"][0].update(seq="1"))),
        ("tokens_per_s must be a number",
         changed(lambda d: d["sessions"][0]["messages"][2].update(tokens_per_s="fast"))),
    ]


def test_malformed_imports_are_rejected_with_a_clear_error_and_nothing_written(store):
    populate(store)
    valid = store.export_all()
    # the last session is new to the target, so a partial write would be visible
    valid["sessions"][-1]["uuid"] = "f" * 32
    with SessionStore(":memory:") as target:
        target.create_session("already here")
        before = {table: list(target.database[table].rows) for table in ("sessions", "messages", "cycles")}
        for message, document in broken_documents(valid):
            with pytest.raises(ImportFormatError, match=f"^not a valid dflash-studio sessions export: .*{message}"):
                target.import_data(document)
            assert {table: list(target.database[table].rows) for table in before} == before, message


def test_default_db_path_follows_the_environment_variable_or_the_user_data_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("DFLASH_STUDIO_DB", str(tmp_path / "custom.db"))
    assert default_db_path() == tmp_path / "custom.db"
    monkeypatch.delenv("DFLASH_STUDIO_DB")
    import platformdirs

    assert default_db_path() == Path(platformdirs.user_data_dir("dflash-studio", appauthor=False)) / "sessions.db"


def test_a_closed_store_refuses_use_and_closing_twice_is_harmless(tmp_path):
    from storage import StoreError

    store = SessionStore(tmp_path / "sessions.db")
    store.close()
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.list_sessions()
    assert not (tmp_path / "sessions.db-wal").exists() or (tmp_path / "sessions.db-wal").stat().st_size == 0


def test_a_file_that_is_not_a_database_gives_a_clear_error(tmp_path):
    from storage import StoreError

    path = tmp_path / "notes.db"
    path.write_bytes(b"these are my notes, not SQLite" * 100)
    with pytest.raises(StoreError, match="cannot open the session database .*notes.db: file is not a database"):
        SessionStore(path)


# -- the package stays a leaf --


def test_storage_imports_only_the_standard_library_sqlite_utils_and_platformdirs():
    allowed = set(sys.stdlib_module_names) | {"sqlite_utils", "platformdirs", "__future__"}
    for source in (REPO_ROOT / "storage").glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            assert {name.split(".")[0] for name in names} <= allowed, f"{source.name} imports {names}"
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, storage; print(' '.join(sorted(sys.modules)))"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=True,
    ).stdout.split()
    assert not {name.split(".")[0] for name in loaded} & {"torch", "engine", "ui", "app", "gradio", "transformers"}
