"""``benchmarks.learning``'s verdict on the return target: the gap to each peer and how well the seeds resolve it."""

from __future__ import annotations

import math

from benchmarks.learning import return_gap, target_words, targets


def row(returns: list[float], wall: float = 100.0) -> dict:
    return {"returns": returns, "return_mean": sum(returns) / len(returns), "wall_sec_mean": wall, "cpu_sec_mean": None}


def test_the_gap_to_a_peer_comes_with_welchs_t_and_the_seeds_that_would_resolve_it():
    # Means 2 and 5, sample variances 1 and 4 over 3 seeds: standard error sqrt(1/3 + 4/3), t = -3 / 1.291 = -2.32;
    # at that spread t reaches 2 with 3 (2 / 2.32)^2 = 2.2 -> 3 seeds a side.
    gap = return_gap(row([1, 2, 3]), row([3, 5, 7]))
    assert gap == {"gap": -3.0, "welch_t": round(-3 / math.sqrt(5 / 3), 2), "seeds_a_side_for_t_2": 3}
    # A peer that barely spreads: t = -1 / sqrt((1 + 0.01) / 3) = -1.72, and 3 (2 / 1.72)^2 = 4.04 -> 5 seeds.
    assert return_gap(row([1, 2, 3]), row([2.9, 3.1, 3.0])) == {
        "gap": -1.0,
        "welch_t": -1.72,
        "seeds_a_side_for_t_2": 5,
    }
    assert return_gap(row([1, 2, 3]), row([4])) == {"gap": -2.0}  # one peer seed: no spread to test against
    verdict = targets("Hopper-v5", {"sfengine": row([1, 2, 3]), "cleanrl": row([3, 5, 7]), "sb3": row([4])}, "sac")
    assert verdict["return_at_least_best_peer"] is False
    assert verdict["return_vs_cleanrl"]["welch_t"] == -2.32 and verdict["return_vs_sb3"] == {"gap": -2.0}
    words = target_words("return_vs_cleanrl", verdict["return_vs_cleanrl"])
    assert words == "return_vs_cleanrl: gap -3 (Welch's t -2.32; t = 2 needs 3 seeds a side)"
