"""Rows and levers from raw timings (pure)."""
import pytest

from remote_payload.payloads.marlin_moe.marlin_stats import (add_levers, bootstrap_lever, floor_us, lever_summary, percentile,
                                        relative_spread, timing_row, window_order)

EXPERT = 24.77e6


def rows_for(per_rep: dict[int, list[float]]) -> list[dict]:
    return add_levers([timing_row(m, [[t] * 5 for t in reps], [8], EXPERT, 4.3e12) for m, reps in per_rep.items()])


def test_lever_is_per_token_cost_at_base_over_cost_at_m():
    rows = rows_for({1: [80.0, 80.0, 80.0], 512: [3600.0, 3600.0, 3600.0]})
    assert rows[0]["lever"] == pytest.approx(1.0)
    assert rows[1]["lever"] == pytest.approx(80.0 * 512 / 3600.0)
    assert rows[1]["lever_spread"] == pytest.approx(0.0)


def test_lever_spread_comes_from_per_repetition_levers():
    rows = rows_for({1: [80.0, 80.0, 80.0], 512: [3600.0, 3600.0, 4000.0]})
    levers = rows[1]["rep_levers"]
    assert levers == pytest.approx([80 * 512 / 3600, 80 * 512 / 3600, 80 * 512 / 4000])
    assert rows[1]["lever_spread"] == pytest.approx((max(levers) - min(levers)) / sorted(levers)[1])


def test_base_is_the_smallest_batch_size_even_without_m1():
    summary = lever_summary(rows_for({4: [200.0] * 3, 16: [400.0] * 3}))
    assert summary["base_m"] == 4
    assert summary["by_m"]["16"]["lever"] == pytest.approx(200 / 4 / (400 / 16))


def test_row_bandwidth_counts_distinct_experts_bytes():
    row = timing_row(1, [[100.0, 100.0]], [8, 8], EXPERT, 4.0e12)
    assert row["expert_gb_per_s"] == pytest.approx(8 * EXPERT / 100e-6 / 1e9)
    assert row["copy_fraction"] == pytest.approx(8 * EXPERT / 100e-6 / 4.0e12)
    assert row["tokens_per_s"] == pytest.approx(1e4)


def test_floor_of_eight_k26_experts_at_4_3_tb_s_is_about_46_us():
    assert floor_us(8, EXPERT, 4.3e12) == pytest.approx(46.1, abs=0.2)


def test_percentile_and_spread():
    assert percentile([1, 2, 3, 4, 5], 0.5) == 3
    assert percentile([0, 10], 0.1) == pytest.approx(1.0)
    assert relative_spread([9.0, 10.0, 11.0]) == pytest.approx(0.2)


def test_interleaved_orders_time_every_batch_size_once_per_repetition():
    sizes = [1, 8, 64, 512]
    for order in ("random", "alternating"):
        windows = window_order(sizes, 3, order, seed=7)
        for r in range(3):
            assert sorted(m for rep, m in windows if rep == r) == sizes
        assert [rep for rep, _ in windows] == [0] * 4 + [1] * 4 + [2] * 4
    assert [m for _, m in window_order(sizes, 2, "alternating", 0)] == sizes + sizes[::-1]


def test_the_interleave_order_alternates_light_and_heavy_the_same_in_every_repetition():
    """Each window of a batch size has the same predecessor in every repetition, and no two heavy
    windows run back to back (the slow repetition of M=512 followed M=512 and M=64)."""
    sizes = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    windows = window_order(sizes, 3, "interleave", seed=0)
    order = [m for _, m in windows]
    assert order[:10] == [1, 512, 2, 256, 4, 128, 8, 64, 16, 32] and order == order[:10] * 3
    assert [rep for rep, _ in windows] == [0] * 10 + [1] * 10 + [2] * 10
    assert all(not (a >= 64 and b >= 64) for a, b in zip(order, order[1:]))
    assert sorted(window_order([3, 1, 2], 1, "interleave", 0)) == [(0, 1), (0, 2), (0, 3)]


def test_the_random_order_is_seeded_and_shuffles():
    sizes = list(range(1, 11))
    assert window_order(sizes, 3, "random", 5) == window_order(sizes, 3, "random", 5)
    assert window_order(sizes, 3, "random", 5) != window_order(sizes, 3, "random", 6)
    assert [m for _, m in window_order(sizes, 3, "random", 5)][:10] != sizes


def test_ascending_is_the_old_order_all_repetitions_of_one_size_then_the_next():
    assert window_order([1, 8], 3, "ascending", 0) == [(0, 1), (1, 1), (2, 1), (0, 8), (1, 8), (2, 8)]


def test_bootstrap_interval_holds_the_lever_and_is_zero_wide_without_spread():
    assert bootstrap_lever([80.0] * 3, [3600.0] * 3, 512) == pytest.approx([80 * 512 / 3600] * 2)
    lo, hi = bootstrap_lever([80.0, 82.0, 84.0], [3500.0, 3600.0, 3900.0], 512)
    assert 80 * 512 / 3900 <= lo <= 82 * 512 / 3600 <= hi <= 84 * 512 / 3500


def test_rows_carry_the_interval_and_the_summary_names_its_method():
    rows = rows_for({1: [80.0, 82.0, 84.0], 512: [3500.0, 3600.0, 3900.0]})
    lo, hi = rows[1]["lever_ci95"]
    assert lo <= rows[1]["lever"] <= hi
    summary = lever_summary(rows)
    assert summary["by_m"]["512"]["ci95"] == [lo, hi] and "bootstrap" in summary["ci"]
