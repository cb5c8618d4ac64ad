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


def summarize_sides(samples: dict, metrics, seed: int, center: str) -> dict:
    """Per side: counts, failures, SDK transport retries, the median of each
    metric (stored under `center`) and its five-number summary; with both
    sides, paired bootstrap CIs over the pairs where both samples succeeded."""
    out = {}
    for n, recs in samples.items():
        ok = [r for r in recs if r["ok"]]
        out[n] = {"n": len(recs), "failed": len(recs) - len(ok),
                  "sdk_transport_retries": sum(len(r.get("sdk_transport_retries", [])) for r in recs),
                  center: {m: median([r[m] for r in ok]) for m in metrics},
                  "five": {m: five([r[m] for r in ok]) for m in metrics}}
    if "pvisor" in samples and "peer" in samples:
        pairs = [(a, b) for a, b in zip(samples["pvisor"], samples["peer"]) if a["ok"] and b["ok"]]
        out["paired"] = {m: paired_bootstrap([a[m] for a, _ in pairs], [b[m] for _, b in pairs], seed=seed)
                         for m in metrics}
        out["paired"]["complete_pairs"] = len(pairs)
    return out
