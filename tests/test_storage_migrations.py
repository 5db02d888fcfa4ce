"""Migrations: from an empty file, from every earlier version, rollback on failure, newer databases."""

from __future__ import annotations

import sqlite3

import pytest
import sqlite_utils

from storage import MigrationError, SessionStore
from storage.migrations import MIGRATIONS, applied_migrations, apply_migrations
from tests.storage_helpers import make_cycle

ALL_NAMES = [name for name, _ in MIGRATIONS]


def schema(path) -> list[tuple]:
    """Every table, index and trigger with its SQL: the whole schema, comparable across files."""
    with sqlite3.connect(path) as connection:
        return connection.execute(
            "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_stat%' ORDER BY name"
        ).fetchall()


def rows(path) -> dict[str, list[tuple]]:
    with sqlite3.connect(path) as connection:
        return {table: connection.execute(f"SELECT * FROM {table} ORDER BY rowid").fetchall()
                for table in ("sessions", "messages", "cycles")
                if connection.execute("SELECT 1 FROM sqlite_master WHERE name = ?", [table]).fetchone()}


@pytest.fixture
def fresh_schema(tmp_path):
    path = tmp_path / "fresh.db"
    SessionStore(path).close()
    return schema(path)


def test_an_empty_file_gets_every_migration_in_order(tmp_path, fresh_schema):
    path = tmp_path / "empty.db"
    path.touch()
    with SessionStore(path) as store:
        assert store.applied_migrations() == ALL_NAMES
        applied_at = [row["applied_at"] for row in store.database["_migrations"].rows]
        assert applied_at == sorted(applied_at)
    assert schema(path) == fresh_schema
    with SessionStore(path) as reopened:  # nothing left to apply
        assert reopened.applied_migrations() == ALL_NAMES


@pytest.mark.parametrize("version", range(1, len(MIGRATIONS)), ids=lambda v: f"from-v{v}")
def test_every_earlier_version_upgrades_to_the_current_schema_keeping_its_data(tmp_path, fresh_schema, version):
    path = tmp_path / f"v{version}.db"
    old = sqlite_utils.Database(path)
    apply_migrations(old, MIGRATIONS[:version])
    # data written while the file was at that version, straight into its tables
    old.execute("INSERT INTO sessions (id, uuid, title, created_at, updated_at) VALUES (1, 'u1', 'old', 't0', 't1')")
    old.execute(
        "INSERT INTO messages (id, session_id, seq, role, content, status, created_at, updated_at) "
        "VALUES (1, 1, 1, 'assistant', 'partial', 'streaming', 't0', 't1')"
    )
    old.execute("INSERT INTO cycles (message_id, idx, block_size, accepted, tau) VALUES (1, 1, 8, 3, 4)")
    assert applied_migrations(old) == ALL_NAMES[:version]
    old.close()

    with SessionStore(path) as upgraded:
        assert upgraded.applied_migrations() == ALL_NAMES
        assert upgraded.recovered == 1
        assert upgraded.get_message(1)["content"] == "partial"
        assert upgraded.get_message(1)["status"] == "interrupted"
        assert upgraded.message_stats(1)["mean_tau"] == 4.0
        # the search index is built for what was stored before it existed, and kept current after
        assert [s.id for s in upgraded.search_sessions("old")] == [1]
        assert [s.id for s in upgraded.search_sessions("partial")] == [1]
        upgraded.update_message(1, content="finished")
        assert upgraded.search_sessions("partial") == [] and [s.id for s in upgraded.search_sessions("finished")] == [1]
    assert schema(path) == fresh_schema


def test_a_failing_migration_rolls_back_and_leaves_the_database_as_before(tmp_path):
    path = tmp_path / "sessions.db"
    with SessionStore(path) as store:
        reply = store.start_reply(store.create_session())
        store.append_cycles(reply, [make_cycle(1)])
    schema_before, rows_before = schema(path), rows(path)

    def m003_half_done(db: sqlite_utils.Database) -> None:
        db.execute("ALTER TABLE messages ADD COLUMN rating INTEGER")
        db.execute("UPDATE messages SET content = 'clobbered'")
        db.execute("CREATE TABLE attachments (id INTEGER PRIMARY KEY)")
        raise RuntimeError("disk caught fire halfway")

    broken = MIGRATIONS + (("m003_half_done", m003_half_done),)
    with pytest.raises(MigrationError, match="migration m003_half_done failed and was rolled back: disk caught fire"):
        SessionStore(path, migrations=broken)
    assert schema(path) == schema_before
    assert rows(path) == rows_before
    assert applied_migrations(sqlite_utils.Database(path)) == ALL_NAMES  # m003 is still pending

    def m003_fixed(db: sqlite_utils.Database) -> None:
        db.execute("ALTER TABLE messages ADD COLUMN rating INTEGER")

    with SessionStore(path, migrations=MIGRATIONS + (("m003_half_done", m003_fixed),)) as store:
        assert store.applied_migrations() == [*ALL_NAMES, "m003_half_done"]
        assert "rating" in store.database["messages"].columns_dict


def test_a_database_from_a_newer_version_is_refused_without_writing(tmp_path):
    path = tmp_path / "sessions.db"
    with SessionStore(path) as store:
        store.start_reply(store.create_session())  # a streaming reply recovery would touch
        store.database.execute("INSERT INTO _migrations VALUES ('m099_from_the_future', 'later')")
    before = rows(path)
    with pytest.raises(MigrationError, match="written by a newer version of dflash-studio .*m099_from_the_future"):
        SessionStore(path)
    assert rows(path) == before


def test_duplicate_migration_names_are_a_programming_error():
    with pytest.raises(ValueError, match="duplicate migration names"):
        apply_migrations(sqlite_utils.Database(memory=True), MIGRATIONS + MIGRATIONS[:1])
