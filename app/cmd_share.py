"""`dflash-studio sessions share ID [--reply N] -o FILE.html [--gif FILE.gif] [--race]`: one
stored reply's decoding as a self-contained HTML replay (and an animated GIF).

``--race`` first runs Compare on the engine (the reply's prompt with speculation off, then DFlash
again) and keeps the result with the reply, so that the page races plain decoding against DFlash;
without it, a comparison Teach already stored is used when there is one.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from engine.files import write_atomically, write_text_atomically
from engine.shipped import SHIPPED_PAIRS, pair_dirs
from storage import SessionStore, default_db_path
from storage.records import stored_model

from .options import add_model_options, open_engine


def register(commands: argparse._SubParsersAction, database: argparse.ArgumentParser, guarded) -> None:
    parser = commands.add_parser(
        "share", parents=[database], help="a reply's decoding as one self-contained HTML replay (and a GIF)",
        description="Write one stored reply's decoding as a single HTML file that plays it cycle by cycle "
                    "(no network needed), and optionally as an animated GIF.")
    parser.add_argument("session_id", type=int, metavar="SESSION_ID")
    parser.add_argument("--reply", "--message", dest="reply", type=int, metavar="N",
                        help="the reply's number in the session (1, 2, …), as `sessions show` lists it "
                             "(default: the last reply)")
    parser.add_argument("-o", "--output", type=Path, metavar="FILE.html", help="write the HTML replay here")
    parser.add_argument("--gif", type=Path, metavar="FILE.gif", help="also write the replay as an animated GIF")
    parser.add_argument("--race", action="store_true",
                        help="run Compare now on the engine (plain decoding, then DFlash) and race the two on the page")
    add_model_options(parser, compile_by_default=False)
    parser.set_defaults(func=guarded(share_reply))


def share_reply(args: argparse.Namespace) -> int:
    from ui.share.replay import ShareError, load_share, replay_document
    from ui.share.page import replay_html

    if args.output is None and args.gif is None:
        print("dflash-studio: error: say where to write the replay: -o FILE.html and/or --gif FILE.gif", file=sys.stderr)
        return 2
    path = args.db if args.db is not None else default_db_path()
    if not Path(path).exists():
        print(f"dflash-studio: error: session {args.session_id} does not exist ({path} does not exist)", file=sys.stderr)
        return 2
    with SessionStore(path, recover=False) as store:
        try:
            share = load_share(store, args.session_id, reply=args.reply)
            if args.race:
                race_now(args, store, share)
                share = load_share(store, args.session_id, reply=args.reply)
        except ShareError as exc:
            print(f"dflash-studio: error: {exc}", file=sys.stderr)
            return 2
    if args.output is not None:
        write_text_atomically(args.output, replay_html(share))
        print(f"wrote the replay of reply {share.reply_number} ({len(share.cycles)} cycles) to {args.output}",
              file=sys.stderr)
    if args.gif is not None:
        from ui.share.gif import replay_gif

        data = replay_gif(replay_document(share))
        write_atomically(args.gif, lambda temporary: temporary.write_bytes(data))
        print(f"wrote the GIF ({len(data) / 1e6:.1f} MB) to {args.gif}", file=sys.stderr)
    return 0


def reply_pair(args: argparse.Namespace, message: dict) -> tuple[argparse.Namespace, str]:
    """Without --target/--draft, the shipped pair that made the reply (by its name or an older
    one): another pair answers another text, and the race would report a different output."""
    name = stored_model(message)
    if args.target or args.draft or getattr(args, "engine", "local") != "local" or not name:
        return args, ""
    for pair in SHIPPED_PAIRS:
        if name == pair.name or name in pair.aliases:
            target, draft = pair_dirs(pair)
            if target.is_dir() and draft.is_dir():
                return argparse.Namespace(**{**vars(args), "target": str(target), "draft": str(draft)}), pair.name
    return args, ""


def race_now(args: argparse.Namespace, store: SessionStore, share) -> None:
    """Compare on the engine now (plain decoding, then DFlash) and keep the result with the reply."""
    from ui.share.replay import ShareError
    from ui.teach.compare import compare_stored_reply, comparison_record

    message = share.message
    messages = store.get_messages(message["session_id"])
    args, pair = reply_pair(args, message)
    print(f"racing: plain decoding, then DFlash, on {pair or 'the engine'}…", file=sys.stderr)
    engine = open_engine(args)
    try:
        comparison = compare_stored_reply(engine, message, messages, share.cycles)
    except ValueError as exc:
        raise ShareError(f"cannot race this reply: {exc}") from None
    finally:
        engine.close()
    if comparison.plain.error:
        raise ShareError(f"plain decoding failed: {comparison.plain.error}")
    store.save_comparison(message["id"], comparison_record(comparison, getattr(engine, "name", "")))
    speed = f", DFlash {comparison.speedup:.2f}× plain decoding" if comparison.speedup else ""
    print(f"raced: {'identical' if comparison.identical else 'different'} output{speed}", file=sys.stderr)
