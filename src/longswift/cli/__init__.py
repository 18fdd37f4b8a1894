"""`longswift generate | info | bench | bench-steps | train-heads | eval-heads | export-heads`: one module per
command; flags come from the config dataclasses' fields (cli.flags)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import NoReturn

from ..errors import AgreedError, ConfigError, LongswiftError, cli_text
from . import bench, bench_steps, export_heads, generate, heads, info
from .flags import seed_number, whole_number
from .stop import StopRequest


def _prefix() -> str:
    from ..runtime.torchrun_env import env_rank

    # Under torchrun every rank prints its own errors; ranks other than 0 say which they are.
    try:
        rank = env_rank()
    except LongswiftError:  # a RANK that is not a number: the error being printed may be that one
        return "longswift"
    return "longswift" if rank == 0 else f"longswift (rank {rank})"


# How long a process of a torchrun run waits before it prints an error that every process of the run meets (an error
# of their common command line, a refusal the ranks agreed on), unless it is its machine's first process (LOCAL_RANK
# 0), which prints at once: torchrun stops every other process of the run once one has exited with an error, so
# the others' line, the same one, is not printed again (where every process printed it, N lines said one thing).
# A process still there after the wait prints it too: its first process may have been stopped before printing (the
# others used to exit at once, and torchrun stopped it: the only line was lost), or this may not be torchrun's run.
SAY_AFTER_THE_FIRST_S = 5.0


def _let_the_first_process_say_it() -> None:
    """Wait SAY_AFTER_THE_FIRST_S before printing an error every process meets, in a torchrun process other than its
    machine's first (a process of WORLD_SIZE > 1 and MASTER_ADDR, as torchrun sets them, and LOCAL_RANK above 0)."""
    from ..runtime.torchrun_env import env_local_rank, env_world_size

    try:
        other = env_world_size() > 1 and bool(os.environ.get("MASTER_ADDR")) and env_local_rank() > 0
    except LongswiftError:  # (a variable that is not a number: every process says so at once)
        return
    if other:
        try:
            time.sleep(SAY_AFTER_THE_FIRST_S)
        except KeyboardInterrupt:  # (Ctrl-C, which torchrun relays to every process: say it now, not a traceback)
            pass


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's final flush of what is still buffered for
    the closed pipe fails neither loudly nor again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # a stdout without a file descriptor (the Python API's callers)
        pass
    finally:
        os.close(devnull)


class Parser(argparse.ArgumentParser):
    """argparse with the CLI's error convention: one line `longswift: error: ...`, exit status 2
    (argparse's default prints the whole usage first). Subcommand parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("longswift").strip()
        hint = f" (see `longswift {command + ' ' if command else ''}--help`)"
        _let_the_first_process_say_it()  # (torchrun gives every process the same command line)
        self.exit(2, f"{_prefix()}: error: {message}{hint}\n")


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = Parser(prog="longswift",
                    description="Lossless acceleration of ultra-long generation (TokenSwift).")
    parser.add_argument("--version", action="version", version=f"longswift {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")
    generate.add_parser(sub)
    info.add_parser(sub)
    bench.add_parser(sub)
    bench_steps.add_parser(sub)
    heads.add_parsers(sub)
    export_heads.add_parser(sub)
    for command in sub.choices.values():  # --debug is accepted after the command name too
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                             help="show tracebacks for errors")
        _name_values(command)
    return parser


def _name_values(command: argparse.ArgumentParser) -> None:
    """Give the options that name no metavar one by their type, as the config flags have (flags.py): N
    for a whole number or a seed, FILE for a path (argparse would print the option's name: SEQ_LEN)."""
    names = {whole_number: "N", seed_number: "N", Path: "FILE"}
    for action in command._actions:
        if action.option_strings and action.metavar is None and action.nargs is None and action.type in names:
            action.metavar = names[action.type]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _replace_what_stdout_cannot_encode()
    try:
        return _main(argv)
    except BrokenPipeError:  # stdout's reader stopped reading (`| head`): stop quietly, as shell tools do
        if "--debug" in argv:
            raise
        _silence_stdout()
        return 141  # 128 + SIGPIPE: what a shell reports for a tool that the closed pipe killed


def _replace_what_stdout_cannot_encode() -> None:
    """A stdout in an encoding that cannot hold the text (an ASCII or Latin-1 locale; Windows' code page when
    redirected) writes such characters as '?': they ended a run with a UnicodeEncodeError traceback, and nothing
    saved. --output and --json files are UTF-8 whatever stdout is."""
    encoding = (getattr(sys.stdout, "encoding", None) or "").lower().replace("-", "").replace("_", "")
    if encoding not in ("utf8", "utf8sig") and hasattr(sys.stdout, "reconfigure"):
        try:
            sys.stdout.reconfigure(errors="replace")
        except (ValueError, OSError):  # (a stream that cannot change its error handler: left as it is)
            pass


def _main(argv: list[str]) -> int:
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # said by the command's parser, whose --help lists the flags it takes
            _subparsers(parser)[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as exc:  # --help, --version (0) and argparse's one-line errors (2)
        return exc.code if isinstance(exc.code, int) else 2
    args.argv = argv  # the exact command, for reports
    commands = {"generate": generate.cmd_generate, "info": info.cmd_info, "bench": bench.cmd_bench,
                "bench-steps": bench_steps.cmd_bench_steps, "train-heads": heads.cmd_train_heads,
                "eval-heads": heads.cmd_eval_heads, "export-heads": export_heads.cmd_export_heads}
    from ..runtime.torchrun_env import env_world_size

    # generate and train-heads stop after a step and save at a signal; the other commands stop at once, SIGTERM
    # and SIGHUP as Ctrl-C does (an export's half-written directory was left behind by a SIGTERM)
    stop = StopRequest()
    StopRequest.stopped_by = None
    try:
        if env_world_size() > 1 and args.command != "generate":
            raise LongswiftError(f"only `generate` runs across several processes: run `longswift {args.command}` "
                                 "without torchrun")
        if args.command in ("generate", "train-heads"):
            return commands[args.command](args)
        with stop, stop.at_once():
            return commands[args.command](args)
    except LongswiftError as exc:
        if args.debug:
            raise
        if isinstance(exc, (ConfigError, AgreedError)):
            _let_the_first_process_say_it()
        # Config errors name API fields (SamplingConfig.top_k); on the command line, the flag (--top-k).
        print(f"{_prefix()}: error: {cli_text(exc)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # not a system error: main's quiet stop
        raise
    except OSError as exc:  # a disk that fills, a file system that refuses: the system's reason, on one line
        if args.debug:
            raise
        access = "; give this user access to it, or choose another path" if isinstance(exc, PermissionError) else ""
        print(f"{_prefix()}: error: {exc}{access} (--debug shows where)", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:  # (a run stopped at once may say where it can continue from)
        print(f"{_prefix()}: interrupted{f'; {exc}' if str(exc) else ''}", file=sys.stderr)
        return 128 + StopRequest.stopped_by if StopRequest.stopped_by is not None else 130
