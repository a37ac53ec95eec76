"""The benchmark's time left: estimates corrected by the stages done, on a fake clock."""

import pytest

from hvdx.bench.progress import TimeLeft, format_duration


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_before_any_stage_the_estimates_are_the_time_left():
    clock = Clock()
    left = TimeLeft([30, 60, 90], clock=clock)
    assert left.left_s() == pytest.approx(180)
    assert left.elapsed_s() == 0


def test_a_machine_twice_as_slow_as_estimated_reads_twice_as_long():
    clock = Clock()
    left = TimeLeft([30, 60, 90], clock=clock)
    left.start()
    clock.now += 60  # the first stage, estimated 30 s, took 60
    left.finish()
    assert left.pace() == pytest.approx(2.0)
    assert left.left_s() == pytest.approx(2 * (60 + 90))
    assert left.elapsed_s() == pytest.approx(60)


def test_the_running_stage_counts_down():
    clock = Clock()
    left = TimeLeft([30, 60], clock=clock)
    left.start()
    clock.now += 10
    assert left.left_s() == pytest.approx(80)
    clock.now += 200  # far past its estimate: never below zero
    assert left.left_s() == 0


def test_finishing_more_stages_than_there_are_is_refused():
    left = TimeLeft([1], clock=Clock())
    left.finish()
    with pytest.raises(ValueError, match="already finished"):
        left.finish()


def test_a_negative_estimate_is_refused_with_its_value():
    with pytest.raises(ValueError, match=r"estimates=\[1, -2\]"):
        TimeLeft([1, -2])


@pytest.mark.parametrize("seconds, text", [(0, "0 s"), (42.4, "42 s"), (119, "119 s"),
                                           (125, "2 min"), (600, "10 min"),
                                           (3900, "1 h 05 min")])
def test_durations_read_as_a_person_would_say_them(seconds, text):
    assert format_duration(seconds) == text
