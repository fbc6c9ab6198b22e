"""Shared test settings: hypothesis profiles (derandomized in CI), markers, small fixtures."""
import os
import shutil

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("ci", derandomize=True, deadline=None, max_examples=25,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("dev", deadline=None, max_examples=25,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))

# Tests that measure kernels check statuses, not timing quality: on a busy machine (a shared CI runner,
# several test sessions at once) codegen.measure would rightly record "noisy" instead of "ok". The
# disturbance detector's own tests (tests/test_measure_safety.py) pass max_wall_cpu_ratio explicitly.
os.environ.setdefault("FELIXJAX_MAX_WALL_CPU_RATIO", "off")


def pytest_collection_modifyitems(config, items):
    if shutil.which("gcc") is None:
        skip = pytest.mark.skip(reason="no C compiler (gcc) on this machine")
        for item in items:
            if "cc" in item.keywords:
                item.add_marker(skip)
    if shutil.which("nvcc") is None:
        skip = pytest.mark.skip(reason="no nvcc on this machine")
        for item in items:
            if "nvcc" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def cpu():
    from codegen.target import Target

    return Target.cpu()


@pytest.fixture(scope="session")
def runner():
    """One measuring process shared by the tests of a session (quick timing protocol)."""
    from codegen.measure import LocalRunner, TimingProtocol

    with LocalRunner(protocol=TimingProtocol.quick()) as r:
        yield r
