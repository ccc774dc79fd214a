"""cleanrl_astral_utils.stats against scipy.stats: each interval the reports print, and its edge cases."""

import math

import numpy as np
import pytest
from scipy import stats as sps

from cleanrl_astral_utils import stats

SAMPLES = [
    [1.0, 2.0, 3.0],
    [500.0, 500.0, 212.5, 87.0, 499.0],
    [0.54, 0.61, 0.47, 0.98, 1.0, 0.2, 0.33],
]


@pytest.mark.parametrize("x", SAMPLES)
def test_t_ci95_half_width_is_scipys_t_interval_of_the_mean(x):
    low, high = sps.t.interval(0.95, len(x) - 1, loc=np.mean(x), scale=sps.sem(x))
    assert stats.t_ci95_half_width(x) == pytest.approx((high - low) / 2, rel=1e-12)
    # wider than the normal interval at these seed counts: t(0.975, n - 1) > 1.96
    assert stats.t_ci95_half_width(x) > stats.normal_ci95_half_width(x)


def test_t_ci95_half_width_along_an_axis_is_the_interval_of_each_column():
    R = np.array(SAMPLES[1:2] * 2).T * np.array([1.0, -0.5])  # 5 seeds x 2 columns
    halves = stats.t_ci95_half_width(R, axis=0)
    assert halves.shape == (2,)
    for k in range(2):
        assert halves[k] == pytest.approx(stats.t_ci95_half_width(R[:, k]), rel=1e-15)


def test_fewer_than_two_values_have_no_t_interval():
    assert math.isnan(stats.t_ci95_half_width([3.0]))
    assert stats.t_ci95_half_width([3.0], below_two=0.0) == 0.0
    assert stats.t_ci95_half_width(np.ones((1, 4)), axis=0, below_two=0.0).tolist() == [0.0] * 4
    assert stats.mean_t_ci95([7.0]) == {"mean": 7.0, "ci95": None, "n": 1}


def test_mean_t_ci95_holds_the_mean_and_the_t_half_width():
    out = stats.mean_t_ci95(SAMPLES[2])
    assert out["mean"] == pytest.approx(np.mean(SAMPLES[2]))
    assert out["ci95"] == stats.t_ci95_half_width(SAMPLES[2])
    assert out["n"] == len(SAMPLES[2])


def test_welch_diff_ci95_is_scipys_welch_interval():
    a = [500.0, 500.0, 500.0, 490.0, 481.0]
    b = [184.0, 491.0, 170.0, 500.0, 50.0]
    diff, half = stats.welch_diff_ci95(a, b)
    ci = sps.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert diff == pytest.approx(np.mean(a) - np.mean(b))
    assert diff - half == pytest.approx(ci.low, rel=1e-10)
    assert diff + half == pytest.approx(ci.high, rel=1e-10)


def test_welch_t_test_p_is_scipys_unequal_variance_test():
    a = [0.5, 0.62, 0.5]
    b = [1.0, 0.98, 1.0]
    assert stats.welch_t_test_p(a, b) == pytest.approx(sps.ttest_ind(a, b, equal_var=False).pvalue, rel=1e-12)
    assert stats.welch_t_test_p(a, b) != pytest.approx(sps.ttest_ind(a, b, equal_var=True).pvalue, rel=1e-3)


@pytest.mark.parametrize("x", SAMPLES)
def test_normal_ci95_half_width_is_the_1_96_interval(x):
    low, high = sps.norm.interval(0.95, loc=np.mean(x), scale=sps.sem(x))
    assert stats.normal_ci95_half_width(x) == pytest.approx((high - low) / 2, rel=1e-3)  # 1.96 against 1.959964
    assert stats.normal_ci95_half_width(x) == pytest.approx(1.96 * sps.sem(x), rel=1e-12)
    assert stats.normal_ci95_half_width([4.0]) == 0.0


@pytest.mark.parametrize("x", SAMPLES)
def test_population_sd_has_ddof_0(x):
    assert stats.population_sd(x) == pytest.approx(math.sqrt(sps.tvar(x) * (len(x) - 1) / len(x)), rel=1e-12)
    assert stats.population_sd(x) < np.std(x, ddof=1)


def test_the_helper_names_are_the_stats_definitions():
    from cleanrl_astral_utils import maml, tta

    assert tta.mean_ci is stats.mean_t_ci95
    assert maml.mean_ci95_half_width is stats.normal_ci95_half_width
