"""What every command line of the project shares: one error class and one way to print it (one line, its exit code),
the argparse types that check numbers and paths where they are read, and the cap on any value an error line echoes."""

from __future__ import annotations

import argparse
import io
import math
import re
import reprlib
import sys
from typing import Callable, NoReturn, Optional

from hpc.node.contract import EXIT_BAD_INPUT

SHOWN_CHARS = 200  # an echoed value is cut to this many characters
LINE_CHARS = 1000  # and a whole error line to this many
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxdict, _REPR.maxlist, _REPR.maxtuple, _REPR.maxset = 3, 6, 6, 6, 6
_REPR.maxstring = _REPR.maxother = SHOWN_CHARS


class HpcError(Exception):
    """A problem reported as one line; ``code`` is the exit status (bad input unless a subclass says otherwise)."""

    code = EXIT_BAD_INPUT


class NodeCheckError(HpcError):
    """This node cannot run the job as configured; the message is one line."""


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """``repr(value)`` of a user's input cut to about ``limit`` characters (nested values shortened, never built
    whole)."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value)} characters)"
    r = _REPR.repr(value)
    return r if len(r) <= limit + 2 else f"{r[:limit]}..."


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with terminal control codes (ESC, BEL, CR, DEL, the C1 codes, ...; not newline or tab) written as
    ``\\xNN``, so what Slurm, a tool or a record holds is shown, never obeyed by the terminal."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


class PrintableWriter:
    """A text stream's writes through `printable` (the stream of a command that shows what Slurm and records say)."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> int:
        return self.stream.write(printable(text))

    def __getattr__(self, name):
        return getattr(self.stream, name)


def error_line(prog: str, error: HpcError | str) -> str:
    """``prog: error: MESSAGE`` on one line, at most `LINE_CHARS` characters, printable in any locale (control codes
    escaped)."""
    text = printable(" ".join(str(error).split()))
    if len(text) > LINE_CHARS:
        text = f"{text[:LINE_CHARS]}... ({len(text)} characters)"
    line = f"{prog}: error: {text}"
    return line.encode("utf-8", "backslashreplace").decode("utf-8")  # a non-UTF-8 argument arrives as surrogates


def whole_lines() -> None:
    """Make stdout and stderr write each line in one piece. Unbuffered (``PYTHONUNBUFFERED``, ``-u``), a print writes
    its text and its newline apart, and processes that share a stream (the ranks of a node) split each other's
    lines."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(line_buffering=True, write_through=False)


def print_error(prog: str, error: HpcError | str) -> None:
    """`error_line` on stderr in one write."""
    sys.stderr.write(error_line(prog, error) + "\n")
    sys.stderr.flush()


def fail(prog: str, error: HpcError | str, code: int | None = None) -> NoReturn:
    """Print `error_line` on stderr and exit with ``code`` (default: the error's, else 2: bad input)."""
    if code is None:
        code = error.code if isinstance(error, HpcError) else EXIT_BAD_INPUT
    print_error(prog, error)
    sys.exit(code)


def whole(lo: int = 1, hi: Optional[int] = None) -> Callable[[str], int]:
    """argparse type: a whole number (ASCII digits, optional sign) in [lo, hi]."""

    def parse(text: str) -> int:
        digits = text.removeprefix("-").removeprefix("+")
        if not digits.isdigit() or not digits.isascii() or len(digits) > 30:
            raise argparse.ArgumentTypeError(f"{shown(text)} is not a whole number")
        value = int(text)
        if value < lo or hi is not None and value > hi:
            allowed = f"{lo}..{hi}" if hi is not None else f"at least {lo}"
            raise argparse.ArgumentTypeError(f"{value} is out of range: allowed {allowed}")
        return value

    parse.__name__ = "whole number"
    return parse


def number(lo: float, hi: float, lo_open: bool = False) -> Callable[[str], float]:
    """argparse type: a finite number in [lo, hi] (lo excluded with ``lo_open``)."""

    def parse(text: str) -> float:
        try:
            value = float(text) if len(text) <= 50 and text.isascii() and text == text.strip() else math.nan
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{shown(text)} is not a finite number")
        if value < lo or value == lo and lo_open or value > hi:
            raise argparse.ArgumentTypeError(
                f"{value:g} is out of range: allowed {'(' if lo_open else '['}{lo:g}, {hi:g}]"
            )
        return value

    parse.__name__ = "number"
    return parse


def path_text(text: str) -> str:
    """argparse type: a non-empty path (an unset shell variable gives an empty one) without a NUL."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path (an unset shell variable?); give a file or directory")
    if "\0" in text:
        raise argparse.ArgumentTypeError("a path cannot contain a NUL character")
    return text


def check_utf8(text: str, what: str) -> str:
    """``text`` unless it holds bytes that are not UTF-8 (Python keeps them as surrogates): one error line then."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise HpcError(
            f"{what} {shown(text)}: not valid UTF-8 (check the terminal's or the script's encoding)"
        ) from None
    return text


class _Once(argparse.Action):
    """A flag that takes one value and may be given once: a second one is an error, not a silent override."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = namespace.__dict__.setdefault("_given_once", set())
        if self.dest in given:
            raise argparse.ArgumentError(self, "given twice; give it once")
        given.add(self.dest)
        setattr(namespace, self.dest, values)


class Parser(argparse.ArgumentParser):
    """argparse with its errors as one line (no usage block): ``prog: error: MESSAGE (see --help)``, exit 2.
    A flag that stores one value may be given only once."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register("action", None, _Once)  # the default action, in groups too
        self.register("action", "store", _Once)

    def error(self, message: str) -> NoReturn:
        fail(self.prog, f"{message} (see --help)")

    def parse_known_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        for arg in args:
            try:
                check_utf8(arg, "argument")
            except HpcError as e:
                self.error(str(e))
        ns, rest = super().parse_known_args(args, namespace)
        ns.__dict__.pop("_given_once", None)
        return ns, rest
