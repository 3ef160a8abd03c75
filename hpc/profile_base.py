"""The pieces every section of a site profile shares: the strict model base, the one-line and shell-name patterns and
their checks (`hpc.site` holds the profile, `hpc.network` its network section)."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

from hpc.node.cli import NodeCheckError, shown
from hpc.node.netcheck import NcclList


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


SHELL_NAME_RE = r"^[A-Za-z_][A-Za-z0-9_]*$"
ONE_LINE_RE = r"^[^\n\r]*$"


def shell_names(names, what: str) -> None:
    for name in names:
        if not re.fullmatch(SHELL_NAME_RE, name):
            raise ValueError(
                f"{shown(name)} is not a shell variable name ({what} names are letters, digits and _, not starting "
                "with a digit)"
            )


def nccl_list(value: str, var: str) -> None:
    try:
        NcclList.parse(value, var)
    except NodeCheckError as e:
        raise ValueError(str(e)) from None
