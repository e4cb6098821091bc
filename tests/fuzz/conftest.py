"""Profiles of the fuzz tests (tests/fuzz). The suite's `fixed` profile (tests/conftest.py) runs a
small derandomized sample in CI; `long` runs many random examples by hand:

    python -m pytest tests/fuzz --hypothesis-profile long            # ~1,000 calls per test
    python -m pytest tests/fuzz --hypothesis-profile long --hypothesis-seed 7
    PLANNER_FUZZ_EXAMPLES=5000 python -m pytest tests/fuzz -p no:cacheprovider

The long profile adds the slow commands (limits, derive, calibrate) to the grammar.
"""

from hypothesis import HealthCheck, settings

settings.register_profile(
    "long", derandomize=False, deadline=None, max_examples=1000, print_blob=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                           HealthCheck.data_too_large, HealthCheck.filter_too_much])
