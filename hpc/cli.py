"""What every command line of the project shares: one-line errors with exit code 2."""
from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from hpc.requeue import EXIT_BAD_INPUT


def fail(prog: str, message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """Print ``prog: error: message`` as one line on stderr and exit (2: bad input)."""
    print(f"{prog}: error: {' '.join(str(message).split())}", file=sys.stderr)
    sys.exit(code)


class Parser(argparse.ArgumentParser):
    """argparse with its errors as one line (no usage block): ``prog: error: MESSAGE (see --help)``, exit 2."""

    def error(self, message: str) -> NoReturn:
        fail(self.prog, f"{message} (see --help)")
