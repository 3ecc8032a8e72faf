"""The warp emulator's schedule for the kernel tests of this folder.

``UNWEIGHT_EMU_SCHEDULE=ORDER[:SEED[:RESIDENT]]`` (ORDER: forward, reverse or shuffle) runs
every emulated launch of every test here under that schedule instead of the default one
(``unweight._cuda.emu_cta_order``), e.g. ``UNWEIGHT_EMU_SCHEDULE=shuffle:7:8 pytest tests/cuda``:
the kernels' results must not change.
"""
import os

import pytest

try:
    from unweight import _cuda
except ImportError:  # CUDA extension not built
    _cuda = None

ENV = "UNWEIGHT_EMU_SCHEDULE"


def schedule_from_env() -> tuple[str, int, int]:
    """(order, seed, resident) from UNWEIGHT_EMU_SCHEDULE; the default schedule when unset."""
    spec = os.environ.get(ENV, "").strip()
    if not spec:
        return ("forward", 0, 1)
    parts = spec.split(":")
    try:
        order, seed, resident = parts[0], int(parts[1]) if len(parts) > 1 else 0, int(parts[2]) if len(parts) > 2 else 1
    except ValueError:
        order, seed, resident = "", 0, 0
    if order not in ("forward", "reverse", "shuffle") or len(parts) > 3 or seed < 0 or resident < 1:
        raise pytest.UsageError(f"{ENV}={spec!r}: expected ORDER[:SEED[:RESIDENT]], ORDER one of forward, "
                                "reverse, shuffle, RESIDENT >= 1")
    return order, seed, resident


def pytest_configure(config):
    schedule_from_env()  # a malformed schedule stops the run before any test


@pytest.fixture(autouse=True)
def emu_schedule():
    """Sets the schedule of UNWEIGHT_EMU_SCHEDULE before each test (tests that change it put
    the default back when they end)."""
    if _cuda is not None:
        _cuda.emu_cta_order(*schedule_from_env())
    yield
