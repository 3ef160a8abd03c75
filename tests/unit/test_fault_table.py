"""The fault table (hpc/node/fault_table.py): real PyTorch exceptions judged by type and the CUDA or NCCL code they
carry; marks of the program's; a rank's exit code and record (hpc/node/fault_exit.py); the docs' copy of the table."""

import json
import runpy
import sys

import pytest
import torch
import torch.distributed as dist
from conftest import ROOT

from hpc.node.contract import ATTEMPT_DIR_VAR, EXIT_FAILED, EXIT_NODE_FAULT
from hpc.node.fault_exit import reported_faults
from hpc.node.fault_table import NODE, PROGRAM, RULES, classify, mark_node_fault, mark_program_error, markdown_table
from train.faults import CUDA_ERRORS, torch_error

# cudaError_t and ncclResult_t values from CUDA's driver_types.h and NCCL's nccl.h (the oracle the table must match)
CUDA_CODES = {
    "cudaErrorInvalidValue": 1,
    "cudaErrorMemoryAllocation": 2,
    "cudaErrorInitializationError": 3,
    "cudaErrorDevicesUnavailable": 46,
    "cudaErrorNoDevice": 100,
    "cudaErrorNoKernelImageForDevice": 209,
    "cudaErrorECCUncorrectable": 214,
    "cudaErrorNvlinkUncorrectable": 221,
    "cudaErrorIllegalAddress": 700,
    "cudaErrorLaunchTimeout": 702,
    "cudaErrorAssert": 710,
    "cudaErrorIllegalInstruction": 715,
    "cudaErrorMisalignedAddress": 716,
    "cudaErrorLaunchFailure": 719,
    "cudaErrorSystemNotReady": 802,
    "cudaErrorUnknown": 999,
}
NCCL_CODES = {
    "ncclUnhandledCudaError": 1,
    "ncclSystemError": 2,
    "ncclInternalError": 3,
    "ncclInvalidArgument": 4,
    "ncclInvalidUsage": 5,
    "ncclRemoteError": 6,
}


def cuda_error(code: int) -> torch.AcceleratorError:
    e = torch.AcceleratorError("CUDA error: something")  # torch's C++ sets error_code on the instance as here
    e.error_code = code
    return e


def nccl_error(name: str) -> dist.DistBackendError:
    return dist.DistBackendError(
        f"NCCL error in: ProcessGroupNCCL.cpp:1, unhandled error, NCCL version 2.27.3\n{name}: x"
    )


def test_every_code_in_the_table_is_the_one_cuda_or_nccl_gives_it():
    for r in RULES:
        if r.code is not None:
            assert (CUDA_CODES if r.error == "torch.AcceleratorError" else NCCL_CODES)[r.code_name] == r.code, r


@pytest.mark.parametrize(
    "exc, cause, signature",
    [
        (cuda_error(214), NODE, "torch.AcceleratorError cudaErrorECCUncorrectable"),
        (cuda_error(719), NODE, "torch.AcceleratorError cudaErrorLaunchFailure"),
        (cuda_error(999), NODE, "torch.AcceleratorError cudaErrorUnknown"),
        (cuda_error(2), PROGRAM, "torch.AcceleratorError cudaErrorMemoryAllocation"),
        (cuda_error(710), PROGRAM, "torch.AcceleratorError cudaErrorAssert"),
        (cuda_error(12345), PROGRAM, "torch.AcceleratorError 12345"),  # any other CUDA error
        (torch.AcceleratorError("CUDA error: no code"), PROGRAM, "torch.AcceleratorError"),
        (torch.OutOfMemoryError("CUDA out of memory"), PROGRAM, "torch.OutOfMemoryError"),
        (nccl_error("ncclSystemError"), NODE, "torch.distributed.DistBackendError ncclSystemError"),
        (nccl_error("ncclUnhandledCudaError"), NODE, "torch.distributed.DistBackendError ncclUnhandledCudaError"),
        (nccl_error("ncclRemoteError"), NODE, "torch.distributed.DistBackendError ncclRemoteError"),
        (nccl_error("ncclInvalidUsage"), PROGRAM, "torch.distributed.DistBackendError ncclInvalidUsage"),
        (dist.DistBackendError("gloo: Connection closed by peer"), PROGRAM, "torch.distributed.DistBackendError"),
        (dist.DistNetworkError("connect() timed out"), NODE, "torch.distributed.DistNetworkError"),
        (dist.DistStoreError("store timeout"), NODE, "torch.distributed.DistStoreError"),
        (ValueError("shape mismatch"), PROGRAM, "builtins.ValueError"),
        # the message's prose says nothing: a ValueError naming ECC is still the program's
        (RuntimeError("CUDA error: uncorrectable ECC error encountered"), PROGRAM, "builtins.RuntimeError"),
    ],
)
def test_exceptions_are_judged_by_type_and_code(exc, cause, signature):
    v = classify(exc)
    assert (v.cause, v.signature) == (cause, signature)


def test_a_wrapped_error_is_judged_by_its_cause_and_a_mark_wins():
    try:
        try:
            raise cuda_error(214)
        except torch.AcceleratorError as e:
            raise RuntimeError("the step failed") from e
    except RuntimeError as wrapped:
        assert classify(wrapped).cause == NODE
    assert classify(mark_node_fault(ValueError("my sensor says the GPU is bad"))).cause == NODE
    v = classify(mark_program_error(cuda_error(214)))
    assert (v.cause, v.marked, v.signature) == (PROGRAM, True, "torch.AcceleratorError cudaErrorECCUncorrectable")


def test_the_injected_faults_are_what_torch_raises():
    for kind, (code, _) in CUDA_ERRORS.items():
        e = torch_error(kind)
        assert type(e) is torch.AcceleratorError and e.error_code == code
    assert classify(torch_error("ecc")).cause == NODE and classify(torch_error("device-assert")).cause == PROGRAM
    assert classify(torch_error("nccl-system")).code == 2 and classify(torch_error("oom")).cause == PROGRAM


def ecc() -> None:
    raise cuda_error(214)


def bad_shape() -> None:
    raise ValueError("bad shape")


def nic_down() -> None:
    raise mark_node_fault(OSError("my NIC is down"))


@pytest.mark.parametrize(
    "fail, rc, cause",
    [(ecc, EXIT_NODE_FAULT, NODE), (bad_shape, EXIT_FAILED, PROGRAM), (nic_down, EXIT_NODE_FAULT, NODE)],
)
def test_a_scripts_exception_ends_with_its_verdicts_code_and_record(tmp_path, monkeypatch, capsys, fail, rc, cause):
    for name, value in ((ATTEMPT_DIR_VAR, str(tmp_path)), ("RANK", "3"), ("SLURMD_NODENAME", "n7")):
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as ended:
        with reported_faults():
            fail()
    assert ended.value.code == rc
    err = capsys.readouterr().err
    assert "Traceback" in err and "[fault] rank 3 on n7: " in err
    rec = json.loads((tmp_path / "fault-3.json").read_text())
    assert (rec["rank"], rec["node"], rec["cause"], rec["exit"]) == (3, "n7", cause, rc)
    with pytest.raises(SystemExit) as ended:  # sys.exit passes through as it is
        with reported_faults():
            sys.exit(93)
    assert ended.value.code == 93


def test_the_docs_hold_the_tables():
    gen = runpy.run_path(str(ROOT / "scripts" / "gen_fault_docs.py"))
    text = (ROOT / "docs" / "spares.md").read_text()
    assert text == gen["render"](text), "docs/spares.md's tables are stale: run python scripts/gen_fault_docs.py"
    assert markdown_table() in text and "| `torch.AcceleratorError` | 214 `cudaErrorECCUncorrectable` |" in text


def _recorded(entry: dict) -> BaseException:
    """An exception of the type, code and message a real GPU fault reached Python with (bench/gpu_faults.py)."""
    kinds = {
        "torch.AcceleratorError": torch.AcceleratorError,
        "torch.OutOfMemoryError": torch.OutOfMemoryError,
        "torch.distributed.DistBackendError": dist.DistBackendError,
    }
    exc = kinds[entry["type"]](entry["message"])
    if entry["error_code"] is not None:
        exc.error_code = entry["error_code"]
    return exc


GPU_RECORDING = json.loads((ROOT / "tests/unit/data/gpu_faults_h100.json").read_text())


@pytest.mark.parametrize("fault", GPU_RECORDING["faults"], ids=lambda f: f"{f['fault']}-{f.get('rank', '')}")
def test_faults_recorded_on_a_gpu_get_the_cause_of_what_provoked_them(fault):
    """Each fault bench/gpu_faults.py provoked on an H100 (an index out of range, a kernel's bad or misaligned
    address, a kernel's trap, out of memory, two NCCL ranks on one GPU), rebuilt from the type, code and message
    recorded there, is judged as what provoked it, a CUDA error by the code it carries; a sticky error fails the next
    CUDA call with the same code."""
    assert fault["raised"]["verdict"] == fault["expected"]  # the table's verdict on the real exception, there
    first = fault["raised"]["chain"][0]
    verdict = classify(_recorded(first))
    assert verdict.cause == fault["expected"], first
    assert verdict.specific == (first["error_code"] is not None), verdict
    if fault.get("sticky"):
        assert fault["next_call"]["chain"][0]["error_code"] == first["error_code"]
