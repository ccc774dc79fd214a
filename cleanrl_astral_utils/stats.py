"""The statistics the reports print, one definition each, named for what it is.

- `t_ci95_half_width` / `mean_t_ci95`: the mean over seeds with its 95% Student-t confidence interval
  (t with n - 1 degrees of freedom times the sample sd, ddof 1, over sqrt(n));
- `welch_diff_ci95`: the difference of two means with its 95% Welch t-interval (Welch-Satterthwaite degrees of freedom);
- `welch_t_test_p`: the two-sided p-value of Welch's t-test of two means;
- `normal_ci95_half_width`: 1.96 sample sd / sqrt(n), the normal interval over the 20+ tasks of maml_ssm's eval.json and
  adapt.json;
- `population_sd`: the standard deviation with ddof 0 (numpy's default), the "± sd" of the reinforce_baby reports.

scipy is imported inside the functions that need it: importing it takes a second, and only reports call them.
"""

import math

import numpy as np


def t_ci95_half_width(x, axis=None, below_two=math.nan):
    """Half-width of the 95% Student-t confidence interval of the mean: t(0.975, n - 1) * sample sd / sqrt(n).

    With `axis`, one half-width per position along the other axes (an array). Fewer than two values have no interval:
    the result is then `below_two` (NaN unless the caller's table prints a single seed's value as ± 0)."""
    from scipy import stats

    x = np.asarray(x, dtype=np.float64)
    n = x.size
    if axis is not None:
        n = x.shape[axis]
    if n < 2:
        if axis is not None:
            return np.full(np.delete(x.shape, axis), below_two, dtype=np.float64)
        return float(below_two)
    half = stats.t.ppf(0.975, n - 1) * x.std(axis=axis, ddof=1) / np.sqrt(n)
    if axis is None:
        return float(half)
    return half


def mean_t_ci95(values):
    """{"mean", "ci95": half-width of the 95% Student-t CI of the mean (None with one value), "n"}."""
    v = np.asarray(values, dtype=np.float64)
    half = None
    if len(v) > 1:
        half = t_ci95_half_width(v)
    return {"mean": float(v.mean()), "ci95": half, "n": int(len(v))}


def welch_diff_ci95(a, b):
    """(mean(a) - mean(b), half-width of its 95% Welch t-interval), with Welch-Satterthwaite degrees of freedom."""
    from scipy import stats

    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    va = a.var(ddof=1) / len(a)
    vb = b.var(ddof=1) / len(b)
    dof = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return float(a.mean() - b.mean()), float(stats.t.ppf(0.975, dof) * np.sqrt(va + vb))


def welch_t_test_p(a, b):
    """Two-sided p-value of Welch's t-test (unequal variances) of mean(a) = mean(b)."""
    from scipy import stats

    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(stats.ttest_ind(a, b, equal_var=False).pvalue)


def normal_ci95_half_width(x):
    """Half-width of the normal 95% confidence interval of the mean: 1.96 sample sd / sqrt(n) (0 for one value)."""
    x = np.asarray(x, dtype=np.float64)
    if len(x) < 2:
        return 0.0
    return float(1.96 * x.std(ddof=1) / math.sqrt(len(x)))


def population_sd(x, axis=None):
    """Standard deviation with ddof 0: the root mean squared deviation from the mean (numpy's default)."""
    return np.std(x, axis=axis)
