"""What the proxy saw used: a sample the store could not take is carried by the next one."""

from __future__ import annotations

from pgplane.proxy.activity import Activity


def test_an_unwritten_sample_comes_back_with_the_next() -> None:
    activity = Activity()
    first = activity.open("ep-a", now=100)
    activity.close(first, now=150)
    sample = activity.sample(now=200)
    assert sample == {"ep-a": 150}
    activity.open("ep-b", now=250)
    activity.unsampled(sample)  # the store was down: nothing of it was written
    assert activity.sample(now=300) == {"ep-a": 150, "ep-b": 300}
    assert activity.sample(now=400) == {}  # written now: not again


def test_a_newer_sighting_is_not_pushed_back_by_an_unwritten_older_one() -> None:
    activity = Activity()
    session = activity.open("ep-a", now=100)
    sample = activity.sample(now=100)
    session.ticks += 1
    activity.close(session, now=500)  # used again, then gone: seen at 500, not sampled yet
    activity.unsampled(sample)
    assert activity.sample(now=600) == {"ep-a": 500}


def test_a_count_read_off_the_kernel_is_activity_as_it_moves_and_at_the_end() -> None:
    activity = Activity()
    bytes_moved = [0]
    session = activity.open("ep-a", now=100)
    session.kernel = lambda: bytes_moved[0]
    assert activity.sample(now=200) == {"ep-a": 200}  # first seen
    assert activity.sample(now=300) == {}  # nothing moved, no chunk counted
    bytes_moved[0] += 42
    assert activity.sample(now=400) == {"ep-a": 400}
    # Its end is its last use: the kernel's count may not have been read since.
    activity.close(session, now=450)
    assert activity.sample(now=500) == {"ep-a": 450}
