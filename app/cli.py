"""`dflash-studio` command line. Each command lives in its own module with a ``register``
function; named engine/storage errors become one clear line on stderr and exit code 2."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# What the top-level help says about running the app: the options a first run needs.
RUN_THE_APP = """\
`dflash-studio` alone runs the app (the serve command): the page and the API on
127.0.0.1:7860. When 7860 is busy (another app, a second copy) it moves to the next free port
(7861, 7862, …) and prints the address it took.

  dflash-studio --port 8000        listen on port 8000 exactly (an error if it is taken)
  dflash-studio --no-browser       do not open a browser tab
  dflash-studio serve --help       every option of the app (--host, --auth, --db, the model …)
"""

# Each module defines register(subparsers) and sets a ``func`` default on its parser.
COMMAND_MODULES = (
    "app.cmd_serve",
    "app.cmd_generate",
    "app.cmd_bench",
    "app.cmd_train",
    "app.cmd_sessions",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dflash-studio",
        description="A local coding assistant that uses, and shows, DFlash speculative decoding.",
        epilog=RUN_THE_APP, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)  # a missing module is a broken install: say so
    return parser


def innermost_parser(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser:
    """The parser of the deepest subcommand named in ``argv`` (``sessions delete`` -> its parser)."""
    for word in argv:
        actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if actions and word in actions[0].choices:
            parser = actions[0].choices[word]
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        argv = ["serve", *argv]  # `dflash-studio` alone runs the app
    args, extra = parser.parse_known_args(argv)
    if extra:  # the error and usage of the (sub)command the user typed, not the top level's
        innermost_parser(parser, argv).error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "func", None):
        parser.print_help()
        return 1
    from engine.errors import DFlashError
    from storage.errors import StoreError

    try:
        status = int(args.func(args) or 0)
        sys.stdout.flush()  # here, where a closed pipe is caught, not at exit
        return status
    except (DFlashError, StoreError) as exc:
        print(f"dflash-studio: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("dflash-studio: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return closed_pipe()


def closed_pipe() -> int:
    """The reader of our output went away (``sessions list | head``): stop quietly, as Python's
    docs advise (signal module, "Note on SIGPIPE"): point stdout at devnull so that the flush at
    exit does not raise again, and exit 1 as the shell expects of a cut pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 1


if __name__ == "__main__":
    sys.exit(main())
