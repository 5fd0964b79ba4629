"""A cell's timeout is recognised by its type, not by the text of the failure."""

from __future__ import annotations

import signal
from types import FrameType

import pytest

from pytest_automedbench.worker import CellTimeout, _raising_cell_timeout


def _pytest_timeouts_handler(signum: int, frame: FrameType | None) -> None:
    pytest.fail("Timeout >6.0s")


def test_the_wrapped_handler_raises_the_same_failure_as_a_cell_timeout() -> None:
    on_alarm = _raising_cell_timeout(_pytest_timeouts_handler)
    with pytest.raises(CellTimeout) as caught:
        on_alarm(signal.SIGALRM, None)
    # Still pytest's test failure, with pytest-timeout's message: the report and the
    # record's error ("timeout: Timeout >6.0s") read as before.
    assert isinstance(caught.value, pytest.fail.Exception)
    assert caught.value.msg == "Timeout >6.0s" and repr(caught.value) == "Timeout >6.0s"


def test_a_failure_that_merely_says_timeout_is_not_a_cell_timeout() -> None:
    with pytest.raises(pytest.fail.Exception) as failure:
        pytest.fail("Timeout of the agent's tool")
    assert not isinstance(failure.value, CellTimeout)


def test_anything_else_the_handler_raises_goes_through_unchanged() -> None:
    def interrupted(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _raising_cell_timeout(interrupted)(signal.SIGALRM, None)
