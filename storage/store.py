"""``SessionStore``: sessions, messages and decoding cycles in one SQLite file.

A thin class over ``sqlite_utils.Database`` whose constructor applies the migrations and then
recovers replies a crash left 'streaming'. It knows nothing of the engine or the UI: cycles are the
engine's plain dicts, settings and stats are plain dicts.

Concurrency: the store owns ONE connection (``check_same_thread=False``) and every use of it holds
one lock, so Gradio's worker threads take turns instead of meeting "database is locked". Writes
run in ``BEGIN IMMEDIATE`` transactions that commit before the method returns; another process on
the same file (the CLI next to a running app) waits up to the busy timeout for its turn.

Durability: WAL journal, ``synchronous=FULL`` by default (a commit survives an OS crash or power
loss, not just an app crash), foreign keys on so that deleting a session deletes its messages and
their cycles.
"""

from __future__ import annotations

import functools
import importlib.metadata
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import sqlite_utils

from .cycles import decode_cycle, encode_cycle
from .errors import (
    MessageNotFound,
    SaveFailed,
    SessionNotFound,
    StaleSessionError,
    StoreError,
)
from .fields import (
    check_role,
    check_status,
    message_columns,
    settings_from_json,
    settings_to_json,
)
from .migrations import MIGRATIONS, Migration, applied_migrations, apply_migrations
from .records import Message, Session, SessionMatch
from .transfer import EXPORT_FORMAT, EXPORT_VERSION, MESSAGE_KEYS, check_document
from .writer import ReplyWriter


# Totals over a set of cycles (per-position acceptance and the τ histogram: engine.acceptance).
CYCLE_TOTALS = (
    "count(*) AS cycles, coalesce(sum(tau), 0) AS tokens, avg(tau) AS mean_tau, "
    "coalesce(sum(draft_ms), 0.0) AS draft_ms, coalesce(sum(verify_ms), 0.0) AS verify_ms, "
    "CAST(sum(accepted) AS REAL) / nullif(sum(block_size - 1), 0) AS acceptance_rate"
)


def _require_sqlite_utils_4() -> None:
    """sqlite-utils 3.x commits inside a caller's transaction (``with conn:``); 4.x nests savepoints."""
    try:
        major = int(importlib.metadata.version("sqlite-utils").split(".")[0])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return
    if major < 4:
        raise ImportError("dflash-studio's storage needs sqlite-utils >= 4.0: pip install 'sqlite-utils>=4'")


_require_sqlite_utils_4()

BUSY_TIMEOUT_MS = 5000
FORGET_RETRY_S = 10.0  # how long a delete retries the checkpoint that wipes the write-ahead log
SYNCHRONOUS_MODES = ("OFF", "NORMAL", "FULL", "EXTRA")
DEFAULT_TITLE = "New session"
MEMORY = ":memory:"
SQLITE_MAX_INTEGER = 2**63 - 1


def is_row_id(value: object) -> bool:
    """An integer SQLite can hold as a row id (a larger one would raise OverflowError in the query)."""
    return isinstance(value, int) and not isinstance(value, bool) and -SQLITE_MAX_INTEGER - 1 <= value <= SQLITE_MAX_INTEGER


def _looks_up(kind: str):
    """For a method whose first argument is a session or message id: an id no row can have (a
    huge number from a client's state, a float) is a missing row, not an OverflowError."""
    missing = SessionNotFound if kind == "session" else MessageNotFound

    def decorate(method):
        @functools.wraps(method)
        def checked(self, row_id, *args, **kwargs):
            if not is_row_id(row_id):
                raise missing(f"{kind} {row_id} does not exist")
            return method(self, row_id, *args, **kwargs)

        return checked

    return decorate


@dataclass(frozen=True)
class ImportResult:
    """What importing one session did: ``created`` (new here), ``merged`` (``added`` messages
    appended to the one here), ``unchanged``, or ``copied`` (diverged: imported beside it)."""

    session_id: int
    outcome: str
    added: int  # messages written


def imported_title(title: str) -> str:
    return title if title.endswith(" (imported copy)") else f"{title or DEFAULT_TITLE} (imported copy)"


def edited_title(title: str) -> str:
    """The title of a copy made by editing an earlier message (marked once, however often)."""
    return title if title.endswith(" (edited)") else f"{title} (edited)"


def utc_now() -> str:
    """Timestamps are ISO 8601 UTC text with microseconds, so they sort as text."""
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


SNIPPET_TOKENS = 12  # words of a matching message shown around its match


def fts_query(text: str) -> str | None:
    """The user's words as an FTS5 query: every word must match, each as the start of a word
    ("fib" finds "fibonacci"; "count_vowels" the words count and vowels in a row), quoted so that no
    character is FTS5 syntax. None when no word has a letter or digit to search for."""
    words = [word for word in text.split() if any(ch.isalnum() for ch in word)]
    if not words:
        return None
    return " ".join('"' + word.replace('"', '""') + '"*' for word in words)


class SessionStore:
    """Read and write chat sessions, their messages and per-cycle decoding records.

    ``SessionStore(path)`` opens (or creates) the database, applies pending migrations and marks
    replies left 'streaming' by a crash as 'interrupted' (their count is ``store.recovered``).
    Pass ``recover=False`` from tools that open the file next to a running app (the CLI), so that
    they do not interrupt a reply that is still streaming there.
    """

    def __init__(
        self,
        path: str | Path = MEMORY,
        *,
        recover: bool = True,
        synchronous: str = "FULL",
        now: Callable[[], str] = utc_now,
        migrations: Iterable[Migration] = MIGRATIONS,
    ):
        if synchronous.upper() not in SYNCHRONOUS_MODES:
            raise ValueError(f"synchronous must be one of {', '.join(SYNCHRONOUS_MODES)}; got {synchronous!r}")
        self.path: str | Path = MEMORY if str(path) == MEMORY else Path(path)
        self._now = now
        self._lock = threading.RLock()
        self._closed = False
        self.wipe_pending = False  # deleted text still in the write-ahead log (a reader held it)
        connection = self._connect()
        self._db = sqlite_utils.Database(connection, execute_plugins=False)
        try:
            self._configure(synchronous.upper())
            apply_migrations(self._db, tuple(migrations))
            self.recovered = self.recover_interrupted() if recover else 0
        except sqlite3.DatabaseError as exc:
            connection.close()
            raise StoreError(f"cannot open the session database {self.path}: {exc}") from exc
        except BaseException:
            connection.close()
            raise

    def _connect(self) -> sqlite3.Connection:
        """The database file's connection; a path that cannot hold one is a ``StoreError``."""
        try:
            if self.path != MEMORY:
                if self.path.is_dir():
                    raise StoreError(f"cannot open the session database {self.path}: it is a directory "
                                     f"(give a file in it, such as {self.path / 'sessions.db'})")
                self.path.parent.mkdir(parents=True, exist_ok=True)
            return sqlite3.connect(str(self.path), check_same_thread=False, timeout=BUSY_TIMEOUT_MS / 1000)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open the session database {self.path}: {exc}") from exc

    def _configure(self, synchronous: str) -> None:
        self._db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        self._db.execute("PRAGMA foreign_keys = ON")
        # Deleted text is overwritten, not left in free pages (see ``_forget``).
        self._db.execute("PRAGMA secure_delete = ON")
        if self.path != MEMORY:
            self._db.enable_wal()
        self._db.execute(f"PRAGMA synchronous = {synchronous}")

    # -- plumbing --

    @property
    def database(self) -> sqlite_utils.Database:
        """The underlying database, for inspection and tests. Write only through the store's methods."""
        return self._db

    def applied_migrations(self) -> list[str]:
        """Names of the migrations this database has had applied, oldest first."""
        with self._lock:
            return applied_migrations(self._db)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the session store is closed")

    @contextmanager
    def _write(self) -> Iterator[sqlite_utils.Database]:
        """One write transaction, committed on exit; SQLite's refusals become ``SaveFailed``."""
        with self._lock:
            self._check_open()
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                    self._db.execute("COMMIT")
                except BaseException:
                    self._db.rollback()
                    raise
            except sqlite3.OperationalError as exc:
                raise SaveFailed(f"could not save to the session database {self.path}: {exc}") from exc

    def _query(self, sql: str, params: list[Any] | dict[str, Any] = ()) -> list[dict]:
        with self._lock:
            self._check_open()
            return list(self._db.query(sql, params))

    def _scalar(self, sql: str, params: list[Any] | dict[str, Any] = ()) -> Any:
        with self._lock:
            self._check_open()
            row = self._db.execute(sql, params).fetchone()
        return None if row is None else row[0]

    def close(self) -> None:
        """Checkpoint the WAL into the main file and close. Safe to call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                if self.path != MEMORY:
                    self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.OperationalError:
                pass  # another process is reading; its connection or the next open checkpoints
            finally:
                self._db.close()

    def __enter__(self) -> SessionStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- sessions --

    def _session_from_row(self, row: dict) -> Session:
        return Session.from_row(row, settings=settings_from_json(row["settings"]))

    _SESSION_SELECT = (
        "SELECT s.*, (SELECT count(*) FROM messages m WHERE m.session_id = s.id) AS message_count "
        "FROM sessions s"
    )

    def create_session(self, title: str = DEFAULT_TITLE, model: str = "", settings: dict | None = None) -> int:
        """Create an empty session and return its id."""
        title = self._check_title(title)
        settings_json = settings_to_json(settings)
        now = self._now()
        row = {
            "uuid": uuid.uuid4().hex, "title": title, "created_at": now, "updated_at": now,
            "model": model, "settings": settings_json,
        }
        with self._write() as db:
            return db.table("sessions").insert(row).last_pk

    @staticmethod
    def _check_title(title: str) -> str:
        if not isinstance(title, str) or not title.strip():
            raise ValueError(f"a session title must be a non-empty string, got {title!r}")
        return title.strip()

    def list_sessions(self, limit: int | None = 200) -> list[Session]:
        """Sessions, most recently updated first, each with its ``message_count`` (``limit=None``: all)."""
        rows = self._query(
            f"{self._SESSION_SELECT} ORDER BY s.updated_at DESC, s.id DESC LIMIT ?", [-1 if limit is None else limit]
        )
        return [self._session_from_row(row) for row in rows]

    def reply_models(self, session_ids: list[int]) -> dict[int, list[str]]:
        """Session id -> the models its replies came from, in the order each first answered (a
        session's own model is only the last one used: the rolling API session holds replies of
        every model an editor asked)."""
        if not session_ids:
            return {}
        marks = ", ".join("?" for _ in session_ids)
        rows = self._query(
            "SELECT session_id, coalesce(nullif(json_extract(settings, '$.model'), ''), model) AS name FROM messages "
            f"WHERE role = 'assistant' AND session_id IN ({marks}) ORDER BY session_id, seq", list(session_ids))
        models: dict[int, list[str]] = {session_id: [] for session_id in session_ids}
        for row in rows:
            if row["name"] and row["name"] not in models[row["session_id"]]:
                models[row["session_id"]].append(row["name"])
        return models

    def count_sessions(self) -> int:
        """How many sessions there are."""
        return self._scalar("SELECT count(*) FROM sessions")

    def get_preference(self, name: str) -> dict | None:
        """A saved preference (a dict), or None when none was saved under ``name``."""
        rows = self._query("SELECT value FROM preferences WHERE name = ?", [name])
        return settings_from_json(rows[0]["value"]) if rows else None

    def set_preference(self, name: str, value: dict | None) -> None:
        """Save a preference (a JSON-able dict); None forgets it."""
        with self._write() as db:
            if value is None:
                db.execute("DELETE FROM preferences WHERE name = ?", [name])
            else:
                db.execute("INSERT INTO preferences (name, value, updated_at) VALUES (?, ?, ?) ON CONFLICT(name) "
                           "DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
                           [name, settings_to_json(value), self._now()])

    def search_sessions(self, query: str, limit: int | None = 200) -> list[Session]:
        """Sessions whose title or messages hold every word of ``query`` (see ``search``), best
        match first; all sessions for a blank query."""
        if not query.strip():
            return self.list_sessions(limit)
        return [match.session for match in self.search(query, limit)]

    def search(self, query: str, limit: int | None = 200, marks: tuple[str, str] = ("[", "]")) -> list[SessionMatch]:
        """Full-text search (the FTS5 indexes of migration m005): sessions whose title or one of
        whose messages holds every word of ``query`` as the start of a word, case-insensitively,
        ranked by BM25 (a session by its best match, title or message), each with its match
        highlighted between ``marks``: the title when it matches (a session named for the words),
        else its best matching message."""
        match = fts_query(query)
        if match is None:
            return []
        rows = self._query(
            "WITH hits AS ("
            " SELECT sessions_fts.rowid AS session_id, bm25(sessions_fts) AS rank, 'title' AS field,"
            "  highlight(sessions_fts, 0, :open, :close) AS snippet"
            " FROM sessions_fts WHERE sessions_fts MATCH :match"
            " UNION ALL"
            " SELECT m.session_id, bm25(messages_fts), 'message',"
            "  snippet(messages_fts, 0, :open, :close, '…', :tokens)"
            " FROM messages_fts JOIN messages m ON m.id = messages_fts.rowid WHERE messages_fts MATCH :match),"
            " best AS (SELECT *, min(rank) OVER (PARTITION BY session_id) AS session_rank,"
            "  row_number() OVER (PARTITION BY session_id ORDER BY field = 'title' DESC, rank) AS n FROM hits)"
            f" SELECT x.*, best.field AS match_field, best.snippet AS match_snippet FROM ({self._SESSION_SELECT}) x"
            " JOIN best ON best.session_id = x.id AND best.n = 1"
            " ORDER BY best.session_rank, x.updated_at DESC, x.id DESC LIMIT :limit",
            {"match": match, "open": marks[0], "close": marks[1], "tokens": SNIPPET_TOKENS,
             "limit": -1 if limit is None else limit},
        )
        return [SessionMatch(self._session_from_row(row), row["match_field"], row["match_snippet"]) for row in rows]

    @_looks_up("session")
    def get_session(self, session_id: int) -> Session:
        """One session with its ``message_count``; raises ``SessionNotFound``."""
        rows = self._query(f"{self._SESSION_SELECT} WHERE s.id = ?", [session_id])
        if not rows:
            raise SessionNotFound(f"session {session_id} does not exist")
        return self._session_from_row(rows[0])

    def _touch_session(self, db: sqlite_utils.Database, session_id: int, now: str, **columns: Any) -> None:
        try:
            db.table("sessions").update(session_id, {"updated_at": now, **columns})
        except sqlite_utils.db.NotFoundError:
            raise SessionNotFound(f"session {session_id} does not exist") from None

    @_looks_up("session")
    def rename_session(self, session_id: int, title: str) -> None:
        """Give a session a new title."""
        title = self._check_title(title)
        with self._write() as db:
            self._touch_session(db, session_id, self._now(), title=title)

    @_looks_up("session")
    def update_session_settings(self, session_id: int, settings: dict) -> None:
        """Replace a session's settings."""
        settings_json = settings_to_json(settings)
        with self._write() as db:
            self._touch_session(db, session_id, self._now(), settings=settings_json)

    @_looks_up("session")
    def update_session_model(self, session_id: int, model: str) -> None:
        """Record the model a session now uses."""
        if not isinstance(model, str):
            raise ValueError(f"model must be a string, got {type(model).__name__}")
        with self._write() as db:
            self._touch_session(db, session_id, self._now(), model=model)

    @_looks_up("session")
    def delete_session(self, session_id: int) -> bool:
        """Delete a session with its messages and their cycles. Returns True once the text is
        gone from the file too, False while another connection's read keeps it in the
        write-ahead log (``wipe_pending``; removed when that reader lets go: ``_forget``)."""
        with self._write() as db:
            if db.execute("DELETE FROM sessions WHERE id = ?", [session_id]).rowcount == 0:
                raise SessionNotFound(f"session {session_id} does not exist")
        return self._forget()

    def delete_all_sessions(self) -> int:
        """Delete every session (messages and cycles too); returns how many there were
        (``wipe_pending`` says whether their text still waits for a reader to let go)."""
        with self._write() as db:
            deleted = db.execute("DELETE FROM sessions").rowcount
        self._forget()
        return deleted

    def _forget(self, retry_s: float | None = None) -> bool:
        """Make deleted text unrecoverable: ``secure_delete`` zeroes the freed pages, and a
        truncating checkpoint copies them over the old ones and empties the write-ahead log.
        Another connection in the middle of a read (the CLI next to the app, a backup) blocks
        the checkpoint: SQLite then reports it busy, so retry (waiting up to the busy timeout
        each time) until ``retry_s`` has passed. Returns whether the text is gone;
        ``wipe_pending`` stays True until a later checkpoint (the next delete, ``close``) succeeds."""
        if self.path == MEMORY:
            return True
        deadline = time.monotonic() + (FORGET_RETRY_S if retry_s is None else retry_s)
        while True:
            with self._lock:
                self._check_open()
                busy, _, _ = self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            self.wipe_pending = bool(busy)
            if not busy or time.monotonic() >= deadline:
                return not busy
            time.sleep(0.05)  # the lock is free meanwhile: the app keeps working

    # -- messages --

    @staticmethod
    def _message_from_row(row: dict) -> Message:
        return Message.from_row(row, settings=settings_from_json(row["settings"]))

    @_looks_up("session")
    def add_message(
        self,
        session_id: int,
        role: str,
        content: str,
        status: str = "complete",
        *,
        expected_last_seq: int | None = None,
        **extra: Any,
    ) -> int:
        """Append a message (committed before this returns) and return its id.

        ``extra`` holds other message fields (model, settings, kind, stats...). With
        ``expected_last_seq`` the append is refused with ``StaleSessionError`` unless the session's
        last message still has that sequence number (0: the session is empty), so a stale browser
        tab cannot interleave with newer history.
        """
        check_role(role)
        check_status(status)
        columns = message_columns({"content": content, "status": status, **extra})
        now = self._now()
        with self._write() as db:
            self._touch_session(db, session_id, now)
            last_seq = db.execute(
                "SELECT coalesce(max(seq), 0) FROM messages WHERE session_id = ?", [session_id]
            ).fetchone()[0]
            if expected_last_seq is not None and expected_last_seq != last_seq:
                raise StaleSessionError(
                    f"session {session_id} changed elsewhere (its last message is #{last_seq}, "
                    f"this view expected #{expected_last_seq}); reload the session"
                )
            row = {"session_id": session_id, "seq": last_seq + 1, "role": role,
                   "created_at": now, "updated_at": now, **columns}
            return db.table("messages").insert(row).last_pk

    def start_reply(
        self,
        session_id: int,
        model: str = "",
        settings: dict | None = None,
        *,
        kind: str = "chat",
        expected_last_seq: int | None = None,
    ) -> int:
        """Append an empty assistant message with status 'streaming' and return its id."""
        return self.add_message(
            session_id, "assistant", "", status="streaming", model=model, settings=settings, kind=kind,
            expected_last_seq=expected_last_seq,
        )

    def _session_of_message(self, db: sqlite_utils.Database, message_id: int) -> int:
        row = db.execute("SELECT session_id FROM messages WHERE id = ?", [message_id]).fetchone()
        if row is None:
            raise MessageNotFound(f"message {message_id} does not exist")
        return row[0]

    def _update_message_columns(self, db: sqlite_utils.Database, message_id: int, columns: dict, now: str) -> None:
        session_id = self._session_of_message(db, message_id)
        db.table("messages").update(message_id, {**columns, "updated_at": now})
        self._touch_session(db, session_id, now)

    @_looks_up("message")
    def update_message(self, message_id: int, **fields: Any) -> None:
        """Change fields of a message: content, status, error, stats..."""
        columns = message_columns(fields)
        with self._write() as db:
            self._update_message_columns(db, message_id, columns, self._now())

    def save_reply(
        self, message_id: int, *, content: str | None = None, cycles: Iterable[dict] = (), **fields: Any
    ) -> None:
        """Save a streaming reply's text, new cycles and any other fields in ONE transaction."""
        if content is not None:
            fields["content"] = content
        columns = message_columns(fields)
        cycle_rows = [encode_cycle(cycle, message_id) for cycle in cycles]
        with self._write() as db:
            self._update_message_columns(db, message_id, columns, self._now())
            self._insert_cycles(db, message_id, cycle_rows)

    def reply_writer(self, message_id: int, flush_interval_s: float = 1.0) -> ReplyWriter:
        """A helper that saves a streaming reply at most every ``flush_interval_s`` and then finally."""
        self.get_message(message_id)  # fail here, not at the first flush
        return ReplyWriter(self, message_id, flush_interval_s)

    @_looks_up("message")
    def get_message(self, message_id: int) -> Message:
        """One message; raises ``MessageNotFound``."""
        rows = self._query("SELECT * FROM messages WHERE id = ?", [message_id])
        if not rows:
            raise MessageNotFound(f"message {message_id} does not exist")
        return self._message_from_row(rows[0])

    @_looks_up("session")
    def get_messages(self, session_id: int) -> list[Message]:
        """A session's messages in order; raises ``SessionNotFound``."""
        with self._lock:
            self.get_session(session_id)
            rows = self._query("SELECT * FROM messages WHERE session_id = ? ORDER BY seq", [session_id])
        return [self._message_from_row(row) for row in rows]

    @_looks_up("session")
    def delete_messages_after(self, session_id: int, seq: int) -> int:
        """Delete the messages after ``seq`` (and their cycles), for regenerate and edit; return how many."""
        with self._write() as db:
            self._touch_session(db, session_id, self._now())
            return db.execute("DELETE FROM messages WHERE session_id = ? AND seq > ?", [session_id, seq]).rowcount

    def recover_interrupted(self) -> int:
        """Mark replies left 'streaming' (by a crash) as 'interrupted', keeping their text; return how many."""
        with self._write() as db:
            return db.execute(
                "UPDATE messages SET status = 'interrupted', updated_at = ? WHERE status = 'streaming'", [self._now()]
            ).rowcount

    # -- cycles --

    @staticmethod
    def _insert_cycles(db: sqlite_utils.Database, message_id: int, rows: list[dict]) -> None:
        if not rows:
            return
        try:
            db.table("cycles").insert_all(rows)
        except sqlite3.IntegrityError as exc:
            raise ValueError(f"message {message_id} already has a cycle with one of these indexes: {exc}") from None

    @_looks_up("message")
    def append_cycles(self, message_id: int, cycles: Iterable[dict]) -> None:
        """Store a batch of cycle dicts (the engine's ``event_to_dict(cycle)``) in one transaction."""
        rows = [encode_cycle(cycle, message_id) for cycle in cycles]
        with self._write() as db:
            self._session_of_message(db, message_id)
            self._insert_cycles(db, message_id, rows)

    @_looks_up("message")
    def get_cycles(self, message_id: int) -> list[dict]:
        """A reply's cycle dicts ordered by index, as they were given (JSON round trip)."""
        with self._lock:
            self.get_message(message_id)
            rows = self._query("SELECT * FROM cycles WHERE message_id = ? ORDER BY idx", [message_id])
        return [decode_cycle(row) for row in rows]

    @_looks_up("session")
    def session_cycle_series(self, session_id: int) -> list[dict]:
        """Every cycle of a session's replies, light columns only, in order: for charts over time."""
        with self._lock:
            self.get_session(session_id)
            return self._query(
                "SELECT c.message_id, m.seq, c.idx AS \"index\", c.block_size, c.accepted, c.tau, "
                "c.draft_ms, c.verify_ms, c.fallback_state, c.fallback_changed, c.next_block_size, "
                "json_extract(c.extra, '$.cost_in_plain_steps') AS cost_in_plain_steps "
                "FROM cycles c JOIN messages m ON m.id = c.message_id "
                "WHERE m.session_id = ? AND m.role = 'assistant' ORDER BY m.seq, c.idx",
                [session_id],
            )

    # -- comparisons with plain decoding --

    @_looks_up("message")
    def save_comparison(self, message_id: int, record: dict) -> None:
        """Keep what Compare measured for a reply (a JSON-able dict), replacing an earlier one."""
        if not isinstance(record, dict):
            raise ValueError(f"a comparison must be a dict, got {type(record).__name__}")
        data = settings_to_json(record)
        with self._write() as db:
            self._session_of_message(db, message_id)
            db.execute("INSERT INTO comparisons (message_id, created_at, data) VALUES (?, ?, ?) "
                       "ON CONFLICT(message_id) DO UPDATE SET created_at = excluded.created_at, data = excluded.data",
                       [message_id, self._now(), data])

    @_looks_up("message")
    def get_comparison(self, message_id: int) -> dict | None:
        """The comparison kept for a reply, or None when Compare never ran on it."""
        rows = self._query("SELECT data FROM comparisons WHERE message_id = ?", [message_id])
        return settings_from_json(rows[0]["data"]) if rows else None

    # -- statistics (computed in SQL over the cycles) --

    def _cycle_stats(self, where: str, params: list[Any]) -> dict:
        """Aggregates over the cycles selected by ``where`` (a fixed SQL fragment of this class)."""
        with self._lock:
            self._check_open()
            [totals] = self._db.table("cycles").rows_where(where, params, select=CYCLE_TOTALS)
        # Per-position acceptance and the τ histogram are computed from the cycles by their one
        # home, engine.acceptance (the UI's analytics read ``session_cycle_series``).
        return totals

    @_looks_up("message")
    def message_stats(self, message_id: int) -> dict:
        """Stats of one reply: cycles, tokens, mean_tau, acceptance_rate, draft_ms, verify_ms, ...

        ``tokens`` counts the tokens emitted by cycles (the prefill token is in ``new_tokens``);
        ``mean_tau`` and ``acceptance_rate`` are None when there are no cycles.
        """
        with self._lock:
            message = self.get_message(message_id)
            stats = self._cycle_stats("message_id = ?", [message_id])
        return {
            "message_id": message_id,
            **stats,
            "tokens_per_s": message["tokens_per_s"],
            "new_tokens": message["new_tokens"],
            "prompt_tokens": message["prompt_tokens"],
        }

    @_looks_up("session")
    def session_stats(self, session_id: int) -> dict:
        """Stats over all assistant replies of a session, plus ``replies``: one summary per reply."""
        assistant_cycles = "message_id IN (SELECT id FROM messages WHERE session_id = ? AND role = 'assistant')"
        with self._lock:
            self.get_session(session_id)
            stats = self._cycle_stats(assistant_cycles, [session_id])
            tokens_per_s = self._scalar(
                "SELECT sum(new_tokens) * 1000.0 / nullif(sum(total_ms), 0) FROM messages "
                "WHERE session_id = ? AND role = 'assistant' AND new_tokens IS NOT NULL AND total_ms > 0",
                [session_id],
            )
            replies = self._query(
                "SELECT m.id AS message_id, m.seq, m.status, m.kind, m.model, m.created_at, "
                "m.new_tokens, m.tokens_per_s, m.total_ms, count(c.id) AS cycles, "
                "coalesce(sum(c.tau), 0) AS tokens, avg(c.tau) AS mean_tau, max(c.block_size) AS max_block_size, "
                "CAST(sum(c.accepted) AS REAL) / nullif(sum(c.block_size - 1), 0) AS acceptance_rate "
                "FROM messages m LEFT JOIN cycles c ON c.message_id = m.id "
                "WHERE m.session_id = ? AND m.role = 'assistant' GROUP BY m.id ORDER BY m.seq",
                [session_id],
            )
        return {"session_id": session_id, **stats, "tokens_per_s": tokens_per_s, "replies": replies}

    # -- export and import --

    def _export_sessions(self, where: str | None, params: list[Any]) -> list[dict]:
        exported = []
        with self._lock:
            self._check_open()
            for session in self._db.table("sessions").rows_where(where, params, order_by="id"):
                messages = []
                for row in self._query("SELECT * FROM messages WHERE session_id = ? ORDER BY seq", [session["id"]]):
                    message = self._message_from_row(row)
                    exported_message = {key: message[key] for key in MESSAGE_KEYS if key not in ("cycles", "comparison")}
                    cycle_rows = self._query("SELECT * FROM cycles WHERE message_id = ? ORDER BY idx", [row["id"]])
                    exported_message["cycles"] = [decode_cycle(cycle) for cycle in cycle_rows]
                    comparison = self._query("SELECT data FROM comparisons WHERE message_id = ?", [row["id"]])
                    if comparison:
                        exported_message["comparison"] = settings_from_json(comparison[0]["data"])
                    messages.append(exported_message)
                exported.append({
                    "uuid": session["uuid"], "title": session["title"], "created_at": session["created_at"],
                    "updated_at": session["updated_at"], "model": session["model"],
                    "settings": settings_from_json(session["settings"]), "messages": messages,
                })
        return exported

    def _export_document(self, sessions: list[dict]) -> dict:
        return {"format": EXPORT_FORMAT, "version": EXPORT_VERSION, "exported_at": self._now(), "sessions": sessions}

    @_looks_up("session")
    def export_session(self, session_id: int) -> dict:
        """A JSON-ready export document holding one session, its messages, their cycles and comparisons."""
        with self._lock:
            self.get_session(session_id)
            return self._export_document(self._export_sessions("id = ?", [session_id]))

    def export_all(self) -> dict:
        """A JSON-ready export document holding every session, oldest first."""
        return self._export_document(self._export_sessions(None, []))

    @staticmethod
    def check_document(data: Any) -> list[dict]:
        """The sessions of an export document, checked whole (``ImportFormatError`` says where it is wrong)."""
        return check_document(data)

    def import_data(self, data: dict) -> list[int]:
        """Import an export document; return the ids of its sessions, in document order
        (``import_document`` says what each one added)."""
        return [result.session_id for result in self.import_document(data)]

    def import_document(self, data: dict) -> list[ImportResult]:
        """Import an export document, one ``ImportResult`` per session, in document order.

        The whole document is checked first: a malformed one raises ``ImportFormatError`` and
        nothing is written. A session whose uuid is already here is merged by message identity
        (sequence number, role, creation time): messages it lacks are added, the ones it has stay
        as they are, so importing a newer export adds what is new and importing a file twice
        changes nothing. Where the two have diverged (a different message at the same place),
        the import arrives as a copy beside it: nothing of either is lost. Replies exported while
        'streaming' arrive 'interrupted'.
        """
        sessions = check_document(data)
        now = self._now()
        results = []
        with self._write() as db:
            for session in sessions:
                existing = db.execute("SELECT id FROM sessions WHERE uuid = ?", [session["uuid"]]).fetchone()
                if not existing:
                    results.append(ImportResult(self._insert_imported_session(db, session, now), "created",
                                                len(session["messages"])))
                    continue
                results.append(self._merge_session(db, existing[0], session, now))
        return results

    def _merge_session(self, db: sqlite_utils.Database, session_id: int, session: dict, now: str) -> ImportResult:
        here = {row[0]: (row[1], row[2]) for row in db.execute(
            "SELECT seq, role, created_at FROM messages WHERE session_id = ?", [session_id]).fetchall()}
        new = []
        for message in session["messages"]:
            mine = here.get(message["seq"])
            if mine is None:
                new.append(message)
            elif mine != (message["role"], message.get("created_at", mine[1])):
                copy = {**session, "uuid": uuid.uuid4().hex, "title": imported_title(session["title"])}
                return ImportResult(self._insert_imported_session(db, copy, now), "copied", len(session["messages"]))
        for message in new:
            self._insert_imported_message(db, session_id, message, now)
        if new:
            self._touch_session(db, session_id, now)
        return ImportResult(session_id, "merged" if new else "unchanged", len(new))

    @_looks_up("session")
    def fork_session(self, session_id: int, before_seq: int, title: str | None = None) -> int:
        """A new session holding copies of this one's messages (with their cycles and settings)
        before sequence number ``before_seq``; the original is left as it is. Editing an earlier
        message continues in such a copy, so the later messages stay where they were."""
        with self._lock:
            original = self.get_session(session_id)
            [session] = self._export_sessions("id = ?", [session_id])
            now = self._now()
            copy = {**session, "uuid": uuid.uuid4().hex, "created_at": now, "updated_at": now,
                    "title": self._check_title(title or edited_title(original["title"])),
                    "messages": [m for m in session["messages"] if m["seq"] < before_seq]}
            with self._write() as db:
                return self._insert_imported_session(db, copy, now)

    def _insert_imported_session(self, db: sqlite_utils.Database, session: dict, now: str) -> int:
        session_id = db.table("sessions").insert({
            "uuid": session["uuid"], "title": session["title"] or DEFAULT_TITLE,
            "created_at": session.get("created_at", now), "updated_at": session.get("updated_at", now),
            "model": session.get("model", ""), "settings": settings_to_json(session.get("settings")),
        }).last_pk
        for message in session["messages"]:
            self._insert_imported_message(db, session_id, message, now)
        return session_id

    def _insert_imported_message(self, db: sqlite_utils.Database, session_id: int, message: dict, now: str) -> None:
        fields = {key: value for key, value in message.items() if key not in ("seq", "role", "cycles", "comparison",
                                                                              "created_at", "updated_at")}
        if fields.get("status") == "streaming":
            fields["status"] = "interrupted"
        message_id = db.table("messages").insert({
            "session_id": session_id, "seq": message["seq"], "role": message["role"],
            "created_at": message.get("created_at", now), "updated_at": message.get("updated_at", now),
            **message_columns(fields),
        }).last_pk
        rows = [encode_cycle(cycle, message_id) for cycle in message.get("cycles", [])]
        self._insert_cycles(db, message_id, rows)
        if message.get("comparison"):
            db.execute("INSERT INTO comparisons (message_id, created_at, data) VALUES (?, ?, ?)",
                       [message_id, now, settings_to_json(message["comparison"])])
