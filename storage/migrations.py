"""Schema migrations: an ordered list of ``(name, function)`` pairs, each applied once.

Each migration runs in its own ``BEGIN IMMEDIATE`` transaction together with the row that records
it in ``_migrations``; if it raises, both are rolled back and the database is exactly as before.
Released migrations are never edited: a schema change is a new function appended to the list.
A database that records a migration this code does not know was written by a newer version and
is refused rather than guessed at.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timezone

import sqlite_utils

from .errors import MigrationError

MIGRATIONS_TABLE = "_migrations"

Migration = tuple[str, Callable[[sqlite_utils.Database], None]]


def m001_sessions_messages_cycles(db: sqlite_utils.Database) -> None:
    """The base schema: sessions, their messages, and one row per draft+verify cycle of a reply."""
    db.execute(
        """
        CREATE TABLE sessions (
            id INTEGER PRIMARY KEY,
            uuid TEXT NOT NULL UNIQUE,
            title TEXT NOT NULL,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            model TEXT NOT NULL DEFAULT '',
            settings TEXT NOT NULL DEFAULT '{}'
        )
        """
    )
    db.execute(
        """
        CREATE TABLE messages (
            id INTEGER PRIMARY KEY,
            session_id INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
            seq INTEGER NOT NULL,
            role TEXT NOT NULL CHECK (role IN ('user', 'assistant', 'system')),
            content TEXT NOT NULL DEFAULT '',
            status TEXT NOT NULL DEFAULT 'complete'
                CHECK (status IN ('streaming', 'complete', 'interrupted', 'error')),
            error TEXT,
            kind TEXT NOT NULL DEFAULT 'chat',
            model TEXT NOT NULL DEFAULT '',
            settings TEXT NOT NULL DEFAULT '{}',
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            prompt_tokens INTEGER,
            new_tokens INTEGER,
            tokens_per_s REAL,
            mean_tau REAL,
            prefill_ms REAL,
            decode_ms REAL,
            total_ms REAL,
            finish_reason TEXT,
            UNIQUE (session_id, seq)
        )
        """
    )
    db.execute(
        """
        CREATE TABLE cycles (
            id INTEGER PRIMARY KEY,
            message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
            idx INTEGER NOT NULL,
            block_size INTEGER NOT NULL,
            accepted INTEGER NOT NULL,
            tau INTEGER NOT NULL,
            bonus INTEGER,
            anchor INTEGER,
            anchor_position INTEGER,
            draft_ms REAL,
            verify_ms REAL,
            fallback_state TEXT,
            fallback_reason TEXT,
            fallback_changed INTEGER,
            next_block_size INTEGER,
            context_length INTEGER,
            new_context_features INTEGER,
            draft_tokens TEXT NOT NULL DEFAULT '[]',
            emitted TEXT NOT NULL DEFAULT '[]',
            emitted_pieces TEXT NOT NULL DEFAULT '[]',
            rejected TEXT NOT NULL DEFAULT '[]',
            rejected_pieces TEXT NOT NULL DEFAULT '[]',
            slots TEXT NOT NULL DEFAULT '[]',
            extra TEXT,
            UNIQUE (message_id, idx)
        )
        """
    )


def m002_listing_and_recovery_indexes(db: sqlite_utils.Database) -> None:
    """Indexes for the session list (newest first) and the startup scan for 'streaming' replies."""
    db.execute("CREATE INDEX idx_sessions_updated_at ON sessions (updated_at)")
    db.execute("CREATE INDEX idx_messages_status ON messages (status)")


def m003_preferences(db: sqlite_utils.Database) -> None:
    """The user's preferences by name (a JSON value each): the settings a new session starts from."""
    db.execute("CREATE TABLE preferences (name TEXT PRIMARY KEY, value TEXT NOT NULL, updated_at TEXT NOT NULL)")


def m004_comparisons(db: sqlite_utils.Database) -> None:
    """What Compare measured for a reply (plain decoding re-run, DFlash re-run): one JSON record per
    reply, the latest; it goes when its reply goes."""
    db.execute(
        """
        CREATE TABLE comparisons (
            message_id INTEGER PRIMARY KEY REFERENCES messages(id) ON DELETE CASCADE,
            created_at TEXT NOT NULL,
            data TEXT NOT NULL
        )
        """
    )


def m005_message_reasoning(db: sqlite_utils.Database) -> None:
    """A reasoning model's reasoning, kept apart from the reply's content (the answer), and how many
    of the reply's tokens it took."""
    db.execute("ALTER TABLE messages ADD COLUMN reasoning TEXT NOT NULL DEFAULT ''")
    db.execute("ALTER TABLE messages ADD COLUMN reasoning_tokens INTEGER")


def m006_search_index(db: sqlite_utils.Database) -> None:
    """Full-text search over session titles and message text: SQLite FTS5 indexes made by
    sqlite-utils' ``enable_fts``, which fills them from what is already stored (a database from an
    older version gets its index here) and adds triggers that keep them current on every insert,
    update and delete (a cascade from a deleted session included)."""
    db["sessions"].enable_fts(["title"], create_triggers=True)
    db["messages"].enable_fts(["content"], create_triggers=True)


MIGRATIONS: tuple[Migration, ...] = (
    ("m001_sessions_messages_cycles", m001_sessions_messages_cycles),
    ("m002_listing_and_recovery_indexes", m002_listing_and_recovery_indexes),
    ("m003_preferences", m003_preferences),
    ("m004_comparisons", m004_comparisons),
    ("m005_message_reasoning", m005_message_reasoning),
    ("m006_search_index", m006_search_index),
)


def applied_migrations(db: sqlite_utils.Database) -> list[str]:
    """Names of the migrations recorded in this database, in the order they were applied."""
    if not db[MIGRATIONS_TABLE].exists():
        return []
    return [row["name"] for row in db.query(f"SELECT name FROM {MIGRATIONS_TABLE} ORDER BY rowid")]


def apply_migrations(db: sqlite_utils.Database, migrations: Sequence[Migration] = MIGRATIONS) -> list[str]:
    """Apply every pending migration in order, each in its own transaction; return the names applied."""
    names = [name for name, _ in migrations]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate migration names in {names}")
    db.execute(
        f"CREATE TABLE IF NOT EXISTS {MIGRATIONS_TABLE} (name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)"
    )
    unknown = [name for name in applied_migrations(db) if name not in names]
    if unknown:
        raise MigrationError(
            "this session database was written by a newer version of dflash-studio "
            f"(unknown migrations: {', '.join(unknown)}); upgrade dflash-studio or use another --db"
        )
    newly_applied = []
    for name, migrate in migrations:
        db.execute("BEGIN IMMEDIATE")  # take the write lock first: another process may be migrating too
        try:
            if db.execute(f"SELECT 1 FROM {MIGRATIONS_TABLE} WHERE name = ?", [name]).fetchone():
                db.execute("COMMIT")
                continue
            migrate(db)
            db.execute(
                f"INSERT INTO {MIGRATIONS_TABLE} (name, applied_at) VALUES (?, ?)",
                [name, datetime.now(timezone.utc).isoformat()],
            )
            db.execute("COMMIT")
        except BaseException as exc:
            db.rollback()
            if isinstance(exc, Exception):
                raise MigrationError(f"migration {name} failed and was rolled back: {exc}") from exc
            raise
        newly_applied.append(name)
    return newly_applied
