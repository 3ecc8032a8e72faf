"""CPU tests of the warp emulator (csrc/cuda/emu/): its mma.sync m16n8k16 and wgmma m64nNk16
against plain matmuls of the same tiles, its warp collectives, barriers and cp.async groups against their
CUDA / PTX meaning, and the errors it reports for bodies that would hang, break a rule or race
on shared memory."""
import os
import platform
import subprocess
import sys

import numpy as np
import pytest

try:
    from unweight import _cuda
except ImportError:  # CUDA extension not built
    _cuda = None

pytestmark = pytest.mark.skipif(_cuda is None, reason="unweight._cuda not built")


def _bf16(f):
    """bf16 bits (round to nearest even) of float32 values."""
    u = np.asarray(f, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _f(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def test_mma_places_every_element_where_the_ptx_layout_says():
    # Distinct small integers: every product and sum is exact, so any element taken from the
    # wrong lane, register or half changes the result.
    A = _bf16(np.arange(256, dtype=np.float32).reshape(16, 16) % 23 - 11)
    B = _bf16(np.arange(128, dtype=np.float32).reshape(16, 8) % 19 - 9)
    C = (np.arange(128, dtype=np.float32).reshape(16, 8) * 3).astype(np.float32)
    D = _cuda.emu_selftest_mma(A, B, C)
    assert np.array_equal(D, _f(A).astype(np.float64) @ _f(B).astype(np.float64) + C)
    for r in range(16):  # one-hot rows of A pick single rows of B
        for k in (0, 5, 8, 15):
            e = np.zeros((16, 16), np.uint16)
            e[r, k] = 0x3F80
            D = _cuda.emu_selftest_mma(e, B, np.zeros((16, 8), np.float32))
            want = np.zeros((16, 8), np.float32)
            want[r] = _f(B[k])
            assert np.array_equal(D, want)


@pytest.mark.parametrize("seed", range(5))
def test_mma_matches_fp32_matmul_of_the_same_fragments(seed):
    rng = np.random.default_rng(seed)
    A = _bf16(rng.standard_normal((16, 16)) * np.exp2(rng.integers(-8, 8, (16, 16))))
    B = _bf16(rng.standard_normal((16, 8)))
    C = rng.standard_normal((16, 8)).astype(np.float32)
    D = _cuda.emu_selftest_mma(A, B, C).astype(np.float64)
    a, b = _f(A), _f(B)
    exact = a.astype(np.float64) @ b.astype(np.float64) + C
    f32 = (a @ b + C).astype(np.float64)  # a plain fp32 matmul: 16 roundings per element
    scale = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)) + np.abs(C)
    # The emulator rounds once: within half an ulp of fp32 of the exact value, and within the
    # fp32 matmul's own error bound of it.
    assert np.all(np.abs(D - exact) <= 2.0 ** -24 * np.abs(exact) + 1e-45)
    assert np.all(np.abs(D - f32) <= 18 * 2.0 ** -24 * scale)


@pytest.mark.parametrize("n", [8, 16, 32, 64, 128])
def test_wgmma_places_every_element_where_the_ptx_layouts_say(n):
    # Small integers: every product and sum is exact, so an element of A, B or D taken from the
    # wrong thread, register or shared-memory byte changes the result; D's prior values (1e30)
    # must not be added (scale-d 0).
    A = _bf16(np.arange(64 * 16, dtype=np.float32).reshape(64, 16) % 23 - 11)
    B = _bf16(np.arange(16 * n, dtype=np.float32).reshape(16, n) % 19 - 9)
    err, D = _cuda.emu_selftest_wgmma(0, A, B)
    assert err is None
    assert np.array_equal(D, _f(A).astype(np.float64) @ _f(B).astype(np.float64))
    for r, k in ((0, 0), (17, 5), (40, 8), (63, 15)):  # one-hot A rows pick single rows of B
        e = np.zeros((64, 16), np.uint16)
        e[r, k] = 0x3F80
        err, D = _cuda.emu_selftest_wgmma(0, e, B)
        want = np.zeros((64, n), np.float32)
        want[r] = _f(B[k])
        assert err is None and np.array_equal(D, want)


def test_wgmma_rounds_each_output_once():
    rng = np.random.default_rng(4)
    A = _bf16(rng.standard_normal((64, 16)) * np.exp2(rng.integers(-8, 8, (64, 16))))
    B = _bf16(rng.standard_normal((16, 64)))
    err, D = _cuda.emu_selftest_wgmma(0, A, B)
    exact = _f(A).astype(np.float64) @ _f(B).astype(np.float64)
    assert err is None and np.array_equal(D, exact.astype(np.float32))


@pytest.mark.parametrize("kind, what", [(1, "fence.proxy.async"), (2, "wgmma.fence"), (3, "in flight"),
                                        (4, "swizzle"), (5, "in flight")])
def test_wgmma_rules_are_errors(kind, what):
    A = _bf16(np.ones((64, 16), np.float32))
    B = _bf16(np.ones((16, 16), np.float32))
    err, _ = _cuda.emu_selftest_wgmma(kind, A, B)
    assert err is not None and what in err


def test_collectives_barriers_and_cp_async_groups():
    src = (1000 + np.arange(512)).astype(np.uint32)
    out = _cuda.emu_selftest_collectives(src).astype(np.int64) & 0xFFFFFFFF
    tid = np.arange(64)
    lane = tid % 32
    assert (out[:, 0] == sum(range(32))).all()                       # shfl_xor butterfly
    assert (out[:, 1] == sum(1 << l for l in range(0, 32, 3))).all()  # ballot
    assert (out[:, 2] == (lane + 5) % 32).all()                      # shfl from a lane
    assert (out[:, 3] == (63 - tid) ** 2).all()                      # smem across a barrier
    assert (out[:, 4] == 3 * (tid - lane + (lane + 1) % 32)).all()   # smem across a syncwarp
    assert (out[:, 5] == src[8 * tid]).all()                         # cp.async after wait_group 0
    assert (out[:, 6] == src[8 * tid + 4]).all()                     # wait_group 1: older group in
    assert (out[:, 7] == src[8 * tid]).all()                         #   newer one after wait_group 0
    assert (out[lane < 16, 8] == 21).all() and (out[lane >= 16, 8] == 0xFFFFFFFF).all()  # partial mask


def test_errors_instead_of_hangs():
    assert "deadlock" in _cuda.emu_selftest_error(0)
    assert "different masks" in _cuda.emu_selftest_error(1)
    assert "deadlock" in _cuda.emu_selftest_error(2)


def test_grid_memory_needs_a_threadfence_on_both_sides():
    # Two CTAs hand each other words through global memory as the split-K fix-up does; the
    # second to arrive sums both.  Without the storing side's fence before its arrival, or
    # the loading side's fence after it, the load is an error naming both CTAs.
    err, out = _cuda.emu_selftest_grid(0)
    assert err is None and np.array_equal(out, 100 + 2 * np.arange(32, dtype=np.float32))
    for kind, what in [(1, "not released"), (2, "not acquired"), (3, "not released")]:
        err, _ = _cuda.emu_selftest_grid(kind)
        assert err is not None and what in err and "CTA (1, 0)" in err and "CTA (0, 0)" in err, err


def test_a_programmatic_launch_waits_before_it_touches_what_earlier_launches_use():
    # x, y and the scratch counters may still be in use by the launch ahead (programmatic
    # dependent launch): a read of x, a count on the counter or a store to y before the
    # grid-dependency wait is an error; streaming the weights before it is not.
    assert _cuda.emu_selftest_grid_dep(0) is None
    for kind, what in [(1, "global load"), (2, "global atomic"), (3, "global store"),
                       (4, "launch_dependents")]:  # the next launch let start before the wait
        err = _cuda.emu_selftest_grid_dep(kind)
        assert err is not None and what in err and "grid-dependency wait" in err, (kind, err)


@pytest.mark.parametrize("kind, what", [
    (3, "shared-memory race"),                            # across warps, only a syncwarp between
    (4, "shared-memory race"),                            # within a warp, only a ballot between
    (5, "race: write to a word another thread read"),     # rewritten before a syncwarp
    (6, "cp.async or bulk copy has not been waited for"),         # own stage read before its wait
    (7, "cp.async or bulk copy has not been waited for"),         # a neighbour's stage still in flight
    (8, "outside the launch's dynamic shared memory"),
    (9, "not aligned to its size"),
    (10, "no thread had written"),
    (11, "written by atomics"),
    (12, "shared-memory race"),                           # a 2-byte read checked on its word
    (13, "sub-word shared-memory store"),
])
def test_shared_memory_races_and_bad_accesses_are_errors(kind, what):
    # Each body's data flow is wrong whatever order the fibers run in; the emulator reports it
    # from the happens-before relation, naming the thread, the byte and the other thread.
    err = _cuda.emu_selftest_error(kind)
    assert err is not None and what in err, err
    assert "thread" in err and "shared byte" in err


@pytest.mark.parametrize("op, bytes_, what", [(2, 16, "cp.async source"), (3, 16, "global load"),
                                               (3, 4, "global load"), (4, 16, "global store")])
def test_global_accesses_outside_the_launch_buffers_are_errors(op, bytes_, what):
    # With the launch's buffers named (global_bounds.h, as the GEMM and GEMV emulations name
    # their planes), an access reaching one byte past them fails the launch, naming the thread.
    span = 32 * 16
    assert _cuda.emu_selftest_access(op, bytes_, 16, bound=span) is None
    err = _cuda.emu_selftest_access(op, bytes_, 16, bound=span - 16 + bytes_ - 1)
    assert err is not None and what in err and "outside every buffer" in err and "thread 31" in err, err
    assert _cuda.emu_selftest_access(op, bytes_, 16, lanes=0x7FFFFFFF, bound=span - 16) is None


def test_bulk_copies_land_at_the_wait_that_sees_their_phase():
    # One warp streams four 512-byte steps through two bulk-copy slots: every lane's sums are
    # the source's, with the slots' barriers on alternating parities.
    err, out = _cuda.emu_selftest_bulk(0)
    src = (np.arange(512, dtype=np.uint64) * 2654435761) & 0xFFFFFFFF
    want = src.reshape(4, 32, 4).sum(axis=0) & 0xFFFFFFFF
    assert err is None and np.array_equal(out.astype(np.uint64), want)


@pytest.mark.parametrize("kind, what", [
    (1, "bulk copy has not been waited for"),         # step 1 read before its wait
    (2, "race: write to a word another thread read"),  # slot refilled before the syncwarp
    (3, "before fence.mbarrier_init"),
    (4, "bulk copies no thread waited for"),          # the last step never waited for
    (5, "deadlock"),                                  # a phase expecting bytes no copy brings
    (6, "multiples of 16"),
    (7, "more arrivals"),
])
def test_bulk_copy_rules_are_errors(kind, what):
    err, _ = _cuda.emu_selftest_bulk(kind)
    assert err is not None and what in err, err


def _shadow_stack() -> bool:
    """Whether this process runs with a CET shadow stack (Linux reports it in /proc)."""
    try:
        with open("/proc/self/status") as f:
            return any(line.startswith("x86_Thread_features:") and "shstk" in line for line in f)
    except OSError:
        return False


def test_fibers_switch_in_user_space_where_they_can():
    """x86-64 Linux without a shadow stack switches the emulator's fibers in user space
    (emu/fiber.h); anywhere else, or with UNWEIGHT_EMU_UCONTEXT=1, through ucontext."""
    want = (sys.platform.startswith("linux") and platform.machine() == "x86_64" and not _shadow_stack()
            and os.environ.get("UNWEIGHT_EMU_UCONTEXT") != "1")
    assert _cuda.emu_fiber_fast() is want
    ns = _cuda.emu_fiber_switch_ns(1000)  # (a timing: only its sanity is checked)
    assert 0 < ns < 1e6, ns


def test_the_ucontext_fallback_runs_the_same_bodies():
    """The fallback (what other machines take) passes this file's tests and the tensor-core GEMV
    at batch 17 (two n-tiles and a half step) at every parts."""
    if os.environ.get("UNWEIGHT_EMU_UCONTEXT") == "1":
        pytest.skip("already on the fallback")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    gemv = "tests/cuda/test_gemv_logic.py::test_mma_gemv_meets_the_bf16_gemm_bound[40-1088-17]"
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                        os.path.abspath(__file__), gemv],
                       cwd=root, env={**os.environ, "UNWEIGHT_EMU_UCONTEXT": "1"}, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert " passed" in p.stdout and "failed" not in p.stdout
