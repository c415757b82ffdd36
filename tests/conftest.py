"""Shared test helpers."""

import os
import sys

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ctrlmem", deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=60
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ctrlmem"))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def python_exe():
    return sys.executable
