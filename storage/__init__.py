"""Sessions, messages and decoding cycles in SQLite (sqlite-utils only; no torch, no engine, no UI).

    from storage import SessionStore, default_db_path
    store = SessionStore(default_db_path())
"""

from .errors import (
    ImportFormatError,
    MessageNotFound,
    MigrationError,
    SaveFailed,
    SessionNotFound,
    StaleSessionError,
    StoreError,
)
from .fields import ROLES, STATUSES
from .paths import DB_PATH_ENV_VAR, default_db_path
from .records import Message, Session
from .store import SessionStore
from .transfer import EXPORT_FORMAT, EXPORT_VERSION
from .writer import ReplyWriter

__all__ = [
    "DB_PATH_ENV_VAR",
    "EXPORT_FORMAT",
    "EXPORT_VERSION",
    "ROLES",
    "STATUSES",
    "ImportFormatError",
    "Message",
    "MessageNotFound",
    "MigrationError",
    "ReplyWriter",
    "SaveFailed",
    "Session",
    "SessionNotFound",
    "SessionStore",
    "StaleSessionError",
    "StoreError",
    "default_db_path",
]
