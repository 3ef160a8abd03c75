"""metrics.jsonl reading and the summary table (pure; test_jobs.py reads a real job's file)."""

import json

import pytest

from hpc.metrics_report import read_metrics, straggler_lines, summary_table
from hpc.node.cli import HpcError


def rec(step, loss, tps=100.0, mfu=None):
    return {"step": step, "loss": loss, "tokens_per_s": tps, "mfu": mfu, "lr": 1e-3, "grad_norm": 0.5}


def test_requeued_steps_keep_the_last_record_and_a_partial_line_waits(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [rec(1, 3.0), rec(2, 2.5), rec(3, 2.2), rec(2, 2.4), rec(3, 2.1)]  # resumed from the step-1 checkpoint
    path.write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"step": 4, "lo')
    assert [(r["step"], r["loss"]) for r in read_metrics(path)] == [(1, 3.0), (2, 2.4), (3, 2.1)]
    assert read_metrics(tmp_path / "none.jsonl") == []


def test_a_broken_line_is_an_error(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps(rec(1, 3.0)) + "\nnot json\n")
    with pytest.raises(HpcError, match="line 2 is not JSON"):
        read_metrics(path)
    path.write_text(json.dumps(rec(1, 3.0)) + '\n{"loss": 1.0}\n')
    with pytest.raises(HpcError, match="line 2 has no whole-number step"):
        read_metrics(path)


def test_summary_table():
    rows = [line.split() for line in summary_table([rec(1, 3.0, 1000.0, 0.25), rec(2, 1.0, 3000.0, None)]).splitlines()]
    assert rows[0] == ["metric", "first", "last", "min", "max", "mean"]
    assert rows[1] == ["loss", "3", "1", "1", "3", "2"]
    assert rows[2] == ["tokens_per_s", "1,000", "3,000", "1,000", "3,000", "2,000"]
    assert rows[3] == ["mfu", "0.25", "n/a", "0.25", "0.25", "0.25"]


def test_straggler_lines_name_each_slow_rank_once():
    def named(rank, node, slower, windows):
        return {"rank": rank, "node": node, "slower": slower, "windows": windows}

    records = [
        rec(20, 3.0),
        rec(40, 2.9),
        {**rec(60, 2.8), "stragglers": [named(3, "n2", 0.14, 3)]},
        {
            **rec(80, 2.7),
            "stragglers": [
                {**named(3, "n2", 0.21, 4), "cause": "host"},
                {**named(0, "n1", 0.12, 3), "cause": "compute"},
            ],
        },
        rec(100, 2.6),
    ]
    assert straggler_lines(records) == [
        "straggler: rank 0 on n1 (its computation slower), named at 1 window(s), steps 80-80; 12% slower than the "
        "median over "
        "3 windows when last named (at most 12%)",
        "straggler: rank 3 on n2 (late, its computation not slower: a host-side stall), named at 2 window(s), steps "
        "60-80; 21% "
        "slower than the median over 4 windows when last named (at most 21%)",
    ]
    assert straggler_lines(records[:2]) == []


def test_tensorboard_scalars_read_back_by_tensorboard(tmp_path):
    """The torch-free event file: tensorboard's own CRC and its reader (an independent oracle) agree with it."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as tensorboard_crc

    from hpc.metrics_report import to_tensorboard
    from hpc.tensorboard_events import masked_crc32c

    for data in (b"", b"a", b"123456789", bytes(range(256)) * 3):
        assert masked_crc32c(data) == tensorboard_crc(data)
    records = [rec(1, 3.0, mfu=0.25), rec(2, 2.5), {"step": 3, "loss": 2.0, "flag": True, "name": "x"}]
    assert to_tensorboard(records, tmp_path / "tb") == 5 + 4 + 1  # mfu None, a bool and a string are not scalars
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == [
        "train/grad_norm",
        "train/loss",
        "train/lr",
        "train/mfu",
        "train/tokens_per_s",
    ]
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(1, 3.0), (2, 2.5), (3, 2.0)]
    assert [(e.step, e.value) for e in events.Scalars("train/mfu")] == [(1, 0.25)]
