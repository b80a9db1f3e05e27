"""Pareto extraction, hypervolume, knee and shape analysis against independent computations."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from experiments import front as fr


def brute_force_mask(F: np.ndarray) -> np.ndarray:
    """Non-dominated rows by the definition, O(n^2) with plain Python."""
    n = len(F)
    out = np.zeros(n, dtype=bool)
    for i in range(n):
        if not np.isfinite(F[i]).all():
            continue
        dominated = False
        for j in range(n):
            if j == i or not np.isfinite(F[j]).all():
                continue
            if F[j, 0] <= F[i, 0] and F[j, 1] <= F[i, 1] and (
                    F[j, 0] < F[i, 0] or F[j, 1] < F[i, 1]):
                dominated = True
                break
        out[i] = not dominated
    return out


def rectangle_hv(F: np.ndarray, ref: np.ndarray) -> float:
    """2-D hypervolume as a union of rectangles on a grid of the points' coordinates."""
    F = F[(F < ref).all(axis=1)]
    if not len(F):
        return 0.0
    xs = np.unique(np.concatenate([F[:, 0], [ref[0]]]))
    area = 0.0
    for a, b in itertools.pairwise(xs):
        ys = F[F[:, 0] <= a, 1]
        if len(ys):
            area += (b - a) * (ref[1] - ys.min())
    return area


# small integer grids make ties and duplicates common; some rows are infinite / NaN
points = st.lists(
    st.tuples(st.one_of(st.integers(0, 6).map(float), st.just(np.inf), st.just(np.nan)),
              st.integers(0, 6).map(float)),
    min_size=0, max_size=40)


@settings(max_examples=300, deadline=None)
@given(points)
def test_pareto_mask_equals_brute_force(rows):
    F = np.array(rows, dtype=float).reshape(-1, 2)
    assert np.array_equal(fr.pareto_mask(F), brute_force_mask(F))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 10), st.floats(0, 10)), min_size=1, max_size=25))
def test_pareto_mask_continuous_values(rows):
    F = np.array(rows, dtype=float)
    assert np.array_equal(fr.pareto_mask(F), brute_force_mask(F))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 10), st.floats(0, 10)), min_size=1, max_size=20))
def test_hypervolume_equals_rectangle_union(rows):
    F = np.array(rows, dtype=float)
    ref = np.array([11.0, 12.0])
    assert fr.hypervolume(F, ref) == pytest.approx(rectangle_hv(F, ref), rel=1e-9, abs=1e-9)


def test_hypervolume_of_one_point_and_outside_points():
    assert fr.hypervolume(np.array([[1.0, 2.0]]), [3.0, 5.0]) == pytest.approx(6.0)
    assert fr.hypervolume(np.array([[4.0, 2.0]]), [3.0, 5.0]) == 0.0


def test_reference_point_adds_margin_of_span():
    ref = fr.reference_point([np.array([[1.0, 10.0], [3.0, 4.0]]), np.array([[2.0, 8.0]])])
    assert ref == pytest.approx([3.0 + 0.2, 10.0 + 0.6])


def test_knee_of_an_l_shaped_front_is_the_corner():
    t = np.array([1.0, 1.1, 1.2, 1.3, 2.0, 3.0, 4.0])
    e = np.array([10.0, 5.0, 2.0, 1.2, 1.1, 1.05, 1.0])
    assert fr.knee_index(np.column_stack([t, e])) == 3


def test_knee_is_invariant_to_units():
    rng = np.random.default_rng(3)
    t = np.sort(rng.uniform(1, 2, 12))
    e = 1.0 / t + rng.uniform(0, 0.01, 12)
    F = np.column_stack([t, e])
    F = F[fr.pareto_mask(F)]
    assert fr.knee_index(F) == fr.knee_index(F * np.array([1e-3, 1e6]))


def test_lower_convex_hull_matches_brute_force():
    rng = np.random.default_rng(5)
    P = rng.uniform(0, 1, (30, 2))
    hull = set(fr.lower_convex_hull(P).tolist())
    # brute force: a point is a lower-hull vertex iff no segment between two other points
    # passes strictly below it at its x, and it is not above the chord of its neighbours
    depth = fr.hull_depth(P)
    assert (depth >= -1e-12).all()
    for i in range(len(P)):
        below = any(
            P[a, 0] < P[i, 0] < P[b, 0]
            and P[a, 1] + (P[b, 1] - P[a, 1]) * (P[i, 0] - P[a, 0]) / (P[b, 0] - P[a, 0])
            < P[i, 1] - 1e-12
            for a in range(len(P)) for b in range(len(P)) if a != i and b != i)
        extreme = P[i, 0] in (P[:, 0].min(), P[:, 0].max())
        assert (i in hull) == (not below and (extreme or depth[i] <= 1e-12))


def _front_df(t, e, family, extra=None):
    df = pd.DataFrame({"t": t, "e": e, "family": family})
    df["label"] = [f"{f}-{i}" for i, f in enumerate(family)]
    if extra is not None:
        df["mb"] = extra
    return df


def test_shape_finds_the_known_gap_between_two_families():
    # family A: fast and hungry on t in [1, 1.5]; family B: slow and frugal on t in [3, 3.5];
    # each family is a convex arc with 6 points; the gap between them is known
    ta = np.linspace(1.0, 1.5, 6)
    tb = np.linspace(3.0, 3.5, 6)
    ea = 10.0 - 2.0 * (ta - 1.0) ** 0.5
    eb = 4.0 - 1.0 * (tb - 3.0) ** 0.5
    df = _front_df(np.r_[ta, tb], np.r_[ea, eb], ["A"] * 6 + ["B"] * 6,
                   extra=[1, 2, 1, 2, 1, 2] * 2)
    F = df[["t", "e"]].to_numpy()
    assert fr.pareto_mask(F).all()
    s = fr.shape_analysis(df, ["t", "e"], ["family", "mb"])
    assert len(s["jumps"]) == 1
    j = s["jumps"][0]
    assert (j["after"], j["before"]) == ("A-5", "B-6")
    assert j["separating"] == ["family"]
    assert j["changed"]["family"] == ["A", "B"]
    assert j["delta"]["t"] == pytest.approx(3.0 - 1.5)
    # expected normalized gap from the construction
    span_t, span_e = 3.5 - 1.0, ea[0] - eb[-1]
    gap = np.hypot(1.5 / span_t, (ea[-1] - eb[0]) / span_e)
    assert j["gap"] == pytest.approx(gap)


def test_shape_treats_duplicate_points_as_one_position():
    """Two placements that make no difference duplicate every point: the jump stays the only
    one, and the placement neither changes across it nor separates the families."""
    ta = np.linspace(1.0, 1.5, 6)
    tb = np.linspace(3.0, 3.5, 6)
    t = np.r_[ta, tb]
    e = np.r_[10.0 - 2.0 * (ta - 1.0) ** 0.5, 4.0 - 1.0 * (tb - 3.0) ** 0.5]
    fam = ["A"] * 6 + ["B"] * 6
    df = _front_df(np.r_[t, t], np.r_[e, e], fam + fam)
    df["placement"] = ["snake"] * 12 + ["row-major"] * 12
    s = fr.shape_analysis(df, ["t", "e"], ["family", "placement"])
    assert s["n_points"] == 24 and s["n_positions"] == 12
    assert len(s["jumps"]) == 1
    j = s["jumps"][0]
    assert j["separating"] == ["family"] and set(j["changed"]) == {"family"}
    assert len(j["after_group"]) == len(j["before_group"]) == 2
    single = fr.shape_analysis(df.iloc[:12], ["t", "e"], ["family", "placement"])
    assert s["gaps"] == single["gaps"]
    assert ([g["first_position"] for g in s["nonconvex_segments"]]
            == [g["first_position"] for g in single["nonconvex_segments"]])


def test_shape_of_an_evenly_sampled_convex_arc_is_smooth():
    t = np.linspace(1, 3, 15)
    df = _front_df(t, 1.0 / t, ["A"] * 15)
    s = fr.shape_analysis(df, ["t", "e"], ["family"])
    assert s["jumps"] == [] and s["convex"] and s["smooth"]


def test_shape_finds_a_dent_above_the_convex_hull():
    t = np.linspace(1, 3, 9)
    e = 1.0 / t
    e[4] += 0.05  # still non-dominated (between neighbours) but above the hull
    df = _front_df(t, e, ["A"] * 4 + ["B"] + ["A"] * 4)
    assert fr.pareto_mask(df[["t", "e"]].to_numpy()).all()
    s = fr.shape_analysis(df, ["t", "e"], ["family"])
    assert len(s["nonconvex_segments"]) == 1
    seg = s["nonconvex_segments"][0]
    assert seg["points"] == ["B-4"]
    assert seg["params"]["family"] == ["B"]
    assert not s["convex"]


def test_shape_never_claims_a_jump_with_two_points():
    df = _front_df([1.0, 2.0], [2.0, 1.0], ["A", "B"])
    assert fr.shape_analysis(df, ["t", "e"], ["family"])["jumps"] == []


def test_compare_fronts():
    a = pd.DataFrame({"label": ["x", "y", "z"]})
    b = pd.DataFrame({"label": ["y", "w"]})
    assert fr.compare_fronts(a, b) == {"left": ["x", "z"], "joined": ["w"], "stayed": ["y"]}


def test_pareto_front_skips_infeasible_rows():
    df = pd.DataFrame({"t": [1.0, 2.0, 0.5], "e": [2.0, 1.0, 0.1],
                       "feasible": [True, True, False], "label": list("abc")})
    assert list(fr.pareto_front(df, ["t", "e"])["label"]) == ["a", "b"]


def test_pareto_mask_refuses_anything_but_two_objective_columns():
    for bad in (np.zeros((4, 3)), np.zeros(4), np.zeros((2, 2, 2))):
        with pytest.raises(ValueError, match="an \\(n, 2\\) array"):
            fr.pareto_mask(bad)


def test_knee_of_two_points_does_not_depend_on_units():
    """Scaled to [0, 1], two front points are (0, 1) and (1, 0), equally close to the ideal
    point: the knee is the first, in any units."""
    F = np.array([[1.0, 10.0], [2.0, 5.0]])
    for scale in ([1.0, 1.0], [1e3, 1e-3], [1e-3, 1e3]):
        assert fr.knee_index(F * np.array(scale)) == 0


def test_knee_of_points_one_of_which_dominates_the_rest_is_that_point():
    """The fastest and the most frugal extremes are the same point (no chord): the knee is the
    point closest to the ideal, the dominating one, wherever it is in the list."""
    F = np.array([[2.0, 3.0], [1.0, 1.0], [3.0, 2.0], [4.0, 4.0]])
    assert fr.knee_index(F) == 1


def test_a_parameter_shared_across_the_jump_by_its_last_points_does_not_separate():
    """Family A (6 points) then, past the jump, family B: ``mb`` is 1 on A's first four points
    and 2 on A's last two and on all of B, so it does not separate the sides of the jump (the
    sides are every position up to the jump and every position after it)."""
    ta, tb = np.linspace(1.0, 1.5, 6), np.linspace(3.0, 3.5, 6)
    df = _front_df(np.r_[ta, tb], np.r_[10.0 - 2.0 * (ta - 1.0) ** 0.5,
                                        4.0 - 1.0 * (tb - 3.0) ** 0.5],
                   ["A"] * 6 + ["B"] * 6, extra=[1, 1, 1, 1, 2, 2] + [2] * 6)
    (j,) = fr.shape_analysis(df, ["t", "e"], ["family", "mb"])["jumps"]
    assert j["separating"] == ["family"]
    assert (j["after_group"], j["before_group"]) == (["A-5"], ["B-6"])
    assert j["changed"] == {"family": ["A", "B"]}


def test_ideal_point_is_the_componentwise_minimum_over_all_fronts():
    """Over fronts of any length (a flat list of two values is one point); empty fronts are
    skipped."""
    fronts = [np.array([[3.0, 1.0], [1.0, 5.0]]), np.array([2.0, 0.5]), np.zeros((0, 2))]
    assert fr.ideal_point(fronts).tolist() == [1.0, 0.5]


def test_knee_of_two_points_does_not_depend_on_an_offset_either():
    """Scaling to [0, 1] subtracts each objective's minimum: an offset of 100 on one
    objective leaves the two points at (0, 1) and (1, 0), and the knee on the first."""
    F = np.array([[1.0, 10.0], [2.0, 5.0]])
    for offset in ([0.0, 100.0], [100.0, 0.0], [-0.5, 1e3]):
        assert fr.knee_index(F + np.array(offset)) == 0


def test_knee_of_more_than_two_points_is_farthest_from_the_chord_not_closest_to_ideal():
    """Scaled points (0, 1), (0.2, 0.5), (0.6, 0.05), (1, 0): distances to the chord x + y =
    1 are 0, 0.3 / sqrt 2 and 0.35 / sqrt 2, so the knee is the third; the point closest to
    the ideal (0, 0) would be the second (0.54 against 0.60)."""
    F = np.array([[0.0, 1.0], [0.2, 0.5], [0.6, 0.05], [1.0, 0.0]]) * [10.0, 100.0] + [5, 7]
    assert fr.knee_index(F) == 2


def test_hull_depth_of_points_sharing_an_x_is_their_height_above_the_lowest():
    """The lower hull keeps the lowest point of each x (it once kept the top of a vertical
    run too, and the points below it got negative depths)."""
    P = np.array([[1.0, 3.0], [1.0, 1.0], [1.0, 2.0]])
    assert fr.lower_convex_hull(P).tolist() == [1]
    assert fr.hull_depth(P).tolist() == [2.0, 0.0, 1.0]
    Q = np.array([[0.0, 1.0], [1.0, 0.5], [1.0, 0.0], [2.0, 1.0]])
    assert fr.lower_convex_hull(Q).tolist() == [0, 2, 3]
    assert fr.hull_depth(Q).tolist() == [0.0, 0.5, 0.0, 0.0]


def test_shape_of_two_and_three_positions():
    """Two positions: one gap, sqrt 2 in scaled units, and no jump (a jump needs 3
    positions). Three positions whose middle one lies above the chord of the others: a
    non-convex segment (the hull is checked from three positions on)."""
    two = fr.shape_analysis(_front_df([1.0, 2.0], [5.0, 1.0], ["a", "b"]), ["t", "e"],
                            ["family"])
    assert two["gaps"] == [pytest.approx(np.sqrt(2.0))] and two["jumps"] == []
    three = fr.shape_analysis(_front_df([0.0, 0.5, 1.0], [1.0, 0.9, 0.0], ["a"] * 3),
                              ["t", "e"], ["family"])
    assert not three["convex"] and three["nonconvex_segments"]


def test_a_gap_under_a_quarter_of_the_path_is_no_jump_however_long_against_the_median():
    """Twenty gaps of 1 and one of 4 along a line: 4 is 4x the median but 4 / 24 of the path,
    under the default fraction 0.25: no jump; with the fraction at 0.15 it is one."""
    t = np.r_[np.arange(21.0), 24.0]
    df = _front_df(t, 100.0 - t, ["a"] * 22)
    assert fr.shape_analysis(df, ["t", "e"], ["family"])["jumps"] == []
    jumps = fr.shape_analysis(df, ["t", "e"], ["family"], jump_fraction=0.15)["jumps"]
    assert [j["index"] for j in jumps] == [20]
