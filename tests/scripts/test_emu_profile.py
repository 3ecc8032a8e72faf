"""scripts/emu_profile.py end to end on the CPU: every kernel family profiled through the warp
emulator, the table and the JSON it writes, and the one-line refusal without the extension."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "scripts"))
import emu_profile as ep  # noqa: E402

needs_ext = pytest.mark.skipif(ep._cuda() is None, reason="unweight._cuda not built")


@needs_ext
def test_report_covers_every_family_and_writes_json(tmp_path, capsys):
    out = tmp_path / "profile.json"
    assert ep.main(["--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "emu_profile" and doc["commit"] and doc["date"]
    families = {r["kernel"] for r in doc["kernels"]}
    assert families == {"palette_gemm", "palette_gemv", "palette_decode", "huffman_decode", "huffman_gather_rows",
                        "transcode", "crc32"}
    for r in doc["kernels"]:
        for k in ep.KINDS:
            d = r[k]
            assert d["units"] >= d["ideal"] and (d["requests"] > 0) == (d["ideal"] > 0), (r["kernel"], k)
        if r["kernel"] == "palette_gemm":  # swizzled stages, whole-sector copies
            for k in ("shared_load", "shared_async", "global_async"):
                assert r[k]["requests"] and r[k]["units"] == r[k]["ideal"], (r["config"], k)
    table = capsys.readouterr().out
    assert "palette_gemm" in table and "wrote" in table


def test_without_the_extension_it_says_so_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(ep, "_cuda", lambda: None)
    assert ep.main(["--no-write"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not built" in err[0]
