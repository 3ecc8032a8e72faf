"""The benchmark scripts other than bench_codec.py (decode, kernels, e2e, moe, scale, vllm) on a
machine without a GPU, vLLM or disk to spare: a run that cannot do what was asked says so in
one line and exits non-zero, before building or measuring anything, and writes no result."""
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import _bench_util as bu  # noqa: E402
import bench_decode  # noqa: E402
import bench_e2e  # noqa: E402
import bench_host  # noqa: E402
import bench_kernels  # noqa: E402
import bench_moe  # noqa: E402
import bench_scale  # noqa: E402
import bench_stack_load  # noqa: E402
import bench_tp_blocks  # noqa: E402
import bench_vllm  # noqa: E402

GPU_SCRIPTS = (bench_decode, bench_kernels, bench_e2e)


def _exit(fn, capsys):
    """(exit code, stderr lines) of fn(), which must exit."""
    with pytest.raises(SystemExit) as e:
        fn()
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return e.value.code, [ln for ln in err.splitlines() if ln.strip()]


@pytest.mark.parametrize("mod", GPU_SCRIPTS, ids=lambda m: m.__name__)
@pytest.mark.parametrize("argv, needle", [(["--runs", "0"], "--runs: 0 is not >= 1"),
                                          (["--runs", "-3"], "--runs: -3 is not >= 1"),
                                          (["--budget", "0"], "--budget: 0 is not a number > 0")])
def test_gpu_scripts_refuse_bad_arguments_without_a_gpu(mod, argv, needle, capsys):
    code, err = _exit(lambda: mod.main(argv), capsys)
    assert code == 2 and needle in err[-1]


@pytest.mark.parametrize("mod", (bench_decode, bench_kernels), ids=lambda m: m.__name__)
def test_bad_shape_is_an_argument_error(mod, capsys):
    code, err = _exit(lambda: mod.main(["--shapes", "4096"]), capsys)
    assert code == 2 and "bad shape '4096': write NxK" in err[-1]


@pytest.mark.parametrize("argv, needle", [(["--batches", "0"], "--batches: 0 is not >= 1"),
                                          (["--batches", "x"], "--batches: 'x' is not a whole number"),
                                          (["--layers", "0"], "--layers: 0 is not >= 1")])
def test_e2e_bad_arguments(argv, needle, capsys):
    code, err = _exit(lambda: bench_e2e.main(argv), capsys)
    assert code == 2 and needle in err[-1]


@pytest.mark.parametrize("mod", GPU_SCRIPTS, ids=lambda m: m.__name__)
def test_unwritable_out_is_refused_first(mod, tmp_path, capsys):
    (tmp_path / "f").write_text("")
    out = tmp_path / "f" / "x.json"
    code, err = _exit(lambda: mod.main(["--out", str(out)]), capsys)
    assert code == 2 and err == [f"{mod.__name__}: cannot write {out}: a part of its folder is a file"]


@pytest.mark.parametrize("mod", GPU_SCRIPTS, ids=lambda m: m.__name__)
def test_no_gpu_is_one_line(mod, tmp_path, capsys):
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    code, err = _exit(lambda: mod.main(["--out", str(tmp_path / "x.json")]), capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith("bench: ")
    assert not (tmp_path / "x.json").exists()


def test_nothing_measured_exits_non_zero(capsys):
    res = {"rows": [{"shape": "4096x4096", "error": "RuntimeError: boom"}],
           "skipped": [{"shape": "128256x4096", "why": "3 s left, about 9 s needed"}]}
    assert bu.nothing_measured("bench_decode", res, "x.json") == 1
    err = capsys.readouterr().err.strip()
    assert err == "bench_decode: nothing was measured (4096x4096: RuntimeError: boom); x.json records only the errors and skips"
    assert bu.nothing_measured("bench_decode", {"rows": [], "skipped": res["skipped"]}, "x.json") == 1
    assert "128256x4096: 3 s left" in capsys.readouterr().err
    res["rows"].append({"shape": "4096x14336", "copy": {"median_ms": 0.1}})
    assert bu.nothing_measured("bench_decode", res, "x.json") == 0


def test_e2e_table_rows():
    res = {"modes": {"bf16": {"runs": [{"batch": 1, "eager_tokens_per_s": 10.04, "graph_tokens_per_s": 20.06}]},
                     "huffman": {"runs": [{"batch": 1, "eager_tokens_per_s": 9.0, "prefill_logits_bitwise": True}]},
                     "palette": {"error": "RuntimeError: boom"}}}
    assert bench_e2e.summary_rows(res) == [
        {"mode": "bf16", "batch": 1, "graph_tok_s": 20.1, "eager_tok_s": 10.0, "prefill_bitwise": "ref"},
        {"mode": "huffman", "batch": 1, "graph_tok_s": "-", "eager_tok_s": 9.0, "prefill_bitwise": True}]


def test_e2e_table_gives_the_layers_alone_where_timed():
    """The README's end-to-end cells: tokens/s, the ratio to BF16, and the layers' ratio (the
    step less its lm_head) where both runs timed it."""
    import render_gpu_results as rg
    bench = {"raw": {"e2e": {"modes": {
        "bf16": {"runs": [{"batch": 1, "graph_tokens_per_s": 100.0, "layers_ms": 6.0, "lm_head_ms": 4.0},
                          {"batch": 16, "graph_tokens_per_s": 800.0}]},
        "palette": {"runs": [{"batch": 1, "graph_tokens_per_s": 110.0, "layers_ms": 7.5, "lm_head_ms": 1.6},
                             {"batch": 16, "graph_tokens_per_s": 700.0}]}}}}}
    row = next(ln for ln in rg.e2e_table(bench) if ln.startswith("| palette"))
    assert row == "| palette | 110.0 [1.10x; layers 0.80x] | 700.0 [0.88x] |"


@pytest.mark.parametrize("content, needle", [(None, "No such file or directory"), ("{", "Expecting"),
                                             ("[1]", "no kernel rows or GPU name in it")])
def test_kernels_from_json_unreadable(tmp_path, content, needle, capsys):
    p = tmp_path / "k.json"
    if content is not None:
        p.write_text(content)
    assert bench_kernels.main(["--from-json", str(p)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]


def test_kernels_unwritable_cache_is_one_line(tmp_path, capsys):
    rec = {"environment": {"gpu": "NVIDIA Test GPU"}, "encodings": ["palette"],
           "rows": [{"shape": "a", "N": 4096, "K": 4096, "M": 1, "cublas": {"median_ms": 1.0},
                     "palette_decode_cublas": {"median_ms": 2.0}}]}
    (tmp_path / "k.json").write_text(json.dumps(rec))
    (tmp_path / "f").write_text("")
    assert bench_kernels.main(["--from-json", str(tmp_path / "k.json"), "--write-cache",
                               str(tmp_path / "f" / "cache.json")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bench_kernels: cannot write the tuning table")


def test_kernels_from_json_records_tile_major_entries_and_the_plane_order(tmp_path, capsys):
    """--from-json files the tile-major timings under "palette:tiled", each against the decode
    + cuBLAS timed on the same tile-major copies, counting only kernels that gave the
    file-order bits and passed in file order; the plane order follows (here tile-major wins
    batch 1 by more than it loses batch 16)."""
    from unweight.runtime.tuning_table import TuningTable
    gpu = "NVIDIA Test GPU"

    def row(M, file_ms, tiled_ms, same=True):
        return {"shape": "a", "N": 4096, "K": 4096, "M": M, "cublas": {"median_ms": 1.0},
                "palette_decode_cublas": {"median_ms": 2.0},
                "palette_tiled_decode_cublas": {"median_ms": 2.0},
                "palette_gemv_mma": {"median_ms": file_ms, "accuracy": {"passed": True}},
                "palette_gemv_mma_tiled": {"median_ms": tiled_ms, "same_bits_as_file_order": same},
                "palette_gemv_tiled": {"median_ms": 0.1, "same_bits_as_file_order": True}}  # no file-order run

    rec = {"environment": {"gpu": gpu}, "encodings": ["palette"],
           "rows": [row(1, 1.0, 0.5), row(16, 1.0, 1.5), row(32, 3.0, 0.1, same=False)]}
    (tmp_path / "k.json").write_text(json.dumps(rec))
    cache = tmp_path / "cache.json"
    assert bench_kernels.main(["--from-json", str(tmp_path / "k.json"), "--write-cache", str(cache)]) == 0
    assert f"{gpu}|4096|4096|palette plane order: tiled" in capsys.readouterr().out
    t = TuningTable.load(str(cache))
    assert t.lookup(gpu, 4096, 4096, "palette:tiled", 1) == "palette_gemv_mma"
    assert t.entries[f"{gpu}|4096|4096|palette:tiled|1"]["times_ms"] == {"decode_cublas": 2.0, "palette_gemv_mma": 0.5}
    assert t.lookup(gpu, 4096, 4096, "palette:tiled", 32) == "decode_cublas"  # other bits: not counted
    assert t.plane_order(gpu, 4096, 4096) == "tiled"


def test_kernels_parts_put_the_goals_batches_first_and_the_rest_last():
    assert bench_kernels.parts_of((1, 4, 16, 32, 64, 256)) == [
        ("headline", True, [1, 16]), ("buckets", True, [4, 32, 64, 256]), ("extras", False, [1, 4, 16, 32, 64, 256])]
    assert bench_kernels.parts_of((4, 64)) == [("buckets", True, [4, 64]), ("extras", False, [4, 64])]


def test_kernels_run_takes_each_part_over_every_shape_before_the_next(monkeypatch, tmp_path):
    """run() times the dispatch's candidates at batch 1 and 16 on every shape before any other
    batch, and the rest only on rows whose candidates were timed; a part the budget cannot fit
    is recorded per shape, and the rows come out in shape and batch order, each with the
    dispatch's choice."""
    import torch
    calls = []

    def fake(torch_, name, N, K, batches, encodings, runs, l2, budget, dev_name, log, skip, core, rows, skipped):
        calls.append((name, "core" if core else "extras", list(batches)))
        if core:
            return [{"shape": name, "N": N, "K": K, "M": M, "cublas": {"median_ms": 1.0},
                     "palette_decode_cublas": {"median_ms": 2.0, "time_vs_cublas": 2.0}} for M in batches]
        assert set(rows) <= set(batches) and all("cublas" in r for r in rows.values())
        for r in rows.values():
            r["cublas_extras"] = {"median_ms": 1.0}
        return list(rows.values())

    monkeypatch.setattr(bench_kernels, "bench_shape", fake)
    shapes = [("a", 64, 64), ("b", 128, 64)]
    res = bench_kernels.run(torch, shapes, bu.Budget(1e6), batches=(1, 4, 16), encodings=("palette",),
                            out_path=str(tmp_path / "k.json"))
    assert calls == [("a", "core", [1, 16]), ("b", "core", [1, 16]), ("a", "core", [4]), ("b", "core", [4]),
                     ("a", "extras", [1, 4, 16]), ("b", "extras", [1, 4, 16])]
    assert [(r["shape"], r["M"]) for r in res["rows"]] == [("a", 1), ("a", 4), ("a", 16), ("b", 1), ("b", 4), ("b", 16)]
    assert all(r["palette_auto"] == {"choice": "decode_cublas", "plane_order": "file", "time_vs_cublas": 2.0}
               for r in res["rows"])
    assert json.loads((tmp_path / "k.json").read_text())["rows"] == res["rows"]
    # A budget for one shape's headline part only: the second shape's and every later part are
    # skipped by name, and the rest of the first shape never runs.
    calls.clear()

    class Budget:
        def __init__(self):
            self.n = 0

        def left(self):
            self.n += 1
            return 100.0 if self.n == 1 else 0.0

    res = bench_kernels.run(torch, shapes, Budget(), batches=(1, 4, 16), encodings=("palette",))
    assert calls == [("a", "core", [1, 16])]
    assert [(s["shape"], s["part"]) for s in res["skipped"]] == [("b", "headline"), ("a", "buckets"),
                                                                 ("b", "buckets"), ("a", "extras")]


def test_kernels_table_counts_untimed_file_order_checks_and_rebases_the_rest():
    """The tile-major rows count where the kernel's file-order run passed its checks, timed or
    not (the core part runs the file-order layouts untimed); a file-order time the extras part
    took enters the table as its ratio to the cuBLAS timed beside it times the core part's
    cuBLAS time; the dispatch choice follows the table's plane order."""
    from unweight.runtime.tuning_table import entry_key
    gpu = "NVIDIA Test GPU"
    row = {"shape": "a", "N": 4096, "K": 4096, "M": 1, "cublas": {"median_ms": 1.0},
           "palette_decode_cublas": {"median_ms": 2.0, "time_vs_cublas": 2.0},
           "palette_fused": {"median_ms": 1.5, "time_vs_cublas": 1.5, "accuracy": {"passed": True}},
           "palette_gemv_mma": {"accuracy": {"passed": True}},  # checked, not timed
           "palette_fused_xs": {"accuracy": {"passed": True}, "same_bits_as_palette_fused": True,
                                "median_ms": 3.0, "time_vs_cublas": 1.2, "part": "extras"},
           "palette_fused_wide": {"accuracy": {"passed": True}, "same_bits_as_palette_fused": False,
                                  "median_ms": 0.1, "time_vs_cublas": 0.1, "part": "extras"},
           "palette_tiled_decode_cublas": {"median_ms": 1.9, "time_vs_cublas": 1.9},
           "palette_gemv_mma_tiled": {"median_ms": 0.8, "time_vs_cublas": 0.8, "same_bits_as_file_order": True},
           "palette_gemv_tiled": {"median_ms": 0.1, "time_vs_cublas": 0.1, "same_bits_as_file_order": True}}
    table = bench_kernels.table_from_rows([row], gpu, ("palette",))
    assert table.entries[entry_key(gpu, 4096, 4096, "palette", "1")]["times_ms"] == {
        "decode_cublas": 2.0, "palette_gemm": 1.5, "palette_gemm_xs": 1.2}  # (wide: other bits)
    assert table.entries[entry_key(gpu, 4096, 4096, "palette:tiled", "1")]["times_ms"] == {
        "decode_cublas": 1.9, "palette_gemv_mma": 0.8}  # (the GEMV: no file-order run)
    bench_kernels._dispatch_choices([row], gpu, ("palette",))
    assert row["palette_auto"] == {"choice": "palette_gemv_mma", "plane_order": "tiled", "time_vs_cublas": 0.8}


def test_e2e_forced_policy_covers_both_plane_orders():
    """bench_e2e's forced policy names its path for a layer held tile-major too (a tile-major
    weight is looked up under its own entries), so a "+tiled" mode times the fused kernel."""
    import torch
    from unweight.runtime import prepare as prep
    from unweight.runtime.modules import CompressedLinear, compressed_modules
    cfg = bench_e2e.llama8b_config(1, vocab_size=64, hidden_size=64, intermediate_size=128, num_attention_heads=2,
                                   num_key_value_heads=1, max_position_embeddings=64)
    model = bench_e2e.build_model(cfg, "cpu")
    bench_e2e.compress_in_place(model, "palette")
    prep.prepare(model, "palette", policy=None, plane_order="tiled")
    pol = bench_e2e.forced_fused_policy(model, torch.device("cpu"), "palette_gemv_mma")
    lins = [m for _, m in compressed_modules(model) if isinstance(m, CompressedLinear) and not m.is_tied]
    assert any(m.plane_order == "tiled" for m in lins)
    for m in lins:
        enc = "palette:tiled" if m.plane_order == "tiled" else "palette"
        assert pol.table.lookup("cpu", m.n_rows, m.n_cols, enc, 1) == "palette_gemv_mma"


def test_e2e_records_the_decoders_a_prepared_model_uses():
    """bench_e2e names, per compressed layer shape, the decoder variant its decode runs: the
    default off CUDA (the policy measures none there) and a variant fixed by use_decoders."""
    from unweight.runtime import dispatch
    from unweight.runtime import prepare as prep
    cfg = bench_e2e.llama8b_config(1, vocab_size=64, hidden_size=64, intermediate_size=128, num_attention_heads=2,
                                   num_key_value_heads=1, max_position_embeddings=64)
    model = bench_e2e.build_model(cfg, "cpu")
    bench_e2e.compress_in_place(model, "huffman")
    prep.prepare(model, "huffman", policy=None)
    got = bench_e2e.decoders_used(model)
    from unweight.runtime.tuning_table import default_decoder
    assert got and set(got.values()) == {default_decoder("huffman")} and all(k.startswith("huffman ") for k in got)
    assert "huffman 128x64 S=0" in got
    prev = dispatch.use_decoders(huffman="chain")
    try:
        assert set(bench_e2e.decoders_used(model).values()) == {"chain"}
    finally:
        dispatch.use_decoders(**prev)


def test_e2e_compiled_modes_trace_whole_and_keep_the_bf16_bits():
    """A "+compile" mode's step goes through torch.compile (the CPU self-test traces with the
    eager backend) as one graph with no break at a compressed layer, and its first step's
    logits are the compiled BF16 model's; each records the compile and its reference."""
    import torch
    res = bench_e2e.run(torch, 1, [1], ["bf16+compile", "palette+compile", "palette+gemv-mma+tiled+compile"],
                        bu.Budget(600), device="cpu", prompt=4, steps=1, runs=2, log=lambda m: None,
                        cfg_over=dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                      num_key_value_heads=2))
    assert not res["skipped"] and set(res["modes"]) == {"bf16", "bf16+compile", "palette+compile",
                                                         "palette+gemv-mma+tiled+compile"}
    for mode in ("bf16+compile", "palette+compile", "palette+gemv-mma+tiled+compile"):
        (r,) = res["modes"][mode]["runs"]
        assert r["compile_backend"] == "eager" and r["graphs"] == 1 and r["graph_breaks"] == 0, (mode, r)
        assert r["step_logits_bitwise"] and r["prefill_logits_bitwise"], mode
        assert r.get("step_reference", "bf16") == ("bf16" if mode == "bf16+compile" else "bf16+compile")
    assert "step_logits_bitwise" not in res["modes"]["bf16"]["runs"][0]  # the reference itself
    assert [bench_e2e.reference_mode(m) for m in ("bf16", "bf16+compile", "palette+compile", "palette+l2")] == [
        "bf16", "bf16", "bf16+compile", "bf16"]


def test_e2e_table_reads_compiled_modes_against_compiled_bf16():
    import render_gpu_results as rg
    bench = {"raw": {"e2e": {"modes": {
        "bf16": {"runs": [{"batch": 1, "graph_tokens_per_s": 100.0}]},
        "bf16+compile": {"runs": [{"batch": 1, "graph_tokens_per_s": 200.0}]},
        "palette": {"runs": [{"batch": 1, "graph_tokens_per_s": 110.0}]},
        "palette+compile": {"runs": [{"batch": 1, "graph_tokens_per_s": 230.0}]}}}}}
    rows = {ln.split(" | ")[0][2:]: ln for ln in rg.e2e_table(bench) if ln.startswith("| ") and "x]" in ln}
    assert rows["bf16+compile"].endswith("200.0 [2.00x] |")
    assert rows["palette"].endswith("110.0 [1.10x] |")
    assert rows["palette+compile"].endswith("230.0 [1.15x] |")


def test_host_bench_times_each_path_both_ways_on_cpu(tmp_path, capsys):
    """bench_host.py on CPU: nn.Linear and each encoding's decode + GEMM, called directly and
    through the dispatcher, the same bits as nn.Linear either way; a table and a JSON."""
    out = tmp_path / "host.json"
    assert bench_host.main(["--device", "cpu", "--calls", "20", "--runs", "2", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert [r["layer"] for r in res["rows"]] == ["nn.Linear", "CompressedLinear huffman", "CompressedLinear palette"]
    for r in res["rows"][1:]:
        assert r["direct"]["same_bits_as_nn_linear"] and r["dispatcher"]["same_bits_as_nn_linear"]
        assert r["direct"]["median_us"] > 0 and len(r["direct"]["runs_us"]) == 2
    assert "via_dispatcher_us" in capsys.readouterr().out
    import render_gpu_results as rg
    lines = rg.host_table({"raw": {"e2e": {"host": res}}})
    assert lines[0].startswith("**Host time per layer forward**") and len(lines) == 4 + 3 + 1


@pytest.mark.parametrize("argv, needle", [(["--shape", "64"], "bench_host: bad shape '64': write NxK"),
                                          (["--calls", "0"], "--calls: 0 is not >= 1"),
                                          (["--runs", "-1"], "--runs: -1 is not >= 1")])
def test_host_bench_refuses_bad_arguments(argv, needle, capsys):
    code, err = _exit(lambda: bench_host.main(argv), capsys)
    assert code == 2 and needle in err[-1]


def test_host_bench_without_a_gpu_is_one_line(capsys):
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    code, err = _exit(lambda: bench_host.main(["--device", "cuda"]), capsys)
    assert code == 2 and err == ["bench_host: --device cuda but torch sees no GPU"]


H200_BENCH = os.path.join(ROOT, "benchmarks", "results", "gpu", "2026-11-27-1342-h200-bench.json")


def test_decoder_choices_from_a_recorded_run(tmp_path, capsys, monkeypatch):
    """bench_decode --from-json on a runbook bench stage: per shape and stream, the variant
    that beat the run's default; bench_kernels --from-json takes the same choices from the same
    file.  (The H200 run timed AHEAD2 faster than the default AHEAD on the MLP matrices at
    S = 256 and slower on the others and at S = 1024.)"""
    from unweight.runtime import tuning_table as tt
    cache = tmp_path / "cache.json"
    monkeypatch.setenv(tt.ENV_CACHE, str(tmp_path / "unused.json"))
    assert bench_decode.main(["--from-json", H200_BENCH, "--write-cache", str(cache)]) == 0
    t = tt.TuningTable.load(str(cache))
    got = {k: e["choice"] for k, e in t.decoders.items()}
    assert got["NVIDIA H200|14336|4096|huffman|256"] == "ahead2"
    assert got["NVIDIA H200|4096|14336|huffman|256"] == "ahead2"
    assert got["NVIDIA H200|4096|4096|huffman|256"] == "ahead"
    assert got["NVIDIA H200|14336|4096|huffman|1024"] == "ahead"
    assert got["NVIDIA H200|4096|4096|palette|0"] == "wide"
    assert all(e["default"] == ("ahead" if "|huffman|" in k else "wide") for k, e in t.decoders.items())
    assert not t.entries  # the decode benchmark chooses no matmul path
    if tt.default_decoder("huffman") == "ahead":
        assert t.decoder("NVIDIA H200", 14336, 4096, "huffman", 256) == tt.kp.HUFF_VARIANT_AHEAD2
    assert "decoder ahead2" in capsys.readouterr().out
    both = tmp_path / "both.json"
    assert bench_kernels.main(["--from-json", H200_BENCH, "--write-cache", str(both)]) == 0
    k = tt.TuningTable.load(str(both))
    assert k.decoders == t.decoders and k.entries


def test_decode_run_takes_the_loaders_streams_of_every_shape_first(monkeypatch):
    """run() times the streams the GPU loaders hold on every shape, then the routed MoE decode,
    then the rest of each shape into the same row; a shape whose first part failed gets no
    second, and its row keeps its error."""
    import torch
    calls = []

    def fake(torch_, name, N, K, seed, runs, l2, skip, part, row):
        calls.append((name, part))
        if name == "bad" and part == "loaders":
            raise RuntimeError("kernel fault")
        row = row if row is not None else {"shape": name, "N": N, "K": K}
        row[part] = {"median_ms": 1.0}
        return row

    monkeypatch.setattr(bench_decode, "bench_shape", fake)
    monkeypatch.setattr(bench_decode, "bench_slots", lambda *a: calls.append(("slots", None)) or {"rows_by_slots": []})
    monkeypatch.setattr(bu, "copy_bandwidth", lambda torch_: {})
    res = bench_decode.run(torch, [("a", 64, 64), ("bad", 64, 64), ("c", 64, 64)], bu.Budget(1e6), log=lambda m: None)
    assert calls == [("a", "loaders"), ("bad", "loaders"), ("c", "loaders"), ("slots", None), ("a", "rest"),
                     ("c", "rest")]
    assert [(r["shape"], sorted(k for k in r if k in ("loaders", "rest", "error"))) for r in res["rows"]] == [
        ("a", ["loaders", "rest"]), ("bad", ["error"]), ("c", ["loaders", "rest"])]
    assert res["rows"][1]["error"] == "loaders: RuntimeError: kernel fault"


def test_decoder_choices_keep_the_timings_a_row_made_before_its_error():
    row = {"shape": "a", "N": 64, "K": 64, "error": "rest: RuntimeError: x",
           "huffman+index256": {"median_ms": 2.0, "bitwise": True},
           "huffman+index256+ring_max": {"median_ms": 1.0, "bitwise": True}}
    t = bench_decode.decoders_from_rows([row], "G", {"huffman": "ring", "palette": "wide"})
    assert t.decoders["G|64|64|huffman|256"]["choice"] == "ring_max"


@pytest.mark.parametrize("content, needle", [("[1]", "no decode rows or GPU name in it"),
                                             ('{"environment": {"gpu": "G"}, "rows": [{"N": 1}]}',
                                              "did not record its default decoders")])
def test_decode_from_json_without_what_it_needs(tmp_path, content, needle, capsys):
    p = tmp_path / "d.json"
    p.write_text(content)
    assert bench_decode.main(["--from-json", str(p)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]


# --------------------------------------------------------------------------- bench_moe

MOE_SMALL = ["--experts", "4", "--top-k", "2", "--layers", "1", "--hidden", "64", "--moe-intermediate", "64",
             "--vocab", "128", "--steps", "2", "--prompt", "4", "--rounds", "1"]


def _moe(argv, monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("bench_moe started building")
    monkeypatch.setattr(bench_moe, "build", refuse)
    monkeypatch.setattr(sys, "argv", ["bench_moe.py", *MOE_SMALL, *argv])
    return bench_moe.main()


@pytest.mark.parametrize("argv, needle", [
    (["--rounds", "0"], "--rounds: 0 is not >= 1"),
    (["--steps", "0"], "--steps: 0 is not >= 1"),
    (["--threads", "0"], "--threads: 0 is not >= 1"),
    (["--top-k", "9"], "--top-k 9 is more than --experts 4"),
    (["--hidden", "60"], "--hidden 60 is not a multiple of 8"),
    (["--moe-intermediate", "32"], "2048 weights per expert matrix, under the 4096 unweight encodes"),
    (["--device", "gpu"], "--device 'gpu': choose cpu or cuda"),
    (["--variants", "routed-pal-fused"], "--variants routed-pal-fused runs on CUDA only"),
    (["--variants", "fast"], "invalid choice: 'fast'"),
])
def test_moe_bad_arguments(argv, needle, monkeypatch, capsys):
    code, err = _exit(lambda: _moe(argv, monkeypatch), capsys)
    assert code == 2 and needle in err[-1]


def test_moe_cuda_without_gpu(monkeypatch, capsys, tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    code, err = _exit(lambda: _moe(["--device", "cuda", "--json-out", str(tmp_path / "m.json")], monkeypatch), capsys)
    assert code == 2 and err == ["bench_moe: --device cuda, but no CUDA GPU is visible "
                                 "(torch.cuda.is_available() is False)"]


def test_moe_kept_model_with_other_settings(tmp_path, monkeypatch, capsys):
    """--keep with a folder built under other settings is refused (its model is not the one asked for)."""
    import argparse
    a = argparse.Namespace(experts=4, top_k=2, layers=1, hidden=64, moe_intermediate=64, vocab=128)
    assert bench_moe.kept_model(str(tmp_path), a) is None
    (tmp_path / bench_moe.KEPT).write_text(json.dumps({"build": bench_moe.build_args(a), "model": {"params": 7}}))
    assert bench_moe.kept_model(str(tmp_path), a) == {"params": 7}
    a.experts = 8
    code, err = _exit(lambda: bench_moe.kept_model(str(tmp_path), a), capsys)
    assert code == 2 and err == [f"bench_moe: {tmp_path} holds a model built with --experts 4; give another --keep folder"]


def test_moe_failed_variant_is_one_line(capsys):
    code, err = _exit(lambda: bench_moe.run_child([sys.executable, "-c", "raise RuntimeError('boom')"], "routed"),
                      capsys)
    assert code == 1 and err == ["bench_moe: variant routed failed (exit 1): RuntimeError: boom"]


# --------------------------------------------------------------------------- bench_scale


@pytest.mark.parametrize("argv, needle", [(["--layers", "0"], "--layers: 0 is not >= 1"),
                                          (["--jobs", "-1"], "--jobs: -1 is not >= 0")])
def test_scale_bad_arguments(argv, needle, capsys):
    code, err = _exit(lambda: bench_scale.main(argv), capsys)
    assert code == 2 and needle in err[-1]


def test_scale_unwritable_out_refused_before_the_checkpoint(tmp_path, monkeypatch, capsys):
    def refuse(*a, **k):
        raise AssertionError("bench_scale started writing the checkpoint")
    monkeypatch.setattr(bench_scale, "make_checkpoint", refuse)
    (tmp_path / "f").write_text("")
    out = tmp_path / "f" / "x.json"
    code, err = _exit(lambda: bench_scale.main(["--layers", "1", "--cache", str(tmp_path / "c"), "--out", str(out)]),
                      capsys)
    assert code == 2 and err == [f"bench_scale: cannot write {out}: a part of its folder is a file"]


# --------------------------------------------------------------------------- bench_vllm


def test_vllm_missing_is_one_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(bench_vllm, "_vllm_installed", lambda: False)
    monkeypatch.setattr(bench_vllm.tempfile, "mkdtemp", lambda **k: pytest.fail("a work folder was made"))
    code, err = _exit(lambda: bench_vllm.main(["--out", str(tmp_path / "v.json")]), capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith("bench_vllm: vllm is not installed in this Python")
    code, err = _exit(lambda: bench_vllm.main(["--tp", "0"]), capsys)
    assert code == 2 and "--tp: 0 is not >= 1" in err[-1]


def test_vllm_bad_model_is_one_line_and_cleans_up(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(bench_vllm, "_vllm_installed", lambda: True)
    work = tmp_path / "work"
    monkeypatch.setattr(bench_vllm.tempfile, "mkdtemp", lambda **k: (work.mkdir(), str(work))[1])
    code, err = _exit(lambda: bench_vllm.main(["--model", str(tmp_path / "missing"), "--out",
                                               str(tmp_path / "v.json")]), capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith(f"bench_vllm: {tmp_path / 'missing'}: no such file")
    assert not work.exists() and not (tmp_path / "v.json").exists()


def test_vllm_refused_configuration_is_one_line(monkeypatch, capsys):
    from tests.integrations import vllm_runner
    refused = [{"error": "ValueError: tp 3 does not divide 8 heads"}]
    monkeypatch.setattr(vllm_runner, "run_configs", lambda configs, timeout=None, quick_gc=True: (refused, ""))
    code, err = _exit(lambda: bench_vllm.run([{"model": "/m", "tp": 3}]), capsys)
    assert code == 1 and err == ["bench_vllm: TP=3 /m: ValueError: tp 3 does not divide 8 heads"]


def test_moe_reference_follows_the_variants_sums():
    """The routed forward ("unweight") is compared with BF16 under "batched_mm" (the sums it
    repeats); other variants with BF16's default implementation; a BF16 run that was already
    under "batched_mm" (no second hash) is the reference for all."""
    bf16 = {"experts_implementation": "grouped_mm", "logits_sha256": "g", "logits_sha256_batched_mm": "b"}
    assert bench_moe.reference(bf16, "unweight") == ("batched_mm", "b")
    assert bench_moe.reference(bf16, "grouped_mm") == ("grouped_mm", "g")
    assert bench_moe.reference(bf16, None) == ("grouped_mm", "g")
    only = {"experts_implementation": "batched_mm", "logits_sha256": "x"}
    assert bench_moe.reference(only, "unweight") == ("batched_mm", "x")


def test_work_estimate_follows_the_run_once_two_shapes_are_timed():
    """The prior until two parts are timed; then a non-negative line through the timings, with
    the margin: a large last shape is asked what the run's own rate says it needs."""
    est = bu.WorkEstimate(5, 1e-8, margin=1.25)
    assert est.need(1e9) == 5 + 10.0
    est.record(100e6, 3.0)
    assert est.need(1e9) == 15.0                  # one timing: still the prior
    est.record(400e6, 6.0)                          # 2 s + 1e-8 s per unit
    assert abs(est.need(1e9) - 1.25 * (2 + 10)) < 1e-9
    est.record(400e6, 6.0)
    assert abs(est.need(0) - 1.25 * 2) < 1e-9      # least squares through repeated points


def test_work_estimate_never_negative_or_shrinking():
    """Timings falling with size (noise) give the slowest part, and a negative intercept a line
    through the origin: never a need below what the slower parts took."""
    est = bu.WorkEstimate(5, 1e-8, margin=1.0)
    est.record(100, 4.0)
    est.record(200, 3.0)
    assert est.need(1000) == 4.0
    est = bu.WorkEstimate(5, 1e-8, margin=1.0)
    est.record(100, 1.0)
    est.record(200, 3.0)                             # the line would cross zero at 50
    assert est.need(0) == 0.0 and est.need(200) >= 3.0 * 0.9


def test_default_candidates_need_a_win_on_every_shape(capsys):
    """A variant is named as the case for a new compiled-in default only where it beat the
    run's default on every shape of that stream: in the H200 run none did (AHEAD2 won on the MLP
    matrices only), in a made-up run where RING wins everywhere at S = 256 it is named."""
    from unweight.runtime import tuning_table as tt
    doc = json.load(open(H200_BENCH))
    h200 = bench_decode.decoders_from_rows(doc["raw"]["decode"]["rows"], "NVIDIA H200",
                                           doc["raw"]["decode"]["default_decoders"])
    assert bench_decode.default_candidates(h200) == []
    t = tt.TuningTable()
    for n, (ahead, ring, chain) in {4096: (0.10, 0.08, 0.12), 6144: (0.14, 0.10, 0.13)}.items():
        t.record_decoders("G", n, 4096, "huffman", 256, {"ahead": ahead, "ring": ring, "chain": chain}, "ahead")
        t.record_decoders("G", n, 4096, "huffman", 1024, {"ahead": ahead, "ring": ahead * 1.1}, "ahead")
    (c,) = bench_decode.default_candidates(t)
    assert c[:4] == ("huffman", 256, "ring", 2) and abs(c[4] - 0.2) < 1e-9 and abs(c[5] - 1 / 3.5) < 1e-9
    bench_decode.print_choices(t)
    assert "huffman, index S=256: ring is faster than the default on all 2 shapes (20.0%-28.6% less time)" \
        in capsys.readouterr().out


def test_moe_forced_expert_policy_names_a_fused_kernel_for_every_expert_piece(tmp_path, monkeypatch):
    """The CUDA-only "routed-pal-fused" variant's policy: for every expert piece shape of the
    model's stacks, a fused win at each batch bucket the kernels take (the tensor-core GEMV
    up to its batch limit, the GEMM past it), set on every stack; the variant runs on CUDA only."""
    import argparse

    import unweight
    from unweight.runtime import experts as ex
    from unweight.runtime.policy import DispatchPolicy
    assert "routed-pal-fused" in bench_moe.variants("cuda") and "routed-pal-fused" not in bench_moe.variants("cpu")
    assert bench_moe.variants("cuda", ["routed-pal-fused", "routed"]) == ("bf16", "routed", "routed-pal-fused")
    a = argparse.Namespace(experts=4, top_k=2, layers=1, hidden=64, moe_intermediate=64, vocab=128)
    bench_moe.build(str(tmp_path / "bf16"), a)
    unweight.compress(str(tmp_path / "bf16"), str(tmp_path / "c"), progress=False)
    model = unweight.load(str(tmp_path / "c"), device="cpu", mode="palette")
    monkeypatch.setattr(DispatchPolicy, "device_name", lambda self, device: "NVIDIA Test GPU")
    pol = bench_moe.forced_expert_policy(model, "cpu")
    stacks = [st for *_, st in ex.expert_stacks(model)]
    assert stacks and all(st.policy is pol for st in stacks)
    shapes = {(p.rows, p.cols) for st in stacks for p in st.pieces(0)}
    assert shapes == {(64, 64)}
    for n, k in shapes:
        assert pol.table.lookup("NVIDIA Test GPU", n, k, "palette", 1) == "palette_gemv_mma"
        assert pol.table.lookup("NVIDIA Test GPU", n, k, "palette", 64) == "palette_gemm"


def test_decode_bench_times_the_expert_slots_against_one_launch_per_expert():
    """bench_decode's MoE row on a small layer (on CPU the timing is wall-clock, not a figure):
    every slot count decodes bitwise and gets its one-launch-per-expert baseline."""
    import torch
    res = bench_decode.bench_slots(torch, runs=2, l2=1 << 16, layer=(4, 32, 64), counts=(2, 4))
    assert [r["slots"] for r in res["rows_by_slots"]] == [2, 4]
    for r in res["rows_by_slots"]:
        assert r["bitwise"] and r["median_ms"] > 0 and r["one_launch_per_expert"]["time_vs_slots"] > 0
    assert res["device_errors"] == 0 and res["held_bytes"] > 0


def test_e2e_full_depth_table_projects_nothing():
    import render_gpu_results as rg
    run = {"batch": 1, "graph_tokens_per_s": 100.0, "layers_ms": 9.0, "lm_head_ms": 1.0}
    bench = {"raw": {"e2e_full": {"model": "Llama-3.1-8B-shaped, 32 layers", "config": {"num_hidden_layers": 32},
                                  "modes": {"bf16": {"runs": [run]},
                                            "palette": {"runs": [{**run, "graph_tokens_per_s": 120.0,
                                                                  "layers_ms": 7.5, "lm_head_ms": 0.8}]}}}}}
    lines = rg.e2e_table(bench, "e2e_full")
    assert "projected" not in lines[0] and "32 layers" in lines[0]
    assert next(ln for ln in lines if ln.startswith("| palette")) == "| palette | 120.0 [1.20x; layers 1.20x] |"
    assert rg.e2e_table(bench) == []  # no 4-layer run recorded


def test_decode_times_a_finer_index_only_where_s256_cannot_fill_the_device():
    """S = 128 joins the huffman rows of a matrix whose chains at S = 256 are fewer than the
    device's RING_MAX threads (two 512-thread CTAs per SM), and never on the CPU self-test."""
    from types import SimpleNamespace as NS
    props = NS(multi_processor_count=132)
    FakeTorch = NS(cuda=NS(is_available=lambda: True, current_device=lambda: 0, get_device_properties=lambda _: props))
    NoCuda = NS(cuda=NS(is_available=lambda: False))

    assert bench_decode.index_intervals(FakeTorch, 4096, 4096) == (1024, 256, 128)  # 65,536 chains
    assert bench_decode.index_intervals(FakeTorch, 6144, 4096) == (1024, 256, 128)  # 98,304
    assert bench_decode.index_intervals(FakeTorch, 14336, 4096) == (1024, 256)  # 229,376
    assert bench_decode.index_intervals(NoCuda, 4096, 4096) == (1024, 256)


def test_clock_summary_reads_nvidia_smis_samples():
    """nvidia-smi's CSV samples -> min / median / max per field and the reasons masks seen; lines
    that are not samples (a header, a refusal) are skipped."""
    text = "1980, 2619, 412.5, 51, 0x0000000000000000\n1755, 2619, 690.1, 55, 0x0000000000000004\n" \
           "1980, 2619, [N/A], 56, 0x0000000000000000\nclocks.sm [MHz], clocks.mem [MHz], a, b, c\n" \
           'Field "clocks_event_reasons.active" is not a valid field to query.\n'
    got = bu.clock_summary(text)
    assert got["samples"] == 3
    assert got["clocks.sm"] == {"min": 1755.0, "median": 1980.0, "max": 1980.0}
    assert got["power.draw"]["max"] == 690.1 and got["temperature.gpu"]["min"] == 51.0
    assert got["reasons"] == ["0x0000000000000000", "0x0000000000000004"]
    assert bu.clock_summary("")["samples"] == 0


def test_clock_sampler_samples_while_the_block_runs(tmp_path, monkeypatch):
    """ClockSampler starts nvidia-smi's own sampling for the block and stops it after (a fake
    nvidia-smi here); without nvidia-smi it says so and the block still runs."""
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\ncase \"$*\" in *clocks_event*) echo 'Field is not a valid field to query.'; exit 2;; "
                    "esac\ncase \"$*\" in *-lms*) while true; do echo '1980, 2619, 500.0, 50, 0x0'; "
                    "sleep 0.05; done;; esac\necho '1980, 2619, 500.0, 50, 0x0'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    import time
    with bu.ClockSampler(period_ms=50) as cs:
        time.sleep(0.4)
    got = cs.summary()
    assert got["samples"] >= 2 and got["clocks.sm"]["median"] == 1980.0
    assert got["reasons_field"] == bu.CLOCK_REASONS[1]  # (this nvidia-smi knows only the older name)
    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    with bu.ClockSampler() as cs:
        pass
    assert "error" in cs.summary()


def test_e2e_times_the_load_check_once_per_encoding():
    """The e2e benchmark times the load check (runtime/verify.py) of the model's weights as the
    first palette and huffman modes hold them, and the README render prints it."""
    import torch

    import render_gpu_results as rg
    res = bench_e2e.run(torch, 1, [1], ["bf16", "palette", "palette+tiled", "huffman"], bu.Budget(600), device="cpu",
                        prompt=4, steps=1, runs=2, log=lambda m: None,
                        cfg_over=dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                      num_key_value_heads=2))
    for enc in ("palette", "huffman"):
        lc = res[f"load_check_{enc}"]
        assert lc["mode"] == enc and lc["tensors"] > 0 and lc["bf16_bytes"] > 0 and lc["ms_per_GB"] > 0, lc
    text = "\n".join(rg.e2e_table({"raw": {"e2e": res}}))
    assert "Load check of this model's" in text and "as `palette` holds" in text and "as `huffman` holds" in text


@pytest.mark.parametrize("old_grid", [False, True])
def test_stack_load_bench_times_a_rank_share_and_scales_it(tmp_path, capsys, old_grid):
    """bench_stack_load.py at TP 8 on one Scout-shaped expert: a row per held encoding, the
    gate_up grid's chunks as wide as the rank's 1024 columns (the stacked grid rule) or, with
    --old-grid, twice as wide (the covering decode), the four step times (decode, load-check
    crcs, transpose, encode) and the per-model totals scaled from them, and the totals with the
    per-row crcs taken one Python call a row."""
    out = tmp_path / "r.json"
    assert bench_stack_load.main(["--experts", "1", "--tp", "8", "--encodings", "palette", "--threads", "2",
                                  "--out", str(out)] + (["--old-grid"] if old_grid else [])) == 0
    res = json.loads(out.read_text())
    (row,) = res["rows"]
    assert row["tp"] == 8 and row["held_encoding"] == "palette" and res["old_grid"] == old_grid
    assert row["gate_up_grid"][1] == (2048 if old_grid else 1024)
    assert row["expert_share_mb"] == round(3 * 5120 * 1024 * 2 / 1e6, 1)
    per = row["decode_s"] + row["check_s"] + row["transpose_s"] + row["encode_s"]
    assert row["scout_s"] == pytest.approx(48 * 16 * per, rel=0.01, abs=0.1) and row["maverick_s"] > row["scout_s"]
    py = per - row["check_s"] + row["check_py_rows_s"]
    assert row["scout_py_rows_s"] == pytest.approx(48 * 16 * py, rel=0.01, abs=0.1)
    assert "maverick_s" in capsys.readouterr().out


@pytest.mark.parametrize("script, argv, needle", [
    (bench_stack_load, ["--encodings", "zstd"], "--encodings takes huffman and/or palette"),
    (bench_stack_load, ["--tp", "3"], "every --tp must divide the intermediate size 8192"),
    (bench_tp_blocks, ["--matrix", "lm_head"], "--matrix takes one of"),
    (bench_tp_blocks, ["--tp", "3"], "--tp 3 does not split every matrix")])
def test_load_benches_refuse_bad_arguments(script, argv, needle, capsys):
    code, err = _exit(lambda: script.main(argv), capsys)
    assert code == 2 and needle in err[-1]


def test_tp_blocks_bench_times_copied_and_recoded_blocks(tmp_path, capsys):
    """bench_tp_blocks.py on DeepSeek-V3's expert down-projection [7168, 2048] (256-column
    chunks): at TP 8 rank 0's 256 columns are copied segments, at TP 16 its 128 columns are
    decoded and encoded anew; each row scales the time per matrix to the model's count."""
    out = tmp_path / "r.json"
    assert bench_tp_blocks.main(["--tp", "8,16", "--matrix", "expert down", "--reps", "1", "--threads", "2",
                                 "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    r8, r16 = res["rows"]
    assert (r8["tp"], r8["held"], r8["recoded"]) == (8, [7168, 256], False)
    assert (r16["tp"], r16["held"], r16["recoded"]) == (16, [7168, 128], True)
    for r in (r8, r16):
        assert r["grid"] == [32, 256] and r["count"] == 58 * 256 and r["seconds"] > 0
        assert r["model_seconds"] == pytest.approx(r["seconds"] * r["count"], rel=0.01, abs=0.1)
    assert res["per_rank_seconds"] == {"8": r8["model_seconds"], "16": r16["model_seconds"]}
    assert "per rank, all matrices above" in capsys.readouterr().out
