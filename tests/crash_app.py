"""Child process for the app-kill test: the real app (page, Gradio API, store) on a FakeEngine
whose replies stream slowly, on 127.0.0.1. The parent drives it with gradio_client and SIGKILLs it.

Usage: python -m tests.crash_app DB_PATH PORT
Prints "ready URL RECOVERED" once it serves (RECOVERED: replies marked interrupted at this start).

``python -m tests.crash_app --zygote`` imports everything once, then forks one app per line
"DB_PATH PORT" read from stdin and prints "pid PID" (then the app prints its "ready" line):
hundreds of kills then cost a fork each, not a Python start. Nothing opens a database before
the fork (SQLite forbids carrying a connection across it).
"""

from __future__ import annotations

import sys
import time

from tests.fake_engine import FakeEngine, FakeReply, fake_studio

REPLY = "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n" * 6
GIVE_UP_AFTER_S = 600.0


def main(db_path: str, port: int) -> None:
    engine = FakeEngine(delay_s=0.01, context_window=10**7, default_reply=FakeReply(REPLY, accept=(2, 5, 0, 7),
                                                                                    fallback_at={}))
    studio = fake_studio(engine, db_path=db_path, flush_interval_s=0.2)
    studio.host.start().result(timeout=30)
    studio.demo.launch(**studio.launch_kwargs(server_port=port, prevent_thread_lock=True, quiet=True, inbrowser=False))
    print("ready", studio.demo.local_url, studio.store.recovered, flush=True)
    time.sleep(GIVE_UP_AFTER_S)


def zygote() -> None:
    import os
    import signal

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # killed apps are reaped at once
    print("zygote ready", flush=True)
    for line in sys.stdin:
        db_path, port = line.split()
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            try:
                main(db_path, int(port))
            finally:
                os._exit(0)
        print("pid", pid, flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["--zygote"]:
        zygote()
    else:
        main(sys.argv[1], int(sys.argv[2]))
