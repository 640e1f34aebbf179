"""Fixtures of every worker test."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="package")
def _one_thread():
    """Tiny matmuls gain nothing from threads, and on shared cores extra threads spin."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
