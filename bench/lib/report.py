"""Markdown helpers."""
from __future__ import annotations

import math


def fmt(v, digits=1) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{digits}f}"


def ci_text(ci) -> str:
    return f"{fmt(ci[0])}–{fmt(ci[1])}"


def ratio_cell(b: dict) -> str:
    if not b or not b.get("pairs"):
        return "–"
    lo, hi = b["ci95_ratio_a_over_b"]
    return f"{b['ratio_a_over_b']:.3f} [{lo:.3f}–{hi:.3f}]"


def target_row(name: str, value: float, limit: float, ci=None) -> str:
    ok = value <= limit
    ci_s = f" (95% CI {ci[0]:.3f}–{ci[1]:.3f})" if ci else ""
    return f"| {name} | {value:.3f}{ci_s} | ≤ {limit:g} | {'met' if ok else 'NOT met'} |"
