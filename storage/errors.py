"""The storage layer's few named exceptions; the UI/CLI edge turns them into user messages.

Bad arguments from our own code (an unknown column, a role outside the schema) are programming
errors and raise ``ValueError``; everything a user can cause or must be told about is a
``StoreError``.
"""


class StoreError(Exception):
    """Base class: every error the session store raises on purpose."""


class SessionNotFound(StoreError):
    """No session has this id (it was deleted, or never existed)."""


class MessageNotFound(StoreError):
    """No message has this id (its session was deleted, or it never existed)."""


class StaleSessionError(StoreError):
    """A write was based on an older view of the session (another tab or process added messages)."""


class SaveFailed(StoreError):
    """SQLite refused a write (disk full, I/O error, locked for too long); nothing of it was saved."""


class MigrationError(StoreError):
    """The schema could not be brought up to date, or the database is from a newer version."""


class ImportFormatError(StoreError):
    """An import document is not a valid dflash-studio sessions export; nothing was written."""
