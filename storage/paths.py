"""Where the session database lives by default."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

DB_PATH_ENV_VAR = "DFLASH_STUDIO_DB"
APP_DIR_NAME = "dflash-studio"
DB_FILE_NAME = "sessions.db"


def default_db_path() -> Path:
    """``$DFLASH_STUDIO_DB`` if set, else ``sessions.db`` in the user's data directory.

    Creates nothing: the store makes the parent directory when it first opens the file.
    """
    override = os.environ.get(DB_PATH_ENV_VAR, "").strip()
    if override:
        return Path(override).expanduser()
    return Path(platformdirs.user_data_dir(APP_DIR_NAME, appauthor=False)) / DB_FILE_NAME
