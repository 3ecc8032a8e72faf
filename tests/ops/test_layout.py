"""ops/layout.py: the tile-major order of the palette planes, and the palette ops' ``tiled``
argument on the CPU (the CUDA kernels' reading of it is tested through the warp emulator in
tests/cuda/test_tiled_planes.py)."""
import numpy as np
import pytest
import torch

from unweight import ops
from unweight.codec import tensor_codec as tc
from unweight.format import constants as C
from unweight.runtime import kernel_plan as kp
from unweight.runtime.modules import plane_tensor


def _palette(rows, cols, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(rows, cols, generator=g) * 0.02).to(torch.bfloat16)
    e = tc.encode(w.view(torch.uint16).numpy(), "palette")
    return w, e.header, {s: plane_tensor(a) for s, a in e.planes.items()}


@pytest.mark.parametrize("rows,cols", [(16, 64), (48, 1088), (128, 256)])
def test_tiling_places_every_byte_by_the_plan_and_round_trips(rows, cols):
    rng = np.random.default_rng(rows + cols)
    sm = torch.from_numpy(rng.integers(0, 256, (rows, cols), dtype=np.uint8))
    idx = torch.from_numpy(rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8))
    st, it = ops.tile_palette_planes(sm, idx)
    assert st.shape == sm.shape and it.shape == idx.shape and st.is_contiguous() and it.is_contiguous()
    r, k = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    at = np.vectorize(lambda a, b: kp.pal_sm_index(a, b, cols, True))(r, k)
    assert np.array_equal(st.numpy().reshape(-1)[at], sm.numpy())
    ati = np.vectorize(lambda a, b: kp.pal_idx_index(a, b, cols, True))(r[:, ::2], k[:, ::2])
    assert np.array_equal(it.numpy().reshape(-1)[ati], idx.numpy())
    s2, i2 = ops.untile_palette_planes(st, it)
    assert torch.equal(s2, sm) and torch.equal(i2, idx)
    assert not torch.equal(st, sm) or rows == 16 and cols == 64


@pytest.mark.parametrize("rows,cols", [(40, 64), (16, 96), (16, 65)])
def test_shapes_that_are_not_whole_tiles_are_refused(rows, cols):
    sm = torch.zeros(rows, cols, dtype=torch.uint8)
    with pytest.raises(ValueError, match="tile-major planes need"):
        ops.tile_palette_planes(sm, torch.zeros(rows, (cols + 1) // 2, dtype=torch.uint8))


def test_cpu_ops_read_tile_major_planes():
    """decode_palette, palette_matmul and palette_gemv with tiled=True give, bit for bit, what
    they give on the file-order planes."""
    rows, cols = 48, 1088
    w, h, p = _palette(rows, cols, seed=3)
    st, it = ops.tile_palette_planes(p[C.SUFFIX_SM], p[C.SUFFIX_IDX])
    pal = [int(b) for b in h.palette[: h.pal_size]]
    out = torch.empty(rows, cols, dtype=torch.bfloat16)
    err = torch.zeros(1, dtype=torch.int32)
    torch.ops.unweight.decode_palette(st, it, p[C.SUFFIX_VPOS], p[C.SUFFIX_VEXP], out, err, rows, cols, pal, 0, True)
    assert torch.equal(out.view(torch.uint16), w.view(torch.uint16)) and int(err) == 0
    x = torch.randn(3, cols).to(torch.bfloat16)
    ws, cnt = torch.empty(0, dtype=torch.float32), torch.empty(0, dtype=torch.int32)
    want = torch.ops.unweight.palette_matmul(x, p[C.SUFFIX_SM], p[C.SUFFIX_IDX], p[C.SUFFIX_VPOS], p[C.SUFFIX_VEXP],
                                             ws, cnt, rows, cols, pal, 1)
    got = torch.ops.unweight.palette_matmul(x, st, it, p[C.SUFFIX_VPOS], p[C.SUFFIX_VEXP], ws, cnt, rows, cols, pal,
                                            1, tiled=True)
    assert torch.equal(got.view(torch.uint16), want.view(torch.uint16))
    got = torch.ops.unweight.palette_gemv(x, st, it, p[C.SUFFIX_VPOS], p[C.SUFFIX_VEXP], rows, cols, pal, 1,
                                          kp.PGEMV_VARIANT_MMA, True)
    assert torch.equal(got.view(torch.uint16), want.view(torch.uint16))
    torch.library.opcheck(torch.ops.unweight.palette_gemv.default,
                          (x, st, it, p[C.SUFFIX_VPOS], p[C.SUFFIX_VEXP], rows, cols, pal, 1, 0, True),
                          test_utils=("test_schema", "test_faketensor"))
