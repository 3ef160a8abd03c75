"""Straggler naming's arithmetic: each rank against the median of the others, and K slow windows in a row."""

import statistics
from pathlib import Path

import pytest

from train.front.config import ConfigError, load_config
from train.straggler import Streaks, describe, slower_than_peers


def test_each_rank_is_compared_with_the_median_of_the_others():
    times = [1.0, 1.02, 0.98, 1.3]
    slower = slower_than_peers(times)
    for r, t in enumerate(times):
        assert slower[r] == pytest.approx(t / statistics.median(times[:r] + times[r + 1 :]) - 1)
    assert (
        slower[3] == pytest.approx(0.3) and max(slower[:3]) < 0.05
    )  # the slow rank does not pull the others' reference
    assert slower_than_peers([2.0, 1.0]) == [1.0, -0.5]  # two ranks: each against the other


def test_a_rank_is_named_after_k_slow_windows_in_a_row():
    s = Streaks(world=4, threshold=0.1, windows=3)
    assert s.add([0, 0, 0, 0.2]) == [] and s.add([0, 0, 0, 0.14]) == []
    assert s.add([0, 0.5, 0, 0.05]) == []  # rank 3's streak broken at 5%; rank 1 has one slow window
    assert s.add([0, 0.5, 0, 0.2]) == [] and s.add([0, 0.5, 0, 0.2]) == [(1, pytest.approx(0.5), 3)]
    named = s.add([0, 0.2, 0, 0.2])
    assert named == [(1, pytest.approx(0.425), 4), (3, pytest.approx(0.2), 3)]
    f = {"rank": 3, "node": "n2", "slower": 0.14, "windows": 3, "cause": "host"}
    assert describe(f) == (
        "rank 3 on n2, 14% slower than the median over 3 windows: the others wait for it, its computation "
        "is not slower (stopped, descheduled, waiting on data or storage)"
    )
    assert describe({**f, "cause": "compute"}).endswith("windows: its computation is slower")


def waiting_in(filename: str, seconds: float):
    """A function whose code object says it lives in ``filename``: a thread running it looks, to a sampler, as if it
    were
    there (a collective of torch.distributed, or not)."""
    scope: dict = {}
    exec(compile(f"def wait():\n    import time\n    time.sleep({seconds})\n", filename, "exec"), scope)
    return scope["wait"]


@pytest.mark.parametrize(
    "filename,inside",
    [
        ("/x/torch/distributed/distributed_c10d.py", True),
        ("/x/torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py", True),
        ("/x/torch/distributed/_functional_collectives.py", True),
        ("/x/torch/distributed/tensor/_dispatch.py", False),
        ("/x/train/loop.py", False),
    ],
)
def test_the_time_a_thread_spends_inside_collectives_is_sampled(filename, inside):
    import threading

    from train.steptime import CollectiveWait

    out: dict = {}

    def thread() -> None:
        w = CollectiveWait(period_s=0.005)
        w.resume()
        waiting_in(filename, 0.4)()
        w.pause()
        out["waited"] = w.take()
        w.resume()
        waiting_in("/x/train/loop.py", 0.2)()
        w.pause()
        out["after"] = w.take()
        waiting_in(filename, 0.2)()  # paused: not counted
        out["paused"] = w.take()
        w.close()
        out["cpu"] = w.cpu_s

    t = threading.Thread(target=thread)
    t.start()
    t.join()
    assert out["waited"] == pytest.approx(0.4, abs=0.15) if inside else out["waited"] == 0.0
    assert out["after"] == 0.0 and out["paused"] == 0.0 and 0 < out["cpu"] < 0.2


TINY = str(Path(__file__).resolve().parents[2] / "train" / "configs" / "tiny.yaml")


def test_defaults_and_bounds():
    cfg = load_config(TINY, [])
    assert (cfg.straggler.every, cfg.straggler.threshold, cfg.straggler.windows) == (20, 0.1, 3)
    with pytest.raises(ConfigError, match="straggler.threshold"):
        load_config(TINY, ["straggler.threshold=0"])
