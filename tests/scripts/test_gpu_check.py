"""The GPU runbook's plan holds without a GPU: scripts/gpu_check.py --dry-run (commands parse,
carried sizes fit, the wheel plan is closed, the JSON writers and the README renderer work on
a fake run, the check groups run through the CPU kernels)."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import gpu_check  # noqa: E402


def test_gpu_check_dry_run():
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gpu_check.py"), "--dry-run"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "dry run OK" in p.stdout
    for n in (1, 2):
        assert f"--call {n}" in p.stdout
    assert "--call 3" not in p.stdout  # the plan fits a 15-minute lease in two calls


def test_render_without_results_says_so(tmp_path):
    out = tmp_path / "section.md"
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "render_gpu_results.py"), "--results",
                        str(tmp_path), "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    text = out.read_text()
    assert text.startswith("## GPU results\n")
    assert "No GPU run is recorded yet; `python scripts/gpu_check.py` produces this section." in text


def test_committed_results_render_to_the_readme():
    """The README's GPU section is what render_gpu_results.py makes of the committed JSONs."""
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "render_gpu_results.py"), "--check"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]


def test_commit_for_digest():
    """A device record's source digest names the commit that holds its code: HEAD's own digest
    (its tracked sources, read from git) finds HEAD or an older commit with the same sources;
    a digest of no commit finds nothing."""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    try:
        import _bench_util as bu
    finally:
        sys.path.pop(0)
    if not bu.short_commit():
        import pytest
        pytest.skip("not a git checkout")
    assert bu.commit_for_digest("0" * 64) == ""
    clean = not bu._run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=all", "--",
                         *bu.SOURCE_GLOBS])
    if clean:  # the working tree's digest is then HEAD's
        assert bu.commit_for_digest(bu.source_digest())


def _gpu_check_module():
    import importlib.util
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    try:
        spec = importlib.util.spec_from_file_location("gpu_check_under_test", os.path.join(ROOT, "scripts",
                                                                                            "gpu_check.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.pop(0)


def test_variant_verdicts_keep_each_tag_apart(tmp_path, monkeypatch):
    """A variant whose checks fail (or whose process died) is left out of the benchmarks of the
    same build; a tag never matches another that it is a prefix of (ahead / ahead2)."""
    gc = _gpu_check_module()
    st = gc.Stage("correctness", 1, 10, quiet=True)
    st.add("variant=huffman:chain: decode huffman chain 1024x4096 index S=256", "pass")
    st.add("variant=huffman:ahead2: decode huffman ahead2 1024x4096 index S=256", "pass")
    st.add("variant=huffman:ahead2 (group process)", "fail", error="group process ended with -11")
    st.add("variant=palette:vec8: decode palette vec8 33x4097", "skip", why="group budget spent")
    st.add("variant=gemm:x: a tag that is only a prefix of gemm:xs", "pass")
    st.add("decode: decode huffman 63x65", "fail")  # a default kernel: no variant verdict
    verdicts = gc.variant_verdicts(st)
    assert verdicts == {"huffman:chain": "pass", "huffman:ahead2": "fail", "palette:vec8": "skip"}

    monkeypatch.setattr(gc, "STATE", str(tmp_path))
    # no correctness stage on this machine yet: only the variants that must pass first are left out
    assert gc.bench_variants_to_skip() == gc.BENCH_NEEDS_PASS
    gc.bu.write_json(gc._variant_path(), {"source_sha256": gc.bu.source_digest(), "verdicts": verdicts})
    assert set(gc.bench_variants_to_skip()) == {"huffman:ahead2", *gc.BENCH_NEEDS_PASS}
    passed = {**verdicts, **{t: "pass" for t in gc.BENCH_NEEDS_PASS}}
    gc.bu.write_json(gc._variant_path(), {"source_sha256": gc.bu.source_digest(), "verdicts": passed})
    assert list(gc.bench_variants_to_skip()) == ["huffman:ahead2"]
    gc.bu.write_json(gc._variant_path(), {"source_sha256": "0" * 64, "verdicts": passed})
    assert gc.bench_variants_to_skip() == gc.BENCH_NEEDS_PASS  # verdicts of other sources are not this build's


def test_every_variant_is_checked_benchmarked_and_profiled_by_tag():
    """The variant tags name kernel_plan's variants and the tuning table's wide GEMM, and each
    variant mode and profile of the bench stage maps to its tag."""
    gc = _gpu_check_module()
    from unweight.runtime import kernel_plan as kp
    for tag in gc.VARIANT_TAGS:
        kind, _, name = tag.partition(":")
        if tag == "tiled":  # not a kernel variant: every palette kernel on tile-major planes
            assert f"variant={tag}" in gc.GROUPS
            continue
        assert {"huffman": kp.HUFF_VARIANTS, "palette": kp.PAL_VARIANTS, "gemm": {"wide": 1, "xs": 1, "wg": 1},
                # (mma_queue has its own op, ops.palette_gemv_queue; pdl is the launch mode of the
                # tensor-core ones, ops.programmatic_launch; mma_split takes split planes only;
                # probe is ops.palette_gemv_probe, timed by the kernel benchmark alone)
                "gemv": {"": 1, "mma_queue": kp.PGEMV_VARIANT_MMA_QUEUE, "pdl": 1, "probe": len(kp.PGEMV_PROBES),
                         "mma_split": kp.PGEMV_VARIANT_MMA_SPLIT,
                         **{n: 1 for n in kp.PGEMV_VARIANTS if n != "std"}}}[kind][name]
        assert f"variant={tag}" in gc.GROUPS and f"variant={tag}" in dict(gc.CORRECTNESS_GROUPS)
    assert set(gc.E2E_MODE_VARIANT.values()) <= set(gc.VARIANT_TAGS)
    assert gc.BENCH_E2E_MODES[-1] == "dense"
    tags = {gc._profile_variant(args) for _, args, _ in gc.PROFILES}
    assert tags - {None} <= set(gc.VARIANT_TAGS) and \
        {"gemm:wide", "gemm:xs", "gemm:wg", "gemv", "huffman:chain", "palette:vec8"} <= tags
    # every decoder the runtime does not run by default has its tag; the defaults have none
    others = {f"huffman:{n}" for n, v in kp.HUFF_VARIANTS.items() if v != kp.HUFF_DEFAULT_VARIANT} | \
        {f"palette:{n}" for n, v in kp.PAL_VARIANTS.items() if v != kp.PAL_DEFAULT_VARIANT}
    assert {t for t in gc.VARIANT_TAGS if t.split(":")[0] in ("huffman", "palette")} == others


def test_variant_groups_run_the_unproven_kernels_before_the_retired_ones():
    """The correctness stage's time cuts the variant groups at the end: the kernels whose
    benchmarks wait on their checks (BENCH_NEEDS_PASS) come first, each capped short, and the
    variants the benchmarks leave out (BENCH_RETIRED) come last."""
    gc = _gpu_check_module()
    order = {t: i for i, t in enumerate(gc.VARIANT_TAGS)}
    assert set(gc.BENCH_NEEDS_PASS) <= set(order) and set(gc.BENCH_RETIRED) <= set(order)
    gated = [order[t] for t in gc.BENCH_NEEDS_PASS]
    retired = [order[t] for t in gc.BENCH_RETIRED]
    rest = [i for t, i in order.items() if t not in gc.BENCH_NEEDS_PASS and t not in gc.BENCH_RETIRED]
    assert max(rest) < min(retired)
    assert sorted(gated) == list(range(len(gated)))
    # then the shipped table's paths
    assert gc.VARIANT_TAGS[len(gated):len(gated) + 4] == ("tiled", "gemv:mma", "gemv:mma_bulk", "gemv")
    assert [g for g, _ in gc.CORRECTNESS_GROUPS][4:] == [f"variant={t}" for t in gc.VARIANT_TAGS]
    caps = dict(gc.CORRECTNESS_GROUPS)
    assert all(caps[f"variant={t}"] == gc.GATED_GROUP_CAP_S < 60 for t in gc.BENCH_NEEDS_PASS)


def test_ncu_report_numbers_include_the_shared_memory_counters():
    """The numbers kept from an ncu text report: section lines with and without units, and the
    --metrics counters the emulator's access profile is compared with."""
    gc = _gpu_check_module()
    text = """
    Section: GPU Speed Of Light Throughput
    ----------------------- ----------- ------------
    Metric Name             Metric Unit Metric Value
    ----------------------- ----------- ------------
    Duration                         us       412.35
    Memory Throughput                 %        71.20
    Section: Command line profiler metrics
    ---------------------------------------------------------- ----------- ------------
    Metric Name                                                Metric Unit Metric Value
    ---------------------------------------------------------- ----------- ------------
    l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum                 1,207,344
    l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum                     1,677,721
    l1tex__t_requests_pipe_lsu_mem_global_op_st.sum                   request      524,288
    l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum                     sector   16,777,216
"""
    got = gc._ncu_numbers(text)
    assert got["duration"] == 412.35 and got["duration_unit"] == "us"
    assert got["smem_ld_bank_conflicts"] == 1207344 and got["smem_ld_wavefronts"] == 1677721
    assert "smem_ld_wavefronts_unit" not in got
    assert got["gst_sectors"] == 16777216 and got["gst_requests"] == 524288 and got["gst_sectors_unit"] == "sector"


def test_ncu_report_numbers_include_clock_instructions_and_the_busiest_pipe():
    """The numbers that say what bounds a kernel's issue rate: the SM clock and cycles, warp
    instructions executed, issue-slot and SM busy shares, and the busiest pipeline, which
    ComputeWorkloadAnalysis gives only in a rule's message."""
    gc = _gpu_check_module()
    text = """
    Section: GPU Speed Of Light Throughput
    SM Frequency                    Ghz         1.75
    Elapsed Cycles                cycle      133,412
    SM Active Cycles              cycle   131,002.25
    Section: Compute Workload Analysis
    Executed Ipc Active      inst/cycle         1.96
    Issue Slots Busy                  %        49.10
    SM Busy                           %        61.33
    OPT   ALU is the highest-utilized pipeline (61.3%) based on active cycles, taking into account the rates of its
          different instructions. It executes integer and logic operations.
    Section: Instruction Statistics
    Avg. Executed Instructions Per Scheduler        inst    64,100.20
    Executed Instructions                           inst   33,844,906
"""
    got = gc._ncu_numbers(text)
    assert got["sm_clock"] == 1.75 and got["sm_clock_unit"] == "Ghz"
    assert got["elapsed_cycles"] == 133412 and got["sm_active_cycles"] == 131002.25
    assert got["ipc_active"] == 1.96 and got["issue_slots_busy_pct"] == 49.1 and got["sm_busy_pct"] == 61.33
    assert got["inst_executed"] == 33844906
    assert got["top_pipe"] == "ALU" and got["top_pipe_pct"] == 61.3
    assert gc._ncu_numbers("    Tensor (FP) is the highest-utilized pipeline (12.0%) based on")["top_pipe"] == \
        "Tensor (FP)"
    assert {"ComputeWorkloadAnalysis", "InstructionStats"} <= set(gc.NCU_SECTIONS)


def _profiles_under_fake_ncu(gc, tmp_path, monkeypatch, script: str) -> dict:
    """The profile step over the first two PROFILES with `script` (sh) standing in for ncu."""
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "ncu"
    fake.write_text("#!/bin/sh\n" + script)
    fake.chmod(0o755)
    monkeypatch.setattr(gc.shutil, "which", lambda name: str(fake) if name == "ncu" else None)
    monkeypatch.setattr(gc, "PROFILES", gc.PROFILES[:2])
    return gc._profiles(gc.bu.Budget(120), str(tmp_path))


def test_profiles_survive_an_ncu_that_refuses_the_counters(tmp_path, monkeypatch):
    """An ncu that does not know one of the counters' names: the stage drops the counters
    once and keeps every profile (the counters only serve the emulator comparison)."""
    gc = _gpu_check_module()
    res = _profiles_under_fake_ncu(gc, tmp_path, monkeypatch,
                                   "case \"$*\" in *--metrics*) echo '==ERROR== Failed to find metric l1tex__x.sum'; "
                                   "exit 1;; esac\n"
                                   "echo '    Duration                         us       12.50'\n")
    assert len(res["metrics_refused"]) == 2 and "Failed to find metric" in res["metrics_refused"][0]
    assert [k["duration"] for k in res["kernels"].values()] == [12.5, 12.5]
    assert not any("error" in k for k in res["kernels"].values())


def test_profiles_keep_the_counters_when_ncu_refuses_only_the_stall_names(tmp_path, monkeypatch):
    """An ncu that knows the access counters but not a stall metric: the stall group goes, the
    counters stay (asked for, and parsed, in every profile)."""
    gc = _gpu_check_module()
    res = _profiles_under_fake_ncu(gc, tmp_path, monkeypatch,
                                   "case \"$*\" in *issue_stalled*) echo '==ERROR== Failed to find metric smsp__x'; "
                                   "exit 1;; esac\n"
                                   "echo '    Duration                         us       12.50'\n"
                                   "case \"$*\" in *--metrics*) "
                                   "echo '    l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum      sector   16,777,216';; "
                                   "esac\n")
    assert len(res["metrics_refused"]) == 1
    assert [k.get("gst_sectors") for k in res["kernels"].values()] == [16777216, 16777216]
    got = gc._ncu_numbers("    smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio            1.37\n")
    assert got == {"stall_barrier": 1.37}


def test_profiles_leave_the_clocks_alone(tmp_path, monkeypatch):
    """Every ncu launch asks it not to lock the clocks (the device rules: the card's settings
    stay as they are), and the stage's record says so."""
    gc = _gpu_check_module()
    log = tmp_path / "args.log"
    res = _profiles_under_fake_ncu(gc, tmp_path, monkeypatch,
                                   f"echo \"$*\" >> {log}\n"
                                   "echo '    Duration                         us       12.50'\n")
    calls = log.read_text().splitlines()
    assert calls and all("--clock-control none" in c for c in calls if "--import" not in c)
    assert res["clock_control"] == "none"


SOURCE_CSV = """"Kernel Name","pgemv_mma_kernel"
"# Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)",\
"Instructions Executed","Thread Instructions Executed","stall_long_sb"
"0x7f00","LOP3.LUT R64, R19, 0x7777, RZ, 0xc0, !PT","10","4","2,048","65,536","0"
"0x7f10","PRMT R67, R91, R64, R88","3","1","4096","131072","0"
"0x7f20","@!P1 LDG.E.128.CONSTANT R76, desc[UR8][R112.64]","0","0","512","16384","0"
"0x7f30","HMMA.16816.F32.BF16 R56, R60, R76, R56","90","80","1,024","32768","85"
"0x7f40","PRMT R69, R91, R65, R88","1","0","4096","131072","0"
"""


def test_sass_summary_reads_ncus_source_page():
    """The source page's CSV -> totals, per-opcode sums (predicates and modifiers dropped) and
    the instructions with the most samples and executions, per-reason stall columns kept."""
    gc = _gpu_check_module()
    got = gc.sass_summary(SOURCE_CSV)
    assert got["instructions"] == 5 and got["inst_executed"] == 2048 + 4096 + 512 + 1024 + 4096
    assert got["samples"] == 104
    ops = {o["op"]: (o["executed"], o["samples"]) for o in got["by_opcode"]}
    assert ops == {"LOP3": (2048, 10), "PRMT": (8192, 4), "LDG": (512, 0), "HMMA": (1024, 90)}
    assert got["by_opcode"][0]["op"] == "PRMT"
    top = got["top_samples"][0]
    assert top["address"] == "0x7f30" and top["sass"].startswith("HMMA") and top["stall_long_sb"] == 85
    assert [r["address"] for r in got["top_executed"][:2]] == ["0x7f10", "0x7f40"]
    assert gc.sass_summary("no table here\n1,2,3\n") == {}


def test_source_profiles_keep_the_per_instruction_counters(tmp_path, monkeypatch):
    """A profile in NCU_SOURCE_PROFILES runs with the SourceCounters section and a saved report,
    whose source page becomes the entry's "sass" summary and a CSV beside the text report; the
    report itself is removed.  An ncu whose import fails costs the summary, not the profile."""
    gc = _gpu_check_module()
    (tmp_path / "page.csv").write_text(SOURCE_CSV)
    monkeypatch.setattr(gc, "NCU_SOURCE_PROFILES", (gc.PROFILES[0][0],))
    res = _profiles_under_fake_ncu(
        gc, tmp_path, monkeypatch,
        "case \"$*\" in *'--page source'*) cat " + str(tmp_path / "page.csv") + "; exit 0;; esac\n"
        "case \"$*\" in *--export*) "
        "  test -n \"$(echo \"$*\" | grep -- '--section SourceCounters')\" || exit 3;"
        "  rep=$(echo \"$*\" | sed 's/.*--export \\([^ ]*\\).*/\\1/'); touch \"$rep.ncu-rep\";; esac\n"
        "echo '    Duration                         us       12.50'\n")
    first, second = (res["kernels"][n] for n, *_ in gc.PROFILES[:2])
    assert "error" not in first and first["sass"]["inst_executed"] == 11776 and "sass" not in second
    assert (tmp_path / "ncu" / f"{gc.PROFILES[0][0]}-sass.csv").read_text() == SOURCE_CSV
    assert not list((tmp_path / "ncu").glob("*.ncu-rep"))


def test_smollm2_parts_fit_two_calls():
    """SmolLM2's xz'd GGUF is split over the two calls, the eval site with the second, each call
    under the device tool's carry limit with its margin; a tree too large for that is refused."""
    gc = _gpu_check_module()
    mib = gc.MIB
    parts, carried = gc.plan_parts(4 * mib, 86 * mib, 6 * mib)
    assert sum(parts) == 86 * mib and set(carried) == set(gc.CALLS) == {1, 2}
    for n in gc.CALLS:
        assert 4 * mib + carried[n] <= gc.CARRY_LIMIT - gc.CARRY_MARGIN
    assert gc.plan_parts(30 * mib, 86 * mib, 6 * mib) is None
    assert gc.lease_seconds_needed() <= gc.LEASE_S


def test_a_call_cut_short_runs_its_first_stages(tmp_path, monkeypatch):
    """With the planned deadline every stage of call 2 gets its share; with less, the model stage
    (the first) gets what is left before the sanitizer and eval, which are then skipped."""
    gc = _gpu_check_module()
    budgets = {}

    def stage(name, used):
        def run(st, *a):
            budgets[name] = round(st.budget.seconds)
            now[0] += used  # the seconds the stage takes, on a fake clock
        return run

    now = [0.0]
    monkeypatch.setattr(gc.bu.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(gc, "DEV", "cpu")
    monkeypatch.setattr(gc, "stash_parts", lambda st: None)
    monkeypatch.setattr(gc, "device_env", dict)
    monkeypatch.setattr(gc, "stage_model", lambda st: stage("model", 70)(st) or True)
    monkeypatch.setattr(gc, "stage_sanitizer", stage("sanitizer", 30))
    monkeypatch.setattr(gc, "stage_eval", stage("eval", 0))
    assert gc.run_stages(gc.CALL_STAGES[2], str(tmp_path / "a"), gc.CALLS[2]["deadline"], 2) == 0
    assert budgets == {"model": 90, "sanitizer": 65, "eval": 80}
    budgets.clear()
    assert gc.run_stages(gc.CALL_STAGES[2], str(tmp_path / "b"), 100, 2) == 0
    assert budgets == {"model": 100}
    with open(tmp_path / "b" / "sanitizer.json") as f:
        assert json.load(f)["status"] == "skipped"


def test_a_call_packs_its_extra_files_into_one_archive(tmp_path):
    """What a call leaves in $OUT stays within the device tool's 8 files: the stage JSONs and
    the call's log as they are, everything else (logs, ncu/ reports) in call<N>-files.tar.xz."""
    import tarfile
    gc = _gpu_check_module()
    for name in ("bench.json", "build.json", "correctness.json", "call1.log", "build.log", "pytest.log",
                 "pytest-variants.log"):
        (tmp_path / name).write_text(name)
    (tmp_path / "ncu").mkdir()
    for i in range(6):
        (tmp_path / "ncu" / f"k{i}.txt").write_text(f"report {i}")
    path = gc.pack_extras(str(tmp_path), 1)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["bench.json", "build.json", "call1-files.tar.xz", "call1.log", "correctness.json"]
    assert len(left) <= gc.OUT_FILES_MAX
    with tarfile.open(path) as tar:
        names = sorted(tar.getnames())
        assert names == sorted(["build.log", "pytest.log", "pytest-variants.log"] + [f"ncu/k{i}.txt" for i in range(6)])
        assert tar.extractfile("ncu/k3.txt").read() == b"report 3"
    assert gc.pack_extras(str(tmp_path), 1) is None  # packed once: nothing left to pack


def test_tile_major_profiles_run_their_kernel_here():
    """Each tile-major entry of the bench stage's PROFILES is a profile_kernels.py command that
    runs (checked) on this machine too, at a small row count: the tile-major planes reach the
    kernel's op; --tiled refuses a Huffman kernel in one line."""
    gc = _gpu_check_module()
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    try:
        import profile_kernels
    finally:
        sys.path.pop(0)
    tiled = [args for _, args, _ in gc.PROFILES if "--tiled" in args]
    assert tiled and {gc._profile_variant(a) for a in tiled} <= set(gc.VARIANT_TAGS) | {None}
    for args in tiled:
        small = list(args)
        if "--rows" in small:
            small[small.index("--rows") + 1] = "64"
        assert profile_kernels.main(small + ["--cols", "512"]) == 0
    with pytest.raises(SystemExit):
        profile_kernels.main(["--kernel", "huffman", "--rows", "64", "--cols", "512", "--tiled"])


def test_sanitizer_tools_each_get_their_time_memcheck_first(tmp_path, monkeypatch):
    """memcheck, the first tool, takes the stage's time less SAN_MIN_S for each later tool (an
    even split had skipped it on a 60 s stage); a tool that runs out of time without a verdict
    is a skip, not a failure."""
    import subprocess
    gc = _gpu_check_module()
    now, asked = [0.0], []
    monkeypatch.setattr(gc.bu.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(gc, "find_compute_sanitizer", lambda: "/bin/compute-sanitizer")

    def run(cmd, timeout=None, **kw):
        tool = cmd[cmd.index("--tool") + 1] if "--tool" in cmd else None
        if tool is None:
            return subprocess.CompletedProcess(cmd, 0, "compute-sanitizer 13.0\n", "")
        asked.append((tool, round(timeout)))
        now[0] += 12
        if tool == "synccheck":
            raise subprocess.TimeoutExpired(cmd, timeout)
        return subprocess.CompletedProcess(cmd, 0, "sanitizer driver: 40 launches\n========= ERROR SUMMARY: 0 errors\n",
                                           "")
    monkeypatch.setattr(gc.subprocess, "run", run)
    st = gc.Stage("sanitizer", 2, 60, quiet=True)
    gc.stage_sanitizer(st, str(tmp_path))
    assert asked == [("memcheck", 30), ("racecheck", 33), ("synccheck", 36)]
    got = {c["name"]: c["status"] for c in st.rec["checks"]}
    assert got == {"memcheck": "pass", "racecheck": "pass", "synccheck": "skip"}


def test_kernel_bench_times_every_bucket_of_the_tuning_table():
    """The runbook's kernel benchmark times the batch each bucket the fused kernels cover is
    measured at, so the dispatcher finds an entry for every batch of 1..256."""
    gc = _gpu_check_module()
    from unweight.runtime import kernel_plan as kp
    from unweight.runtime.tuning_table import BUCKET_BATCH
    assert gc.KERNEL_BATCHES == tuple(sorted(m for m in BUCKET_BATCH.values() if m <= kp.PMMA_MAX_M))


def test_group_runner_survives_exits_poisoned_contexts_and_hangs(monkeypatch):
    """The check groups run in one process until one ends it (a fault), leaves the CUDA context
    unusable or hangs: that group fails, named "<group> (group process)", and the groups after
    it run in a new process, each check named after its group."""
    monkeypatch.setattr(gpu_check, "GROUP_GRACE_S", 1.0)
    st = gpu_check.Stage("correctness", None, 120, fake=True, quiet=True)
    gpu_check.run_groups(st, [(g, 3 if g == "runner=hang" else 30) for g in gpu_check.RUNNER_SELFTEST], "cpu")
    got = [(c["name"], c["status"]) for c in st.rec["checks"]]
    assert got == [
        ("runner=pass: a check before the group's end", "pass"), ("runner=pass: a second check", "pass"),
        ("runner=exit: a check before the group's end", "pass"), ("runner=exit (group process)", "fail"),
        ("runner=poison: a check before the group's end", "pass"), ("runner=poison: a second check", "pass"),
        ("runner=poison (group process)", "fail"),
        ("runner=hang: a check before the group's end", "pass"), ("runner=hang (group process)", "fail"),
        ("runner=last: a check before the group's end", "pass"), ("runner=last: a second check", "pass")]
    fails = {c["name"]: c for c in st.rec["checks"] if c["status"] == "fail"}
    assert fails["runner=exit (group process)"]["returncode"] == 9
    assert "after 1 of its checks" in fails["runner=exit (group process)"]["error"]
    assert fails["runner=poison (group process)"]["returncode"] == gpu_check.POISONED_RC
    assert fails["runner=hang (group process)"]["returncode"] == "timeout"


def test_group_runner_skips_what_the_stage_has_no_time_for():
    st = gpu_check.Stage("correctness", None, 5, fake=True, quiet=True)
    gpu_check.run_groups(st, [("runner=pass", 30), ("runner=last", 30)], "cpu")
    assert [(c["name"], c["status"]) for c in st.rec["checks"]] == [("runner=pass (group)", "skip"),
                                                                     ("runner=last (group)", "skip")]


def _prebuilt_repo(tmp_path, monkeypatch, **man_over):
    """A device-side tree (tmp_path/repo: the package's Python files, no extensions) whose carry
    holds a prebuilt archive of this checkout's extensions, as gpu_wheels.sh packs them (here for
    this Python); gpu_check pointed at it."""
    import hashlib
    import shutil
    import tarfile
    repo = tmp_path / "repo"
    shutil.copytree(os.path.join(ROOT, "unweight"), repo / "unweight",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    py = "%d.%d" % sys.version_info[:2]
    members = gpu_check._prebuilt_members(py)
    src = tmp_path / "src"
    for m in members:
        (src / m).parent.mkdir(parents=True, exist_ok=True)
        built = os.path.join(ROOT, m)
        if m.endswith(".so"):
            if not os.path.exists(built):
                pytest.skip(f"{m} is not built here")
            shutil.copy(built, src / m)
        else:
            (src / m).write_text("ptxas info    : Used 32 registers\n")
    carry = repo / ".gpu_carry" / "call1"
    carry.mkdir(parents=True)
    tar = carry / gpu_check.PREBUILT_NAME
    with tarfile.open(tar, "w:xz", preset=0) as tf:
        for m in members:
            tf.add(src / m, arcname=m)
    man = {"build_sha256": gpu_check.bu.build_digest(), "python": py, "archs": gpu_check.PREBUILT_ARCHS,
           "sha256": hashlib.sha256(tar.read_bytes()).hexdigest(), "nvcc": "test", "build_seconds": 1.0}
    man.update(man_over)
    (carry / gpu_check.PREBUILT_JSON).write_text(json.dumps(man))
    monkeypatch.setattr(gpu_check, "ROOT", str(repo))
    monkeypatch.setattr(gpu_check, "CARRY", str(repo / ".gpu_carry"))
    monkeypatch.setattr(gpu_check, "STATE", str(repo / ".gpu_state"))
    monkeypatch.setattr(gpu_check, "DEV", "cpu")  # a CPU self-test: no target to match, no device to see
    return repo, members


def test_prebuilt_extensions_serve_when_built_from_the_same_inputs(tmp_path, monkeypatch):
    repo, members = _prebuilt_repo(tmp_path, monkeypatch)
    st = gpu_check.Stage("build", None, 60, fake=True, quiet=True)
    assert gpu_check.use_prebuilt(st)
    (c,) = st.rec["checks"]
    assert c["status"] == "pass" and c["ok"] and c["nvcc"] == "test"
    assert all((repo / m).exists() for m in members)
    assert json.loads((repo / ".gpu_state" / "build.json").read_text())["prebuilt"] is True
    assert st.rec["raw"]["ptxas"]  # the carried ptxas report, read as a device build's


@pytest.mark.parametrize("over, why", [({"build_sha256": "0" * 64}, "built from other csrc/ or setup.py"),
                                       ({"python": "3.99"}, "built for Python 3.99"),
                                       ({"archs": "80"}, "built for sm_80"),
                                       ({"sha256": "0" * 64}, "its archive is missing or not the one described")])
def test_prebuilt_extensions_that_do_not_match_are_left_out(tmp_path, monkeypatch, over, why):
    repo, members = _prebuilt_repo(tmp_path, monkeypatch, **over)
    st = gpu_check.Stage("build", None, 60, fake=True, quiet=True)
    assert not gpu_check.use_prebuilt(st)
    (c,) = st.rec["checks"]
    assert c["status"] == "skip" and c["why"].startswith(why) and c["why"].endswith("; building on the device")
    assert not any((repo / m).exists() for m in members)


def test_prebuilt_extensions_that_do_not_import_are_removed(tmp_path, monkeypatch):
    import hashlib
    import tarfile
    repo, members = _prebuilt_repo(tmp_path, monkeypatch)
    carry = repo / ".gpu_carry" / "call1"
    bad = tmp_path / "bad"
    bad.mkdir()
    with tarfile.open(carry / gpu_check.PREBUILT_NAME, "w:xz") as tf:
        for m in members:
            (bad / os.path.basename(m)).write_bytes(b"\x7fELF not a library")
            tf.add(bad / os.path.basename(m), arcname=m)
    man = json.loads((carry / gpu_check.PREBUILT_JSON).read_text())
    man["sha256"] = hashlib.sha256((carry / gpu_check.PREBUILT_NAME).read_bytes()).hexdigest()
    (carry / gpu_check.PREBUILT_JSON).write_text(json.dumps(man))
    st = gpu_check.Stage("build", None, 60, fake=True, quiet=True)
    assert not gpu_check.use_prebuilt(st)
    (c,) = st.rec["checks"]
    assert c["status"] == "skip" and c["why"].startswith("they do not import here")
    assert not any((repo / m).exists() for m in members[:2])


def test_pack_places_the_prebuilt_extensions_where_they_fit():
    e = gpu_check.EXPECTED_BYTES
    tree = 9 * gpu_check.MIB
    both = gpu_check.plan_parts(tree, e["gguf.xz"], e["site.tar.xz"], extra={1: e["prebuilt"], 2: e["prebuilt"]})
    assert both is not None
    parts, calls = both
    assert sum(parts) == e["gguf.xz"]
    assert max(calls.values()) + tree <= gpu_check.CARRY_LIMIT - gpu_check.CARRY_MARGIN
    big = {1: 40 * gpu_check.MIB, 2: 40 * gpu_check.MIB}
    assert gpu_check.plan_parts(tree, e["gguf.xz"], e["site.tar.xz"], extra=big) is None
