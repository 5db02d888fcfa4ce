"""`dflash-studio sessions list|show|export|import|share|delete`: the stored chat sessions from a shell.

Opens the database with ``recover=False``: a running app may be streaming a reply into the same
file, and only the app itself decides that a reply left 'streaming' was interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from engine.files import write_text_atomically
from storage import DB_PATH_ENV_VAR, ImportFormatError, SessionStore, StoreError, default_db_path
from storage.records import number_replies
from storage.transfer import parse_export

from . import cmd_share


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "sessions",
        help="list, show, export, import, share or delete stored chat sessions",
        description="Manage the chat sessions stored in SQLite.",
    )
    parser.set_defaults(func=lambda args: _print_help(parser))
    commands = parser.add_subparsers(dest="sessions_command", metavar="SUBCOMMAND")

    database = argparse.ArgumentParser(add_help=False)
    database.add_argument(
        "--db", type=Path, default=None, metavar="PATH",
        help=f"session database (default: ${DB_PATH_ENV_VAR}, else {default_db_path()})",
    )

    list_parser = commands.add_parser("list", parents=[database], help="sessions, most recent first")
    list_parser.add_argument("--search", metavar="TEXT", help="only sessions whose title or messages hold every word of TEXT (a word's start "
                             "is enough: 'fib' finds 'fibonacci'), best match first, each with its match in [brackets]")
    list_parser.add_argument("--limit", type=int, default=200, help="at most this many (default 200)")
    list_parser.set_defaults(func=_guarded(list_sessions))

    show_parser = commands.add_parser("show", parents=[database], help="one session's messages and stats")
    show_parser.add_argument("session_id", type=int, metavar="ID")
    show_parser.set_defaults(func=_guarded(show_session))

    export_parser = commands.add_parser("export", parents=[database], help="sessions as JSON, cycles included")
    export_parser.add_argument("session_id", type=int, nargs="?", metavar="ID", help="one session (default: all)")
    export_parser.add_argument("-o", "--output", type=Path, metavar="FILE", help="write here instead of stdout")
    export_parser.set_defaults(func=_guarded(export_sessions))

    import_parser = commands.add_parser("import", parents=[database], help="sessions from an export file")
    import_parser.add_argument("file", metavar="FILE", help="a file written by `sessions export` ('-': stdin)")
    import_parser.set_defaults(func=_guarded(import_sessions))

    delete_parser = commands.add_parser("delete", parents=[database],
                                        help="delete a session (or --all) with its messages, unrecoverably")
    target = delete_parser.add_mutually_exclusive_group(required=True)
    target.add_argument("session_id", type=int, nargs="?", metavar="ID")
    target.add_argument("--all", action="store_true", help="every session")
    delete_parser.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    delete_parser.set_defaults(func=_guarded(delete_session))

    cmd_share.register(commands, database, _guarded)


def _print_help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 1


def _fail(message: str) -> int:
    print(f"dflash-studio: error: {message}", file=sys.stderr)
    return 2


def _guarded(command):
    """Run a subcommand; the store's errors and file errors become one line on stderr and exit 2."""

    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except StoreError as exc:
            return _fail(str(exc))
        except BrokenPipeError:
            raise  # the reader went away (`sessions list | head`): app.cli ends quietly
        except OSError as exc:
            return _fail(f"{exc.strerror or exc}: {exc.filename}" if exc.filename else str(exc))

    run.__name__ = command.__name__
    return run


def _db_path(args: argparse.Namespace) -> Path:
    return args.db if args.db is not None else default_db_path()


def _open_existing(args: argparse.Namespace) -> SessionStore | None:
    """The store, or None when the database file does not exist yet (reading creates nothing)."""
    path = _db_path(args)
    return SessionStore(path, recover=False) if path.exists() else None


# -- subcommands --


def list_sessions(args: argparse.Namespace) -> int:
    store = _open_existing(args)
    if store is None:
        print(f"no sessions yet ({_db_path(args)} does not exist)")
        return 0
    searching = bool(args.search and args.search.strip())
    with store:
        matches = store.search(args.search, args.limit) if searching else []
        sessions = [m.session for m in matches] if searching else store.list_sessions(args.limit)
        by_session = store.reply_models([session.id for session in sessions])
    if not sessions:
        print("no sessions" + (f" matching {args.search!r}" if args.search else ""))
        return 0
    models = {session.id: models_label(by_session[session.id], session["model"]) for session in sessions}
    width = max(len("MODEL"), *(len(label) for label in models.values()))  # never cut a name
    print(f"{'ID':>5}  {'UPDATED':<19}  {'MSGS':>4}  {'MODEL':<{width}}  TITLE")
    snippets = {m.session.id: m.snippet for m in matches if m.field == "message"}
    for session in sessions:
        updated = session["updated_at"][:19].replace("T", " ")
        print(f"{session['id']:>5}  {updated:<19}  {session['message_count']:>4}  "
              f"{models[session.id]:<{width}}  {session['title']}")
        if session.id in snippets:  # where the words are, when not in the title
            print(f"{'':>5}  {' '.join(snippets[session.id].split())}")
    return 0


MODELS_NAMED = 3  # a session with replies from more models says "several models (N)"


def models_label(reply_models: list[str], session_model: str) -> str:
    """Every model a session holds replies from ("tiny-coder, tiny-coder-fast"), so that a session
    answered by several (the rolling API one) is not listed under the last alone; before its first
    reply, the model it was opened with."""
    if len(reply_models) > MODELS_NAMED:
        return f"several models ({len(reply_models)})"
    return ", ".join(reply_models) or session_model or "-"


def _reply_summary(reply: dict) -> str:
    parts = []
    if reply["cycles"]:  # new_tokens counts the prefill token too, as the page does
        parts.append(f"{reply.get('new_tokens') or reply['tokens']} tokens in {reply['cycles']} cycles")
        parts.append(f"mean τ {reply['mean_tau']:.2f}")
    if reply["tokens_per_s"]:
        parts.append(f"{reply['tokens_per_s']:.1f} tok/s")
    return " · ".join(parts)


def show_session(args: argparse.Namespace) -> int:
    store = _open_existing(args)
    if store is None:
        return _fail(f"session {args.session_id} does not exist ({_db_path(args)} does not exist)")
    with store:
        session = store.get_session(args.session_id)
        messages = store.get_messages(args.session_id)
        stats = store.session_stats(args.session_id)
    replies = {reply["message_id"]: reply for reply in stats["replies"]}
    numbers = number_replies(messages)  # the number `sessions share --reply N` takes
    print(f"session {session['id']} · {session['title']}")
    print(f"model {session['model'] or '-'} · {session['message_count']} messages · "
          f"created {session['created_at'][:19].replace('T', ' ')} · "
          f"updated {session['updated_at'][:19].replace('T', ' ')}")
    if stats["cycles"]:
        tokens = sum(reply.get("new_tokens") or reply["tokens"] for reply in stats["replies"] if reply["cycles"])
        print(f"{tokens} tokens in {stats['cycles']} cycles · mean τ {stats['mean_tau']:.2f}"  # as its replies count
              + (f" · {stats['tokens_per_s']:.1f} tok/s" if stats["tokens_per_s"] else ""))
    for message in messages:
        header = [f"reply {numbers[message['id']]}" if message["id"] in numbers else message["role"], message["status"]]
        if message["role"] == "assistant" and message["model"] and message["model"] != session["model"]:
            header.append(f"by {message['model']}")  # the session's model changed after this reply
        if message["id"] in replies and _reply_summary(replies[message["id"]]):
            header.append(_reply_summary(replies[message["id"]]))
        if message["error"]:
            header.append(f"error: {message['error']}")
        print()
        print(" · ".join(header))
        print(message["content"])
    return 0


def export_sessions(args: argparse.Namespace) -> int:
    store = _open_existing(args)
    if store is None:
        if args.session_id is not None:
            return _fail(f"session {args.session_id} does not exist ({_db_path(args)} does not exist)")
        store = SessionStore(":memory:")  # an empty, valid export document
    with store:
        document = store.export_session(args.session_id) if args.session_id is not None else store.export_all()
    text = json.dumps(document, ensure_ascii=False, indent=2) + "\n"
    if args.output is None:
        sys.stdout.write(text)
    else:
        write_text_atomically(args.output, text)
        count = len(document["sessions"])
        print(f"exported {count} session{'s' * (count != 1)} to {args.output}", file=sys.stderr)
    return 0


def import_sessions(args: argparse.Namespace) -> int:
    if args.file == "-":
        source, data = "stdin", getattr(sys.stdin, "buffer", sys.stdin).read()
    else:
        source, data = args.file, Path(args.file).read_bytes()
    try:
        document = parse_export(data)
    except ImportFormatError as exc:
        return _fail(f"{source} {exc}; nothing was imported")
    with SessionStore(_db_path(args), recover=False) as store:
        results = store.import_document(document)
    print(f"imported {len(results)} session{'s' * (len(results) != 1)} from {source}: {import_summary(results)}")
    return 0


def import_summary(results) -> str:
    """What an import did, in words: '1 new (4 messages), 1 with 2 new messages, 1 unchanged'."""
    parts = []
    for outcome, words in (("created", "new"), ("merged", "updated"), ("copied", "diverged, imported as a copy"),
                           ("unchanged", "already up to date")):
        chosen = [r for r in results if r.outcome == outcome]
        if chosen:
            added = sum(r.added for r in chosen)
            detail = f" (+{added} message{'s' * (added != 1)})" if outcome != "unchanged" else ""
            parts.append(f"{len(chosen)} {words}{detail}")
    return ", ".join(parts) or "nothing"



def delete_session(args: argparse.Namespace) -> int:
    store = _open_existing(args)
    if store is None:
        what = "there are no sessions" if args.all else f"session {args.session_id} does not exist"
        return _fail(f"{what} ({_db_path(args)} does not exist)")
    with store:
        if args.all:
            count = store.count_sessions()
            description = f"all {count} session{'s' * (count != 1)}"
        else:
            session = store.get_session(args.session_id)
            description = f"session {session['id']} {session['title']!r} ({session['message_count']} messages)"
        if not args.yes:
            if sys.stdin is None or not sys.stdin.isatty():
                return _fail(f"not deleting {description} without confirmation; pass --yes")
            answer = input(f"Delete {description}? [y/N] ").strip().lower()
            if answer not in ("y", "yes"):
                print("nothing deleted")
                return 1
        if args.all:
            store.delete_all_sessions()
        else:
            store.delete_session(args.session_id)
        pending = store.wipe_pending
    print(f"deleted {description}")
    if pending:
        print(WIPE_PENDING, file=sys.stderr)
    return 0


WIPE_PENDING = ("note: another program is reading the session database (the app?), so the deleted text stays in "
                "its write-ahead log until that read ends; it is wiped at the next delete or when the app closes")
