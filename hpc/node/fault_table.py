"""Which exceptions are a node's (its GPU, driver, link or network) and which are the program's: ONE table, by the
exception's type and the CUDA or NCCL result code it carries, never by its message's prose.

* ``torch.AcceleratorError`` carries the CUDA error (``cudaError_t``) as ``error_code`` (torch sets it);
* ``torch.distributed.DistBackendError`` carries no code attribute: NCCL's result (``ncclResult_t``) is the name
  token torch puts in every NCCL error (``ncclSystemError: System call ... failed``), read as that enum's value;
* a mark of your own wins over the table: `mark_node_fault` / `mark_program_error` (an attribute of the exception,
  ``hpc_fault``), for an exception of your script that says either.

A suspected node fault restarts the ranks only where the health stage then finds the node's GPUs bad (the node
leaves the job) or, once, elsewhere (the node not blamed); the same error coming back on another node is the
program's and ends the job (`hpc.node.restart_policy`). Anything the table does not name is the program's error.
The docs' table (docs/spares.md) is generated from `RULES` (`markdown_table`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

NODE, PROGRAM = "node", "program"
FAULT_ATTR = "hpc_fault"  # on an exception: NODE or PROGRAM, set by mark_node_fault / mark_program_error

ACCELERATOR_ERROR = "torch.AcceleratorError"
OUT_OF_MEMORY = "torch.OutOfMemoryError"
DIST_BACKEND_ERROR = "torch.distributed.DistBackendError"
DIST_NETWORK_ERROR = "torch.distributed.DistNetworkError"
DIST_STORE_ERROR = "torch.distributed.DistStoreError"

NCCL_RESULTS = {  # ncclResult_t (nccl.h)
    "ncclUnhandledCudaError": 1,
    "ncclSystemError": 2,
    "ncclInternalError": 3,
    "ncclInvalidArgument": 4,
    "ncclInvalidUsage": 5,
    "ncclRemoteError": 6,
}
_NCCL_TOKEN = re.compile(r"\b(" + "|".join(NCCL_RESULTS) + r")\b")


@dataclass(frozen=True)
class Rule:
    error: str  # the exception type's qualified name (it or a subclass)
    code: Optional[int]  # the result code it carries; None: any code, or none
    code_name: str  # cudaError_t / ncclResult_t name ("" for any)
    cause: str  # NODE (suspected: the health stage decides) or PROGRAM (never restarted)
    what: str


def _cuda(code: int, name: str, cause: str, what: str) -> Rule:
    return Rule(ACCELERATOR_ERROR, code, name, cause, what)


def _nccl(name: str, cause: str, what: str) -> Rule:
    return Rule(DIST_BACKEND_ERROR, NCCL_RESULTS[name], name, cause, what)


RULES: tuple[Rule, ...] = (
    _cuda(214, "cudaErrorECCUncorrectable", NODE, "uncorrectable ECC error in the GPU's memory"),
    _cuda(221, "cudaErrorNvlinkUncorrectable", NODE, "uncorrectable NVLink error"),
    _cuda(719, "cudaErrorLaunchFailure", NODE, "unspecified launch failure (a GPU fault, the context is lost)"),
    _cuda(702, "cudaErrorLaunchTimeout", NODE, "a kernel ran past the driver's watchdog"),
    _cuda(999, "cudaErrorUnknown", NODE, "unknown CUDA error (the driver's)"),
    _cuda(3, "cudaErrorInitializationError", NODE, "the CUDA driver failed to initialise"),
    _cuda(46, "cudaErrorDevicesUnavailable", NODE, "the GPUs are busy or unavailable"),
    _cuda(100, "cudaErrorNoDevice", NODE, "no GPU found"),
    _cuda(802, "cudaErrorSystemNotReady", NODE, "the system is not ready (fabric manager)"),
    _cuda(2, "cudaErrorMemoryAllocation", PROGRAM, "out of GPU memory"),
    _cuda(710, "cudaErrorAssert", PROGRAM, "a device-side assert (an index out of range, a bad label)"),
    _cuda(700, "cudaErrorIllegalAddress", PROGRAM, "an illegal memory access by a kernel"),
    _cuda(715, "cudaErrorIllegalInstruction", PROGRAM, "an illegal instruction in a kernel"),
    _cuda(716, "cudaErrorMisalignedAddress", PROGRAM, "a misaligned address in a kernel"),
    _cuda(1, "cudaErrorInvalidValue", PROGRAM, "an invalid argument to a CUDA call"),
    _cuda(209, "cudaErrorNoKernelImageForDevice", PROGRAM, "no kernel built for this GPU"),
    Rule(ACCELERATOR_ERROR, None, "", PROGRAM, "any other CUDA error"),
    Rule(OUT_OF_MEMORY, None, "", PROGRAM, "out of GPU memory"),
    _nccl("ncclUnhandledCudaError", NODE, "a CUDA call inside NCCL failed"),
    _nccl("ncclSystemError", NODE, "a system call or the network failed"),
    _nccl("ncclInternalError", NODE, "NCCL's internal error (often the network)"),
    _nccl("ncclRemoteError", NODE, "a peer or the link failed"),
    _nccl("ncclInvalidArgument", PROGRAM, "an invalid argument to a collective"),
    _nccl("ncclInvalidUsage", PROGRAM, "NCCL used wrongly (mismatched collectives, a bad communicator)"),
    Rule(DIST_NETWORK_ERROR, None, "", NODE, "the network between the ranks failed"),
    Rule(DIST_STORE_ERROR, None, "", NODE, "the rendezvous store could not be reached"),
)


@dataclass(frozen=True)
class Verdict:
    """What an exception is: its cause (NODE or PROGRAM), the type and code it was judged by, and why."""

    cause: str
    error: str  # the exception's own qualified type name
    code: Optional[int] = None
    code_name: str = ""
    what: str = ""
    marked: bool = False  # a mark of the program's, not the table

    @property
    def signature(self) -> str:
        """The same error, wherever it comes back: its type and code."""
        return f"{self.error} {self.code_name or self.code}" if self.code is not None else self.error

    @property
    def specific(self) -> bool:
        """Judged by a mark or a result code (not just a type)."""
        return self.marked or self.code is not None


def qualified(t: type) -> str:
    return f"{t.__module__}.{t.__qualname__}"


def _code(exc: BaseException, names: set[str]) -> tuple[Optional[int], str]:
    if ACCELERATOR_ERROR in names:
        code = getattr(exc, "error_code", None)
        if isinstance(code, int) and not isinstance(code, bool):
            name = next((r.code_name for r in RULES if r.error == ACCELERATOR_ERROR and r.code == code), "")
            return code, name
    if DIST_BACKEND_ERROR in names:
        m = _NCCL_TOKEN.search(str(exc))
        if m:
            return NCCL_RESULTS[m.group(1)], m.group(1)
    return None, ""


def _judge_one(exc: BaseException) -> Optional[Verdict]:
    own = qualified(type(exc))
    mark = getattr(exc, FAULT_ATTR, None)
    names = {qualified(t) for t in type(exc).__mro__}
    code, code_name = _code(exc, names)
    if mark in (NODE, PROGRAM):
        return Verdict(mark, own, code, code_name, "marked by the program", marked=True)
    for rule in RULES:
        if rule.error in names and rule.code in (None, code):
            return Verdict(rule.cause, own, code, code_name or rule.code_name, rule.what)
    return None


def classify(exc: BaseException) -> Verdict:
    """``exc``'s verdict: the first exception of its chain (itself, then what caused it) that a mark or the table
    names; else the program's error."""
    seen: set[int] = set()
    e: Optional[BaseException] = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        verdict = _judge_one(e)
        if verdict is not None:
            return verdict
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
    return Verdict(PROGRAM, qualified(type(exc)), what="an error of the program (not in the fault table)")


def mark_node_fault(exc: BaseException) -> BaseException:
    """Mark ``exc`` as a suspected fault of this node (its GPU, driver, link or network); returns it (``raise
    mark_node_fault(MyError(...))``)."""
    setattr(exc, FAULT_ATTR, NODE)
    return exc


def mark_program_error(exc: BaseException) -> BaseException:
    """Mark ``exc`` as the program's own error, whatever the table says (never restarted); returns it."""
    setattr(exc, FAULT_ATTR, PROGRAM)
    return exc


def markdown_table() -> str:
    """`RULES` as the docs show them."""
    cause = {NODE: "suspected node fault", PROGRAM: "the program's error"}
    lines = ["| exception | code | what | counts as |", "| --- | --- | --- | --- |"]
    for r in RULES:
        code = f"{r.code} `{r.code_name}`" if r.code is not None else "any"
        lines.append(f"| `{r.error}` | {code} | {r.what} | {cause[r.cause]} |")
    return "\n".join(lines) + "\n"
