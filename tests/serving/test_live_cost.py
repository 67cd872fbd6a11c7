"""The measured share of the calibrated output cost: what admission multiplies each stream's cost by."""

from serving.live_cost import FLOOR, MIN_SPAN, WINDOW, LiveCost


def test_the_calibration_stands_until_the_reports_span_a_few_seconds() -> None:
    cost = LiveCost()
    for second in range(int(MIN_SPAN)):
        cost.add(second, 30.0, 60.0)
        assert cost.share(second) is None
    cost.add(MIN_SPAN, 30.0, 60.0)
    assert cost.share(MIN_SPAN) == 0.5


def test_the_share_weighs_each_report_by_its_calibrated_load_and_skips_idle_workers() -> None:
    cost = LiveCost()
    for second in range(10):
        cost.add(second, 45.0, 60.0)  # a worker with two 1080p streams at three quarters of their calibration
        cost.add(second, 12.0, 20.0)  # one with a 720p stream at 0.6 of it
        cost.add(second, 2.0, 0.0)  # one with no stream: its idle CPU is nobody's cost
    assert cost.share(9) == (45 + 12) / (60 + 20)


def test_old_reports_leave_the_window_and_the_share_never_falls_below_the_floor() -> None:
    cost = LiveCost()
    for second in range(10):
        cost.add(second, 60.0, 60.0)
    for second in range(10, 10 + int(WINDOW) + 1):
        cost.add(second, 6.0, 60.0)  # the avatars stood still: far under the calibration
    assert cost.share(10 + WINDOW) == FLOOR
    assert cost.share(10 + 3 * WINDOW) is None, "no report in the window: the calibration again"
