import random

import pytest

from core.backoff import backoff_delay_s


def test_backoff_doubles_its_ceiling_until_the_cap() -> None:
    rng = random.Random(7)
    ceilings = [
        max(backoff_delay_s(n, base_s=1, cap_s=8, rng=rng) for _ in range(500)) for n in (1, 2, 3, 4, 5)
    ]
    assert ceilings[0] <= 1 < ceilings[1] <= 2 < ceilings[2] <= 4 < ceilings[3] <= 8
    assert ceilings[4] <= 8


def test_backoff_is_jittered_not_fixed() -> None:
    rng = random.Random(1)
    assert len({backoff_delay_s(3, rng=rng) for _ in range(10)}) == 10


def test_attempts_count_from_one() -> None:
    with pytest.raises(ValueError, match="from 1"):
        backoff_delay_s(0)
