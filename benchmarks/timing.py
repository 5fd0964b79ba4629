"""Wall-clock timing the benchmark scripts share (imported from beside them: run each as
``.venv/bin/python benchmarks/<name>.py``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def best_of(repeats: int, *fns: Callable[[], Any], warm_up: bool = True) -> list[tuple[float, Any]]:
    """Best wall time of each function over ``repeats`` rounds, run interleaved (so a busy
    neighbour hurts every side alike), with the value of its last run. ``warm_up`` runs
    each once first (imports, allocators, caches, the page cache)."""
    best = [float("inf")] * len(fns)
    values: list[Any] = [fn() for fn in fns] if warm_up else [None] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            values[i] = None  # free the previous round's value before timing again
            start = time.perf_counter()
            values[i] = fn()
            best[i] = min(best[i], time.perf_counter() - start)
    return list(zip(best, values, strict=True))
