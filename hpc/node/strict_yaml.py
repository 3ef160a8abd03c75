"""The one YAML reader of the project's files (site profiles, training configs) and ``key=value`` overrides.

Plain YAML 1.2 core scalars, nothing that changes meaning silently: ``true``/``false`` (no yes/on), ``null``/``~``,
decimal integers (no leading zero: ``010`` is not 8; at most 30 digits), decimal floats (``1e-3`` is a number),
``.inf``/``.nan`` (left to the fields' finite checks); ``1:30`` and ``0x10`` stay strings. A key given twice, an
alias (``*name``: no expansion bombs), a NUL character or nesting deeper than `MAX_DEPTH` is an error.
Every error is a `YamlError` of one line naming the source and its line.
"""

from __future__ import annotations

import re

import yaml

from hpc.node.cli import HpcError, shown

MAX_DEPTH = 100
MAX_DIGITS = 30
_INT = r"[-+]?[0-9]+"
_FLOAT = r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)"


class YamlError(HpcError):
    """A YAML text that cannot be read as the project reads it; the message is one line."""


class _Refused(yaml.MarkedYAMLError):
    pass


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core scalars and no aliases, duplicate keys, NULs or deep nesting."""

    yaml_implicit_resolvers: dict = {}

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise _Refused(None, None, f"alias *{event.anchor} is not allowed (write the value out)", event.start_mark)
        self._depth = getattr(self, "_depth", 0) + 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Refused(None, None, f"nested deeper than {MAX_DEPTH} levels", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (list, dict)):
                raise _Refused(None, None, "a mapping key must be a plain value", key_node.start_mark)
            if key in seen:
                raise _Refused(
                    None, None, f"key {shown(key)} is given twice (first on line {seen[key] + 1})", key_node.start_mark
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)


def _scalar(loader: _Loader, node) -> str:
    return loader.construct_scalar(node)


def _construct_int(loader: _Loader, node) -> int:
    text = _scalar(loader, node)
    digits = text.lstrip("+-")
    if len(digits) > 1 and digits.startswith("0"):
        raise _Refused(
            None,
            None,
            f"{text}: a leading zero is ambiguous (YAML 1.1 reads it as octal); write {int(digits)} or quote it",
            node.start_mark,
        )
    if len(digits) > MAX_DIGITS:
        raise _Refused(None, None, f"an integer of {len(digits)} digits (at most {MAX_DIGITS})", node.start_mark)
    return int(text)


def _construct_float(loader: _Loader, node) -> float:
    text = _scalar(loader, node)
    if len(text) > 2 * MAX_DIGITS:
        raise _Refused(None, None, f"a number of {len(text)} characters", node.start_mark)
    lower = text.lower()
    if lower.endswith(".inf"):
        return float("-inf") if lower.startswith("-") else float("inf")
    if lower == ".nan":
        return float("nan")
    return float(text)


def _construct_str(loader: _Loader, node) -> str:
    text = _scalar(loader, node)
    if "\0" in text:
        raise _Refused(None, None, "a NUL character is not allowed", node.start_mark)
    return text


for _tag, _regex, _first in (
    ("tag:yaml.org,2002:bool", r"true|True|TRUE|false|False|FALSE", "tTfF"),
    ("tag:yaml.org,2002:null", r"~|null|Null|NULL|", ["~", "n", "N", ""]),
    ("tag:yaml.org,2002:int", _INT, "-+0123456789"),
    ("tag:yaml.org,2002:float", _FLOAT, "-+0123456789."),
):
    _Loader.add_implicit_resolver(_tag, re.compile(f"^(?:{_regex})$"), list(_first))
_Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)
_Loader.add_constructor("tag:yaml.org,2002:float", _construct_float)
_Loader.add_constructor("tag:yaml.org,2002:str", _construct_str)


def load_yaml(text: str, source: str):
    """The YAML document in ``text`` (None when empty); ``source`` names it in the error line."""
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" line {mark.line + 1}" if mark else ""
        raise YamlError(f"{source}{where}: not valid YAML ({e.problem or e.context})") from None
    except yaml.YAMLError as e:
        raise YamlError(f"{source}: not valid YAML ({' '.join(str(e).split())[:200]})") from None
    except RecursionError:
        raise YamlError(f"{source}: nested too deeply") from None


def parse_override(text: str, source: str):
    """The value of a ``key=value`` override: one YAML scalar or flow list/mapping, refused where the text would
    not mean what it shows (an empty value, spaces around it, a # comment, a bare ~)."""
    if text == "":
        raise YamlError(
            f"{source}: an empty value (an unset shell variable?); write null for none or '' for an empty string"
        )
    if text != text.strip():
        raise YamlError(f"{source}: spaces around the value; leave them out or quote the value")
    if text.startswith("#") or " #" in text or "\t#" in text:
        raise YamlError(f"{source}: # would start a YAML comment; quote the value")
    if text == "~":
        raise YamlError(f"{source}: a bare ~ is YAML's null, not the home directory; write null, or ~/DIR for a path")
    return load_yaml(text, source)
