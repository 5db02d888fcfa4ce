"""Child process for the SIGKILL test: streams a reply into the store until it is killed.

Usage: python -m tests.storage_crash_writer DB_PATH LABEL

It prints one line per commit, AFTER the commit returned, and flushes stdout, so every line the
parent reads describes data that must survive the kill:
    session ID / user ID / reply ID / flushed REPLY_ID CYCLES CHARS
It stops on its own after a bounded time in case nobody kills it.
"""

from __future__ import annotations

import sys
import time

from storage import SessionStore
from tests.storage_helpers import expected_reply_text, make_cycle

PROMPT = "Write a function that returns the n-th Fibonacci number."
GIVE_UP_AFTER_S = 20.0


def report(*fields: object) -> None:
    print(*fields, flush=True)


def main(db_path: str, label: str) -> None:
    store = SessionStore(db_path)
    session_id = store.create_session(f"crash {label}", model="tiny")
    report("session", session_id)
    report("user", store.add_message(session_id, "user", PROMPT))
    reply_id = store.start_reply(session_id, model="tiny")
    report("reply", reply_id)
    writer = store.reply_writer(reply_id, flush_interval_s=0.01)
    deadline = time.monotonic() + GIVE_UP_AFTER_S
    index = 0
    while time.monotonic() < deadline:
        index += 1
        writer.add_cycle(make_cycle(index, block_size=8, accepted=index % 8))
        writer.set_content(expected_reply_text(index))
        if writer.maybe_flush():
            report("flushed", reply_id, index, len(expected_reply_text(index)))
        time.sleep(0.001)
    writer.finish("complete")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
