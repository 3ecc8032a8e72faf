"""scripts/bench_codec.py's accounting, without running the benchmark: the exponent-bit
breakdown against its entropy bounds, the README tables from the committed runs, and the
OpenZL contender's round trip where openzl is installed."""
import glob
import io
import json
import os
import re
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import bench_codec as bc  # noqa: E402
from unweight.codec import tensor_codec as tc  # noqa: E402


def _bf16(rng, shape, scale):
    f = (rng.standard_normal(shape, dtype=np.float32) * scale).view(np.uint32)
    return (f >> 16).astype(np.uint16)


def test_exponent_bits_against_bounds():
    rng = np.random.default_rng(3)
    # Rows whose scale changes by block: the block entropy sits below the tensor's.
    emb = np.concatenate([_bf16(rng, (64, 1024), 0.002), _bf16(rng, (64, 1024), 0.2)])
    mats = {"model.embed_tokens.weight": emb, "layers.0.mlp.up_proj.weight": _bf16(rng, (256, 512), 0.02)}
    names = list(mats)
    encs = [tc.encode(mats[n], "huffman") for n in names]
    out = bc.exponent_bits(names, mats, encs, None, block=65536)
    assert set(out) == {"embeddings", "other"}
    for g, n in (("embeddings", names[0]), ("other", names[1])):
        x = out[g]
        assert x["weights"] == mats[n].size and x["openzl_fse"] is None
        # A per-tensor prefix code under the 4 contexts cannot go below their conditional
        # entropy, and conditioning or splitting into blocks never raises the entropy.
        assert x["unweight_huffman"] >= x["h_ctx"] - 1e-9
        assert x["h_ctx"] <= x["h0"] + 1e-9 and x["h0_blocks"] <= x["h0"] + 1e-9
        assert x["unweight_huffman"] == 8 * memoryview(encs[names.index(n)].planes["__exp"]).nbytes / mats[n].size
    assert out["embeddings"]["h0"] - out["embeddings"]["h0_blocks"] > 0.5


def _runs():
    runs = sorted(glob.glob(os.path.join(ROOT, "benchmarks", "results", "codec-*-run[0-9].json")))
    by_commit = {}
    for p in runs:
        with open(p) as f:
            doc = json.load(f)
        if "exponent_bits" in doc["results"][0]:
            by_commit.setdefault(doc["commit"], []).append(p)
    if not by_commit:
        pytest.skip("no committed codec runs with the exponent breakdown")
    return max(by_commit.values(), key=len)


def test_summarize_committed_runs():
    paths = _runs()
    out = io.StringIO()
    bc.summarize(paths, out)
    text = out.getvalue()
    with open(paths[0]) as f:
        r = json.load(f)["results"][0]
    assert f"| {r['model']} | {r['ratio_huffman']:.4f} | {r['ratio_palette']:.4f} |" in text
    assert "| OpenZL FSE |" in text and "H(e \\| m6 m5) per tensor" in text
    # The file's bytes split into parts that add up to the huffman ratio.
    line = next(ln for ln in text.splitlines() if ln.startswith(f"  {r['model']}: __hdr"))
    parts = [float(v) for v in re.findall(r"\d+\.\d+", line)]  # 4 planes, other tensors, header; input's
    assert len(parts) == 7
    assert abs(sum(parts[:6]) - r["file_bytes_huffman"] / r["input_file_bytes"]) < 6 * 5e-6


def test_summarize_refuses_mixed_commits(tmp_path):
    paths = _runs()[:1]
    with open(paths[0]) as f:
        doc = json.load(f)
    doc["commit"] = "0000000"
    other = tmp_path / "other.json"
    other.write_text(json.dumps(doc))
    with pytest.raises(SystemExit, match="one commit"):
        bc.summarize(paths + [str(other)], io.StringIO())


@pytest.mark.parametrize("coder", bc.OPENZL_CODERS)
def test_openzl_contender_round_trip(coder):
    pytest.importorskip("openzl.ext")
    rng = np.random.default_rng(5)
    a = _bf16(rng, (300, 700), 0.02)
    a[0, :4] = [0x7FC1, 0xFF80, 0x0001, 0x8000]  # NaN payload, -Inf, subnormal, -0
    z = bc.OpenZL(coder)
    frames = [z.compress(a), z.compress(a[:17])]  # a context per frame: a second frame works
    assert z.decompress(frames[0]).tobytes() == a.tobytes()
    assert z.decompress(frames[1]).tobytes() == a[:17].tobytes()
    assert len(frames[0]) < 0.7 * a.nbytes


def test_dfloat11_sizes_groups_blocks():
    if bc._dfloat11_utils() is None:
        pytest.skip("dfloat11 not installed")
    pytest.importorskip("dahuffman")
    rng = np.random.default_rng(7)
    mats = {"model.embed_tokens.weight": _bf16(rng, (64, 128), 0.02),
            "model.layers.0.mlp.up_proj.weight": _bf16(rng, (128, 64), 0.02),
            "model.layers.0.self_attn.q_proj.weight": _bf16(rng, (64, 64), 0.02),
            "model.layers.1.mlp.up_proj.weight": _bf16(rng, (128, 64), 0.02)}
    enc = sum(a.nbytes for a in mats.values())
    mats["model.layers.1.mlp.up_proj.weight"][0, :4] = [0x7FC1, 0xFF80, 0x0001, 0x8000]
    d = bc.dfloat11_sizes(list(mats), mats, enc + 100, enc, verify=True)  # its stream decodes to the weights
    assert d["blocks"] == 3  # the embedding alone, then one code per layer
    assert 0.6 < d["tensor_ratio"] < 0.8
    assert d["checkpoint_ratio"] == pytest.approx((d["tensor_ratio"] * enc + 100) / (enc + 100))
