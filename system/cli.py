"""The `odqa` command. Each subcommand is a thin layer over a library function, and each group of
them has its module in `odqa.system.commands` (data, retrieval, reader, system); `odqa SUB --help`
explains its flags. Bad input ends with `odqa: error: ...` naming the input, and exit status 2."""
from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback

from odqa.common.device import keep_freed_memory
from odqa.common.io import InputError
from odqa.system.commands import data, reader, retrieval, system


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="odqa", description="Open-domain question answering toolkit.")
    parser.add_argument("-q", "--quiet", action="store_true", help="log warnings only")
    parser.add_argument("--debug", action="store_true", default=os.environ.get("ODQA_DEBUG", "") not in ("", "0"),
                        help="on an input error, show the traceback as well as the one-line message "
                             "(also ODQA_DEBUG=1)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in (system, data, retrieval, reader):
        group.add(sub)
    return parser


def configure_logging(quiet: bool) -> None:
    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    # faiss's loader tells at INFO which instruction-set build it tried and fell back from
    # ("Could not load library with AVX2 support due to: ModuleNotFoundError(...)"): on every command,
    # and it reads as an error when it is none
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with a training command's --config file read in (flags on the line win)."""
    from odqa.system.commands.args import expand_config
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        expanded, config = expand_config(argv)
    except InputError as e:
        parser.error(str(e))
    args, unknown = parser.parse_known_args(expanded)
    if unknown:
        from_file = [t for t in unknown if config and t in config[1] and t not in argv]
        if from_file:
            parser.error(f"--config {config[0]}: not settings of `odqa {args.command}`: {' '.join(from_file)}")
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


def main(argv: list[str] | None = None, quick_exit: bool = False) -> int:
    """Run one command; its exit status. With `quick_exit` (the `odqa` script), a command that leaves
    nothing to finish (`command(..., quick_exit=True)`) ends the process itself (`_exit_now`)."""
    args = parse_args(argv)
    configure_logging(args.quiet)
    keep_freed_memory()
    code = _run(args)
    if quick_exit and args.quick_exit:
        _exit_now(code)
    return code


def _exit_now(code: int) -> None:
    """Exit without the interpreter's teardown, as mypy's `hard_exit` does: freeing the thousands of
    modules torch and transformers import took 0.75 s of a 5 s `odqa ask` (docs/notes/speed.md). Output
    is flushed first; the command has written and closed its files."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):   # a reader that closed the pipe (`odqa ask ... | head -1`)
            pass
    os._exit(code)


def console() -> None:
    """The `odqa` script."""
    sys.exit(main(quick_exit=True))


def _run(args: argparse.Namespace) -> int:
    from odqa.common.datapack import FetchError
    try:
        args.func(args)
    except InputError as e:
        if args.debug:
            traceback.print_exc()
        print(f"odqa: error: {e}", file=sys.stderr)
        return 2
    except FetchError as e:
        print(f"odqa: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        # the machine refused a named file (a folder made read-only mid-run, a full disk): the path and the
        # reason, as for bad input; an OSError naming no file is a bug, and keeps its traceback
        if e.filename is None:
            raise
        if args.debug:
            traceback.print_exc()
        print(f"odqa: error: {e.filename}: {e.strerror or e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    console()
