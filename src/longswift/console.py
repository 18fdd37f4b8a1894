"""The `longswift` command's entry point: the command line's imports and its parser's building run inside a
Ctrl-C handler (the commands' own imports, torch and transformers, run under the command line's), so an interrupt
while starting ends as one during a run does, with one line and exit status 130, not a traceback. Imports nothing
itself (the package's names are lazy)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    try:
        from .cli import main as cli_main

        return cli_main(argv)  # (an interrupt the command line handles ends there; one before it, here)
    except KeyboardInterrupt:
        print("longswift: interrupted", file=sys.stderr)
        return 130
