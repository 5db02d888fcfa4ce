"""Writing a file whole or not at all, for everything the project saves outside its database
(session exports, training checkpoints, run summaries): an interrupted write must never leave a
half file where a good one was, because a resume or an import would then read it."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path


def write_atomically(path: Path | str, write: Callable[[Path], None]) -> None:
    """``write(temporary)`` fills a temporary file in the same directory, which then replaces
    ``path`` in one rename; on any error the temporary file goes and ``path`` is untouched."""
    path = Path(path)
    if path.is_dir():  # checked first: the rename would fail only after a temporary file was made beside it
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        handle, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:  # named after the file asked for, not the temporary one
        raise type(exc)(exc.errno, exc.strerror, str(path)) from exc
    os.close(handle)
    temporary = Path(name)
    try:
        write(temporary)
        # mkstemp makes the file private (0600); the file keeps the mode it had, or gets what
        # open() would give a new one (others read shared replays and exports)
        os.chmod(temporary, stat.S_IMODE(path.stat().st_mode) if path.exists() else 0o666 & ~_umask())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def write_text_atomically(path: Path | str, text: str) -> None:
    write_atomically(path, lambda temporary: temporary.write_text(text, encoding="utf-8"))


def _umask() -> int:
    """The process's umask, read without changing it where Linux shows it (/proc), else by
    setting it and putting it straight back."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
