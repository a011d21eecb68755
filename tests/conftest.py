"""Shared test settings (small hypothesis budgets so the suite stays fast) and fixtures."""

import pytest
from hypothesis import HealthCheck, settings
from redis_fixture import killable_redis, redis_server  # noqa: F401 - shared fixtures

settings.register_profile("ci", max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tests run tiny tensors: one torch thread avoids oversubscription stalls."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

