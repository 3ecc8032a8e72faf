"""unweight.tools.tune: the measured dispatch table written from this machine's GPU (matmul
paths per batch bucket, in both plane orders for palette, and the decoder variant per shape).  Timings need a CUDA GPU; off one
the tool refuses with a ValueError."""
import pytest

torch = pytest.importorskip("torch")

from unweight import ops  # noqa: E402
from unweight.format import constants as C  # noqa: E402
from unweight.runtime import kernel_plan as kp  # noqa: E402
from unweight.runtime import tuning_table as tt  # noqa: E402
from unweight.tools import tune  # noqa: E402


def test_tune_refuses_a_cpu_device(tmp_path):
    with pytest.raises(ValueError, match="CUDA devices only"):
        tune.tune([(64, 64, "palette")], device="cpu", path=str(tmp_path / "t.json"))
    assert not (tmp_path / "t.json").exists()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_tune_records_paths_and_decoders(tmp_path):
    """One synthetic shape per encoding at batch bucket 1: an entry per (shape, encoding)
    whose choice the lookup re-derives, and decoder times for every variant but Huffman's
    SCALAR fallback, with the choice a win over the default or the default itself."""
    if not ops.cuda_kernels_built():
        pytest.skip("unweight._cuda not built")
    path = str(tmp_path / "tuning.json")
    tab = tune.tune([(256, 512, "huffman"), (256, 512, "palette")], buckets=["1"], warmup=1, iters=5, path=path)
    back = tt.TuningTable.load(path)
    assert back.entries == tab.entries and back.decoders == tab.decoders
    name = torch.cuda.get_device_name(0)
    for enc in ("huffman", "palette", "palette:tiled"):  # a palette weight is timed in both plane orders
        e = back.entries[tt.entry_key(name, 256, 512, enc, "1")]
        assert back.lookup(name, 256, 512, enc, 1) == tt.choose(e["times_ms"], enc)
    # The bulk-copy GEMV is timed tile-major only (where an sm_90 GPU runs it).
    tiled_times = back.entries[tt.entry_key(name, 256, 512, "palette:tiled", "1")]["times_ms"]
    assert "palette_gemv_mma_bulk" not in back.entries[tt.entry_key(name, 256, 512, "palette", "1")]["times_ms"]
    assert ("palette_gemv_mma_bulk" in tiled_times) == (torch.cuda.get_device_capability(0)[0] >= 9)
    assert not any("huffman:tiled" in k for k in back.entries)
    assert back.plane_order(name, 256, 512) in ("file", "tiled")
    (hk, he), = [(k, e) for k, e in back.decoders.items() if "|huffman|" in k]
    assert hk == tt.decoder_key(name, 256, 512, "huffman", C.LOAD_CHK_INTERVAL)  # the index prepare adds
    assert set(he["times_ms"]) == {n for n, v in kp.HUFF_VARIANTS.items() if v != kp.HUFF_VARIANT_SCALAR}
    (pk, pe), = [(k, e) for k, e in back.decoders.items() if "|palette|" in k]
    assert set(pe["times_ms"]) == set(kp.PAL_VARIANTS)
    for e in (he, pe):
        assert e["choice"] == tt.choose_decoder(e["times_ms"], e["default"], e["times_ms"])
