"""worker/wide_integers.py: the run of 19 digits that may be an integer orjson reads as a float."""

import pytest

from worker.wide_integers import has_long_digit_run


@pytest.mark.parametrize(
    "text, long",
    [
        ("1" * 18, False),
        ("1" * 19, True),
        ("x" + "9" * 19 + "y", True),
        ("1" * 18 + "a" + "1" * 18, False),
        ("0123456789" * 2, True),
        ('{"n": -' + str(2**64) + "}", True),
        ("", False),
        ("/:" * 20, False),
    ],
)
def test_a_run_of_19_digits_is_found_wherever_it_is(text, long):
    assert has_long_digit_run(text.encode()) is long
