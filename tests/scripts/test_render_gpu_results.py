"""scripts/render_gpu_results.py's eval table: a tolerance check whose samples all came out
bitwise identical (no differing sample, no log-likelihood difference, equal sha256) reads
"bitwise (N docs; tolerance check)"; any other passing tolerance check reads "within tolerance"."""
import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _renderer():
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    try:
        spec = importlib.util.spec_from_file_location("render_gpu_results_under_test",
                                                      os.path.join(ROOT, "scripts", "render_gpu_results.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.pop(0)


def _check(mode, check, differing=0, diff=0.0, sha=("fe25", "fe25"), n=1838, status="pass"):
    c = {"name": f"eval piqa {mode}", "status": status, "check": check, "samples": n, "docs": n,
         "differing_samples": differing, "max_abs_ll_diff": diff}
    if sha is not None:
        c["sha256"] = {"original": sha[0], "compressed": sha[1]}
    return c


def _row(checks):
    lines = _renderer().eval_table({"checks": checks})
    rows = [ln for ln in lines if ln.startswith("| piqa |")]
    assert len(rows) == 1, lines
    return [cell.strip() for cell in rows[0].strip("|").split("|")]


def test_tolerance_check_with_identical_samples_reads_bitwise():
    row = _row([_check("dense", "bitwise"), _check("huffman", "tolerance"), _check("palette", "tolerance", sha=None)])
    assert row == ["piqa", "bitwise (1838 docs)", "bitwise (1838 docs; tolerance check)",
                   "bitwise (1838 docs; tolerance check)"]


def test_other_tolerance_checks_read_within_tolerance():
    row = _row([_check("dense", "tolerance", differing=3, diff=0.004, sha=("aa", "bb")),
                _check("huffman", "tolerance", sha=("aa", "bb")),
                _check("palette", "tolerance", differing=0, diff=1e-9)])
    assert row == ["piqa", "within tolerance", "within tolerance", "within tolerance"]


def test_failed_tolerance_check_still_reads_differs():
    row = _row([_check("dense", "bitwise"), _check("huffman", "tolerance", differing=5, diff=0.2, status="fail")])
    assert row == ["piqa", "bitwise (1838 docs)", "DIFFERS (5 of 1838)", "—"]


def test_kernel_table_shows_tile_major_rows_and_the_order_auto_picks():
    """The kernels table gains the tile-major rows, and a line names the plane order the
    table from those rows gives each shape and how many tile-major runs kept the bits."""
    def row(M, tiled_ms):
        return {"shape": "o", "N": 4096, "K": 4096, "M": M, "cublas": {"median_ms": 0.010},
                "palette_decode_cublas": {"median_ms": 0.02, "time_vs_cublas": 2.0},
                "palette_tiled_decode_cublas": {"median_ms": 0.02, "time_vs_cublas": 2.0},
                "palette_gemv_mma": {"median_ms": 0.011, "time_vs_cublas": 1.1, "accuracy": {"passed": True}},
                "palette_gemv_mma_tiled": {"median_ms": tiled_ms, "time_vs_cublas": tiled_ms / 0.010,
                                           "same_bits_as_file_order": True}}
    bench = {"env": {"gpu": "NVIDIA H100 80GB HBM3"}, "raw": {"kernels": {"rows": [row(1, 0.008), row(16, 0.012)]}}}
    lines = _renderer().kernels_table(bench)
    tiled = [ln for ln in lines if "tensor cores, tile-major" in ln]
    assert tiled == ["| | palette GEMV, tensor cores, tile-major (batch 1-32) | 0.80 | 1.20 |"]
    assert any("decode + cuBLAS, tile-major" in ln for ln in lines)
    note = [ln for ln in lines if ln.startswith("Plane order")]
    assert note == ['Plane order `plane_order="auto"` picks from these timings: 4096 x 4096 tiled. Tile-major runs '
                    'with the file-order bits: 2 of 2.']
    assert not any(ln.startswith("Plane order") for ln in _renderer().kernels_table(
        {"raw": {"kernels": {"rows": [{k: v for k, v in row(1, 0.008).items() if "tiled" not in k}]}}}))


def test_profile_table_gains_the_busiest_pipe_column_only_where_profiles_have_it():
    """The Nsight Compute table's "busiest pipe / issue slots busy" column appears when a
    profile recorded them (runs from before simply lack it), and a kernel without them reads "—"."""
    r = _renderer()
    old = {"gemv": {"duration": 76.3, "duration_unit": "us", "memory_throughput": 55.6}}
    assert not any("busiest pipe" in ln for ln in r.profile_table({"raw": {"profile": {"kernels": old}}}))
    new = {"gemv": {"duration": 70.1, "duration_unit": "us", "top_pipe": "ALU", "top_pipe_pct": 61.3,
                    "issue_slots_busy_pct": 49.1},
           "ring": {"duration": 49.5, "duration_unit": "us"}}
    lines = r.profile_table({"raw": {"profile": {"kernels": new}}})
    assert any("busiest pipe" in ln for ln in lines)
    rows = {ln.split("|")[1].strip(): [c.strip() for c in ln.strip("|").split("|")]
            for ln in lines if ln.startswith("| gemv") or ln.startswith("| ring")}
    assert rows["gemv"][-1] == "ALU 61.3 / 49.1" and rows["ring"][-1] == "— — / —"


def test_profile_section_lists_the_per_instruction_counters_where_kept():
    """A profile with a "sass" summary (ncu's source page) gets one line under the table: the
    warp instructions executed, the opcodes' shares and where the warp-state samples fell."""
    r = _renderer()
    sass = {"inst_executed": 1000.0, "samples": 200.0, "instructions": 3,
            "by_opcode": [{"op": "PRMT", "executed": 500.0, "samples": 20.0},
                          {"op": "LOP3", "executed": 300.0, "samples": 10.0}],
            "top_samples": [{"address": "0x10", "sass": "HMMA.16816.F32.BF16 R56, R60, R76, R56", "executed": 10.0,
                             "samples": 150.0}]}
    kernels = {"gemv": {"duration": 70.1, "duration_unit": "us", "sass": sass},
               "ring": {"duration": 49.5, "duration_unit": "us"}}
    lines = [ln for ln in r.profile_table({"raw": {"profile": {"kernels": kernels}}}) if ln.startswith("- ")]
    assert lines == ["- gemv, per instruction (ncu's source page): 1,000 warp instructions executed (PRMT 50%, "
                     "LOP3 30%); most warp-state samples at `HMMA.16816.F32.BF16` at 0x10 75%."]


def test_probe_table_gives_each_probe_as_a_share_of_the_full_gemv():
    """bench_kernels.py's probe rows -> one line per shape and batch: the full kernel's time, its
    verbatim blocks, and each probe's share of the time ("error" for a refused probe)."""
    r = _renderer()
    probe = {"full_ms": 0.0334, "parts": 2, "verbatim_blocks": 1500,
             "no_verbatim": {"median_ms": 0.030, "share_of_full": 0.898}, "no_decode": {"error": "RuntimeError: x"},
             "stream": {"median_ms": 0.020, "share_of_full": 0.599},
             "search": {"median_ms": 0.036, "share_of_full": 1.078}}
    lines = r.probe_table({"raw": {"kernels": {"rows": [{"N": 14336, "K": 4096, "M": 1,
                                                         "palette_gemv_mma_tiled_probe": probe}]}}})
    assert "| 14336 x 4096 | 1 | 33.4 | 1500 | 0.90 | 1.08 | error | — | 0.60 |" in lines
    assert r.probe_table({"raw": {"kernels": {"rows": [{"N": 1, "K": 64, "M": 1}]}}}) == []


def test_kernels_table_gives_the_measured_dispatch_and_says_when_it_chose_in_file_order_only():
    r = _renderer()

    def bench(auto):
        return {"raw": {"kernels": {"rows": [{"N": 64, "K": 64, "M": 1, "cublas": {"median_ms": 0.01},
                                              "palette_decode_cublas": {"time_vs_cublas": 1.5},
                                              "palette_auto": auto}]}}}
    new = r.kernels_table(bench({"choice": "palette_gemv_mma", "plane_order": "tiled", "time_vs_cublas": 0.91}))
    assert "| | palette, the path the measured dispatch picks | 0.91 |" in new
    old = r.kernels_table(bench({"choice": "decode_cublas", "time_vs_cublas": 1.5}))
    assert "| | palette, the path the measured dispatch picks among the file-order paths | 1.50 |" in old


def test_goals_table_reads_each_goal_from_the_fastest_checked_path():
    """Per goal shape: the fastest palette kernel that passed its checks (a faster one that gave
    other bits does not count), the slowest batch up to 16, the measured dispatch's slowest
    batch, the fastest bitwise decoders; a goal is met only where every shape was measured."""
    r = _renderer()

    def krow(M, fused, tiled, same=True, auto=1.5):
        return {"N": 4096, "K": 4096, "M": M, "cublas": {"median_ms": 0.01},
                "palette_fused": {"time_vs_cublas": fused, "accuracy": {"passed": True}},
                "palette_gemv_mma_tiled": {"time_vs_cublas": tiled, "same_bits_as_file_order": same},
                "palette_auto": {"choice": "x", "plane_order": "tiled", "time_vs_cublas": auto}}
    drow = {"N": 4096, "K": 4096, "huffman+index256": {"out_GBps": 700.0, "bitwise": True},
            "huffman+index256+ring_max": {"out_GBps": 1100.0, "bitwise": True},
            "huffman+index1024": {"out_GBps": 1300.0, "bitwise": True},
            "palette": {"out_GBps": 1500.0, "bitwise": True}, "palette+vec8": {"out_GBps": 1600.0, "bitwise": False},
            "palette_tiled": {"out_GBps": 1700.0, "bitwise": True}}
    e2e = {"modes": {"bf16": {"runs": [{"batch": 1, "graph_tokens_per_s": 100.0}]},
                     "palette+gemv-mma+tiled": {"runs": [{"batch": 1, "graph_tokens_per_s": 120.0}]},
                     "huffman": {"runs": [{"batch": 1, "graph_tokens_per_s": 30.0}]}}}
    bench = {"raw": {"kernels": {"rows": [krow(1, 1.25, 0.8), krow(16, 1.1, 0.5, same=False, auto=1.25)]},
                     "decode": {"rows": [drow]}, "e2e": e2e}}
    lines = r.goals_table(bench)
    assert "| matmul speed at batch 1 | 1.25 | >= 1.2 | so far (not every shape measured) |" in lines
    assert "| matmul speed, slowest batch of 1-16 (its batch) | 0.91 (M=16) | >= 1 | no |" in lines
    assert "| measured dispatch's speed, slowest batch | 0.67 | >= 0.97 | no |" in lines
    assert "| Huffman -> BF16 at S=256, GB/s | 1100 | >= 1000 | so far (not every shape measured) |" in lines
    assert "| palette -> BF16, GB/s | 1500 | >= 1450 | so far (not every shape measured) |" in lines
    assert ("End to end (the 4-layer model, batch 1, tokens/s against BF16): 1.20x with `palette+gemv-mma+tiled` "
            "(goal >= 1.15x); huffman 0.30x (Unweight reports 0.59x).") in lines
    assert r.goals_table({"raw": {}}) == []


def test_clocks_line_gives_each_benchmarks_sm_clock_and_the_reasons_it_was_held():
    r = _renderer()
    clocks = {"samples": 9, "clocks.sm": {"min": 1755.0, "median": 1980.0, "max": 1980.0},
              "reasons": ["0x0000000000000000", "0x0000000000000001", "0x0000000000000010"]}
    bench = {"raw": {"kernels": {"rows": [], "clocks": clocks}, "decode": {"clocks": {"samples": 0}},
                     "e2e": {"clocks": {"error": "no nvidia-smi clocks"}}}}
    assert r.clocks_line(bench) == ["SM clock while each benchmark ran (nvidia-smi, median and range): kernels "
                                    "1980 MHz (1755-1980), reasons 0x0000000000000010.", ""]
    assert r.clocks_line({"raw": {}}) == []
