"""The `longswift` command's entry point: the command line's imports (torch, transformers: 2-3 s)
run inside a Ctrl-C handler, so an interrupt while starting ends as one during a run does, with one
line and exit status 130, not a traceback. Imports nothing itself (the package's names are lazy)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    try:
        from .cli import main as cli_main
    except KeyboardInterrupt:
        print("longswift: interrupted", file=sys.stderr)
        return 130
    return cli_main(argv)
