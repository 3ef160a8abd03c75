"""Job isolation under a race: processes of two jobs claim one directory at once; one job wins."""

import multiprocessing

from hpc.node.ownership import OwnershipError, claim


def _claim(args):
    directory, name = args
    try:
        claim(directory, name, "dir")
        return name
    except OwnershipError:
        return None


def test_concurrent_claims_have_one_winner(tmp_path):
    """Many processes of two jobs race for one directory: exactly one name wins, all of its processes agree."""
    with multiprocessing.get_context("fork").Pool(8) as pool:
        won = pool.map(_claim, [(tmp_path / "shared", "A" if i % 2 else "B") for i in range(32)])
    winners = {w for w in won if w}
    assert len(winners) == 1 and won.count(winners.pop()) == 16
    assert not list((tmp_path / "shared").glob(".owner.*.tmp"))
