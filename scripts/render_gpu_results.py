#!/usr/bin/env python3
"""Render the README's "## GPU results" section from the stage JSONs of scripts/gpu_check.py
kept in benchmarks/results/gpu/.

    python scripts/render_gpu_results.py                  # rewrite the section in README.md
    python scripts/render_gpu_results.py --import DIR     # first copy a device run's JSONs in
    python scripts/render_gpu_results.py --out FILE       # write the section alone to FILE
    python scripts/render_gpu_results.py --check          # exit 1 when README's section is stale

Only the section from its "## GPU results" heading to the next "## " heading is replaced (it is
appended at the end when absent).  One subsection per GPU model, the most recent run first; per
GPU and stage, the latest record is used; records of a dry run
("fake": true) are refused unless --allow-fake.  --import names each file
<date>-<machine>-<stage>.json and stamps into it the commit whose tracked sources give the
record's source digest (the device copy of the tree has no reliable git state), or the device's
commit with -dirty when no recent commit does.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _bench_util as bu  # noqa: E402
import bench_e2e  # noqa: E402

HEADING = "## GPU results"
DEFAULT_RESULTS = os.path.join(bu.ROOT, "benchmarks", "results", "gpu")
NONE_YET = "No GPU run is recorded yet; `python scripts/gpu_check.py` produces this section."
STAGE_ORDER = ("build", "correctness", "sanitizer", "model", "eval", "bench")


def load_records(folder: str, allow_fake: bool = False) -> dict:
    """{gpu name: {stage: latest record}} of the stage JSONs in folder."""
    latest: dict = {}
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        try:
            with open(path) as f:
                rec = json.load(f)
        except (OSError, ValueError):
            continue
        if not isinstance(rec, dict) or "stage" not in rec or "checks" not in rec:
            continue
        if rec.get("fake") and not allow_fake:
            continue
        rec["_file"] = os.path.relpath(path, bu.ROOT)
        per_gpu = latest.setdefault((rec.get("env") or {}).get("gpu") or "an unrecorded GPU", {})
        cur = per_gpu.get(rec["stage"])
        if cur is not None and rec.get("status") == "skipped" and cur.get("status") != "skipped":
            continue  # a stage that did not run in a later call does not hide one that did
        if cur is None or cur.get("status") == "skipped" or rec.get("started", "") >= cur.get("started", ""):
            per_gpu[rec["stage"]] = rec
    return latest


def import_run(src: str, dst: str) -> list[str]:
    """Copy the stage JSONs of a device run (src) into dst under date-machine-stage names."""
    os.makedirs(dst, exist_ok=True)
    here = bu.source_digest()
    out = []
    for path in sorted(glob.glob(os.path.join(src, "*.json"))):
        with open(path) as f:
            rec = json.load(f)
        if not isinstance(rec, dict) or "stage" not in rec:
            continue
        env = rec.get("env") or {}
        same = env.get("source_sha256") == here
        rec["imported"] = {"source_matches_checkout": same, "checkout_commit": bu.short_commit() or None,
                           "device_commit": env.get("commit")}
        # The device's copy of the tree has no reliable git state: name the commit by its code.
        found = bu.commit_for_digest(env.get("source_sha256") or "")
        if found:
            env["commit"] = found
        elif env.get("commit") and not str(env["commit"]).endswith("-dirty"):
            env["commit"] = f"{env['commit']}-dirty"  # code that no recent commit holds
        started = rec.get("started", "")
        tag = f"{bu.machine_tag(env.get('gpu'))}-{rec['stage']}.json"
        target = os.path.join(dst, f"{started[:10]}-{tag}")
        if os.path.exists(target):
            with open(target) as f:
                old = json.load(f)
            if old.get("started", "") != started:
                # Another run of that stage on the same day and GPU keeps its own raw record: the
                # later one is named by its start time as well (the renderer shows the latest).
                hhmm = started[11:16].replace(":", "") or "0000"
                target = os.path.join(dst, f"{started[:10]}-{hhmm}-{tag}")
        bu.write_json(target, rec)
        out.append(target)
    return out


# ------------------------------------------------------------------------------------ formatting


def _f(v, fmt="{:.2f}", none="—"):
    if v is None or isinstance(v, str):
        return none if v is None else v
    return fmt.format(v)


def _checks_line(rec) -> str:
    s = rec.get("summary") or {}
    return f"{s.get('pass', 0)} / {s.get('fail', 0)} / {s.get('skip', 0)}"


def _code(env: dict) -> str:
    """The commit a record ran (with -dirty where the tree had changes), else its source digest."""
    return env.get("commit") or (env.get("source_sha256") or "")[:12] or "unknown"


def stage_table(recs: dict) -> list[str]:
    lines = ["| stage | result | checks passed / failed / skipped | seconds | code | raw |",
             "|---|---|---|---|---|---|"]
    for st in STAGE_ORDER:
        r = recs.get(st)
        if r is None:
            lines.append(f"| {st} | not run | — | — | — | — |")
            continue
        lines.append(f"| {st} | {r.get('status', '?')} | {_checks_line(r)} | {_f(r.get('seconds'), '{:.0f}')} | "
                     f"{_code(r.get('env') or {})} | [json]({r['_file']}) |")
    return lines


def failures(recs: dict, limit: int = 12) -> list[str]:
    out = []
    for st in STAGE_ORDER:
        for c in (recs.get(st) or {}).get("checks", []):
            if c.get("status") == "fail":
                why = c.get("error") or c.get("message") or ", ".join(c.get("findings", [])[:2]) or "see the JSON"
                out.append(f"- {st}: {c['name']}: {str(why)[:160]}")
    if len(out) > limit:
        out = out[:limit] + [f"- ... and {len(out) - limit} more (see the JSONs)"]
    return out


def decode_table(bench: dict) -> list[str]:
    dec = bench.get("raw", {}).get("decode") or {}
    rows = dec.get("rows") or []
    if not rows:
        return []
    # The unsuffixed rows ran the runtime's default decoders; records from before bench_decode
    # named them ran CHAIN and VEC8.
    default = {"huffman": "chain", "palette": "vec8", **(dec.get("default_decoders") or {})}
    pre = "huffman+index"  # bench_decode's huffman-with-index rows: huffman+index<S>[+<decoder variant>]

    def parts(k):  # "huffman+index256+ahead2" -> (256, "ahead2"); the default's row -> (256, <its name>)
        s_, _, v = k.removeprefix(pre).partition("+")
        return int(s_), v or default["huffman"]

    keys = {k for r in rows for k in r}
    idx = sorted({k for k in keys if k.startswith(pre)}, key=lambda k: (-parts(k)[0], parts(k)[1]))
    pal = sorted((k for k in keys if k == "palette" or k.startswith("palette+")),
                 key=lambda k: (k.partition("+")[2] or default["palette"]))
    cols = ["huffman", *idx, *pal, "transcode", "copy"]
    names = {"huffman": f"huffman (as stored, {default['huffman']})", "transcode": "huffman -> palette transcode",
             "copy": "dense copy",
             **{k: f"palette, {k.partition('+')[2] or default['palette']}" for k in pal},
             **{k: f"huffman, index S={parts(k)[0]}, {parts(k)[1]}" for k in idx}}
    lines = ["**Decode** (GB/s of BF16 written; the copy reads and writes the dense weights once; the GPU loaders "
             "give huffman weights the checkpoint index at S=256; the runtime's decoders: huffman "
             f"{default['huffman']}, palette {default['palette']} when this ran):", "",
             "| shape [N, K] | " + " | ".join(names[c] for c in cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['N']} x {r['K']} | error: {r['error'][:60]} |" + " |" * (len(cols) - 1))
            continue
        cells = [_f((r.get(e) or {}).get("out_GBps"), "{:.0f}") for e in cols]
        lines.append(f"| {r['N']} x {r['K']} | " + " | ".join(cells) + " |")
    # The load-time transcode as time per GB of BF16 weights (a palette-mode load of a huffman
    # checkpoint pays it once per layer).
    per_gb = sorted(1e3 / r["transcode"]["out_GBps"] for r in rows if (r.get("transcode") or {}).get("out_GBps"))
    if per_gb:
        lines += ["", f"Load-time huffman -> palette transcode on the GPU (stream as stored): {per_gb[0]:.0f}-"
                  f"{per_gb[-1]:.0f} ms per GB of BF16 weights."]
    # The checkpoint index a huffman-mode GPU load adds, on the device and on the host.
    ix = [r["index"] for r in rows if (r.get("index") or {}).get("out_GBps")]
    if ix:
        dev = sorted(1e3 / i["out_GBps"] for i in ix)
        host = sorted(1e3 / i["host_GBps"] for i in ix)
        ok = all(i.get("matches_host_codec") for i in ix)
        lines += ["", f"Load-time checkpoint index (S=256) built on the GPU: {dev[0]:.0f}-{dev[-1]:.0f} ms per GB of "
                  f"BF16 weights; on the host codec: {host[0]:.0f}-{host[-1]:.0f} ms per GB"
                  f"{'' if ok else ' (the GPU index differed from the host one)'}."]
    # The load check of the weights a GPU holds (decode + crc32 there) against the host pass.
    lc = [r["load_check"] for r in rows if (r.get("load_check") or {}).get("out_GBps")]
    if lc:
        dev = sorted(1e3 / i["out_GBps"] for i in lc)
        crc = sorted(1e3 / i["crc_GBps"] for i in lc)
        host = sorted(1e3 / i["host_GBps"] for i in lc)
        ok = all(i.get("matches_header") for i in lc)
        lines += ["", f"Load check of the palette weights a GPU holds (decode + crc32 on the GPU): {dev[0]:.1f}-"
                  f"{dev[-1]:.1f} ms per GB of BF16 weights, the crc32 alone {crc[0]:.1f}-{crc[-1]:.1f}; the host "
                  f"pass it replaces: {host[0]:.0f}-{host[-1]:.0f} ms per GB"
                  f"{'' if ok else ' (a GPU crc32 differed from the header)'}."]
    return lines + [""]


def slots_lines(bench: dict) -> list[str]:
    """The routed MoE decode (bench_decode.py's moe_slots): per slot count, the time, GB/s of
    BF16 written and the one-launch-per-expert decode's time against it."""
    ms = (bench.get("raw", {}).get("decode") or {}).get("moe_slots") or {}
    rows = ms.get("rows_by_slots") or []
    if not rows:
        return []
    parts = []
    for r in rows:
        one = (r.get("one_launch_per_expert") or {}).get("time_vs_slots")
        g = r.get("slots_gemv") or {}
        parts.append(f"{r['slots']} slots {r['median_ms'] * 1e3:.1f} us ({r['out_GBps']:.0f} GB/s"
                     + (f"; one launch per expert {one:.2f}x the time" if one else "") + ")"
                     + ("" if r.get("bitwise") else " NOT BITWISE")
                     + (f", slots GEMV {g['median_ms'] * 1e3:.1f} us ({g['time_vs_decode_matmul']:.2f}x slot decode + "
                        f"batched matmul)" if "median_ms" in g else ""))
    built = (f" Built at load (host weights copied to the device and encoded there) in {ms['build_ms']:.0f} ms, "
             f"{ms['build_ms_per_GB']:.0f} ms per GB of BF16." if "build_ms" in ms else "")
    return [f"**Routed MoE decode** (`ops.decode_palette_slots`, experts by ids on the device; a layer of "
            f"{ms['experts']} experts of {ms['rows']} x {ms['cols']}): " + "; ".join(parts) + "." + built, ""]


def kernels_table(bench: dict) -> list[str]:
    rows = (bench.get("raw", {}).get("kernels") or {}).get("rows") or []
    rows = [r for r in rows if "cublas" in r]
    if not rows:
        return []
    batches = sorted({r["M"] for r in rows})
    shapes = []
    for r in rows:
        if (r["N"], r["K"]) not in shapes:
            shapes.append((r["N"], r["K"]))
    variants = [k for k in ("palette_fused", "palette_fused_wide", "palette_fused_xs", "palette_fused_wg",
                            "palette_gemv",
                            "palette_gemv_mma", "palette_gemv_mma_staged",
                            "palette_gemv_mma_prefetch", "palette_gemv_mma_queue", "palette_gemv_deep",
                            "palette_gemv_staged",
                            "huffman_fused", "palette_decode_cublas", "huffman_decode_cublas",
                            *(key for key, _ in TILED_ROWS), "palette_auto")
                if any(k in r for r in rows)]
    label = {"palette_fused": "palette fused", "palette_fused_wide": "palette fused, wide stages",
             "palette_fused_xs": "palette fused, shared x", "palette_fused_wg": "palette fused, wgmma (sm_90a)",
             "palette_gemv": "palette GEMV (batch 1-4)",
             "palette_gemv_deep": "palette GEMV, deep (batch 1-4)",
             "palette_gemv_staged": "palette GEMV, staged (batch 1-4)",
             "palette_gemv_mma": "palette GEMV, tensor cores (batch 1-32)",
             "palette_gemv_mma_staged": "palette GEMV, tensor cores, staged (batch 1-32)",
             "palette_gemv_mma_prefetch": "palette GEMV, tensor cores, L2 prefetch (batch 1-32)",
             "palette_gemv_mma_queue": "palette GEMV, tensor cores, queued units (batch 1-32)",
             "huffman_fused": "huffman fused",
             "palette_decode_cublas": "palette decode + cuBLAS", "huffman_decode_cublas": "huffman decode + cuBLAS",
             **dict(TILED_ROWS),
             # (records older than the plane order in "auto" chose among the file-order paths)
             "palette_auto": "palette, the path the measured dispatch picks" + (
                 "" if any("plane_order" in (r.get("palette_auto") or {}) for r in rows)
                 else " among the file-order paths")}
    lines = ["**y = x W^T against cuBLAS BF16** (cuBLAS in microseconds; the others as time / cuBLAS time, "
             "so 2.00 is twice as slow; \"—\" the kernel refuses that batch):", "",
             "| shape [N, K] | path | " + " | ".join(f"M={m}" for m in batches) + " |",
             "|---|---|" + "---|" * len(batches)]
    by = {(r["N"], r["K"], r["M"]): r for r in rows}
    for N, K in shapes:
        ms = [((by.get((N, K, m)) or {}).get("cublas") or {}).get("median_ms") for m in batches]
        cells = ["—" if t is None else f"{t * 1e3:.1f}" for t in ms]
        lines.append(f"| {N} x {K} | cuBLAS BF16 (us) | " + " | ".join(cells) + " |")
        for v in variants:
            cs = []
            for m in batches:
                e = (by.get((N, K, m)) or {}).get(v) or {}
                cs.append(_f(e.get("time_vs_cublas")) if "time_vs_cublas" in e else ("error" if "error" in e else "—"))
            lines.append(f"| | {label[v]} | " + " | ".join(cs) + " |")
    return lines + [""] + plane_order_lines(bench, rows)


# The GPU kernels' goals (docs/design/gpu-kernels.md, "What the GPU runs must establish"): the
# weight shapes they name (Llama-3.1-8B's o, qkv, mlp up, mlp down, lm_head) and each figure's
# bar, as a speed against cuBLAS BF16 (cuBLAS's time / ours) or GB/s of BF16 written.
GOAL_SHAPES = ((4096, 4096), (6144, 4096), (14336, 4096), (4096, 14336), (128256, 4096))
GOAL_BATCH1, GOAL_TO16, GOAL_DISPATCH, GOAL_E2E = 1.20, 1.0, 0.97, 1.15
GOAL_HUFFMAN_GBPS, GOAL_PALETTE_GBPS = 1000, 1450


def _fastest(r: dict):
    """cuBLAS's time / the fastest palette kernel's time in a kernel row: the
    fused kernels in file order that passed their checks (bench_kernels.file_order_passed) and on
    tile-major planes with the file-order bits (the launch-mode switches and probes left out);
    None when none ran."""
    import bench_kernels
    from unweight.runtime.tuning_table import PALETTE_GEMM
    ratios = [e["time_vs_cublas"] for key, path in [("palette_fused", PALETTE_GEMM)] + [(k, p) for k, p, *_ in
                                                                                     bench_kernels.LAYOUTS]
              for e in [r.get(key) or {}] if "time_vs_cublas" in e and bench_kernels.file_order_passed(r, path)]
    ratios += [e["time_vs_cublas"] for key, *_ in bench_kernels.TILED
               for e in [r.get(key) or {}] if "time_vs_cublas" in e and e.get("same_bits_as_file_order")]
    return 1 / min(ratios) if ratios else None


def _goal_met(vals: list, bar: float) -> str:
    got = [v for v in vals if v is not None]
    if not got:
        return "not measured"
    if any(v < bar for v in got):
        return "no"
    return "yes" if len(got) == len(vals) else "so far (not every shape measured)"


def goals_table(bench: dict) -> list[str]:
    """The goals' figures from one bench record: per goal shape, the fastest palette kernel's
    speed against cuBLAS at batch 1 and at the slowest batch up to 16, the measured dispatch's
    at its slowest batch, and the fastest Huffman and palette decoders' GB/s; the end-to-end
    ratio below it."""
    raw = bench.get("raw") or {}
    krows = [r for r in (raw.get("kernels") or {}).get("rows") or [] if "cublas" in r]
    drows = [r for r in (raw.get("decode") or {}).get("rows") or [] if "N" in r]
    if not krows and not drows:
        return []
    by = {(r["N"], r["K"], r["M"]): r for r in krows}
    shapes = [s for s in GOAL_SHAPES if any(k[:2] == s for k in by) or any((r["N"], r["K"]) == s for r in drows)]

    def fastest_at(s, pick):
        vals = [(m, f) for (n, k, m), r in by.items() if (n, k) == s and pick(m) for f in [_fastest(r)] if f]
        return min(vals, key=lambda v: v[1]) if vals else None

    def dispatch(s):
        vals = [1 / r["palette_auto"]["time_vs_cublas"] for (n, k, m), r in by.items()
                if (n, k) == s and "time_vs_cublas" in (r.get("palette_auto") or {})]
        return min(vals) if vals else None

    def decode(s, enc):
        r = next((r for r in drows if (r["N"], r["K"]) == s), {})
        vals = [v["out_GBps"] for k, v in r.items() if isinstance(v, dict) and v.get("bitwise") and "out_GBps" in v
                and (k.partition("+")[0] == "palette" if enc == "palette" else
                     k == "huffman+index256" or k.startswith("huffman+index256+"))]
        return max(vals) if vals else None

    b1 = [fastest_at(s, lambda m: m == 1) for s in shapes]
    to16 = [fastest_at(s, lambda m: m <= 16) for s in shapes]
    disp = [dispatch(s) for s in shapes]
    huf, pal = [decode(s, "huffman") for s in shapes], [decode(s, "palette") for s in shapes]
    file_only = krows and not any("plane_order" in (r.get("palette_auto") or {}) for r in krows)
    head = "| goal | " + " | ".join(f"{n} x {k}" for n, k in shapes) + " | bar | met |"
    lines = ["**Against the goals** (speed = cuBLAS BF16's time / the compressed path's; the fastest palette "
             "kernel that passed its checks, file order or tile-major; decoders: the fastest bitwise one):", "",
             head, "|---|" + "---|" * (len(shapes) + 2)]

    def row(label, vals, cell, bar):
        lines.append(f"| {label} | " + " | ".join(cell(v) for v in vals) + f" | >= {bar:g} | "
                     + _goal_met([None if v is None else (v[1] if isinstance(v, tuple) else v) for v in vals]
                                 + [None] * (len(GOAL_SHAPES) - len(shapes)), bar)
                     + " |")
    row("matmul speed at batch 1", b1, lambda v: "—" if v is None else f"{v[1]:.2f}", GOAL_BATCH1)
    row("matmul speed, slowest batch of 1-16 (its batch)", to16,
        lambda v: "—" if v is None else f"{v[1]:.2f} (M={v[0]})", GOAL_TO16)
    row("measured dispatch's speed, slowest batch" + (" (file-order paths only)" if file_only else ""), disp,
        lambda v: _f(v), GOAL_DISPATCH)
    row("Huffman -> BF16 at S=256, GB/s", huf, lambda v: _f(v, "{:.0f}"), GOAL_HUFFMAN_GBPS)
    row("palette -> BF16, GB/s", pal, lambda v: _f(v, "{:.0f}"), GOAL_PALETTE_GBPS)
    lines.append("")
    e2e = _e2e_goal(raw)
    return lines + ([e2e, ""] if e2e else [])


def _e2e_goal(raw: dict) -> str:
    """The end-to-end goal's line: the fastest palette mode's and the huffman mode's tokens/s
    against BF16 at batch 1, from the full-depth benchmark where it ran, else the 4-layer one."""
    for key, what in (("e2e_full", "the full-depth model"), ("e2e", "the 4-layer model")):
        modes = (raw.get(key) or {}).get("modes") or {}

        def tps(mode):
            r = next((r for r in (modes.get(mode) or {}).get("runs", []) if r.get("batch") == 1), {})
            return r.get("graph_tokens_per_s") or r.get("eager_tokens_per_s")
        ref = tps("bf16")
        pal = [(tps(m) / ref, m) for m in modes if m.startswith("palette") and "+compile" not in m and tps(m)] \
            if ref else []
        if pal:
            best = max(pal)
            huf = tps("huffman")
            return (f"End to end ({what}, batch 1, tokens/s against BF16): {best[0]:.2f}x with `{best[1]}` "
                    f"(goal >= {GOAL_E2E:g}x)" + (f"; huffman {huf / ref:.2f}x (Unweight reports 0.59x)" if huf else "")
                    + ".")
    return ""


def _mask(text: str) -> int:
    try:
        return int(text, 16)
    except ValueError:
        return 0


def clocks_line(bench: dict) -> list[str]:
    """What the card ran at during each benchmark (gpu_check's nvidia-smi sampling): the SM
    clock's median and range, and the driver's reasons for holding clocks down when any."""
    parts = []
    for name, res in (bench.get("raw") or {}).items():
        c = (res or {}).get("clocks") if isinstance(res, dict) else None
        if not c or not c.get("samples") or "clocks.sm" not in c:
            continue
        sm = c["clocks.sm"]
        held = [r for r in c.get("reasons", []) if _mask(r) & ~1]  # (bit 0: the GPU was idle)
        parts.append(f"{name} {sm['median']:.0f} MHz ({sm['min']:.0f}-{sm['max']:.0f})"
                     + (f", reasons {' '.join(held)}" if held else ""))
    return ["SM clock while each benchmark ran (nvidia-smi, median and range): " + "; ".join(parts) + ".", ""] \
        if parts else []


def probe_table(bench: dict) -> list[str]:
    """The tensor-core GEMV on tile-major planes with one stage left out (bench_kernels.py's
    "palette_gemv_mma_tiled_probe" rows): each probe's time as a share of the full kernel's."""
    rows = [r for r in (bench.get("raw", {}).get("kernels") or {}).get("rows") or []
            if "palette_gemv_mma_tiled_probe" in r]
    if not rows:
        return []
    names = (("no_verbatim", "empty verbatim list"), ("search", "cursors searched, no row index"),
             ("no_decode", "no decode"), ("no_mma", "no x, no mma"), ("stream", "loads only"))
    lines = ["**The tensor-core GEMV with a stage left out** (`ops.palette_gemv_probe`, tile-major planes; the "
             "full kernel in microseconds, the probes as a share of its time):", "",
             "| shape [N, K] | M | full (us) | verbatim blocks | " + " | ".join(n for _, n in names) + " |",
             "|---|---|---|---|" + "---|" * len(names)]
    for r in rows:
        p = r["palette_gemv_mma_tiled_probe"]
        cells = [_f((p.get(k) or {}).get("share_of_full")) if "share_of_full" in (p.get(k) or {})
                 else ("error" if "error" in (p.get(k) or {}) else "—") for k, _ in names]
        lines.append(f"| {r['N']} x {r['K']} | {r['M']} | {_f(p.get('full_ms', 0) * 1e3, '{:.1f}')} | "
                     f"{p.get('verbatim_blocks', '—')} | " + " | ".join(cells) + " |")
    return lines + [""]


# The tile-major rows of bench_kernels.py (its TILED, and decode + cuBLAS on the same copies).
TILED_ROWS = (("palette_tiled_decode_cublas", "palette decode + cuBLAS, tile-major"),
              ("palette_fused_tiled", "palette fused, tile-major"),
              ("palette_fused_wide_tiled", "palette fused, wide stages, tile-major"),
              ("palette_fused_xs_tiled", "palette fused, shared x, tile-major"),
              ("palette_fused_wg_tiled", "palette fused, wgmma, tile-major (sm_90a)"),
              ("palette_gemv_tiled", "palette GEMV, tile-major (batch 1-4)"),
              ("palette_gemv_mma_tiled", "palette GEMV, tensor cores, tile-major (batch 1-32)"),
              ("palette_gemv_mma_staged_tiled", "palette GEMV, tensor cores, staged, tile-major (batch 1-32)"),
              ("palette_gemv_mma_bulk_tiled", "palette GEMV, tensor cores, bulk copies, tile-major (batch 1-32)"),
              ("palette_gemv_mma_queue_tiled", "palette GEMV, tensor cores, queued units, tile-major (batch 1-32)"),
              ("palette_gemv_mma_split_tiled", "palette GEMV, tensor cores, split layout, tile-major"),
              ("palette_gemv_mma_tiled_pdl", "palette GEMV, tensor cores, tile-major, programmatic launch"),
              ("palette_gemv_mma_queue_tiled_pdl", "palette GEMV, tensor cores, queued units, tile-major, "
                                                   "programmatic launch"),
              ("palette_gemv_mma_tiled_no_x_prefetch", "palette GEMV, tensor cores, tile-major, x not prefetched "
                                                       "into L1"),
              ("palette_gemv_mma_queue_tiled_no_x_prefetch", "palette GEMV, tensor cores, queued units, tile-major, "
                                                             "x not prefetched into L1"),
              ("palette_fused_wg_tiled_pdl", "palette fused, wgmma, tile-major, programmatic launch (sm_90a)"),
              ("palette_fused_wg_tiled_tile_wait", "palette fused, wgmma, tile-major, each tile waiting for its "
                                                   "wgmmas (sm_90a)"))


def plane_order_lines(bench: dict, rows: list) -> list[str]:
    """The plane order plane_order="auto" holds each shape's palette weight in under the table
    these rows give (bench_kernels.table_from_rows, TuningTable.plane_order), and whether every
    tile-major run gave the file-order bits; nothing where no tile-major row was timed."""
    if not any("palette_tiled_decode_cublas" in r for r in rows):
        return []
    import bench_kernels
    gpu = (bench.get("env") or {}).get("gpu") or "gpu"
    table = bench_kernels.table_from_rows(rows, gpu, ("palette",))
    shapes = sorted({(r["N"], r["K"]) for r in rows if "palette_tiled_decode_cublas" in r})
    orders = ", ".join(f"{n} x {k} {table.plane_order(gpu, n, k)}" for n, k in shapes)
    runs = [r[key] for r in rows for key, _ in TILED_ROWS[1:] if "same_bits_as_file_order" in (r.get(key) or {})]
    same = sum(bool(e["same_bits_as_file_order"]) for e in runs)
    return [f"Plane order `plane_order=\"auto\"` picks from these timings: {orders}. Tile-major runs with the "
            f"file-order bits: {same} of {len(runs)}.", ""]


FULL_DEPTH = 32  # Llama-3.1-8B's layers: the e2e table projects the timed model's step to this depth


def e2e_table(bench: dict, key: str = "e2e") -> list[str]:
    """The end-to-end rows of bench_e2e.py: `key` "e2e" (the 4-layer model, every mode) or
    "e2e_full" (Llama-3.1-8B's full depth at batch 1, where nothing is projected)."""
    e2e = bench.get("raw", {}).get(key) or {}
    modes = e2e.get("modes") or {}
    if not modes:
        return []
    batches = sorted({r["batch"] for m in modes.values() for r in m.get("runs", [])})
    refs = {name: {r["batch"]: r for r in (modes.get(name) or {}).get("runs", [])}
            for name in ("bf16", "bf16+compile")}
    depth = (e2e.get("config") or {}).get("num_hidden_layers")

    def tps(r):
        return r.get("graph_tokens_per_s") or r.get("eager_tokens_per_s")
    lines = [f"**End-to-end decode** ({e2e.get('model', 'Llama-3.1-8B-shaped model')}; tokens/s of one decode "
             "step replayed in a CUDA graph, eager where capture failed; relative to BF16 in brackets (a "
             "`+compile` mode, its step compiled by torch.compile, to `bf16+compile`), and the "
             "layers alone, the step less its lm_head, where timed"
             + (f", and a {FULL_DEPTH}-layer model's step projected from the two, not measured):"
                if depth != FULL_DEPTH else "):"), "",
             "| mode | " + " | ".join(f"batch {b}" for b in batches) + " |", "|---|" + "---|" * len(batches)]
    for mode, m in modes.items():
        if "error" in m:
            lines.append(f"| {mode} | error: {m['error'][:80]} |" + " |" * (len(batches) - 1))
            continue
        runs = {r["batch"]: r for r in m.get("runs", [])}
        ref = refs[bench_e2e.reference_mode(mode)]  # a compiled mode against the compiled BF16 model
        cells = []
        for b in batches:
            r = runs.get(b)
            if not r or not tps(r):
                cells.append("—")
                continue
            rel = tps(r) / tps(ref[b]) if b in ref and tps(ref[b]) and mode != "bf16" else None
            eager = "" if r.get("graph_tokens_per_s") else " (eager)"
            # the layers alone (the step less its lm_head), where both runs timed them
            lay = (ref[b]["layers_ms"] / r["layers_ms"] if rel and r.get("layers_ms") and ref[b].get("layers_ms")
                   else None)
            # Llama-3.1-8B's 32 layers, projected from the timed layers and lm_head (not measured)
            k = FULL_DEPTH / depth if depth and depth != FULL_DEPTH else None
            deep = ((ref[b]["layers_ms"] * k + ref[b]["lm_head_ms"]) / (r["layers_ms"] * k + r["lm_head_ms"])
                    if lay and k and r.get("lm_head_ms") and ref[b].get("lm_head_ms") else None)
            cells.append(f"{tps(r):.1f}{eager}" + (f" [{rel:.2f}x" + (f"; layers {lay:.2f}x" if lay else "")
                                                  + (f"; {FULL_DEPTH} layers ~{deep:.2f}x" if deep else "") + "]"
                                                  if rel else ""))
        lines.append(f"| {mode} | " + " | ".join(cells) + " |")
    for enc in ("palette", "huffman"):  # the load check of the model's weights as a mode holds them
        lc = e2e.get(f"load_check_{enc}") or {}
        if lc.get("ms_per_GB"):
            lines += ["", f"Load check of this model's {lc['tensors']} compressed weights as `{lc['mode']}` holds "
                      f"them (each decoded and hashed on the GPU): {lc['seconds'] * 1e3:.0f} ms, "
                      f"{lc['ms_per_GB']:.1f} ms per GB of BF16 weights."]
        elif lc.get("error"):
            lines += ["", f"Load check as `{lc['mode']}` holds the weights: {lc['error'][:160]}"]
    return lines + [""]


def host_table(bench: dict) -> list[str]:
    """Host microseconds per forward of one layer (bench_host.py inside the e2e benchmark)."""
    host = (bench.get("raw", {}).get("e2e") or {}).get("host") or {}
    rows = host.get("rows") or []
    if not rows:
        return []
    lines = [f"**Host time per layer forward** (`scripts/bench_host.py`: a {host['shape'][0]} x {host['shape'][1]} "
             f"weight at batch {host.get('batch')}, {host.get('calls')} eager forwards per timing, median of "
             f"{host.get('runs')}; the forward's ops called directly, and through torch's dispatcher):", "",
             "| layer | path | us per call | through the dispatcher |", "|---|---|---|---|"]
    for r in rows:
        p = r.get("dispatcher")
        lines.append(f"| {r['layer']} | {r['path']} | {_f(r['direct']['median_us'], '{:.1f}')} | "
                     f"{_f(p['median_us'], '{:.1f}') if p else '–'} |")
    return lines + [""]


def moe_table(bench: dict) -> list[str]:
    moe = bench.get("raw", {}).get("moe") or {}
    rows = moe.get("results") or []
    if not rows:
        return []
    c = moe.get("config", {})
    lines = [f"**Mixture of experts** (`scripts/bench_moe.py --device cuda`: Qwen3-MoE, {c.get('layers')} layers, "
             f"{c.get('experts')} experts top-{c.get('top_k')}, hidden {c.get('hidden')}, expert intermediate "
             f"{c.get('moe_intermediate')}; one token per step after a {c.get('prompt')}-token prompt, eager):", "",
             "| variant | ms per token | vs BF16 | experts decoded per layer and token | experts fused per layer "
             "and token | device peak MB | logits = BF16 |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        peak = r.get("device_peak_bytes")
        lines.append(f"| {r.get('variant')} | {_f(r.get('ms_per_token'))} | {_f(r.get('vs_bf16'))}x | "
                     f"{_f(r.get('experts_decoded_per_layer_token'), '{:.1f}')} | "
                     f"{_f(r.get('experts_fused_per_layer_token'), '{:.1f}')} | "
                     f"{_f(peak / 1e6 if peak else None, '{:.0f}')} | {_logits_cell(r)} |")
    return lines + [""]


def _logits_cell(r: dict) -> str:
    """"yes" for bitwise logits; otherwise "NO", with the largest difference and whether the
    greedy tokens still matched where the run recorded them (a fused variant's GEMM rounding)."""
    if r.get("logits_equal_bf16"):
        return "yes" + _ref_impl(r)
    diff = r.get("max_abs_logit_diff_vs_bf16")
    if diff is None:
        return "NO" + _ref_impl(r)
    same = "same greedy tokens" if r.get("greedy_tokens_equal_bf16") else "other greedy tokens"
    return f"NO (max diff {diff:.3g}, {same})"


def _ref_impl(r: dict) -> str:
    """' (BF16 under X)' when the variant was compared with the BF16 model run under another
    experts implementation than the variant's own (the routed forward mirrors "batched_mm")."""
    ref = r.get("reference_experts_implementation")
    return f" (BF16 under {ref})" if ref and ref != r.get("experts_implementation") else ""


def profile_table(bench: dict) -> list[str]:
    kernels = ((bench.get("raw", {}).get("profile") or {}).get("kernels")) or {}
    if not kernels:
        return []
    # The stall breakdown (gpu_check.NCU_STALLS), where this run's ncu gave it: the two reasons
    # with the most warps waiting per issued instruction.
    stalls = any(k.startswith("stall_") for e in kernels.values() for k in e)
    # The busiest pipeline and the share of issue slots used (ComputeWorkloadAnalysis), where
    # this run's profiles have them.
    pipes = any("top_pipe" in e or "issue_slots_busy_pct" in e for e in kernels.values())
    lines = ["**Nsight Compute** (`scripts/profile_kernels.py` under ncu, one launch each, caches flushed):", "",
             "| kernel | duration | memory throughput % of peak | DRAM % | achieved / theoretical occupancy % | "
             "registers | grid x block |" + (" top stalls (warps per issue) |" if stalls else "")
             + (" busiest pipe % / issue slots busy % |" if pipes else ""),
             "|---|---|---|---|---|---|---|" + ("---|" if stalls else "") + ("---|" if pipes else "")]
    for name, k in kernels.items():
        if "error" in k:
            lines.append(f"| {name} | error: {k['error'][:60]} | | | | | |" + (" |" if stalls else "")
                         + (" |" if pipes else ""))
            continue
        pipe = (f" {k.get('top_pipe', '—')} {_f(k.get('top_pipe_pct'), '{:g}')} / "
                f"{_f(k.get('issue_slots_busy_pct'), '{:g}')} |")
        top = sorted(((v, r.removeprefix("stall_")) for r, v in k.items()
                      if r.startswith("stall_") and not r.endswith("_unit")), reverse=True)[:2]
        lines.append(f"| {name} | {_f(k.get('duration'), '{:g}')} {k.get('duration_unit', '')} | "
                     f"{_f(k.get('memory_throughput'), '{:g}')} | {_f(k.get('dram_throughput_pct'), '{:g}')} | "
                     f"{_f(k.get('achieved_occupancy_pct'), '{:g}')} / "
                     f"{_f(k.get('theoretical_occupancy_pct'), '{:g}')} | "
                     f"{_f(k.get('registers_per_thread'), '{:.0f}')} | {_f(k.get('grid_size'), '{:.0f}')} x "
                     f"{_f(k.get('block_size'), '{:.0f}')} |"
                     + (f" {', '.join(f'{r} {v:.2f}' for v, r in top) or '—'} |" if stalls else "")
                     + (pipe if pipes else ""))
    return lines + [""] + sass_lines(kernels)


def sass_lines(kernels: dict) -> list[str]:
    """Where a profile kept ncu's per-instruction counters (gpu_check.NCU_SOURCE_PROFILES): the
    warp instructions executed, the opcodes that took most of them, and the instructions with
    the most warp-state samples."""
    out = []
    for name, k in kernels.items():
        sass = k.get("sass") or {}
        if not sass.get("inst_executed"):
            continue
        total, samples = sass["inst_executed"], sass.get("samples") or 0
        ops = ", ".join(f"{o['op']} {100 * o['executed'] / total:.0f}%" for o in sass.get("by_opcode", [])[:6])
        hot = ", ".join(f"`{' '.join(w for w in r['sass'].split()[:2] if not w.startswith('R'))}` at {r['address']} "
                        f"{100 * r['samples'] / samples:.0f}%"
                        for r in sass.get("top_samples", [])[:4]) if samples else ""
        out.append(f"- {name}, per instruction (ncu's source page): {total:,.0f} warp instructions executed "
                   f"({ops})" + (f"; most warp-state samples at {hot}" if hot else "") + ".")
    return out + [""] if out else []


def _bitwise_anyway(c: dict) -> bool:
    """A tolerance check entry whose samples all came out bitwise identical: none differing, no
    log-likelihood difference, and (when recorded) equal sha256 of both runs' values."""
    sha = c.get("sha256") or {}
    return (c.get("differing_samples") == 0 and c.get("max_abs_ll_diff") == 0
            and (not sha or sha.get("original") == sha.get("compressed")))


def eval_table(ev: dict) -> list[str]:
    cells = {}
    units = []
    for c in ev.get("checks", []):
        name = c.get("name", "")
        if not name.startswith("eval "):
            continue
        parts = name.split(" ")
        if c.get("status") == "skip" and len(parts) == 2:
            units.append(parts[1])
            cells[(parts[1], "*")] = "skipped: " + str(c.get("why", ""))[:60]
            continue
        if len(parts) != 3:
            continue
        unit, mode = parts[1], parts[2]
        if unit not in units:
            units.append(unit)
        n = c.get("samples")
        if c.get("status") == "pass":
            if c.get("check") == "bitwise":
                cells[(unit, mode)] = f"bitwise ({n} docs)"
            elif _bitwise_anyway(c):
                cells[(unit, mode)] = f"bitwise ({n} docs; tolerance check)"
            else:
                cells[(unit, mode)] = "within tolerance"
        else:
            cells[(unit, mode)] = f"DIFFERS ({c.get('differing_samples')} of {n})"
    if not units:
        return []
    modes = ("dense", "huffman", "palette")
    lines = ["**Eval** (unweight eval's per-sample check: every log-likelihood of the compressed model against the "
             "BF16 model, both on CUDA):", "", "| task | " + " | ".join(modes) + " |", "|---|" + "---|" * len(modes)]
    for u in units:
        if (u, "*") in cells:
            lines.append(f"| {u} | {cells[(u, '*')]} |" + " |" * (len(modes) - 1))
        else:
            lines.append(f"| {u} | " + " | ".join(cells.get((u, m), "—") for m in modes) + " |")
    return lines + [""]


def render(by_gpu: dict) -> str:
    out = [HEADING, ""]
    if not by_gpu:
        return "\n".join(out + [NONE_YET, ""])
    # Newest run first; an older GPU's figures stay, under their own heading.
    order = sorted(by_gpu, key=lambda g: max(r.get("started", "") for r in by_gpu[g].values()), reverse=True)
    for gpu in order:
        out += render_gpu(gpu, by_gpu[gpu], several=len(order) > 1)
    return "\n".join(out).rstrip() + "\n"


def render_gpu(gpu: str, recs: dict, several: bool) -> list[str]:
    """The lines of one GPU's results (its own ### heading when several GPUs are recorded)."""
    out = [f"### {gpu}", ""] if several else []
    env = next((r["env"] for st in STAGE_ORDER for r in [recs.get(st)] if r and r.get("env")), {}) or {}
    codes = sorted({_code(r.get("env") or {}) for r in recs.values()})
    code = codes[0] if len(codes) == 1 else "as listed per stage"
    dates = sorted({r.get("started", "")[:10] for r in recs.values()})
    fake = " (FAKE DATA from a dry run)" if any(r.get("fake") for r in recs.values()) else ""
    out += [f"Measured on {gpu}{fake} (driver {env.get('driver') or '?'}, "
            f"CUDA {env.get('torch_cuda') or '?'}, torch {env.get('torch') or '?'}) on {', '.join(dates)}, code "
            f"{code}, by `python scripts/gpu_check.py` (two device calls, see its docstring); raw JSON in "
            f"[benchmarks/results/gpu/](benchmarks/results/gpu/).", ""]
    out += stage_table(recs) + [""]
    if any(str(_code(r.get("env") or {})).endswith("-dirty") for r in recs.values()):
        out += ["A code ending in -dirty ran that commit plus changes no commit holds exactly (see the JSON's "
                "source_sha256).", ""]
    fails = failures(recs)
    if fails:
        out += ["Failed checks:", ""] + fails + [""]
    bench = recs.get("bench") or {}
    out += goals_table(bench)
    out += (clocks_line(bench) + decode_table(bench) + slots_lines(bench) + kernels_table(bench) + probe_table(bench)
            + e2e_table(bench)
            + e2e_table(bench, "e2e_full") + host_table(bench) + moe_table(bench) + profile_table(bench))
    out += eval_table(recs.get("eval") or {})
    model = recs.get("model") or {}
    loads = [c for c in model.get("checks", []) if c.get("name", "").startswith("unweight.load(")]
    if loads:
        ok = sum(c.get("status") == "pass" for c in loads)
        bitwise = sum(bool(c.get("logits_bitwise")) for c in loads)
        out += [f"SmolLM2-135M loaded with `unweight.load(..., device=\"cuda\")`: {ok} of {len(loads)} mode / "
                f"checkpoint combinations passed, {bitwise} with logits bitwise equal to the BF16 model's.", ""]
    return out


def replace_section(text: str, section: str) -> str:
    lines = text.splitlines(keepends=True)
    start = next((i for i, ln in enumerate(lines) if ln.rstrip() == HEADING), None)
    if start is None:
        return text.rstrip("\n") + "\n\n" + section
    end = next((j for j in range(start + 1, len(lines)) if lines[j].startswith("## ")), len(lines))
    tail = "".join(lines[end:])
    return "".join(lines[:start]) + section + ("\n" + tail if tail else "")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=DEFAULT_RESULTS, help="folder of stage JSONs (default: %(default)s)")
    ap.add_argument("--readme", default=os.path.join(bu.ROOT, "README.md"))
    ap.add_argument("--out", help="write the section alone here instead of editing the README")
    ap.add_argument("--import", dest="import_dir", metavar="DIR", help="copy a device run's stage JSONs in first")
    ap.add_argument("--check", action="store_true", help="exit 1 when the README's section differs from the render")
    ap.add_argument("--allow-fake", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.import_dir:
        if not os.path.isdir(args.import_dir):
            print(f"render_gpu_results: {args.import_dir}: no such folder", file=sys.stderr)
            return 2
        for p in import_run(args.import_dir, args.results):
            print("imported", os.path.relpath(p, bu.ROOT))
    section = render(load_records(args.results, args.allow_fake))
    if args.out:
        with open(args.out, "w") as f:
            f.write(section)
        return 0
    if not os.path.exists(args.readme):
        print(f"render_gpu_results: {args.readme}: no such file", file=sys.stderr)
        return 2
    with open(args.readme) as f:
        text = f.read()
    new = replace_section(text, section)
    if args.check:
        if new != text:
            print("render_gpu_results: the README's GPU results section is stale; run scripts/render_gpu_results.py",
                  file=sys.stderr)
            return 1
        return 0
    if new != text:
        with open(args.readme, "w") as f:
            f.write(new)
        print(f"rewrote the {HEADING[3:]} section of {os.path.relpath(args.readme, bu.ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
