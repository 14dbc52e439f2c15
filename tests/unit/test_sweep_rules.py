"""How long the sweeper rests between batches: it deletes during at most its duty share."""

from __future__ import annotations

import pytest

from stepline_server.loops.sweeper import SWEEP_DUTY, rest_after


def test_a_quarter_duty_rests_three_times_the_batch() -> None:
    assert SWEEP_DUTY == 0.25
    assert rest_after(0.2) == pytest.approx(0.6)


@pytest.mark.parametrize("duty", [0.1, 0.25, 0.5, 0.9])
def test_deleting_takes_the_duty_share_of_the_time(duty: float) -> None:
    batch = 0.13
    assert batch / (batch + rest_after(batch, duty)) == pytest.approx(duty)


def test_full_duty_never_rests_and_a_clock_step_back_rests_nothing() -> None:
    assert rest_after(5.0, 1.0) == 0.0
    assert rest_after(-0.5) == 0.0
