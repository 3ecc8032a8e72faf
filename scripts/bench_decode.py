#!/usr/bin/env python3
"""Benchmark the GPU decode kernels: Huffman -> BF16, palette -> BF16 and the Huffman -> palette
transcode, on Llama-3.1-8B layer shapes, against a device-to-device copy of the dense BF16
weights measured in the same process.  Needs a CUDA GPU; exits with status 2 and one line
otherwise.

    python scripts/bench_decode.py [--shapes 4096x4096,128256x4096] [--runs 25] [--out PATH]
                                   [--write-cache [PATH]] [--write-defaults]
    python scripts/bench_decode.py --from-json RESULT.json --write-defaults   # no GPU needed

Method (scripts/_bench_util.py, graph_time): weights are N(0, 0.02) BF16 made on the GPU,
encoded by the host codec; each variant rotates over copies of its planes and outputs
spanning >= 4x the L2, launches are captured in a CUDA graph and replayed between CUDA events
(median and min of >= 20 replays, no host sync inside).  Every decoded weight is first
checked bitwise against the original.  The transcode reads two values back to the host by
design (a load-time operation), so it is timed call by call between events.

GB/s: out_GBps counts the BF16 bytes written; moved_GBps counts planes read + BF16 written,
the number to hold against the copy's read + write rate.

Order: first, over every shape, the streams the GPU loaders hold (Huffman with the checkpoint
index at S = 256, and palette, each with every decoder variant) beside the copy; then the
routed MoE decode; then, over every shape, the rest.  A budget that runs out leaves the rest
out first.

The palette stream is timed again with its planes tile-major ("palette_tiled" rows, each
decoder variant; ops/layout.py), the order a runtime may hold its matmul weights in, whose
decode + cuBLAS path (large batches) then reads them that way.

Decoder choice: each stream is timed with every decoder variant (the same bits), and the
runtime decodes a weight of that device, shape, encoding and checkpoint interval with the
variant that was strictly faster than the default in the same run (runtime/tuning_table.py,
"decoders").  --write-cache / --write-defaults record those choices in the user's tuning
cache / the shipped tuning_defaults.json; --from-json takes them from a recorded run (a result
JSON of this script, or a bench stage JSON of scripts/gpu_check.py, whose raw.decode it reads).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _bench_util as bu  # noqa: E402


def _time_transcode(torch, ops, header, planes, lut, err, runs):
    times = []
    for _ in range(runs):
        if torch.cuda.is_available():
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            out = ops.transcode_to_palette(header, planes, lut, err)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            out = ops.transcode_to_palette(header, planes, lut, err)
            times.append((time.perf_counter() - t0) * 1e3)
        del out
    return {"median_ms": sorted(times)[len(times) // 2], "min_ms": min(times), "runs_ms": times, "graph": False}


def _time_index(torch, ops, enc, planes, lut, err, runs, dense) -> dict:
    """The checkpoint index a GPU load adds to a huffman weight stored without one (S =
    LOAD_CHK_INTERVAL): built on the device (ops.build_index) against the host codec's
    tc.with_index (all host threads), each timed, the device's plane checked against the host's
    byte for byte.  out_GBps: GB of BF16 weights indexed per second."""
    from unweight.codec import tensor_codec as tc
    from unweight.format import constants as C
    t0 = time.perf_counter()
    want = tc.with_index(enc.header, enc.planes, chk_interval=C.LOAD_CHK_INTERVAL)
    host_ms = (time.perf_counter() - t0) * 1e3
    got = ops.build_index(enc.header, planes, lut, err)
    same = (got is None) == (want.header is enc.header) and (
        got is None or got[1][C.SUFFIX_CHK].cpu().numpy().tobytes() == want.planes[C.SUFFIX_CHK].tobytes())
    del got
    times = []
    for _ in range(runs):
        bu.sync(torch)
        t0 = time.perf_counter()
        ops.build_index(enc.header, planes, lut, err)  # reads the error counter back: a host sync
        bu.sync(torch)
        times.append((time.perf_counter() - t0) * 1e3)
    med = sorted(times)[len(times) // 2]
    return {"median_ms": med, "min_ms": min(times), "runs_ms": times, "matches_host_codec": same,
            "host_ms": host_ms, "out_GBps": dense / (med * 1e-3) / 1e9, "host_GBps": dense / (host_ms * 1e-3) / 1e9}


def _time_load_check(torch, ops, h, ew, enc, out, err, runs, dense) -> dict:
    """The load check of a palette weight as a GPU holds it (runtime/verify.py): decoded into a
    buffer and hashed there (ops.crc32_ranges), against the host pass it replaces (the CPU
    codec's decode and crc32 of the stored planes, all host threads).  The device's crc32 is
    checked against the header's.  out_GBps: GB of BF16 weights checked per second; crc_GBps:
    the hash alone."""
    from unweight.codec.verify import decode_verified
    t0 = time.perf_counter()
    decode_verified(enc.header, enc.planes, keep=False)
    host_ms = (time.perf_counter() - t0) * 1e3
    h.decode_op(ew, out, err)
    crc = int(ops.crc32_ranges(out, 1).view(torch.int32).item()) & 0xFFFFFFFF
    t = bu.graph_time(torch, [lambda: (h.decode_op(ew, out, err), ops.crc32_ranges(out, 1))], runs=runs)
    c = bu.graph_time(torch, [lambda: ops.crc32_ranges(out, 1)], runs=runs)
    return {**t, "crc_median_ms": c["median_ms"], "matches_header": crc == enc.header.crc32, "host_ms": host_ms,
            "out_GBps": dense / (t["median_ms"] * 1e-3) / 1e9, "crc_GBps": dense / (c["median_ms"] * 1e-3) / 1e9,
            "host_GBps": dense / (host_ms * 1e-3) / 1e9}


INDEX_INTERVALS = (1024, 256)
# A finer index, timed on matrices whose chains at S = 256 cannot fill the device at RING_MAX's
# two 512-thread CTAs per SM (4096 x 4096: 65,536 chains where 132 SMs hold 135,168): S = 128
# doubles their chains.  The loaders keep S = 256 until a run shows this faster.
FINE_INTERVAL = 128


def index_intervals(torch, N: int, K: int) -> tuple:
    """The checkpoint intervals a matrix's huffman rows are timed at: INDEX_INTERVALS, and
    FINE_INTERVAL where the device holds more RING_MAX threads than it has chains at S = 256."""
    from unweight.runtime import kernel_plan as kp
    if bu.device(torch) != "cuda":
        return INDEX_INTERVALS
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    resident = sms * kp.HUFF_RING_MAX_CTAS_PER_SM * kp.HUFF_RING_MAX_THREADS
    return INDEX_INTERVALS + ((FINE_INTERVAL,) if N * K // 256 < resident else ())


def other_decoders(kp) -> dict:
    """{encoding: decoder variant names} timed beside the runtime's default on each stream
    (runtime.kernel_plan.HUFF_VARIANTS / PAL_VARIANTS, less the default and Huffman's SCALAR,
    the fallback of shapes the vector readers cannot take); the default's row has no suffix."""
    return {"huffman": [n for n, v in kp.HUFF_VARIANTS.items() if v not in (kp.HUFF_DEFAULT_VARIANT,
                                                                            kp.HUFF_VARIANT_SCALAR)],
            "palette": [n for n, v in kp.PAL_VARIANTS.items() if v != kp.PAL_DEFAULT_VARIANT]}


def default_decoders() -> dict:
    """{encoding: the name of the variant the extension runs unless named} (the unsuffixed rows)."""
    from unweight.runtime.tuning_table import default_decoder
    return {enc: default_decoder(enc) for enc in ("huffman", "palette")}


def decoders_from_rows(rows, device_name: str, defaults: dict | None):
    """TuningTable whose "decoders" hold the decoder times of a recorded run's rows: per shape
    and stream (palette; huffman at each checkpoint interval), the median of each variant
    whose decode was bitwise, the unsuffixed row under the run's default (`defaults`, the
    run's default_decoders; None: a run that did not record them, whose rows say nothing).
    Streams timed with one variant only are left out (nothing to choose)."""
    from unweight.runtime.tuning_table import TuningTable
    table = TuningTable()
    if not defaults:
        return table
    for r in rows:  # (a row with an error keeps the timings its shape made before it)
        streams: dict = {}
        for key, v in r.items():
            if not isinstance(v, dict) or "median_ms" not in v or not v.get("bitwise"):
                continue
            if key.startswith("huffman+index"):
                s_chk, _, variant = key[len("huffman+index"):].partition("+")
                if not s_chk.isdigit():
                    continue
                enc, S = "huffman", int(s_chk)
            elif key == "palette" or key.startswith("palette+"):
                enc, S, variant = "palette", 0, key.partition("+")[2]
            else:
                continue  # the copy, the transcode, the unindexed stream (its default only)
            streams.setdefault((enc, S), {})[variant or defaults.get(enc, "")] = v["median_ms"]
        for (enc, S), times in sorted(streams.items()):
            if len(times) > 1 and defaults.get(enc) in times:
                table.record_decoders(device_name, r["N"], r["K"], enc, S, times, defaults[enc])
    return table


# The parts of the decode benchmark, in the order run() takes each over every shape before the
# next: the streams the GPU loaders hold ("loaders": the copy, Huffman at the loaders' checkpoint
# interval and palette, each with every decoder variant: what the decode goals and the decoder
# choices are read from), then the rest (the stream as stored with the transcode to palette, the
# other checkpoint intervals, palette tile-major).
DECODE_PARTS = ("loaders", "rest")


def bench_shape(torch, name, N, K, seed, runs, l2, skip=(), part: str | None = None, row: dict | None = None):
    """One shape's decode rows: every stream (part None), or one part of DECODE_PARTS, into `row`
    (the shape's row of an earlier part) when given."""
    import numpy as np

    from unweight import ops
    from unweight.codec import tensor_codec as tc
    from unweight.format import constants as C
    h = bu.import_helpers()
    dev = bu.device(torch)
    err = torch.zeros(1, dtype=torch.int32, device=dev)
    w = bu.bf16_weights(torch, N, K, seed)
    w_bits = h.bits(w)
    dense = N * K * 2
    loaders, rest = part in (None, "loaders"), part in (None, "rest")
    row = row if row is not None else {"shape": name, "N": N, "K": K, "bf16_bytes": dense}
    if loaders:
        # Dense baseline: copy the BF16 weights (2 B read + 2 B written per weight).
        k = bu.rotation_copies(2 * dense, l2)
        srcs = [w] + [w.clone() for _ in range(k - 1)]
        dsts = [torch.empty_like(w) for _ in range(k)]
        t = bu.graph_time(torch, [lambda s=s, d=d: d.copy_(s) for s, d in zip(srcs, dsts)], runs=runs)
        row["copy"] = {**t, "out_GBps": dense / (t["median_ms"] * 1e-3) / 1e9,
                       "moved_GBps": 2 * dense / (t["median_ms"] * 1e-3) / 1e9}
        del srcs, dsts
    encs = {e: tc.encode(w_bits, e) for e in ("huffman", "palette")}
    # The file's stream as stored (one chain per segment) and with a checkpoint index (chains of
    # S weights: the GPU loaders' S = 256, a file's --index S = 1024, and FINE_INTERVAL where
    # index_intervals adds it).
    for s_chk in index_intervals(torch, N, K):
        if (s_chk == C.LOAD_CHK_INTERVAL and loaders) or (s_chk != C.LOAD_CHK_INTERVAL and rest):
            encs[f"huffman+index{s_chk}"] = tc.with_index(encs["huffman"].header, encs["huffman"].planes,
                                                          chk_interval=s_chk)
    stored = encs.pop("huffman")  # (timed in the rest, with the transcode)
    if rest:
        encs = {"huffman": stored, **encs}
    from unweight.runtime import kernel_plan as kp
    decoders = other_decoders(kp)
    for e, enc in encs.items():
        ew = bu.as_gpu_loaders_hold(h.encoded_weight(enc, dev, err))
        nb = bu.encoded_bytes(ew)
        k = bu.rotation_copies(nb + dense, l2)
        ws = [ew] + [bu.clone_encoded(ew) for _ in range(k - 1)]
        outs = [torch.empty((N, K), dtype=torch.bfloat16, device=dev) for _ in range(k)]
        others = (decoders["huffman"] if e.startswith("huffman+index") else
                  decoders["palette"] if e == "palette" else ())
        others = tuple(v for v in others if f"{e.split('+')[0]}:{v}" not in skip)

        def time_variants(key, copies, outs):
            for v in ("", *others):
                code = (kp.PAL_VARIANTS[v] if e == "palette" else kp.HUFF_VARIANTS[v]) if v else 0
                bitwise = all(np.array_equal(g, w_bits) for g in h.decode_poisoned(copies[0], err, code))
                t = bu.graph_time(torch, [lambda x=x, o=o: h.decode_op(x, o, err, code) for x, o in zip(copies, outs)],
                                  runs=runs)
                s = t["median_ms"] * 1e-3
                row[key + (f"+{v}" if v else "")] = {**t, "bitwise": bitwise, "planes_bytes": nb, "ratio": nb / dense,
                                                     "out_GBps": dense / s / 1e9,
                                                     "moved_GBps": (nb + dense) / s / 1e9}
        if e != "palette" or loaders:
            time_variants(e, ws, outs)
        if e == "palette" and loaders:
            row["load_check"] = _time_load_check(torch, ops, h, ew, enc, outs[0], err, max(5, runs // 2), dense)
        if e == "palette" and rest and "tiled" not in skip and kp.pal_tiled_ok(N, K):
            # The same planes tile-major (ops/layout.py), as a runtime holding its matmul weights
            # that way decodes them for decode + cuBLAS ("palette_tiled": not a decoder variant).
            time_variants("palette_tiled", [bu.clone_encoded(x, tiled=True) for x in ws], outs)
        if e == "huffman":
            planes = h.huffman_planes(enc, ew)
            hdr, got = ops.transcode_to_palette(enc.header, planes, ew.lut, err)
            ref = tc.transcode_to_palette(enc.header, enc.planes)
            same = bool(np.array_equal(hdr.pack(), ref.header.pack()) and
                        np.array_equal(got[C.SUFFIX_IDX].cpu().numpy(), ref.planes[C.SUFFIX_IDX]))
            del got
            t = _time_transcode(torch, ops, enc.header, planes, ew.lut, err, max(5, runs // 2))
            row["transcode"] = {**t, "matches_host_codec": same,
                                "out_GBps": dense / (t["median_ms"] * 1e-3) / 1e9}
            row["index"] = _time_index(torch, ops, enc, planes, ew.lut, err, max(5, runs // 2), dense)
        del ws, outs, ew
        bu.empty_cache(torch)
    row["device_errors"] = row.get("device_errors", 0) + int(err.item())
    return row


# A mixture-of-experts layer's projection for the routed decode (runtime/expert_slots.py): 32
# experts of Qwen3-30B-A3B's gate+up shape at TP=1 (32 of its 128: the weights pass through the
# host, ~0.2 GB each way), and the slot counts timed: one token's top-8 and every expert.
SLOTS_LAYER = (32, 1536, 2048)
SLOTS_COUNTS = (8, 32)


# What bench_slots may need on a GPU (the layer made, copied and encoded on the device, then its
# timings): a bound, not a measurement.
SLOTS_SECONDS = 20.0


def bench_slots(torch, runs, l2, layer=SLOTS_LAYER, counts=SLOTS_COUNTS) -> dict:
    """The expert-slot decode (ops.decode_palette_slots: the routed experts of a palette stack by
    ids on the device) against decoding the same experts one launch each (ops.decode_palette
    on each expert's own planes, what a layer of per-expert pieces does), at each slot count:
    the ids rotate over disjoint sets so the planes read span >= 4x the L2 where the layer
    allows.  Every slot decode is first checked bitwise."""
    import numpy as np

    from unweight.runtime.expert_slots import ExpertSlots
    h = bu.import_helpers()
    dev = bu.device(torch)
    E, rows, cols = layer
    w = np.stack([h.bits(bu.bf16_weights(torch, rows, cols, seed=100 + e)) for e in range(E)])
    # The slots' build at load (the host weights copied over and encoded on the device), timed
    # once with its host syncs, as a load runs it.
    bu.sync(torch)
    t0 = time.perf_counter()
    slots = ExpertSlots.from_weights(w, dev)
    bu.sync(torch)
    build_s = time.perf_counter() - t0
    err = torch.zeros(1, dtype=torch.int32, device=dev)
    planes_per_expert = rows * (cols + (cols + 1) // 2)  # sign+mantissa and index bytes
    res = {"experts": E, "rows": rows, "cols": cols, "verbatim_per_expert": int(slots.vpos.shape[1]),
           "padding_bytes": int(slots.padding_bytes), "held_bytes": slots.held_bytes(), "rows_by_slots": [],
           "build_ms": build_s * 1e3, "build_ms_per_GB": build_s * 1e3 / (E * rows * cols * 2 / 1e9)}
    # Each expert as a weight of its own (views of the stack), for the one-launch-per-expert baseline.
    from unweight.format import constants as C
    from unweight.runtime.weights import EncodedWeight
    own = [EncodedWeight(C.ENC_PALETTE, rows, cols, *slots.grid, 0, 0, slots.palette, slots.sm[e], idx=slots.idx[e],
                         vpos=slots.vpos[e], vexp=slots.vexp[e]) for e in range(E)]
    for S in counts:
        sets = max(1, min(E // S, bu.rotation_copies(S * planes_per_expert, l2)))
        id_lists = [[(i * S + j) % E for j in range(S)] for i in range(sets)]
        ids = [torch.tensor(x, device=dev) for x in id_lists]
        outs = [torch.empty(S * rows * cols, dtype=torch.bfloat16, device=dev) for _ in range(sets)]
        got = slots.decode(ids[0], outs[0])
        bitwise = bool(np.array_equal(h.bits(got), w[id_lists[0]]))
        t = bu.graph_time(torch, [lambda i=i, o=o: slots.decode(i, o) for i, o in zip(ids, outs)], runs=runs)
        r = {"slots": S, "bitwise": bitwise, "rotation_sets": sets, **t,
             "out_GBps": S * rows * cols * 2 / (t["median_ms"] * 1e-3) / 1e9}

        def one_each(x, o):
            for j, e in enumerate(x):
                h.decode_op(own[e], o[j * rows * cols:(j + 1) * rows * cols].view(rows, cols), err)
        t1 = bu.graph_time(torch, [lambda x=x, o=o: one_each(x, o) for x, o in zip(id_lists, outs)], runs=runs)
        r["one_launch_per_expert"] = {**t1, "time_vs_slots": t1["median_ms"] / t["median_ms"]}
        # A decode step's routed projection, one token per slot: the slots GEMV on the compressed
        # stack (ExpertSlots.gemv) against the slot decode + a batched matmul on the decoded
        # experts (what the layer runs without it).  time_vs_decode_matmul < 1: the GEMV wins.
        xs = torch.randn(S, cols, device=dev).to(torch.bfloat16)

        def decode_matmul(i, o):
            wd = slots.decode(i, o)
            return torch.bmm(wd, xs.unsqueeze(-1))
        try:
            tg = bu.graph_time(torch, [lambda i=i: slots.gemv(xs, i) for i in ids], runs=runs)
            td = bu.graph_time(torch, [lambda i=i, o=o: decode_matmul(i, o) for i, o in zip(ids, outs)], runs=runs)
            y = slots.gemv(xs, ids[0]).float()
            ref = decode_matmul(ids[0], outs[0]).squeeze(-1).float()
            r["slots_gemv"] = {**tg, "decode_matmul_ms": td["median_ms"],
                               "time_vs_decode_matmul": tg["median_ms"] / td["median_ms"],
                               "weight_GBps": S * planes_per_expert / (tg["median_ms"] * 1e-3) / 1e9,
                               "max_rel_diff": float((y - ref).abs().max() / ref.abs().max().clamp_min(1e-30))}
        except Exception as ex:  # noqa: BLE001 - a failing kernel is a finding
            r["slots_gemv"] = {"error": f"{type(ex).__name__}: {ex}"}
        res["rows_by_slots"].append(r)
    res["device_errors"] = int(err.item())
    return res


def run(torch, shapes, budget: "bu.Budget", runs: int = 25, out_path: str | None = None, log=print,
        skip: dict | None = None, slots_layer: tuple | None = SLOTS_LAYER) -> dict:
    """Decode benchmark over `shapes` [(name, N, K)] within `budget`, in the parts of
    DECODE_PARTS, each over every shape before the next (the routed MoE decode between them); a
    shape that fails is recorded with its error ("<part>: ...") and the next one still runs.
    Writes out_path after every shape.
    skip: {"huffman:<variant>" | "palette:<variant>": why} decoder variants left out.
    slots_layer: (experts, rows, cols) of the routed MoE decode's layer (bench_slots; None: not
    timed)."""
    skip = dict(skip or {})
    l2 = bu.l2_bytes(torch)
    res = {"benchmark": "decode", "environment": bu.environment(torch), "l2_bytes": l2, "runs": runs,
           "rotate_l2_factor": bu.ROTATE_L2_FACTOR, "rows": [],
           "skipped": [{"variant": t, "why": why} for t, why in sorted(skip.items())]}
    res["default_decoders"] = default_decoders()
    res["copy_1GiB"] = bu.copy_bandwidth(torch)
    res["parts"] = list(DECODE_PARTS)
    # The routed MoE decode's time is kept from the loaders' streams: the shapes' figures stand
    # from earlier runs, the slots GEMV's had none (an H200 run spent the step's time before it).
    keep = SLOTS_SECONDS if slots_layer is not None else 0.0
    rows: dict = {}  # {shape: its row}
    place = {name: i for i, (name, *_) in enumerate(shapes)}

    def shapes_part(part: str, reserve: float) -> None:
        # Before two shapes are timed: ~80 ns/weight for encoding on the host, the checked
        # decodes and the timings (a part: about half of them); then the part's own rate.
        est = bu.WorkEstimate(5, 4e-8)
        for i, (name, N, K) in enumerate(shapes):
            if part != DECODE_PARTS[0] and (name not in rows or "error" in rows[name]):
                continue  # (a shape whose first part did not run or failed)
            need = est.need(N * K)
            if budget.left() - reserve < need:
                res["skipped"].append({"shape": name, "part": part,
                                       "why": f"{budget.left():.0f} s left, about {need:.0f} s needed"})
                continue
            t0 = time.monotonic()
            try:
                row = bench_shape(torch, name, N, K, i, runs, l2, skip, part, rows.get(name))
            except Exception as e:  # noqa: BLE001 - a failing kernel is a finding; the next shape still runs
                row = rows.get(name) or {"shape": name, "N": N, "K": K}
                row["error"] = f"{part}: {type(e).__name__}: {e}"
                bu.sync(torch)
            else:
                est.record(N * K, time.monotonic() - t0)
            rows[name] = row
            log(f"decode {name} ({part}): " + ", ".join(
                f"{e} {v['median_ms']:.4f} ms ({v.get('out_GBps', 0):.0f} GB/s)"
                for e, v in row.items() if isinstance(v, dict) and "median_ms" in v)
                + (f" ERROR {row['error']}" if "error" in row else ""))
            res["rows"] = sorted(rows.values(), key=lambda r: place[r["shape"]])
            if out_path:
                bu.write_json(out_path, res)
            bu.empty_cache(torch)

    shapes_part("loaders", keep)
    # The routed MoE decode, where the budget leaves room (~10 s: the layer encoded on the host).
    if slots_layer is not None and budget.left() > SLOTS_SECONDS:
        try:
            res["moe_slots"] = bench_slots(torch, runs, l2, slots_layer,
                                           tuple(c for c in SLOTS_COUNTS if c <= slots_layer[0]) or (slots_layer[0],))
            log("decode moe slots: " + ", ".join(
                f"{r['slots']} slots {r['median_ms']:.4f} ms ({r['out_GBps']:.0f} GB/s)"
                + (f", one launch per expert x{r['one_launch_per_expert']['time_vs_slots']:.2f}"
                   if "one_launch_per_expert" in r else "") for r in res["moe_slots"]["rows_by_slots"]))
        except Exception as e:  # noqa: BLE001 - a failing kernel is a finding
            res["moe_slots"] = {"error": f"{type(e).__name__}: {e}"}
            bu.sync(torch)
        if out_path:
            bu.write_json(out_path, res)
    elif slots_layer is not None:
        res["skipped"].append({"shape": "moe slots", "why": f"{budget.left():.0f} s left"})
    shapes_part("rest", 0.0)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", type=bu.shapes_arg, default=None,
                    help="NxK,... (default: Llama-3.1-8B's o, qkv, mlp up, mlp down, lm_head)")
    ap.add_argument("--runs", type=bu.positive_int, default=25, help="timed graph replays per variant (>= 20)")
    ap.add_argument("--budget", type=bu.positive_float, default=600.0,
                    help="seconds; shapes that would not fit are skipped")
    ap.add_argument("--out", help="result JSON (default: benchmarks/results/decode-<date>-<gpu>-<commit>.json)")
    ap.add_argument("--write-cache", nargs="?", const="", default=None, metavar="PATH",
                    help="record the decoder choices in the user's tuning cache (or PATH)")
    ap.add_argument("--write-defaults", action="store_true",
                    help="record the decoder choices in unweight/runtime/tuning_defaults.json")
    ap.add_argument("--from-json", metavar="RESULT", help="take the timings from a recorded run (no GPU)")
    args = ap.parse_args(argv)
    if args.from_json:
        return _from_json(args)
    out = bu.writable_path(args.out, "bench_decode") if args.out else None
    torch = bu.require_gpu()
    shapes = args.shapes or bu.parse_shapes(None)
    out = out or bu.result_path("decode", bu.machine_tag(torch.cuda.get_device_name(0)))
    res = run(torch, shapes, bu.Budget(args.budget), args.runs, out)
    rows = [{"shape": r["shape"], **{f"{e}_ms": round(r[e]["median_ms"], 4) for e in ("copy", "huffman", "palette",
                                                                                       "transcode") if e in r},
             **{f"{e}_GBps": round(r[e]["out_GBps"], 1) for e in ("huffman", "palette") if e in r}}
            for r in res["rows"] if "error" not in r]
    bu.print_table(rows, ["shape", "copy_ms", "huffman_ms", "palette_ms", "transcode_ms", "huffman_GBps",
                          "palette_GBps"])
    print("wrote", bu.write_json(out, res))
    if bu.nothing_measured("bench_decode", res, out):
        return 1
    env = res["environment"]
    measured = decoders_from_rows(res["rows"], env.get("gpu"), res["default_decoders"])
    print_choices(measured)
    return bu.write_tuning(measured, args.write_cache, args.write_defaults, bu.tuning_stamp(env, "bench_decode"),
                           "bench_decode")


def default_candidates(measured) -> list:
    """The variants faster than the run's default on every shape of a stream: [(encoding, S,
    variant, shapes, least and most time saved as fractions of the default's time)], the
    fastest-everywhere first.  Such a variant is the case for changing the compiled-in default
    (kernel_plan.h / kernel_plan.py HUFF_DEFAULT_VARIANT, PAL_DEFAULT_VARIANT); one that wins on
    some shapes only is what the tuning table's per-shape choice is for."""
    from unweight.runtime.tuning_table import split_key
    streams: dict = {}
    for key, e in measured.decoders.items():
        *_, enc, s_chk = split_key(key)
        streams.setdefault((enc, int(s_chk)), []).append(e)
    out = []
    for (enc, S), entries in sorted(streams.items()):
        default = entries[0]["default"]
        if any(e["default"] != default for e in entries):
            continue  # rows of runs with different defaults say nothing together
        names = set.intersection(*(set(e["times_ms"]) for e in entries)) - {default}
        for name in sorted(names):
            saved = [1 - e["times_ms"][name] / e["times_ms"][default] for e in entries]
            if min(saved) > 0:
                out.append((enc, S, name, len(entries), min(saved), max(saved)))
    return sorted(out, key=lambda c: -c[4])


def print_choices(measured) -> None:
    for key, e in sorted(measured.decoders.items()):
        print(f"{key}: decoder {e['choice']} (default {e['default']}; "
              + ", ".join(f"{n} {t:.4f} ms" for n, t in sorted(e["times_ms"].items())) + ")")
    for enc, S, name, n, lo, hi in default_candidates(measured):
        stream = f"{enc}, index S={S}" if enc == "huffman" else enc
        print(f"{stream}: {name} is faster than the default on all {n} shapes ({lo:.1%}-{hi:.1%} less time): "
              f"a case for making it the compiled-in default")


def _from_json(args) -> int:
    doc = bu.read_result(args.from_json, "bench_decode")
    if doc is None:
        return 2
    dec = ((doc.get("raw") or {}).get("decode") or doc) if isinstance(doc, dict) else {}
    env = (doc.get("env") or doc.get("environment") or {}) if isinstance(doc, dict) else {}
    gpu = env.get("gpu") or (dec.get("environment") or {}).get("gpu")
    if not gpu or not isinstance(dec, dict) or not dec.get("rows"):
        print(f"{args.from_json}: no decode rows or GPU name in it", file=sys.stderr)
        return 2
    if not dec.get("default_decoders"):
        print(f"{args.from_json}: the run did not record its default decoders; its rows choose nothing",
              file=sys.stderr)
        return 2
    measured = decoders_from_rows(dec["rows"], gpu, dec["default_decoders"])
    print_choices(measured)
    stamp = bu.tuning_stamp({**env, "gpu": gpu}, "bench_decode", args.from_json, doc.get("started"))
    return bu.write_tuning(measured, args.write_cache, args.write_defaults, stamp, "bench_decode")


if __name__ == "__main__":
    sys.exit(main())
