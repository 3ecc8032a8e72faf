"""Mode application at load (unweight/runtime/prepare.py): what every module kept compressed
gets, whichever mode kept it."""
import pytest

import unweight
from unweight.runtime import prepare as prep
from unweight.runtime.modules import compressed_modules


@pytest.mark.parametrize("mode", ["auto", "huffman", "palette"])
def test_every_module_kept_compressed_is_finished(llama_ck, monkeypatch, mode):
    # "auto" keeps the checkpoint's encoding when memory is short ("compressed"): such a module
    # must get the checkpoint index and decode tables (on a GPU) as an explicit mode's do, or
    # its huffman decode runs with a thread per segment.  On this CPU both steps are no-ops,
    # so the calls are recorded.
    _, ck = llama_ck
    seen = []
    real = prep._add_index
    monkeypatch.setattr(prep, "_meminfo_available", lambda: 1)  # nothing fits dense
    monkeypatch.setattr(prep, "_add_index", lambda m, policy=None: (seen.append(id(m)), real(m, policy)))
    m = unweight.load(ck["huffman"], device="cpu", mode=mode)
    owners = [x for _, x in compressed_modules(m) if not x.is_tied]
    assert owners and m.unweight_info["modules"]["dense"] == 0
    assert sorted(seen) == sorted(id(x) for x in owners)


def test_dense_conversion_decodes_with_the_measured_policy(llama_ck, monkeypatch):
    """Decoding to BF16 at load asks the policy for each weight's decoder variant (the one the
    tuning table measured fastest for its shape on a GPU; every variant writes the same bits)."""
    from unweight.runtime import policy as policies
    _, ck = llama_ck
    asked = []
    pol = policies.DispatchPolicy(None)
    monkeypatch.setattr(pol, "decoder", lambda w, device: (asked.append((w.rows, w.cols)), 0)[1])
    monkeypatch.setattr(prep.policies, "measured", lambda: pol)
    m = unweight.load(ck["huffman"], device="cpu", mode="dense")
    assert m.unweight_info["modules"]["dense"] > 0 and not list(compressed_modules(m))
    assert len(asked) >= m.unweight_info["modules"]["dense"] - len(m.unweight_info["tied"])


def test_transcode_at_load_decodes_with_the_measured_policy(llama_ck, monkeypatch):
    """A huffman checkpoint loaded in palette mode is transcoded with the decoder variant the
    policy gives for each weight's shape (on a GPU, the one the tuning table measured fastest;
    the CPU transcode ignores it)."""
    from unweight import ops
    from unweight.runtime import policy as policies
    _, ck = llama_ck
    pol = policies.DispatchPolicy(None)
    monkeypatch.setattr(pol, "decoder", lambda w, device: 7 if w.encoding_name == "huffman" else 0)
    monkeypatch.setattr(prep.policies, "measured", lambda: pol)
    used = []
    real = ops.transcode_to_palette
    monkeypatch.setattr(ops, "transcode_to_palette", lambda h, p, lut, err, variant=0, **kw: (
        used.append(variant), real(h, p, lut, err, variant, **kw))[1])
    m = unweight.load(ck["huffman"], device="cpu", mode="palette")
    owners = [x for _, x in compressed_modules(m) if not x.is_tied]
    assert all(x.encoding_name == "palette" for x in owners)
    assert used == [7] * len(owners)


def test_tile_major_planes_hold_the_same_model(llama_ck):
    """plane_order="tiled" permutes every palette matmul weight that is whole 16 x 64 tiles
    (not the embedding, nor the lm_head tied to it): the logits are bitwise the file-order
    model's, state_dict() and host_planes() still give the checkpoint's bytes, a state-dict
    load puts the planes back in file order, and prepare's default order undoes the permutation."""
    import torch

    from unweight.format import constants as C
    _, ck = llama_ck
    ref = unweight.load(ck["palette"], device="cpu", mode="palette")
    m = unweight.load(ck["palette"], device="cpu", mode="palette", plane_order="tiled")
    info = m.unweight_info
    mods = dict(compressed_modules(m))
    tiled = {n for n, x in mods.items() if x.plane_order == "tiled" and not x.is_tied}
    assert info["tiled_modules"] == len(tiled) >= 10  # q, o, gate, up, down x 2 layers
    # the paired palette order is the CUDA decode's: on CPU every module keeps the stored order
    assert info["paired_palette_modules"] == 0 and all(x.palette_order == "file" for x in mods.values())
    assert all(mods[n].can_tile() for n in tiled)
    assert not any(x.can_tile() for n, x in mods.items() if n not in tiled)
    n0 = sorted(tiled)[0]
    assert not torch.equal(mods[n0].weight__sm, dict(compressed_modules(ref))[n0].weight__sm)
    ids = torch.tensor([[1, 5, 9, 33, 200]])
    with torch.no_grad():
        want = ref(ids).logits
        assert torch.equal(m(ids).logits.view(torch.int16), want.view(torch.int16))
    sd, rsd = m.state_dict(), ref.state_dict()
    assert sd.keys() == rsd.keys() and all(torch.equal(sd[k], rsd[k]) for k in rsd)
    hp, rhp = mods[n0].host_planes(), dict(compressed_modules(ref))[n0].host_planes()
    assert all((hp[s] == rhp[s]).all() for s in (C.SUFFIX_SM, C.SUFFIX_IDX))
    m.load_state_dict(rsd)
    assert all(x.plane_order == "file" for _, x in compressed_modules(m))
    with torch.no_grad():
        assert torch.equal(m(ids).logits.view(torch.int16), want.view(torch.int16))
    prep.prepare(m, "palette", plane_order="tiled")
    prep.prepare(m, "palette")
    assert all(x.plane_order == "file" for _, x in compressed_modules(m))
    assert all(torch.equal(v, rsd[k]) for k, v in m.state_dict().items())
    with pytest.raises(ValueError, match="plane_order"):
        prep.prepare(m, "palette", plane_order="rows")
    with pytest.raises(unweight.InputError, match="plane_order"):
        unweight.load(ck["palette"], device="cpu", plane_order="rows")
