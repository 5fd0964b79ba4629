"""``[environment.healthcheck]``: the task's readiness check, run as Harbor 0.25 runs it.

Once the attempt's container has started, and before the agent (or the oracle's solution)
gets it, the command runs in the container (the harness's bash, the image's user and
environment; whatever it leaves running is killed after it) until it exits 0. Docker
HEALTHCHECK's rules, as Harbor applies them: a failure that began within
``start_period_sec`` of the first try only waits ``start_interval_sec``; after that, each
failure waits ``interval_sec``, and ``retries`` failures in a row end the attempt as an
infrastructure error, :class:`HealthcheckError` (Harbor's name for it): an environment
that never became ready is no fault of the agent's. A try that runs past ``timeout_sec``
ends it at once, as in Harbor (whose exec raises on a time-out).

Unlike Harbor, the whole check is bounded: the task's author sets its retries and
intervals, and a check that has not passed within ``deadline_s`` (the environment's
``build_timeout_sec``) fails there, so no task can hold a session for longer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from pytest_automedbench.harbor._harness import HARNESS_BASH

if TYPE_CHECKING:
    from pytest_automedbench.harbor._environment import HarborContainer
    from pytest_automedbench.harbor._task import HealthcheckSection

__all__ = ["HealthcheckError", "run_healthcheck"]

#: How much of the last failure's output the error keeps.
OUTPUT_TAIL_CHARS = 2000


class HealthcheckError(RuntimeError):
    """The task's healthcheck did not pass: the attempt is an infrastructure error."""


def run_healthcheck(
    box: HarborContainer,
    check: HealthcheckSection,
    deadline_s: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Run ``check`` in ``box`` until it passes, for at most ``deadline_s``; return how
    many tries it took. Raises :class:`HealthcheckError` naming the command, the tries
    and the last output."""
    started = clock()
    start_period_ends = started + check.start_period_sec

    def wait(seconds: float) -> None:
        if clock() + seconds - started > deadline_s:
            raise HealthcheckError(
                f"the task's [environment.healthcheck] {check.command!r} did not pass "
                f"within {deadline_s:g} s (the environment's build_timeout_sec; {tries} "
                "tries)"
            )
        sleep(seconds)

    failures = tries = 0
    while True:
        in_start_period = clock() < start_period_ends
        result = box.run(
            [HARNESS_BASH, "--noprofile", "--norc", "-c", check.command],
            timeout_s=check.timeout_sec,
        )
        tries += 1
        if result.timed_out:
            raise HealthcheckError(
                f"the task's [environment.healthcheck] {check.command!r} ran past its "
                f"timeout_sec ({check.timeout_sec:g} s) on try {tries}"
            )
        if result.exit_code == 0:
            return tries
        if in_start_period:
            wait(check.start_interval_sec)
            continue
        failures += 1
        if failures >= check.retries:
            output = (result.stdout + result.stderr).strip()[-OUTPUT_TAIL_CHARS:]
            raise HealthcheckError(
                f"the task's [environment.healthcheck] did not pass: {check.command!r} "
                f"failed {failures} time(s) in a row after its start period ({tries} "
                f"tries in all; the last: exit {result.exit_code})"
                f"{': ' + output if output else ''}"
            )
        wait(check.interval_sec)
