"""What every command line of the project shares: one error class and one way to print it (one line, its exit code)."""
from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from hpc.node.contract import EXIT_BAD_INPUT


class HpcError(Exception):
    """A problem reported as one line; ``code`` is the exit status (bad input unless a subclass says otherwise)."""

    code = EXIT_BAD_INPUT


def error_line(prog: str, error: HpcError | str) -> str:
    """``prog: error: MESSAGE`` on one line."""
    return f"{prog}: error: {' '.join(str(error).split())}"


def fail(prog: str, error: HpcError | str, code: int | None = None) -> NoReturn:
    """Print `error_line` on stderr and exit with ``code`` (default: the error's, else 2: bad input)."""
    if code is None:
        code = error.code if isinstance(error, HpcError) else EXIT_BAD_INPUT
    print(error_line(prog, error), file=sys.stderr, flush=True)
    sys.exit(code)


class Parser(argparse.ArgumentParser):
    """argparse with its errors as one line (no usage block): ``prog: error: MESSAGE (see --help)``, exit 2."""

    def error(self, message: str) -> NoReturn:
        fail(self.prog, f"{message} (see --help)")
