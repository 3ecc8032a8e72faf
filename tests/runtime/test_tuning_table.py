"""The measured dispatch table (unweight/runtime/tuning_table.py): buckets, the never-slower
rule, cache files, shipped defaults."""
import json
import os

import numpy as np
import pytest

from unweight.runtime import tuning_table as tuning

DEV = "NVIDIA H100 80GB HBM3"


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    """Every test gets its own empty user cache."""
    monkeypatch.setenv(tuning.ENV_CACHE, str(tmp_path / "cache" / "tuning.json"))


def test_bucket_mapping():
    want = {1: "1", 2: "2-4", 4: "2-4", 5: "5-16", 16: "5-16", 17: "17-32", 32: "17-32", 33: "33-64", 64: "33-64",
            65: "65-256", 256: "65-256", 257: ">256", 4096: ">256"}
    for M, b in want.items():
        assert tuning.bucket(M) == b, M
    assert tuple(tuning.BUCKET_BATCH) == tuning.BUCKETS
    for b, M in tuning.BUCKET_BATCH.items():
        assert tuning.bucket(M) == b  # each bucket is measured at a batch inside it


def test_cache_path_from_env_and_default(monkeypatch, tmp_path):
    assert tuning.default_cache_path() == str(tmp_path / "cache" / "tuning.json")
    monkeypatch.delenv(tuning.ENV_CACHE)
    assert tuning.default_cache_path() == os.path.join(os.path.expanduser("~"), ".cache", "unweight", "tuning.json")


def test_shipped_defaults_are_measured_choices():
    """Every shipped entry is a measurement whose recorded choice is what the rule picks from
    its own times (a fused path only where it was faster than decode + cuBLAS); a device the
    file does not name runs decode + cuBLAS."""
    with open(tuning.DEFAULTS_PATH) as f:
        doc = json.load(f)
    assert doc["schema"] == tuning.SCHEMA
    def measured_for(b, M):  # M's bucket, or one that shares a retired bucket with it
        return b == tuning.bucket(M) or any(b in new and tuning.bucket(M) in new
                                            for new in tuning.LEGACY_BUCKETS.values())

    for key, e in doc["entries"].items():
        dev, n, k, enc, b = key.split("|")
        assert enc in ("palette", "palette" + tuning.TILED) and measured_for(b, e["M"]), key
        assert e["choice"] == tuning.choose(e["times_ms"], enc), key
        if e["choice"] != tuning.DECODE_CUBLAS:
            assert e["times_ms"][e["choice"]] < e["times_ms"][tuning.DECODE_CUBLAS], key
        assert tuning.load_table().lookup(dev, int(n), int(k), enc, e["M"]) == e["choice"]
    t = tuning.load_table()
    for enc in ("huffman", "palette"):
        for M in (1, 3, 16, 17, 300):
            assert t.lookup("NVIDIA A100-SXM4-80GB", 4096, 4096, enc, M) == tuning.DECODE_CUBLAS
            assert t.lookup(DEV, 4096, 4096, "huffman", M) == tuning.DECODE_CUBLAS  # no fused huffman kernel


def test_entries_under_a_retired_bucket_cover_its_batches(tmp_path):
    """A table written with the single 17-64 bucket (measured at 64) still governs batches
    17..64 after the bucket's split, until 17-32 or 33-64 is measured on its own."""
    times = {"decode_cublas": 1.0, "palette_gemm": 0.5}
    doc = {"schema": tuning.SCHEMA, "entries": {
        tuning.entry_key(DEV, 4096, 4096, "palette", "17-64"): {"M": 64, "choice": "palette_gemm", "times_ms": times},
        tuning.entry_key(DEV, 512, 4096, "palette", "17-64"): {"M": 64, "choice": "palette_gemm", "times_ms": times},
        tuning.entry_key(DEV, 512, 4096, "palette", "17-32"): {"M": 32, "choice": "decode_cublas",
                                                               "times_ms": {"decode_cublas": 1.0}}}}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    t = tuning.TuningTable.load(str(path))
    for M in (17, 32, 33, 64):
        assert t.lookup(DEV, 4096, 4096, "palette", M) == "palette_gemm", M
    assert [t.lookup(DEV, 512, 4096, "palette", M) for M in (20, 50)] == ["decode_cublas", "palette_gemm"]
    assert not any(k.endswith("|17-64") for k in t.entries)  # saved back under the current buckets


def test_choose_never_picks_a_path_not_faster_than_decode_cublas():
    c = tuning.choose
    assert c({}) == tuning.DECODE_CUBLAS
    assert c({"palette_gemm": 0.001}) == tuning.DECODE_CUBLAS  # no baseline measured in the same run
    assert c({"decode_cublas": 1.0, "palette_gemm": 1.0}) == tuning.DECODE_CUBLAS  # a tie is not a win
    assert c({"decode_cublas": 1.0, "palette_gemm": 1.5}) == tuning.DECODE_CUBLAS
    assert c({"decode_cublas": 1.0, "palette_gemm": 0.5}) == tuning.PALETTE_GEMM
    # a time under a name no path has (a fused Huffman kernel of earlier tables) never wins
    assert c({"decode_cublas": 1.0, "huffman_gemm": 0.5, "palette_gemm": 0.95}) == tuning.PALETTE_GEMM
    assert c({"decode_cublas": 1.0, "huffman_gemm": 0.5}) == tuning.DECODE_CUBLAS
    for bad in (float("nan"), float("inf"), -1.0, 0.0, "0.1", None, True):
        assert c({"decode_cublas": 1.0, "palette_gemm": bad}) == tuning.DECODE_CUBLAS
        assert c({"decode_cublas": bad, "palette_gemm": 0.1}) == tuning.DECODE_CUBLAS
    rng = np.random.default_rng(0)
    # the faster of the two palette kernels, when it beats decode + cuBLAS; a tie keeps palette_gemm
    assert c({"decode_cublas": 1.0, "palette_gemm": 0.8, "palette_gemm_wide": 0.7}) == tuning.PALETTE_GEMM_WIDE
    assert c({"decode_cublas": 1.0, "palette_gemm": 0.7, "palette_gemm_wide": 0.8}) == tuning.PALETTE_GEMM
    assert c({"decode_cublas": 1.0, "palette_gemm": 0.7, "palette_gemm_wide": 0.7}) == tuning.PALETTE_GEMM
    assert c({"decode_cublas": 1.0, "palette_gemm_wide": 1.2}) == tuning.DECODE_CUBLAS
    assert c({"decode_cublas": 1.0, "palette_gemm": 0.8, "palette_gemm_wide": 0.7,
              "palette_gemm_xs": 0.6}) == tuning.PALETTE_GEMM_XS
    assert c({"decode_cublas": 0.5, "palette_gemm_xs": 0.6}) == tuning.DECODE_CUBLAS
    assert c({"decode_cublas": 1.0, "palette_gemm": 0.8, "palette_gemv": 0.7}) == tuning.PALETTE_GEMV
    for _ in range(500):
        times = {k: float(v) for k, v in zip(tuning.CHOICES, rng.uniform(0.01, 1, len(tuning.CHOICES)))
                 if rng.random() < 0.8}
        for enc in ("palette", "palette:tiled"):  # (a tile-major-only path counts tile-major only)
            ch = c(times, enc)
            ok = {k: v for k, v in times.items() if enc.endswith(":tiled") or k not in tuning.TILED_ONLY}
            if ch != tuning.DECODE_CUBLAS:
                assert times[ch] < times["decode_cublas"] and times[ch] == min(ok.values())


def test_record_save_load_roundtrip(tmp_path):
    t = tuning.TuningTable(comment="test")
    assert t.record(DEV, 4096, 4096, "palette", 1, {"decode_cublas": 0.03, "palette_gemm": 0.02}) == "palette_gemm"
    assert t.record(DEV, 4096, 4096, "palette", 16, {"decode_cublas": 0.03, "palette_gemm": 0.04}) == "decode_cublas"
    assert t.record(DEV, 4096, 14336, "palette", 3, {"decode_cublas": 0.1, "palette_gemm": 0.05,
                                                     "bogus": 0.0001}) == "palette_gemm"
    path = t.save(str(tmp_path / "sub" / "t.json"))
    u = tuning.TuningTable.load(path)
    assert u.entries == t.entries and u.comment == "test"
    assert u.lookup(DEV, 4096, 4096, "palette", 1) == "palette_gemm"
    assert u.lookup(DEV, 4096, 4096, "palette", 5) == "decode_cublas"   # bucket 5-16 measured slower
    assert u.lookup(DEV, 4096, 4096, "palette", 2) == "decode_cublas"   # bucket 2-4 never measured
    assert u.lookup(DEV, 4096, 14336, "palette", 4) == "palette_gemm"   # same bucket as M = 3
    assert u.lookup("NVIDIA A100-SXM4-80GB", 4096, 4096, "palette", 1) == "decode_cublas"  # other device
    assert u.lookup(DEV, 4096, 4096, "huffman", 1) == "decode_cublas"   # other encoding
    assert "bogus" not in u.entries[tuning.entry_key(DEV, 4096, 14336, "palette", "2-4")]["times_ms"]


def test_lookup_rederives_choice_from_times(tmp_path):
    """A stale or hand-edited "choice" can never select a path recorded as slower."""
    key = tuning.entry_key(DEV, 64, 64, "palette", "1")
    doc = {"schema": 1, "comment": "", "entries": {
        key: {"M": 1, "choice": "palette_gemm", "times_ms": {"decode_cublas": 0.01, "palette_gemm": 0.02}}}}
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc))
    assert tuning.TuningTable.load(str(p)).lookup(DEV, 64, 64, "palette", 1) == "decode_cublas"


@pytest.mark.parametrize("text", ["{not json", json.dumps({"schema": 99, "entries": {}}), json.dumps([1, 2]),
                                  json.dumps({"schema": 1, "entries": {"k": 3}})])
def test_unreadable_cache_is_ignored(tmp_path, text):
    p = tmp_path / "t.json"
    p.write_text(text)
    t = tuning.TuningTable.load(str(p))
    assert t.entries == {} or all(isinstance(v, dict) for v in t.entries.values())
    assert t.lookup(DEV, 64, 64, "palette", 1) == "decode_cublas"
    assert tuning.TuningTable.load(str(tmp_path / "missing.json")).entries == {}


def test_user_cache_overrides_shipped_defaults(tmp_path):
    user = tuning.TuningTable()
    user.record(DEV, 128, 256, "palette", 1, {"decode_cublas": 0.02, "palette_gemm": 0.01})
    user.save(tuning.default_cache_path())
    assert tuning.load_table().lookup(DEV, 128, 256, "palette", 1) == "palette_gemm"
    assert tuning.load_table().lookup(DEV, 128, 256, "palette", 200) == "decode_cublas"


def test_candidates():
    both = ["palette_gemm", "palette_gemm_wide", "palette_gemm_xs", "palette_gemm_wg"]  # the copy layouts
    gemv = ["palette_gemv", "palette_gemv_deep", "palette_gemv_staged"]  # the GEMV at batch 1..4, its variants
    mma = ["palette_gemv_mma", "palette_gemv_mma_staged", "palette_gemv_mma_prefetch",  # tensor cores, batch 1..32
           "palette_gemv_mma_queue"]
    assert tuning.candidates("palette", 1, 4096, 512) == both + gemv + mma
    assert tuning.candidates("palette", 4, 4096, 512) == both + gemv + mma
    assert tuning.candidates("palette", 5, 4096, 512) == both + mma
    assert tuning.candidates("palette", 16, 4096, 512) == both + mma
    assert tuning.candidates("palette", 32, 4096, 512) == both + mma
    assert tuning.candidates("palette", 33, 4096, 512) == both
    assert tuning.candidates("palette", 64, 14336) == both
    assert tuning.candidates("palette", 16, 4100, 4100) == []  # K % 64 != 0
    assert tuning.candidates("palette", 256, 4096) == both
    assert tuning.candidates("palette", 257, 4096, 512) == []  # past the kernel's batch range
    assert tuning.candidates("huffman", 1, 4096, 512) == []    # no fused Huffman kernel


def test_tile_major_entries_are_their_own_key_and_decide_the_plane_order():
    """A tile-major palette weight is measured under "palette:tiled"; plane_order says "tiled"
    only where both orders were timed and the best tile-major time wins over the buckets timed
    in both (geometric mean), "file" otherwise."""
    assert tuning.table_encoding("palette", True) == "palette:tiled"
    assert tuning.table_encoding("palette", False) == "palette"
    assert tuning.table_encoding("huffman", True) == "huffman"  # nothing of Huffman is tiled
    # Tile-major adds the bulk-copy GEMV, which only tile-major planes let a warp fetch whole.
    tiled = tuning.candidates("palette:tiled", 1, 4096)
    assert "palette_gemv_mma_bulk" in tiled
    assert [p for p in tiled if p != "palette_gemv_mma_bulk"] == tuning.candidates("palette", 1, 4096)
    assert tuning.candidates("palette:tiled", 33, 4096) == tuning.candidates("palette", 33, 4096)
    t = tuning.TuningTable()
    assert t.plane_order(DEV, 64, 128) == "file"  # nothing measured
    t.record(DEV, 64, 128, "palette", 1, {"decode_cublas": 1.0, "palette_gemv_mma": 0.5})
    assert t.plane_order(DEV, 64, 128) == "file"  # one order only
    t.record(DEV, 64, 128, "palette:tiled", 1, {"decode_cublas": 1.0, "palette_gemv_mma": 0.4})
    assert t.lookup(DEV, 64, 128, "palette:tiled", 1) == "palette_gemv_mma"
    assert t.best_ms(DEV, 64, 128, "palette:tiled", "1") == 0.4
    assert t.plane_order(DEV, 64, 128) == "tiled"
    assert t.plane_order("NVIDIA H200", 64, 128) == "file"  # another device measured nothing
    # A second bucket that tile-major loses by more: the geometric mean decides (0.8 * 1.5 > 1).
    t.record(DEV, 64, 128, "palette", 16, {"decode_cublas": 2.0, "palette_gemm": 1.0})
    t.record(DEV, 64, 128, "palette:tiled", 16, {"decode_cublas": 2.0, "palette_gemm": 1.5})
    assert t.plane_order(DEV, 64, 128) == "file"
    # A bucket timed in one order only does not count.
    t.record(DEV, 64, 128, "palette:tiled", 64, {"decode_cublas": 0.1})
    assert t.plane_order(DEV, 64, 128) == "file"
    t.record(DEV, 64, 128, "palette:tiled", 16, {"decode_cublas": 2.0, "palette_gemm": 1.2})
    assert t.plane_order(DEV, 64, 128) == "tiled"


# --------------------------------------------------------------------------- decoders

def test_decoder_choice_needs_a_win_over_the_default():
    """A variant other than the default is chosen only when strictly faster than the default
    timed in the same run; ties and missing or invalid times keep the default."""
    names = tuning.decoder_names("huffman")
    assert tuning.choose_decoder({"ahead": 1.0, "ahead2": 0.9, "chain": 0.95}, "ahead", names) == "ahead2"
    assert tuning.choose_decoder({"ahead": 1.0, "ahead2": 1.0}, "ahead", names) == "ahead"
    assert tuning.choose_decoder({"ahead2": 0.5}, "ahead", names) == "ahead"  # default not timed
    assert tuning.choose_decoder({"ahead": float("nan"), "ahead2": 0.5}, "ahead", names) == "ahead"
    assert tuning.choose_decoder({"ahead": 1.0, "ahead2": -1.0, "ring": 0.0}, "ahead", names) == "ahead"
    assert tuning.choose_decoder({"ahead": 1.0, "fast": 0.1}, "ahead", names) == "ahead"  # no such variant


def test_decoder_lookup_and_roundtrip(tmp_path):
    """record_decoders keeps the variants' times; decoder() gives the variant number, 0 for the
    default or an unmeasured key; the interval S is part of the key for Huffman only; save and
    load keep the decoders; update overlays them key by key."""
    kp = tuning.kp
    t = tuning.TuningTable()
    default = tuning.default_decoder("huffman")
    other = next(n for n in tuning.decoder_names("huffman") if n not in (default, "scalar"))
    assert t.record_decoders(DEV, 14336, 4096, "huffman", 256, {default: 0.22, other: 0.20, "bogus": 0.01},
                             default) == other
    assert t.record_decoders(DEV, 4096, 4096, "huffman", 256, {default: 0.066, other: 0.08}, default) == default
    pal_other = next(n for n in tuning.decoder_names("palette") if n != tuning.default_decoder("palette"))
    t.record_decoders(DEV, 4096, 4096, "palette", 256, {tuning.default_decoder("palette"): 0.02, pal_other: 0.03})
    assert t.decoder(DEV, 14336, 4096, "huffman", 256) == kp.HUFF_VARIANTS[other]
    assert t.decoder(DEV, 14336, 4096, "huffman", 1024) == 0  # another interval: not measured
    assert t.decoder(DEV, 14336, 4096, "palette", 256) == 0
    assert t.decoder(DEV, 4096, 4096, "huffman", 256) == 0  # the default won
    assert t.decoder("NVIDIA A100-SXM4-80GB", 14336, 4096, "huffman", 256) == 0
    assert tuning.decoder_key(DEV, 1, 2, "palette", 256) == tuning.decoder_key(DEV, 1, 2, "palette", 0)
    assert "bogus" not in t.decoders[tuning.decoder_key(DEV, 14336, 4096, "huffman", 256)]["times_ms"]
    path = str(tmp_path / "t.json")
    t.save(path)
    back = tuning.TuningTable.load(path)
    assert back.decoders == t.decoders and back.decoder(DEV, 14336, 4096, "huffman", 256) == kp.HUFF_VARIANTS[other]
    u = tuning.TuningTable()
    u.record_decoders(DEV, 14336, 4096, "huffman", 256, {default: 0.2, other: 0.3})
    assert back.update(u).decoder(DEV, 14336, 4096, "huffman", 256) == 0
    # a table with no decoders writes none (the file stays as readers before them wrote it)
    assert "decoders" not in tuning.TuningTable().to_json()


def test_decoder_entry_without_this_builds_default_chooses_nothing(tmp_path, monkeypatch):
    """An entry timed before the default changed, one that never timed the current default,
    cannot claim a win over it; nor can a recorded choice the times do not support."""
    t = tuning.TuningTable()
    t.decoders[tuning.decoder_key(DEV, 8, 64, "huffman", 256)] = {
        "default": "chain", "choice": "ahead2", "times_ms": {"chain": 1.0, "ahead2": 0.5}}
    monkeypatch.setattr(tuning.kp, "HUFF_DEFAULT_VARIANT", tuning.kp.HUFF_VARIANT_RING)
    assert t.decoder(DEV, 8, 64, "huffman", 256) == 0
    t.decoders[tuning.decoder_key(DEV, 8, 64, "huffman", 256)]["times_ms"]["ring"] = 0.7
    assert t.decoder(DEV, 8, 64, "huffman", 256) == tuning.kp.HUFF_VARIANT_AHEAD2
    t.decoders[tuning.decoder_key(DEV, 8, 64, "huffman", 256)]["times_ms"]["ring"] = 0.4
    assert t.decoder(DEV, 8, 64, "huffman", 256) == 0


@pytest.mark.parametrize("decoders", ['[1]', '{"a|1|2|huffman|0": 3}', '{"a|1|2|huffman|0": {"times_ms": {}}}'])
def test_malformed_decoders_are_ignored(tmp_path, decoders):
    p = tmp_path / "t.json"
    p.write_text('{"schema": 1, "entries": {}, "decoders": %s}' % decoders)
    t = tuning.TuningTable.load(str(p))
    assert t.decoders == {} and t.decoder("a", 1, 2, "huffman", 0) == 0


def test_shipped_decoders_are_measured_wins():
    """Every shipped decoder entry chooses what the rule gives from its own times, timed
    against the default it names; decoder() agrees with it where this build's default is that
    one."""
    with open(tuning.DEFAULTS_PATH) as f:
        doc = json.load(f)
    t = tuning.load_table()
    for key, e in doc.get("decoders", {}).items():
        dev, n, k, enc, s = key.split("|")
        names = tuning.decoder_names(enc)
        assert e["default"] in e["times_ms"] and set(e["times_ms"]) <= set(names), key
        assert e["choice"] == tuning.choose_decoder(e["times_ms"], e["default"], names), key
        if e["default"] == tuning.default_decoder(enc):
            want = 0 if e["choice"] == e["default"] else names[e["choice"]]
            assert t.decoder(dev, int(n), int(k), enc, int(s)) == want, key


def test_a_tile_major_only_path_never_runs_file_order():
    """The bulk-copy GEMV reads tile-major planes only: a file-order entry that lists it (a
    hand-edited or foreign table) never chooses it; a tile-major entry does where it won."""
    times = {"decode_cublas": 1.0, "palette_gemv_mma": 0.6, "palette_gemv_mma_bulk": 0.4}
    assert tuning.choose(times) == "palette_gemv_mma"
    assert tuning.choose(times, "palette") == "palette_gemv_mma"
    assert tuning.choose(times, "palette:tiled") == "palette_gemv_mma_bulk"
    t = tuning.TuningTable()
    assert t.record(DEV, 64, 128, "palette", 1, times) == "palette_gemv_mma"
    assert t.record(DEV, 64, 128, "palette:tiled", 1, times) == "palette_gemv_mma_bulk"
    assert t.lookup(DEV, 64, 128, "palette", 1) == "palette_gemv_mma"
    assert t.lookup(DEV, 64, 128, "palette:tiled", 1) == "palette_gemv_mma_bulk"
    assert t.best_ms(DEV, 64, 128, "palette:tiled", "1") == 0.4
    assert t.best_ms(DEV, 64, 128, "palette", "1") == 0.6


def test_faster_is_a_recorded_win_over_decode_cublas():
    """TuningTable.faster: the path timed strictly faster than decode + cuBLAS in the same run at
    that key, even where another path was faster still; never a tile-major-only path for a
    file-order key; nothing measured, nothing faster."""
    t = tuning.TuningTable()
    assert not t.faster(DEV, 64, 128, "palette", 1, "palette_gemv_mma")
    t.record(DEV, 64, 128, "palette", 1, {"decode_cublas": 1.0, "palette_gemv_mma": 0.8, "palette_gemm": 0.5,
                                          "palette_gemv_mma_bulk": 0.4})
    assert t.faster(DEV, 64, 128, "palette", 1, "palette_gemv_mma")
    assert not t.faster(DEV, 64, 128, "palette", 1, "palette_gemv_mma_bulk")
    assert not t.faster(DEV, 64, 128, "palette", 16, "palette_gemv_mma")  # another bucket
    t.record(DEV, 64, 128, "palette", 4, {"decode_cublas": 1.0, "palette_gemv_mma": 1.0})
    assert not t.faster(DEV, 64, 128, "palette", 4, "palette_gemv_mma")  # a tie is no win
    from unweight.runtime.policy import DispatchPolicy
    assert not DispatchPolicy(t).measured_faster(64, 128, 1, "palette_gemv_mma", "cpu")


def test_nearest_choice_is_the_nearest_measured_shapes_winner_by_a_margin():
    t = tuning.TuningTable()
    dev = "NVIDIA H200"
    t.record(dev, 4096, 4096, "palette", 1, {"decode_cublas": 2.0, "palette_gemv_mma": 1.0})
    t.record(dev, 14336, 4096, "palette", 1, {"decode_cublas": 2.0, "palette_gemm": 1.0})
    t.record(dev, 4096, 4096, "palette", 16, {"decode_cublas": 1.0, "palette_gemm": 0.9})  # won by 1.11x only
    t.record(dev, 4096, 4096, "palette", 4, {"decode_cublas": 2.0, "palette_gemv": 1.0})
    t.record(dev, 4096, 4096, "palette", 32, {"decode_cublas": 2.0, "palette_gemv": 1.0})  # (a hand-edited entry)
    assert t.nearest_choice(dev, 3072, 4096, "palette", 1) == ("palette_gemv_mma", (4096, 4096))
    assert t.nearest_choice(dev, 12288, 4096, "palette", 1) == ("palette_gemm", (14336, 4096))
    assert t.nearest_choice(dev, 768, 2048, "palette", 1) == ("palette_gemv_mma", (4096, 4096))
    assert t.nearest_choice(dev, 3072, 4096, "palette", 16) == ("decode_cublas", (4096, 4096))  # below the margin
    assert t.nearest_choice(dev, 3072, 4096, "palette", 3) == ("palette_gemv", (4096, 4096))
    assert t.nearest_choice(dev, 3072, 4096, "palette", 20) == ("decode_cublas", (4096, 4096))  # GEMV takes <= 4
    assert t.nearest_choice(dev, 3072, 4096, "palette:tiled", 1) is None  # nothing measured tile-major
    assert t.nearest_choice("NVIDIA H100 80GB HBM3", 3072, 4096, "palette", 1) is None
    assert t.nearest_choice(dev, 3072, 4096, "palette", 64) is None  # nor in that bucket
    assert t.has(dev, 4096, 4096, "palette", 1) and not t.has(dev, 3072, 4096, "palette", 1)


def test_nearest_order_is_the_order_of_the_nearest_shape_timed_in_both():
    t = tuning.TuningTable()
    dev = "NVIDIA H200"
    for enc, ms in (("palette", 1.2), ("palette:tiled", 1.0)):
        t.record(dev, 4096, 4096, enc, 1, {"decode_cublas": 2.0, "palette_gemv_mma": ms})
    for enc, ms in (("palette", 1.0), ("palette:tiled", 1.2)):
        t.record(dev, 128256, 4096, enc, 1, {"decode_cublas": 2.0, "palette_gemm": ms})
    t.record(dev, 2048, 2048, "palette", 1, {"decode_cublas": 2.0, "palette_gemm": 1.0})  # one order only
    assert t.orders_timed(dev, 4096, 4096) == {"palette", "palette:tiled"}
    assert t.orders_timed(dev, 2048, 2048) == {"palette"} and t.orders_timed(dev, 768, 2048) == set()
    assert t.nearest_order(dev, 768, 2048) == "tiled"
    assert t.nearest_order(dev, 65536, 4096) == "file"
    assert t.nearest_order("NVIDIA H100 80GB HBM3", 768, 2048) is None


def test_nearest_faster_asks_the_nearest_shape_for_one_path():
    t = tuning.TuningTable()
    dev = "NVIDIA H200"
    t.record(dev, 4096, 4096, "palette", 1, {"decode_cublas": 2.0, "palette_gemv_mma": 1.0, "palette_gemm": 1.9})
    assert t.nearest_faster(dev, 768, 2048, "palette", 1, "palette_gemv_mma")
    assert not t.nearest_faster(dev, 768, 2048, "palette", 1, "palette_gemm")  # faster, not by the margin
    assert not t.nearest_faster(dev, 768, 2048, "palette", 1, "decode_cublas")
    assert not t.nearest_faster(dev, 768, 2048, "palette", 16, "palette_gemv_mma")  # nothing at 5-16
