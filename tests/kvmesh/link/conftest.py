"""Fixtures of the link's tests: the worker side's engine runs single-threaded."""
from tests.worker.conftest import _one_thread  # noqa: F401 - a fixture, used by name
