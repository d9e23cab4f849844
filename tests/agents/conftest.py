"""Agents fixtures."""

from __future__ import annotations

import pytest

from tests.conftest import tiny_decider


@pytest.fixture(scope="session")
def tiny_agents():
    """The tiny random llama (seed 0) used across the agents tests."""
    return tiny_decider(0)
