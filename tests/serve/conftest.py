"""Fixtures for server tests."""

from __future__ import annotations

import pytest

from .live import live_server


@pytest.fixture(scope="session")
def live():
    """`live(app)`: a context manager running `app` on a free loopback port."""
    return live_server
