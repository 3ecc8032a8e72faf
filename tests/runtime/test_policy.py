"""The dispatch policy (unweight/runtime/policy.py): explicit, never fused off CUDA, never a
path the table did not measure faster, a refused launch remembered with one warning, and a
shape no kernel covers falling back with one warning."""
import warnings

import pytest
import torch
import torch.nn as nn

from unweight.runtime import policy as pol
from unweight.runtime import prepare
from unweight.runtime.modules import CompressedLinear
from unweight.runtime.tuning_table import TuningTable

DEV = "NVIDIA H100 80GB HBM3"


def _module(enc, n=40, k=128):
    torch.manual_seed(0)
    lin = nn.Linear(k, n).to(torch.bfloat16)
    nn.init.normal_(lin.weight, std=0.02)
    return lin, CompressedLinear.from_linear(lin, enc)


def _winning_table(n=40, k=128):
    t = TuningTable()
    for dev in (DEV, "cpu"):
        for enc in ("huffman", "palette"):
            for M in (1, 4, 16, 64, 256):  # a time under a name no path has ("huffman_gemm") is dropped
                t.record(dev, n, k, enc, M, {"decode_cublas": 1.0, "palette_gemm": 0.1, "huffman_gemm": 0.1})
    return t


@pytest.mark.parametrize("enc", ["huffman", "palette"])
def test_cpu_never_fused_even_when_the_table_says_so(enc):
    lin, cl = _module(enc)
    p = pol.DispatchPolicy(_winning_table())
    prepare.prepare_module(cl, p)
    for M in (1, 3, 16):
        assert p.linear_path(cl.encoded(), M, torch.device("cpu")) == pol.DECODE_CUBLAS
        x = torch.randn(M, 128, dtype=torch.bfloat16)
        with torch.no_grad():
            assert torch.equal(cl(x), lin(x))
    assert not p.may_fuse("cpu")


@pytest.fixture
def on_cuda(monkeypatch):
    """(policy with a table of fused wins, a CUDA device whose name the table knows, palette weight)."""
    p = pol.DispatchPolicy(_winning_table())
    monkeypatch.setattr(p, "device_name", lambda device: DEV)
    return p, torch.device("cuda", 0), _module("palette")[1].encoded()


def test_cuda_lookup_follows_the_table_and_supports(on_cuda):
    p, cuda, w = on_cuda
    assert p.linear_path(w, 1, cuda) == pol.PALETTE_GEMM
    assert p.linear_path(w, 64, cuda) == pol.PALETTE_GEMM
    assert p.linear_path(w, 256, cuda) == pol.PALETTE_GEMM
    assert p.linear_path(w, 257, cuda) == pol.DECODE_CUBLAS  # no fused kernel above 256 rows
    assert pol.DispatchPolicy(None).linear_path(w, 1, cuda) == pol.DECODE_CUBLAS
    assert pol.DispatchPolicy(TuningTable()).linear_path(w, 1, cuda) == pol.DECODE_CUBLAS  # nothing measured
    # huffman weights have no fused kernel, whatever the table says
    _, ch = _module("huffman")
    assert p.linear_path(ch.encoded(), 1, cuda) == pol.DECODE_CUBLAS
    assert p.may_fuse(cuda)


def test_uncovered_shape_falls_back_with_one_warning(on_cuda):
    p, cuda, _ = on_cuda
    w = _module("palette", k=96)[1].encoded()  # in_features % 64 != 0
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        assert p.linear_path(w, 1, cuda) == pol.DECODE_CUBLAS
        assert p.linear_path(w, 8, cuda) == pol.DECODE_CUBLAS
    assert len(got) == 1 and "no fused kernel covers" in str(got[0].message)


def test_refusal_is_remembered_with_one_warning(on_cuda):
    p, cuda, w = on_cuda
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        p.refuse(w, 1, cuda, pol.PALETTE_GEMM, "too much shared memory")
        p.refuse(w, 1, cuda, pol.PALETTE_GEMM, "too much shared memory")
    assert len(got) == 1 and "too much shared memory" in str(got[0].message)
    assert p.linear_path(w, 1, cuda) == pol.DECODE_CUBLAS
    assert p.linear_path(w, 4, cuda) == pol.PALETTE_GEMM  # another bucket is unaffected


def test_decoder_variant_from_the_table_on_cuda_only(monkeypatch):
    """The policy names the decoder variant the table measured faster for the weight's device,
    shape, encoding and checkpoint interval; 0 (the extension's default) off CUDA, without a
    table, or for a shape it did not measure."""
    from unweight.runtime import kernel_plan as kp
    w = _module("huffman")[1].encoded()
    t = TuningTable()
    from unweight.runtime.tuning_table import default_decoder
    d = default_decoder("huffman")  # an entry counts only where it timed the compiled-in default
    t.record_decoders(DEV, w.rows, w.cols, "huffman", w.chk_interval, {d: 1.0, "ahead2": 0.5}, d)
    p = pol.DispatchPolicy(t)
    monkeypatch.setattr(p, "device_name", lambda device: DEV)
    assert p.decoder(w, torch.device("cuda", 0)) == kp.HUFF_VARIANT_AHEAD2
    assert p.decoder(w, torch.device("cpu")) == 0
    assert pol.DispatchPolicy(None).decoder(w, torch.device("cuda", 0)) == 0
    assert p.decoder(_module("huffman", n=48)[1].encoded(), torch.device("cuda", 0)) == 0


def test_tile_major_weight_is_looked_up_under_its_own_entries_and_auto_order(on_cuda):
    """A tile-major weight takes the paths measured tile-major ("palette:tiled"), never the
    file-order ones; plane_order is "tiled" only on CUDA where the table measured it faster."""
    p, cuda, w = on_cuda
    p.table.record(DEV, w.rows, w.cols, "palette:tiled", 1, {"decode_cublas": 1.0, "palette_gemv_mma": 0.05})
    assert p.plane_order(w.rows, w.cols, cuda) == "tiled"  # 0.05 against file order's best, 0.1
    assert p.plane_order(w.rows, w.cols, "cpu") == "file"
    assert pol.DispatchPolicy(None).plane_order(w.rows, w.cols, cuda) == "file"
    w.tiled = True
    assert p.linear_path(w, 1, cuda) == pol.PALETTE_GEMV_MMA
    assert p.linear_path(w, 4, cuda) == pol.DECODE_CUBLAS  # not measured tile-major at this batch
    w.tiled = False
    assert p.linear_path(w, 4, cuda) == pol.PALETTE_GEMM


def test_unmeasured_palette_shapes_are_reported_once(monkeypatch, caplog):
    """A palette matmul weight on a GPU whose shape the table never timed runs decode + cuBLAS
    at every batch: prepare names such shapes in one warning per device (a stacked sibling by
    its stack's shape); measured shapes, huffman weights, the CPU and a shape no fused kernel
    takes are never named."""
    import types
    from unweight.runtime import kernel_plan as kp
    p = pol.DispatchPolicy(_winning_table())
    monkeypatch.setattr(p, "device_name", lambda device: DEV)
    gpu = torch.device("cuda", 0)
    measured = _module("palette")[1].encoded()
    other = _module("palette", n=48)[1].encoded()
    assert not p.unmeasured(measured, gpu) and p.unmeasured(other, gpu)
    assert not p.unmeasured(other, torch.device("cpu"))
    assert not p.unmeasured(_module("huffman", n=48)[1].encoded(), gpu)
    assert not kp.pmma_supported(1, 100) and not p.unmeasured(_module("palette", n=48, k=100)[1].encoded(), gpu)
    assert pol.DispatchPolicy(None).unmeasured(measured, gpu)  # an empty table measured nothing

    from unweight.format import constants as C

    def fake(w, group=None):  # a compressed linear on the GPU, as _report_unmeasured reads it
        m = types.SimpleNamespace(is_tied=False, encoding=C.ENC_HUFFMAN if w.is_huffman else C.ENC_PALETTE,
                                  device=gpu, encoded=lambda: w)
        if group is not None:
            m._uw_group = types.SimpleNamespace(w=group)
        return m

    with caplog.at_level("WARNING", logger="unweight.runtime.policy"):
        prepare._report_unmeasured([fake(measured), fake(other), fake(other), fake(other, group=measured)], p)
    msgs = [r.getMessage() for r in caplog.records if "no measurement" in r.getMessage()]
    assert len(msgs) == 1 and "1 palette matmul shape(s)" in msgs[0] and "[48x128]" in msgs[0] and DEV in msgs[0]
    caplog.clear()
    with caplog.at_level("WARNING", logger="unweight.runtime.policy"):
        prepare._report_unmeasured([fake(other)], p)  # named already (a vLLM load names layer by layer)
        fresh = pol.DispatchPolicy(_winning_table())
        monkeypatch.setattr(fresh, "device_name", lambda device: DEV)
        prepare._report_unmeasured([fake(measured), fake(other, group=measured)], fresh)
        prepare._report_unmeasured([fake(other)], None)  # no policy: decode + F.linear by choice
    assert not [r for r in caplog.records if "no measurement" in r.getMessage()]


def test_a_shape_the_table_did_not_measure_runs_the_nearest_shapes_winner(on_cuda):
    """The fused path chosen for the nearest shape measured on that GPU (TuningTable.
    nearest_choice), never on the CPU, never against a measurement of its own, never with
    nearest=False, and never a path its self-test took out."""
    p, cuda, measured = on_cuda
    other = _module("palette", n=48)[1].encoded()
    assert p.linear_path(other, 1, cuda) == pol.PALETTE_GEMM
    assert p.linear_path(other, 1, torch.device("cpu")) == pol.DECODE_CUBLAS
    strict = pol.DispatchPolicy(p.table, nearest=False)
    strict.device_name = lambda device: DEV
    assert strict.linear_path(other, 1, cuda) == pol.DECODE_CUBLAS
    p.table.record(DEV, 48, 128, "palette", 1, {"decode_cublas": 1.0, "palette_gemm": 1.5})  # its own: slower
    fresh = pol.DispatchPolicy(p.table)
    fresh.device_name = lambda device: DEV
    assert fresh.linear_path(other, 1, cuda) == pol.DECODE_CUBLAS
    assert fresh.linear_path(other, 4, cuda) == pol.PALETTE_GEMM  # (not measured at 2-4: the nearest's)
    with pytest.warns(UserWarning):
        fresh.mark_faulty(cuda, pol.PALETTE_GEMM, False, "a test")
    assert fresh.linear_path(other, 4, cuda) == pol.DECODE_CUBLAS


def test_the_environment_can_keep_unmeasured_shapes_on_decode_and_cublas(monkeypatch):
    assert pol.DispatchPolicy(None).nearest
    for v in ("0", "false", "No"):
        monkeypatch.setenv("UNWEIGHT_NEAREST_SHAPES", v)
        assert not pol.DispatchPolicy(None).nearest and not pol.measured().nearest
    monkeypatch.setenv("UNWEIGHT_NEAREST_SHAPES", "1")
    assert pol.DispatchPolicy(None).nearest
    assert not pol.DispatchPolicy(None, nearest=False).nearest


def test_auto_plane_order_of_a_shape_not_timed_in_both_is_the_nearest_ones(on_cuda):
    p, cuda, _ = on_cuda
    for enc, ms in (("palette", 0.2), ("palette:tiled", 0.1)):
        p.table.record(DEV, 64, 128, enc, 1, {"decode_cublas": 1.0, "palette_gemm": ms})
    assert p.plane_order(64, 128, cuda) == "tiled"
    assert p.plane_order(48, 128, cuda) == "tiled"  # not timed: 64 x 128's
    assert p.plane_order(40, 128, cuda) == "file"  # timed in file order only: the table's rule
    assert p.plane_order(48, 128, torch.device("cpu")) == "file"
    strict = pol.DispatchPolicy(p.table, nearest=False)
    strict.device_name = lambda device: DEV
    assert strict.plane_order(48, 128, cuda) == "file"


def test_measured_faster_of_a_shape_not_measured_asks_the_nearest(on_cuda):
    p, cuda, _ = on_cuda
    assert p.measured_faster(40, 128, 1, pol.PALETTE_GEMM, cuda)  # its own measurement
    assert p.measured_faster(48, 128, 1, pol.PALETTE_GEMM, cuda)  # 40 x 128's
    strict = pol.DispatchPolicy(p.table, nearest=False)
    strict.device_name = lambda device: DEV
    assert not strict.measured_faster(48, 128, 1, pol.PALETTE_GEMM, cuda)
