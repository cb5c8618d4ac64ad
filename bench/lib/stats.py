"""Medians, quantiles and the paired bootstrap (pure Python, seeded)."""
from __future__ import annotations

import math
import random
import statistics


def median(xs) -> float:
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    return statistics.median(xs) if xs else float("nan")


def quantile(xs, q: float) -> float:
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return float("nan")
    pos = (len(xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def five(xs) -> dict:
    xs = [x for x in xs if x is not None]
    if not xs:
        return {"n": 0}
    return {"n": len(xs), "min": min(xs), "q1": quantile(xs, 0.25), "median": median(xs),
            "q3": quantile(xs, 0.75), "max": max(xs)}


def _med(xs):
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def paired_bootstrap(a: list[float], b: list[float], n: int = 10000, seed: int = 0) -> dict:
    """a[i], b[i] form pair i. Resamples pairs with replacement n times and
    returns 95% percentile CIs for median(a), median(b), median(a)/median(b)
    and median(b)-median(a)."""
    assert len(a) == len(b)
    k = len(a)
    if k == 0:
        return {"pairs": 0}
    rng = random.Random(seed)
    ma, mb, ratio, diff = [], [], [], []
    idx = range(k)
    for _ in range(n):
        pick = rng.choices(idx, k=k)
        x = _med([a[i] for i in pick])
        y = _med([b[i] for i in pick])
        ma.append(x)
        mb.append(y)
        ratio.append(x / y if y else float("inf"))
        diff.append(y - x)

    def ci(v):
        v.sort()
        return [v[int(0.025 * (n - 1))], v[int(math.ceil(0.975 * (n - 1)))]]

    return {"pairs": k, "resamples": n, "seed": seed,
            "median_a": _med(a), "median_b": _med(b),
            "ratio_a_over_b": _med(a) / _med(b) if _med(b) else float("inf"),
            "ci95_median_a": ci(ma), "ci95_median_b": ci(mb),
            "ci95_ratio_a_over_b": ci(ratio), "ci95_diff_b_minus_a": ci(diff)}
