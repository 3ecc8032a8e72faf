#!/usr/bin/env python3
"""Codec benchmark: unweight vs ZipNN, OpenZL and DFloat11 side by side, in one run, on real and synthetic weights.

Models: MiniLM-L6 (BF16), SmolLM2-135M (BF16), and a Gaussian N(0, 0.02) BF16 file of
>= 256M weights with Llama-3.1-8B layer shapes.  For each: whole-checkpoint ratio (every
output byte counted) for huffman and palette; the order-0 bound; in-memory compress and
decompress GB/s (of BF16) at 1 and 2 threads, median of --repeat runs, for unweight and
ZipNN 0.5.4; OpenZL 0.3.0 (exponents split out by its BFloat16Deconstruct node and coded with
its FSE or its Huffman graph, sign+mantissa stored: the layout that compresses BF16 best among
its stock graphs) at one thread, since its Python binding has no thread setting; end-to-end
CLI GB/s (files in, files out) and peak RSS of `unweight compress`.  With --dfloat11, also
DFloat11 0.5.0's ratio through its own encoder (dfloat11_sizes).

Usage: python scripts/bench_codec.py [--models minilm,smollm2,gaussian] [--repeat 7] [--out PATH]
Prints a table and writes JSON, by default benchmarks/results/codec-<date>-<machine>-<commit>.json
(benchmarks/README.md: method and names).
       python scripts/bench_codec.py --summarize RUN.json [RUN.json ...]
Prints the README's ratio and speed tables (markdown) from several runs of the same code.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import _bench_util as bench_util  # noqa: E402  (scripts/, beside this file)
from unweight import api, sources  # noqa: E402
from unweight.codec import tensor_codec as tc  # noqa: E402
from unweight.format.checkpoint import Checkpoint  # noqa: E402
from unweight.format.errors import UnweightError  # noqa: E402

LLAMA8B_LAYER = [("q_proj", 4096, 4096), ("k_proj", 1024, 4096), ("v_proj", 1024, 4096), ("o_proj", 4096, 4096),
                 ("gate_proj", 14336, 4096), ("up_proj", 14336, 4096), ("down_proj", 4096, 14336)]


def gaussian_checkpoint(folder: str, min_weights: int = 256 * 2**20, seed: int = 0) -> str:
    """Write N(0, 0.02) BF16 matrices with Llama-3.1-8B layer shapes until >= min_weights."""
    from unweight.format.safetensors_io import ShardWriter
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "model.safetensors")
    if os.path.exists(os.path.join(folder, "config.json")):  # written last: a killed run's file is redone
        return folder
    rng = np.random.default_rng(seed)
    w = ShardWriter(path, {"format": "pt"})
    total, layer = 0, 0
    while total < min_weights:
        for name, n, k in LLAMA8B_LAYER:
            f = (rng.standard_normal((n, k), dtype=np.float32) * 0.02).view(np.uint32)
            bf = ((f + 0x7FFF + ((f >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even
            w.add(f"model.layers.{layer}.{'mlp' if 'proj' in name and name[0] in 'gud' else 'self_attn'}.{name}.weight",
                  "BF16", (n, k), bf)
            total += n * k
            if total >= min_weights:
                break
        layer += 1
    w.close()
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump({"model_type": "synthetic-gaussian", "weights": total}, fh)
    return folder


def _entropy_bits(counts):
    """Total bits of an ideal order-0 code for symbols with these counts."""
    c = counts[counts > 0].astype(np.float64)
    return float(-(c * np.log2(c / c.sum())).sum())


def entropy_bound(ck: Checkpoint) -> float:
    """Order-0 bound: exponent at its per-tensor entropy, sign+mantissa raw, other tensors raw."""
    bits, nbytes = 0.0, 0
    for n in ck.names():
        dt, shape, b, e = ck.info(n)
        nbytes += e - b
        a = ck.array(n)
        if dt == "BF16" and len(shape) == 2 and a.size >= 4096:
            bits += 8 * a.size + _entropy_bits(np.bincount((a.reshape(-1) >> 7) & 0xFF, minlength=256))
        else:
            bits += 8 * (e - b)
    return bits / 8 / nbytes


def exponent_bits(mats, u16, huffman_encs, fse_frames, block=65536):
    """Where the exponent bits go, bit/weight, for embedding matrices and the others apart:
    unweight's exponent plane, OpenZL FSE's frame less its stored sign+mantissa bytes, and three
    bounds: per-tensor order-0 entropy H(e), per-tensor conditional entropy H(e | m6 m5) (the
    bound for unweight's context model), and order-0 entropy per `block` weights (what a coder
    that re-estimates its statistics block by block could reach, tables not counted)."""
    out = {}
    for i, n in enumerate(mats):
        u = u16[n].reshape(-1)
        e = ((u >> 7) & 0xFF).astype(np.int64)
        m = ((u >> 5) & 3).astype(np.int64)
        g = out.setdefault("embeddings" if "embed" in n else "other", dict.fromkeys(
            ("weights", "unweight_huffman", "openzl_fse", "h0", "h_ctx", "h0_blocks"), 0.0))
        g["weights"] += u.size
        g["unweight_huffman"] += 8 * memoryview(huffman_encs[i].planes["__exp"]).nbytes
        if fse_frames is not None:
            g["openzl_fse"] += 8 * (len(fse_frames[i]) - u.size)
        g["h0"] += _entropy_bits(np.bincount(e, minlength=256))
        g["h_ctx"] += _entropy_bits(np.bincount(e * 4 + m, minlength=1024)) - _entropy_bits(np.bincount(m, minlength=4))
        g["h0_blocks"] += sum(_entropy_bits(np.bincount(e[j:j + block], minlength=256)) for j in range(0, u.size, block))
    for g in out.values():
        for k in g:
            if k != "weights":
                g[k] /= g["weights"]
        if fse_frames is None:
            g["openzl_fse"] = None
    return out


def timed(fn, repeat):
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts), out


class OpenZL:
    """OpenZL's stock BF16 layout: BFloat16Deconstruct, sign+mantissa stored, exponents coded
    by `entropy` ("fse" or "huffman").  One compressor graph is built once and reused; each
    tensor gets a fresh compression context, since an OpenZL CCtx refuses a second frame once
    its graph is set."""

    def __init__(self, entropy):
        import openzl.ext as zl
        self.zl = zl
        self.compressor = zl.Compressor()
        self.compressor.set_parameter(zl.CParam.FormatVersion, zl.MAX_FORMAT_VERSION)
        coder = {"fse": zl.graphs.Fse, "huffman": zl.graphs.Huffman}[entropy]()
        graph = zl.nodes.BFloat16Deconstruct().build_graph(
            self.compressor, [zl.graphs.Store()(self.compressor), coder(self.compressor)])
        self.compressor.select_starting_graph(graph)
        self.dctx = zl.DCtx()

    def compress(self, a):
        """a: uint16 view of one BF16 tensor (CPU, C-contiguous) -> one OpenZL frame (bytes)."""
        cctx = self.zl.CCtx()
        cctx.ref_compressor(self.compressor)
        return cctx.compress([self.zl.Input(self.zl.Type.Numeric, a.reshape(-1))])

    def decompress(self, frame):
        """One OpenZL frame -> uint16 array (flat)."""
        return self.dctx.decompress(frame)[0].content.as_nparray()


OPENZL_CODERS = ("fse", "huffman")


def _dfloat11_utils():
    """DFloat11 0.5.0's encoder module, loaded by path: the package's __init__ loads its CUDA
    kernel through cupy at import, which needs a GPU; the encoder itself does not."""
    import importlib.util
    spec = importlib.util.find_spec("dfloat11")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "dfloat11_utils.py")
    mod_spec = importlib.util.spec_from_file_location("_dfloat11_utils", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod


def dfloat11_sizes(mats, tensors, raw_bytes, enc_bytes, verify=False):
    """DFloat11's checkpoint ratio as its own encoder writes it: one Huffman code (lengths up
    to 32 bits) per transformer block over all of the block's matrices, and one per matrix
    outside a block (embeddings, lm_head), as its compress_model groups them; counted are
    every buffer it stores (exponent stream, sign+mantissa bytes, output positions, 5-bit
    gaps, lookup tables, split positions), other tensors raw.  Its decoder is GPU-only and
    is not run here; verify=True (what --dfloat11 runs) instead decodes each exponent stream
    with the encoder's own codec (dahuffman, pure Python) and compares every BF16 word rebuilt
    from it and the sign+mantissa bytes.  Slow by design of its encoder (a Python loop per
    weight)."""
    import contextlib
    import re
    import warnings

    import torch
    du = _dfloat11_utils()
    blocks = {}
    for n in mats:
        m = re.match(r"^(.*?\.(?:layers?|h|blocks?)\.\d+)\.", n)
        blocks.setdefault(m.group(1) if m else n, []).append(n)
    total, t0 = 0, time.perf_counter()
    # Its encoder prints code tables and progress bars, and hands torch a read-only array.
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null), contextlib.redirect_stderr(null), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for names in blocks.values():
            weights = [torch.from_numpy(tensors[n].view(np.int16).reshape(-1).copy()).view(torch.bfloat16)
                       for n in names]
            _, counter = du.get_codec(torch.cat(weights))
            codec, _, table = du.get_32bit_codec(counter)
            luts = du.get_luts(table)
            encoded, other, positions, gaps, splits = du.encode_weights(weights, codec, 8, 512)
            total += sum(t.numel() * t.element_size() for t in (luts, encoded, other, positions, gaps, splits))
            if verify:
                exps = np.array(list(codec.decode(encoded.numpy().tobytes(), concat=list)), dtype=np.uint16)
                sm = other.numpy().astype(np.uint16)
                words = ((sm & 0x80) << 8) | (exps << 7) | (sm & 0x7F)
                if words.tobytes() != np.concatenate([tensors[n].view(np.uint16).reshape(-1) for n in names]).tobytes():
                    raise RuntimeError("DFloat11 round trip failed")
    return {"checkpoint_ratio": (total + raw_bytes - enc_bytes) / raw_bytes, "tensor_ratio": total / enc_bytes,
            "blocks": len(blocks), "round_trip_checked": bool(verify),
            ("encode_and_check_seconds" if verify else "encode_seconds"): time.perf_counter() - t0}


def paired_speed_ratio(times, peer, own="huffman"):
    """unweight's speed over a peer's, as the median of per-repeat time ratios: within one
    repeat the two ran back to back, so this is what a load change between repeats (this
    VM's steal time) disturbs least.  times: {key: [seconds per repeat]}, keys <who>_c, <who>_d."""
    return {what: statistics.median(p / u for p, u in zip(times[f"{peer}_{k}"], times[f"{own}_{k}"]))
            for what, k in (("compress", "c"), ("decompress", "d"))}


def bench_model(label, folder, threads_list, repeat, zipnn_ok, openzl_ok=False, dfloat11=False):
    ck = Checkpoint(folder)
    mats = [n for n in ck.names() if ck.info(n)[0] == "BF16" and len(ck.info(n)[1]) == 2 and ck.array(n).size >= 4096]
    tensors = {n: np.ascontiguousarray(ck.array(n)) for n in ck.names()}
    raw_bytes = sum(a.nbytes for a in tensors.values())
    res = {"model": label, "path": folder, "tensors": len(tensors), "tensor_bytes": raw_bytes,
           "weights": int(sum(a.size for a in tensors.values())), "order0_bound": entropy_bound(ck)}
    # Whole-checkpoint ratios through the real writer (every byte of the output counted).
    with tempfile.TemporaryDirectory() as td:
        for enc in ("huffman", "palette"):
            r = api.compress(folder, os.path.join(td, enc), encoding=enc, verify=False, progress=False)
            res[f"ratio_{enc}"] = r["ratio"]
            res[f"file_bytes_{enc}"] = r["output_bytes"]
        res["input_file_bytes"] = r["input_bytes"]
    # In-memory codec speed, per tensor as ZipNN is measured (bytes in, bytes out).
    enc_bytes = sum(tensors[n].nbytes for n in mats)
    res["encoded_tensor_bytes"] = enc_bytes
    if dfloat11:
        res["dfloat11"] = dfloat11_sizes(mats, tensors, raw_bytes, enc_bytes, verify=True)
    z = None
    if zipnn_ok:
        from zipnn import ZipNN
        blobs = [tensors[n].tobytes() for n in mats]
    ozl = {e: OpenZL(e) for e in OPENZL_CODERS} if openzl_ok else {}
    u16 = {n: tensors[n].view(np.uint16) for n in mats}
    ozl_frames = {}
    for th in threads_list:
        # Every repeat times each contender once, alternating, so a load change on a shared
        # machine hits all of them alike; medians are taken per contender.
        times = {}

        def rec(key, dt):
            times.setdefault(key, []).append(dt)
        encs = {}
        zcomp = None
        if zipnn_ok:
            z = ZipNN(method="huffman", input_format="byte", bytearray_dtype="bfloat16", threads=th)
        for _ in range(repeat):
            for enc in ("huffman", "palette"):
                t = time.perf_counter()
                encs[enc] = [tc.encode(tensors[n], enc, threads=th) for n in mats]
                rec(f"{enc}_c", time.perf_counter() - t)
                t = time.perf_counter()
                dec = [tc.decode(e.header, e.planes, threads=th, verify=False) for e in encs[enc]]
                rec(f"{enc}_d", time.perf_counter() - t)
                t = time.perf_counter()
                dec = [tc.decode(e.header, e.planes, threads=th, verify=True) for e in encs[enc]]
                rec(f"{enc}_dc", time.perf_counter() - t)
                assert all(np.array_equal(d, tensors[n]) for d, n in zip(dec, mats)), "round trip failed"
                del dec
            if zipnn_ok:
                # ZipNN rewrites its input buffer in place: hand it fresh copies (copy untimed).
                copies = [bytes(bytearray(b)) for b in blobs]
                t = time.perf_counter()
                zcomp = [z.compress(c) for c in copies]
                rec("z_c", time.perf_counter() - t)
                t = time.perf_counter()
                zdec = [z.decompress(c) for c in zcomp]
                rec("z_d", time.perf_counter() - t)
                assert all(bytes(d) == b for d, b in zip(zdec, blobs)), "ZipNN round trip failed"
                del zdec, copies
            # OpenZL runs one thread whatever `th` is: timed once, in the first thread pass.
            for e in ozl if th == threads_list[0] else ():
                t = time.perf_counter()
                ocomp = [ozl[e].compress(u16[n]) for n in mats]
                rec(f"ozl_{e}_c", time.perf_counter() - t)
                t = time.perf_counter()
                odec = [ozl[e].decompress(c) for c in ocomp]
                rec(f"ozl_{e}_d", time.perf_counter() - t)
                assert all(d.tobytes() == u16[n].tobytes() for d, n in zip(odec, mats)), "OpenZL round trip failed"
                ozl_frames[e] = ocomp
                del odec
        # Medians are the headline; the best run of each is kept too, since on a shared
        # machine the fastest repeat is the least disturbed one.
        med = {k: statistics.median(v) for k, v in times.items()}
        best = {k: min(v) for k, v in times.items()}
        for enc in ("huffman", "palette"):
            res[f"unweight_{enc}_t{th}"] = {"compress_gbps": enc_bytes / med[f"{enc}_c"] / 1e9,
                                            "decompress_gbps": enc_bytes / med[f"{enc}_d"] / 1e9,
                                            "decompress_crc_gbps": enc_bytes / med[f"{enc}_dc"] / 1e9,
                                            "best_compress_gbps": enc_bytes / best[f"{enc}_c"] / 1e9,
                                            "best_decompress_gbps": enc_bytes / best[f"{enc}_d"] / 1e9,
                                            "tensor_ratio": sum(e.nbytes for e in encs[enc]) / enc_bytes}
        if zipnn_ok:
            zbytes = sum(len(c) for c in zcomp) + raw_bytes - enc_bytes
            res[f"zipnn_t{th}"] = {"compress_gbps": enc_bytes / med["z_c"] / 1e9,
                                   "decompress_gbps": enc_bytes / med["z_d"] / 1e9,
                                   "best_compress_gbps": enc_bytes / best["z_c"] / 1e9,
                                   "best_decompress_gbps": enc_bytes / best["z_d"] / 1e9,
                                   "tensor_ratio": sum(len(c) for c in zcomp) / enc_bytes,
                                   "checkpoint_ratio": zbytes / raw_bytes}
            res[f"paired_speed_ratio_t{th}"] = paired_speed_ratio(times, "z")
        for e in ozl if th == threads_list[0] else ():
            obytes = sum(len(c) for c in ozl_frames[e])
            res[f"openzl_{e}_t1"] = {"compress_gbps": enc_bytes / med[f"ozl_{e}_c"] / 1e9,
                                     "decompress_gbps": enc_bytes / med[f"ozl_{e}_d"] / 1e9,
                                     "best_compress_gbps": enc_bytes / best[f"ozl_{e}_c"] / 1e9,
                                     "best_decompress_gbps": enc_bytes / best[f"ozl_{e}_d"] / 1e9,
                                     "tensor_ratio": obytes / enc_bytes,
                                     "checkpoint_ratio": (obytes + raw_bytes - enc_bytes) / raw_bytes,
                                     "paired_speed_ratio": paired_speed_ratio(times, f"ozl_{e}")}
        res[f"raw_seconds_t{th}"] = times
    # Bytes per plane over the matrices: with the raw tensors and the file size these say
    # what the container itself costs (summarize).
    res["huffman_plane_bytes"] = {k: sum(memoryview(e.planes[k]).nbytes for e in encs["huffman"])
                                  for k in encs["huffman"][0].planes}
    res["exponent_bits"] = exponent_bits(mats, u16, encs["huffman"], ozl_frames.get("fse"))
    # End-to-end CLI: files in, files out, and the child's peak RSS.
    with tempfile.TemporaryDirectory() as td:
        out = os.path.join(td, "o")
        # Peak RSS through GNU time: a child forked from this (large) process inherits its
        # high-water mark across exec, so the child's own rusage would over-report.
        timer = ["/usr/bin/time", "-f", "%M"] if os.path.exists("/usr/bin/time") else []
        dt, err = run_cli(["compress", folder, out, "-j", str(max(threads_list))], timer)
        res["cli_compress_gbps"] = res["input_file_bytes"] / dt / 1e9
        res["cli_compress_seconds"] = dt
        res["cli_peak_rss_bytes"] = int(err.strip().splitlines()[-1]) * 1024 if timer else None
        res["largest_tensor_bytes"] = max(a.nbytes for a in tensors.values())
        dt, _ = run_cli(["decompress", out, os.path.join(td, "d"), "-j", str(max(threads_list))],
                        stdout=subprocess.PIPE)
        res["cli_decompress_gbps"] = res["input_file_bytes"] / dt / 1e9
    ck.close()
    return res


def run_cli(args, prefix=(), stdout=subprocess.DEVNULL):
    """`unweight ARGS` in a child process: (seconds, its stderr).  A failed step ends the run
    with its one-line error: a time of a command that did not do its work is no speed."""
    t = time.perf_counter()
    p = subprocess.run([*prefix, sys.executable, "-m", "unweight.cli", *args], stdout=stdout,
                       stderr=subprocess.PIPE, text=True, check=False)
    dt = time.perf_counter() - t
    if p.returncode != 0:
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        if prefix:  # GNU time's own two lines: "Command exited with non-zero status N", the peak RSS
            lines = [ln for ln in lines[:-1] if not ln.startswith("Command exited with")]
        raise SystemExit(f"bench_codec: `unweight {args[0]}` failed (exit {p.returncode}): "
                         f"{lines[-1] if lines else 'no message'}")
    return dt, p.stderr


def _cell(entry, key, fmt="{:.2f}") -> str:
    """entry[key] formatted, or "n/a" where the contender did not run (no entry)."""
    return fmt.format(entry[key]) if entry and key in entry else "n/a"


def _peak_rss(rs) -> str:
    """The largest peak RSS of compress over the runs; "n/a" when no run measured it (no GNU time)."""
    got = [x["cli_peak_rss_bytes"] for x in rs if x.get("cli_peak_rss_bytes") is not None]
    return f"{max(got) / 1e6:.0f} MB" if got else "n/a"


def _spread(values, fmt="{:.2f}"):
    lo, hi = min(values), max(values)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else f"{fmt.format(lo)}-{fmt.format(hi)}"


def summarize(paths, out=sys.stdout):
    """README tables from runs of one commit: ratios (the same in every run, checked), and
    per model and thread count the median over runs of each run's median GB/s, with the
    spread over runs of unweight huffman's speed over each peer's."""
    if not paths:
        raise SystemExit("usage: bench_codec.py --summarize RUN.json [RUN.json ...]")
    runs = []
    for p in paths:
        try:
            with open(p) as f:
                runs.append(json.load(f))
        except (OSError, ValueError) as e:
            raise SystemExit(f"error: {p}: {getattr(e, 'strerror', None) or e}") from None
        if not isinstance(runs[-1], dict) or runs[-1].get("benchmark") != "bench_codec" or not runs[-1].get("results"):
            raise SystemExit(f"error: {p}: not a result of bench_codec.py")
    if len({r["commit"] for r in runs}) != 1:
        raise SystemExit("error: --summarize takes runs of one commit")
    by_model = [[r["results"][i] for r in runs] for i in range(len(runs[0]["results"]))]
    med = statistics.median
    out.write("| model | unweight huffman | unweight palette | ZipNN | OpenZL FSE | OpenZL Huffman | order-0 exponent bound |\n"
              "|---|---|---|---|---|---|---|\n")
    for rs in by_model:
        r = rs[0]
        for key in ("ratio_huffman", "ratio_palette"):
            if len({x[key] for x in rs}) != 1:
                raise SystemExit(f"error: {r['model']}: {key} differs between runs")
        # A peer that did not run gets "n/a", never a number.
        z = _cell(r.get("zipnn_t1"), "checkpoint_ratio", "{:.4f}")
        o = {e: _cell(r.get(f"openzl_{e}_t1"), "checkpoint_ratio", "{:.4f}") for e in OPENZL_CODERS}
        out.write(f"| {r['model']} | {r['ratio_huffman']:.4f} | {r['ratio_palette']:.4f} | {z} | "
                  f"{o['fse']} | {o['huffman']} | {r['order0_bound']:.4f} |\n")
    out.write("\n| model | threads | unweight huffman c / d | palette c / d | ZipNN c / d | "
              "huffman / ZipNN, ratio of medians, c / d | same, median of per-repeat ratios |\n"
              "|---|---|---|---|---|---|---|\n")
    threads = sorted(int(k.rsplit("_t", 1)[1]) for k in by_model[0][0] if k.startswith("unweight_huffman_t"))
    for rs in by_model:
        for th in threads:
            cell = {}
            for who, key in (("h", f"unweight_huffman_t{th}"), ("p", f"unweight_palette_t{th}"), ("z", f"zipnn_t{th}")):
                if all(key in x for x in rs):
                    cell[who] = (f"{med(x[key]['compress_gbps'] for x in rs):.2f} / "
                                 f"{med(x[key]['decompress_gbps'] for x in rs):.2f}")
                else:  # ZipNN not installed in (some of) these runs
                    cell[who] = "n/a"
            if cell["z"] == "n/a":
                rom = pr = "n/a"
            else:
                rom = [(x[f"unweight_huffman_t{th}"]["compress_gbps"] / x[f"zipnn_t{th}"]["compress_gbps"],
                        x[f"unweight_huffman_t{th}"]["decompress_gbps"] / x[f"zipnn_t{th}"]["decompress_gbps"])
                       for x in rs]
                rom = f"{_spread([a for a, _ in rom])} / {_spread([b for _, b in rom])}"
                pr = [(x[f"paired_speed_ratio_t{th}"]["compress"], x[f"paired_speed_ratio_t{th}"]["decompress"])
                      for x in rs]
                pr = f"{_spread([a for a, _ in pr])} / {_spread([b for _, b in pr])}"
            out.write(f"| {rs[0]['model']} | {th} | {cell['h']} | {cell['p']} | {cell['z']} | {rom} | {pr} |\n")
    if all("openzl_fse_t1" in x for rs in by_model for x in rs):
        out.write("\n| model | unweight huffman c / d | OpenZL FSE c / d | OpenZL Huffman c / d | "
                  "huffman / OpenZL FSE, c / d | huffman / OpenZL Huffman, c / d |\n|---|---|---|---|---|---|\n")
        for rs in by_model:
            h = [med(x["unweight_huffman_t1"][k] for x in rs) for k in ("compress_gbps", "decompress_gbps")]
            o = {e: [med(x[f"openzl_{e}_t1"][k] for x in rs) for k in ("compress_gbps", "decompress_gbps")]
                 for e in OPENZL_CODERS}
            q = {e: [_spread([x[f"openzl_{e}_t1"]["paired_speed_ratio"][k] for x in rs])
                     for k in ("compress", "decompress")] for e in OPENZL_CODERS}
            out.write(f"| {rs[0]['model']} | {h[0]:.2f} / {h[1]:.2f} | {o['fse'][0]:.2f} / {o['fse'][1]:.2f} | "
                      f"{o['huffman'][0]:.2f} / {o['huffman'][1]:.2f} | {q['fse'][0]} / {q['fse'][1]} | "
                      f"{q['huffman'][0]} / {q['huffman'][1]} |\n")
    out.write("\n| model | matrices | weights | unweight huffman | OpenZL FSE | H(e) per tensor | "
              "H(e \\| m6 m5) per tensor | H(e) per 64Ki-weight block |\n|---|---|---|---|---|---|---|---|\n")
    for rs in by_model:
        for g, x in rs[0].get("exponent_bits", {}).items():
            fse = "n/a" if x["openzl_fse"] is None else f"{x['openzl_fse']:.3f}"
            out.write(f"| {rs[0]['model']} | {g} | {x['weights'] / 1e6:.1f}M | {x['unweight_huffman']:.3f} | {fse} | "
                      f"{x['h0']:.3f} | {x['h_ctx']:.3f} | {x['h0_blocks']:.3f} |\n")
    for rs in by_model:
        if "dfloat11" in rs[0]:
            d = rs[0]["dfloat11"]
            out.write(f"\nDFloat11 0.5.0, {rs[0]['model']}: {d['checkpoint_ratio']:.4f} ({d['blocks']} codes)\n")
    out.write("\nhuffman file bytes over the input's, by part: matrix planes, other tensors raw, the rest "
              "(safetensors header with every tensor's metadata), and the input's own header:\n")
    for rs in by_model:
        r = rs[0]
        pb = r.get("huffman_plane_bytes")
        if not pb:
            continue
        inp, raw_other = r["input_file_bytes"], r["tensor_bytes"] - r["encoded_tensor_bytes"]
        rest = r["file_bytes_huffman"] - sum(pb.values()) - raw_other
        parts = ", ".join(f"{k} {v / inp:.5f}" for k, v in pb.items())
        out.write(f"  {r['model']}: {parts}; other tensors {raw_other / inp:.5f}; header {rest / inp:.5f} "
                  f"(input's header {(inp - r['tensor_bytes']) / inp:.5f})\n")
    out.write("\n| model | `unweight compress` GB/s | `unweight decompress` GB/s | peak RSS of compress | largest tensor |\n"
              "|---|---|---|---|---|\n")
    for rs in by_model:
        out.write(f"| {rs[0]['model']} | {_spread([x['cli_compress_gbps'] for x in rs])} | "
                  f"{_spread([x['cli_decompress_gbps'] for x in rs])} | "
                  f"{_peak_rss(rs)} | "
                  f"{rs[0]['largest_tensor_bytes'] / 1e6:.0f} MB |\n")


MODELS = ("minilm", "smollm2", "gaussian")


def _models_arg(text: str) -> list:
    names = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in names if m not in MODELS]
    if bad or not names:
        raise argparse.ArgumentTypeError((f"unknown model {bad[0]!r}" if bad else "no model named")
                                         + f"; choose from {', '.join(MODELS)}")
    return names


def _peer_version(dist: str):
    """The installed version of a peer (recorded and printed as measured, not assumed)."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def report(results, threads, versions, out=sys.stdout):
    """The run's tables.  versions: {"zipnn" | "openzl" | "dfloat11": installed version, or
    None when that peer did not run}; a peer that did not run shows "n/a", never a number."""
    zv = versions.get("zipnn")
    rows = []
    for r in results:
        for th in threads:
            h, p = r[f"unweight_huffman_t{th}"], r[f"unweight_palette_t{th}"]
            z = r.get(f"zipnn_t{th}")
            rows.append([r["model"], th, f"{r['ratio_huffman']:.4f}", f"{r['ratio_palette']:.4f}",
                         _cell(z, "checkpoint_ratio", "{:.4f}"), f"{r['order0_bound']:.4f}",
                         f"{h['compress_gbps']:.2f}", _cell(z, "compress_gbps"),
                         f"{h['decompress_gbps']:.2f}", _cell(z, "decompress_gbps"),
                         f"{p['compress_gbps']:.2f}", f"{p['decompress_gbps']:.2f}"])
    hdr = ["model", "thr", "uw huff", "uw pal", "zipnn", "order0", "uw c GB/s", "zn c", "uw d GB/s", "zn d",
           "pal c", "pal d"]
    widths = [max(len(str(x)) for x in col) for col in zip(hdr, *rows)]
    out.write("  ".join(h.ljust(w) for h, w in zip(hdr, widths)) + "\n")
    for row in rows:
        out.write("  ".join(str(c).ljust(w) for c, w in zip(row, widths)) + "\n")
    if zv:
        out.write(f"best of the repeats, GB/s (unweight huffman vs ZipNN {zv}), compress / decompress:\n")
    else:
        out.write("best of the repeats, GB/s (unweight huffman; ZipNN not installed, not run), compress / decompress:\n")
    for r in results:
        for th in threads:
            h, z = r[f"unweight_huffman_t{th}"], r.get(f"zipnn_t{th}")
            out.write(f"  {r['model']} t{th}: {h['best_compress_gbps']:.2f} / {h['best_decompress_gbps']:.2f}"
                      + (f" vs {_cell(z, 'best_compress_gbps')} / {_cell(z, 'best_decompress_gbps')}\n" if z else "\n"))
    if zv:
        out.write("unweight huffman speed / ZipNN's, median of per-repeat ratios, compress / decompress:\n")
    for r in results:
        for th in threads:
            q = r.get(f"paired_speed_ratio_t{th}")
            if q:
                out.write(f"  {r['model']} t{th}: {q['compress']:.2f}x / {q['decompress']:.2f}x\n")
    if versions.get("openzl"):
        out.write(f"OpenZL {versions['openzl']}, one thread: checkpoint ratio (as ZipNN's), compress / decompress "
                  "GB/s, unweight huffman t1 speed over it (median of per-repeat ratios):\n")
        for r in results:
            for e in OPENZL_CODERS:
                o = r[f"openzl_{e}_t1"]
                q = o["paired_speed_ratio"]
                out.write(f"  {r['model']} {e}: {o['checkpoint_ratio']:.4f} (tensors {o['tensor_ratio']:.4f}), "
                          f"{o['compress_gbps']:.2f} / {o['decompress_gbps']:.2f}, "
                          f"{q['compress']:.2f}x / {q['decompress']:.2f}x\n")
    for r in results:
        if "dfloat11" in r:
            d = r["dfloat11"]
            out.write(f"DFloat11 {versions.get('dfloat11')} {r['model']}: checkpoint ratio {d['checkpoint_ratio']:.4f} "
                      f"(tensors {d['tensor_ratio']:.4f}, {d['blocks']} codes), its encoder and the round-trip check "
                      f"{d['encode_and_check_seconds']:.0f} s\n")
    out.write("exponent bit/weight: unweight huffman, OpenZL FSE; bounds H(e), H(e | m6 m5), H(e) per 64Ki block:\n")
    for r in results:
        for g, x in r["exponent_bits"].items():
            fse = "n/a" if x["openzl_fse"] is None else f"{x['openzl_fse']:.3f}"
            out.write(f"  {r['model']} {g} ({x['weights'] / 1e6:.1f}M): {x['unweight_huffman']:.3f}, {fse}; "
                      f"{x['h0']:.3f}, {x['h_ctx']:.3f}, {x['h0_blocks']:.3f}\n")
    for r in results:
        out.write(f"{r['model']}: CLI compress {r['cli_compress_gbps']:.2f} GB/s, decompress {r['cli_decompress_gbps']:.2f} GB/s "
                  f"(files), peak RSS of compress "
                  + (f"{r['cli_peak_rss_bytes'] / 1e6:.0f} MB" if r["cli_peak_rss_bytes"] is not None
                     else "not measured (no /usr/bin/time)")
                  + f", largest tensor {r['largest_tensor_bytes'] / 1e6:.0f} MB\n")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "--summarize":
        summarize(argv[1:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=_models_arg, default=list(MODELS), help="comma list of " + ", ".join(MODELS))
    ap.add_argument("--threads", type=bench_util.positive_int_list, default=[1, 2], help="comma list, e.g. 1,2")
    ap.add_argument("--repeat", type=bench_util.positive_int, default=3)
    ap.add_argument("--gaussian-weights", type=bench_util.positive_int, default=256 * 2**20)
    ap.add_argument("--out", default=None)
    ap.add_argument("--dfloat11", action="store_true",
                    help="also DFloat11 0.5.0's ratio through its own encoder, its streams decoded back through its "
                         "codec and compared (pip install --no-deps dfloat11==0.5.0 dahuffman==0.4.2; minutes "
                         "per 100M weights)")
    args = ap.parse_args(argv)
    if args.out:
        args.out = bench_util.writable_path(args.out, "bench_codec")
    try:
        import zipnn  # noqa: F401
        zipnn_ok = True
    except ImportError:
        sys.stderr.write("zipnn not installed (pip install zipnn==0.5.4): running without the side-by-side\n")
        zipnn_ok = False
    try:
        import openzl.ext  # noqa: F401
        openzl_ok = True
    except ImportError:
        sys.stderr.write("openzl not installed (pip install openzl==0.3.0): running without it\n")
        openzl_ok = False
    if args.dfloat11:
        try:
            du = _dfloat11_utils()
        except ImportError as e:  # its encoder's own imports (dahuffman, tqdm)
            du, why = None, f" ({e})"
        else:
            why = ""
        if du is None:
            bench_util.fail(f"error: --dfloat11 needs dfloat11 0.5.0{why} (pip install --no-deps dfloat11==0.5.0 "
                            "dahuffman==0.4.2)")
    threads = args.threads
    folders = {"minilm": ("MiniLM-L6 (BF16)", sources.bundled_minilm),
               "smollm2": ("SmolLM2-135M (BF16)", sources.bundled_smollm2),
               "gaussian": ("Gaussian, Llama-8B shapes", lambda: gaussian_checkpoint(
                   os.path.join(sources.cache_dir(), f"gaussian-{args.gaussian_weights}"), args.gaussian_weights))}
    results = []
    for m in args.models:
        label, get = folders[m]
        try:
            folder = get()
        except UnweightError as e:  # a bundled model that is not installed
            bench_util.fail(f"error: {m}: {e}")
        results.append(bench_model(label, folder, threads, args.repeat, zipnn_ok, openzl_ok, args.dfloat11))
    versions = {"zipnn": _peer_version("zipnn") if zipnn_ok else None,
                "openzl": _peer_version("openzl") if openzl_ok else None,
                "dfloat11": _peer_version("dfloat11") if args.dfloat11 else None}
    report(results, threads, versions)
    commit = bench_util.short_commit()
    doc = {"benchmark": "bench_codec", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "load_average_at_end": os.getloadavg(), "repeat": args.repeat,
           "commit": commit, "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
           "environment": bench_util.environment(),
           "zipnn_version": versions["zipnn"], "openzl_version": versions["openzl"],
           "dfloat11_version": versions["dfloat11"], "results": results}
    path = args.out or bench_util.result_path("codec", bench_util.machine_tag(), commit)
    bench_util.write_json(path, doc)
    sys.stdout.write(f"wrote {path}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
