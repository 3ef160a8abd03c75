"""Preflight's verdicts (slow link, slow node, unhealthy node, expected bandwidth) on recorded sweeps."""

from pathlib import Path

from hpc.node.health import check_smi
from hpc.preflight import analyze

SIZES = [1 << 20, 4 << 20]


def rows(gbps: float) -> list[dict]:
    return [{"bytes": s, "time_us": 1.0, "algbw_gbps": gbps, "busbw_gbps": gbps} for s in SIZES]


def record(nodes: list[str], pairs: dict[tuple, float], intra: dict[str, float], all_gbps: float = 10.0) -> dict:
    return {
        "sizes": SIZES,
        "nodes": [{"name": n} for n in nodes],
        "all": rows(all_gbps),
        "intra": {n: rows(v) for n, v in intra.items()},
        "pairs": [{"nodes": list(k), "rows": rows(v)} for k, v in pairs.items()],
    }


def test_slow_link_and_slow_node_are_found():
    pairs = {tuple(k): 10 for k in ("ab", "ac", "bc", "bd", "cd")} | {("a", "d"): 2}
    r = analyze(record(list("abcd"), pairs, dict.fromkeys("abcd", 50)), None, None, 0.5)
    assert r["slow_links"] == ["a-d"] and r["slow_nodes"] == [] and r["failed"]
    assert r["exclude"] == "a,d"  # either end may be at fault: their other links are equally fast
    assert "slow link a-d: 2 GB/s, below 0.5 x the other pairs' median" in r["warnings"]
    pairs[("a", "b")] = 6  # a's links are now the slower ones: a alone is excluded
    assert analyze(record(list("abcd"), pairs, dict.fromkeys("abcd", 50)), None, None, 0.5)["exclude"] == "a"
    names = ["gpu-a1", "gpu-a2", "gpu-b1"]  # every link to gpu-b1 is slow, and so is the node inside
    pairs = {("gpu-a1", "gpu-a2"): 10, ("gpu-a1", "gpu-b1"): 2, ("gpu-a2", "gpu-b1"): 2}
    r = analyze(record(names, pairs, {"gpu-a1": 50, "gpu-a2": 50, "gpu-b1": 10}), None, None, 0.5)
    assert r["slow_links"] == ["gpu-a1-gpu-b1", "gpu-a2-gpu-b1"] and r["slow_nodes"] == ["gpu-b1"]
    assert r["failed"] and r["exclude"] == "gpu-b1"
    r = analyze(record(names, pairs, dict.fromkeys(names, 50)), None, None, 0.5)
    assert r["slow_nodes"] == ["gpu-b1"]  # from its links alone


def test_expected_bandwidth_decides_the_verdict():
    raw = record(["a", "b"], {("a", "b"): 40}, {"a": 400, "b": 300}, all_gbps=45)
    ok = analyze(raw, 480, 60, 0.5)
    assert not ok["failed"]
    assert (
        "inter-node busbw (slowest of all ranks and node pairs): 40 GB/s at 4 MB, 67% of the expected 60 GB/s: ok"
        in ok["verdict"]
    )
    bad = analyze(raw, 480, 100, 0.5)
    assert bad["failed"] and any(
        "40 GB/s at 4 MB is below 0.5 x the expected 100 GB/s: FAIL" in line for line in bad["verdict"]
    )
    assert analyze(raw, 700, None, 0.5)["failed"]  # node b: 300 < 0.5 x 700
    none = analyze(raw, None, None, 0.5)
    assert not none["failed"] and "nothing to compare" in none["verdict"][0]


def test_peers_alike_pass_and_an_unhealthy_node_is_excluded():
    names = ["n1", "n2", "n3"]
    raw = record(names, {("n1", "n2"): 10, ("n1", "n3"): 9, ("n2", "n3"): 11}, dict.fromkeys(names, 50))
    ok = analyze(raw, None, None, 0.5)
    assert not ok["failed"] and ok["exclude"] is None and ok["warnings"] == []
    smi = Path(__file__).parent / "data" / "nvidia-smi"
    for node, name in zip(raw["nodes"], ("h100-healthy.txt", "h100-faulty.txt", "h100-healthy.txt"), strict=False):
        node["facts"] = {"health": [f.__dict__ for f in check_smi((smi / name).read_text(), 8)]}
    bad = analyze(raw, None, None, 0.5)
    assert bad["failed"] and bad["exclude"] == "n2" and bad["unhealthy_nodes"] == ["n2"]
