"""Bursts are served, not refused (issue 21): fifty creates released at once through the
official SDK, against the suite's server with the default admission flags (eight creates run at
once, the rest wait their turn), all succeed and each sandbox answers its own command."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from e2e_util import BUSYBOX, sh

BURST = 50


@pytest.mark.backend("ns", why="fifty microVMs at once do not fit the emulated KVM test host")
@pytest.mark.deadline(300)
def test_a_burst_of_fifty_sdk_creates_all_succeed(sandbox):
    barrier = threading.Barrier(BURST)

    def one(i: int) -> tuple[int, str, float]:
        barrier.wait()
        t0 = time.monotonic()
        sb = sandbox(BUSYBOX)
        took = time.monotonic() - t0
        return i, sh(sb, f"echo $(({i} * {i}))").strip(), took

    with ThreadPoolExecutor(BURST) as pool:
        futures = [pool.submit(one, i) for i in range(BURST)]
        errors = [repr(f.exception()) for f in futures if f.exception() is not None]
        assert not errors, f"{len(errors)} of {BURST} creates failed: {errors[:5]}"
        results = [f.result() for f in futures]
    assert sorted(out for _, out, _ in results) == sorted(str(i * i) for i in range(BURST))
    assert len({sb.id for sb in sandbox.created}) == BURST
    took = sorted(t for _, _, t in results)
    print(f"\n{BURST} concurrent SDK creates: P50 {took[BURST // 2]:.2f} s, max {took[-1]:.2f} s")
