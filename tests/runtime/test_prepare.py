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
    monkeypatch.setattr(prep, "_add_index", lambda m: (seen.append(id(m)), real(m)))
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
