"""Python API of the offline tools: compress, decompress, verify, inspect.

Every function returns a report dict (what the CLI prints) and raises a subclass of
unweight.UnweightError with a one-line message on bad input.  Outputs are built in a
temporary folder next to DST and renamed into place only when complete and verified;
SRC is only ever read.
"""
from __future__ import annotations

import fnmatch
import json
import logging
import math
import numbers
import os
import re
import time

import numpy as np

from . import __version__, sources
from .codec import tensor_codec as tc
from .codec.verify import check_raw, check_records, decode_verified, raw_crc32, sm_release, verify_checkpoint
from .format import constants as C
from .format.checkpoint import Checkpoint, CompressedCheckpoint, split_name
from .format.errors import FormatError, InputError, MismatchError
from .format.shards import ShardSet, write_index
from .format.staging import copy_side_files, same_or_inside, staged_output

log = logging.getLogger(__name__)

# Files of a source folder that compress and decompress write themselves.
SKIP_FILES = {C.INDEX_NAME, "pytorch_model.bin.index.json", "config.json", C.REPORT_NAME}


def parse_size(s, what: str = "max_shard_size") -> int:
    """'5GB' / '500MB' / '1.5GiB' / 123 -> bytes (at least 1); InputError naming `what` otherwise."""
    if isinstance(s, numbers.Real) and not isinstance(s, bool):
        if not float(s).is_integer():
            raise InputError(f"bad {what} {s!r}: a number of bytes is a whole number")
        n = int(s)
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*((?:[KMGT]i?)?B?)\s*", s, re.I) if isinstance(s, str) else None
        if not m:
            raise InputError(f"bad {what} {s!r}: use e.g. 5GB or 500MB")
        unit = m.group(2).upper().rstrip("B")
        mult = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
                "KI": 2**10, "MI": 2**20, "GI": 2**30, "TI": 2**40}[unit]
        x = float(m.group(1))
        if mult == 1 and not x.is_integer():
            raise InputError(f"bad {what} {s!r}: a number of bytes is a whole number")
        n = int(x * mult)
    # Any size below one tensor already gives one tensor per shard; zero or less is a mistake.
    if n < 1:
        raise InputError(f"{what} must be at least 1 byte, got {s!r}")
    return n


def _jobs(jobs) -> int:
    """Threads: None is all cores; otherwise an int >= 1 (as the CLI's -j: no "0 = all cores")."""
    if jobs is None:
        return tc.default_threads()
    if isinstance(jobs, bool) or not isinstance(jobs, numbers.Integral) or jobs < 1:
        raise InputError(f"jobs must be an int >= 1 (or None for all cores), got {jobs!r}")
    return int(jobs)


def _patterns(value, what: str) -> list[str]:
    """include / exclude: None, one glob, or an iterable of globs (a str is one glob, not its characters)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    try:
        pats = list(value)
    except TypeError:
        raise InputError(f"{what} must be a glob or a list of globs, got {type(value).__name__}") from None
    for p in pats:
        if not isinstance(p, str):
            raise InputError(f"{what} patterns must be str, got {type(p).__name__} ({p!r})")
    return pats


def category(name: str) -> str:
    """Report bucket of a tensor name (reporting only; nothing depends on it)."""
    n = name.lower()
    if re.search(r"embed|wte|wpe|lm_head|word_embeddings|position_embeddings|token_type", n):
        return "embedding"
    if re.search(r"attn|attention|q_proj|k_proj|v_proj|o_proj|qkv|query|key|value", n):
        return "attention"
    if re.search(r"mlp|ffn|feed_forward|intermediate|gate_proj|up_proj|down_proj|fc1|fc2|w1|w2|w3|experts|\.output\.dense", n):
        return "mlp"
    return "other"


def _progress(total, desc, enabled):
    from tqdm import tqdm  # a dependency of huggingface_hub; writes to stderr, off when not a TTY
    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, disable=None if enabled else True,
                leave=False)


def _encodable_shape(shape) -> bool:
    """Matrices, and 3-D tensors as stacks of matrices (stacked MoE experts, FORMAT.md
    "Stacked tensors"); other ranks are stored raw."""
    return len(shape) == 2 or (len(shape) == 3 and 1 <= shape[0] <= C.MAX_STACK)


# A matrix of _BAND_FROM bytes or more is encoded from its memory map in bands of about
# _BAND_BYTES, each band's pages dropped once read (tensor_codec.encode band_bytes): peak memory
# is then its planes plus a band, not the matrix plus its planes (an 8B model's 1 GB embedding).
_BAND_FROM = 256 << 20
_BAND_BYTES = 64 << 20


def _entry_len(name: str, dt: str, shape, hi: int) -> int:
    """Characters of one safetensors header entry and its comma, offsets at most hi."""
    return len(json.dumps({name: {"dtype": dt, "shape": [int(x) for x in shape], "data_offsets": [hi, hi]}},
                          separators=(",", ":"))) - 1


def _header_bound(name: str, dt: str, shape, hi: int, encodings: tuple, segment_weights: int) -> int:
    """Most characters a tensor can take in its shard's header: stored raw (with its crc32 in
    the shard metadata) or as the planes of any of `encodings`.  Shapes the data decides
    (stream and index lengths, verbatim blocks) are bounded by the tensor's bytes or blocks;
    offsets by hi."""
    crc = len(json.dumps(json.dumps({name: 0xFFFFFFFF}, separators=(",", ":")))) - 3
    best = _entry_len(name, dt, shape, hi) + crc
    if encodings:
        *stack, n, k = (int(x) for x in shape)
        e = stack[0] if stack else 1
        R, Cc = tc.choose_grid(n, k, segment_weights, stacked=bool(stack))
        nseg = e * -(-n // R) * -(-k // Cc)
        blocks = e * n * -(-k // C.PAL_BLOCK)
        common = [(C.SUFFIX_HDR, "U8", [C.HEADER_BYTES + C.HUFF_NUM_CTX * 256]), (C.SUFFIX_SM, "U8", shape)]
        planes = {"huffman": common + [(C.SUFFIX_EXP, "U8", [hi]), (C.SUFFIX_OFF, "U32", [nseg + 1]),
                                       (C.SUFFIX_CHK, "U16", [nseg, R * Cc])],
                  "palette": common + [(C.SUFFIX_IDX, "U8", [*stack, n, (k + 1) // 2]), (C.SUFFIX_VPOS, "U32", [blocks]),
                                       (C.SUFFIX_VEXP, "U8", [blocks, C.PAL_BLOCK])]}
        for enc in encodings:
            best = max(best, sum(_entry_len(name + suf, sdt, shp, hi) for suf, sdt, shp in planes[enc]))
    return best


def compress(src, dst, *, encoding: str = "huffman", jobs: int | None = None,
             overwrite: bool = False, include: str | list[str] | None = None,
             exclude: str | list[str] | None = None,
             verify: bool = True, max_shard_size="5GB", revision: str | None = None,
             segment_weights: int = C.DEFAULT_SEGMENT_WEIGHTS, index: bool = False, progress: bool = True) -> dict:
    """Compress a checkpoint (folder, .safetensors file, bundled name or hub id) into dst.

    src, dst: str or os.PathLike; revision: only for hub ids.  jobs: threads >= 1 (None: all
    cores).  include / exclude: one glob or a list of them.  index: also store the Huffman
    checkpoint index (format 1.2, ~0.014 bit per weight) that the GPU decoder needs; without it
    (the default, the smallest file) the GPU loader builds it at load time; refused with
    encoding="palette", which has no huffman tensors.  Returns the report written to
    dst/unweight_report.json.
    """
    # Every argument is checked before resolving src, which may download or convert a model.
    src, dst = sources.as_path(src, "src"), sources.as_path(dst, "dst")
    if encoding not in tc.ENCODINGS:
        raise InputError(f"unknown encoding {encoding!r}: choose huffman, palette or auto")
    if index and encoding == "palette":
        raise InputError("index=True stores the index of huffman tensors; a palette checkpoint has none "
                         "(use encoding huffman or auto)")
    jobs = _jobs(jobs)
    max_bytes = parse_size(max_shard_size)
    include, exclude = _patterns(include, "include"), _patterns(exclude, "exclude")
    if isinstance(segment_weights, bool) or not isinstance(segment_weights, numbers.Integral) or segment_weights < 1:
        raise InputError(f"segment_weights must be an int >= 1, got {segment_weights!r}")
    segment_weights = int(segment_weights)
    local = sources.resolve(src, revision)
    t0 = time.perf_counter()  # GB/s counts our work, not a hub download or bundled conversion
    if same_or_inside(local, dst):
        raise InputError(f"SRC and DST overlap ({local} / {dst}): choose another output folder")
    ck = Checkpoint(local)
    names = ck.names()
    if not names:
        raise InputError(f"{local}: no tensors found (empty model)")
    if _written_by_unweight(ck):
        raise InputError(f"{local} is already an unweight checkpoint: load it as it is, or decompress it first "
                         "(unweight decompress)")
    for n in names:
        if split_name(n)[1] is not None:
            raise InputError(f"{local}: tensor {n!r} ends in a reserved unweight suffix; cannot compress it")
    dtypes = sorted({ck.info(n)[0] for n in names})
    if "BF16" not in dtypes:
        # Nothing to encode: the "compressed" copy would be the original at ratio 1.0.  Mixed
        # checkpoints (BF16 weights beside F32 norms or FP8 blocks) pass their other dtypes through.
        raise InputError(f"{local}: no BF16 tensor to compress (dtypes: {', '.join(dtypes)}); unweight codes the "
                         "exponents of BF16 weights, and a cast to BF16 is not lossless")
    total_in = sum(ck.info(n)[3] - ck.info(n)[2] for n in names)
    tensors, cats = [], {}
    passthrough_dtypes = set()
    def encodable(name, dt, shape) -> bool:
        wanted = (not include or any(fnmatch.fnmatchcase(name, p) for p in include)) and \
                 not any(fnmatch.fnmatchcase(name, p) for p in exclude)
        return dt == "BF16" and _encodable_shape(shape) and math.prod(shape) >= C.MIN_ENCODED_WEIGHTS and wanted

    # Each shard's header is written last into room reserved ahead of its data (one write of
    # every byte): the room is bounded from what each tensor can become.
    meta = {"format": "pt", "unweight_format_version": C.FORMAT_VERSION}
    bounds, hi = [len(json.dumps({"__metadata__": {**meta, "unweight_crc32": "{}"}}, separators=(",", ":")))], 0
    for name in names:
        dt, shape, b, e = ck.info(name)
        hi += e - b  # an encoded tensor is kept only when smaller than the original
        encs = (("huffman", "palette") if encoding == "auto" else (encoding,)) if encodable(name, dt, shape) else ()
        bounds.append(_header_bound(name, dt, shape, hi, encs, segment_weights))
    with staged_output(dst, overwrite) as tmp:
        shards = ShardSet(tmp, max_bytes, meta, True, header_bounds=bounds)
        bar = _progress(total_in, "compress", progress)
        try:
            for name in names:
                dt, shape, b, e = ck.info(name)
                arr = ck.array(name)
                rec = {"name": name, "dtype": dt, "shape": list(shape), "orig_bytes": e - b,
                       "category": category(name)}
                enc = None
                if encodable(name, dt, shape):
                    band = {}
                    if len(shape) == 2 and e - b >= _BAND_FROM:  # read in bands, dropping each band's pages
                        row = shape[1] * 2
                        band = {"band_bytes": _BAND_BYTES,
                                "done": lambda r0, r1, n=name, row=row: ck.release(n, r0 * row, r1 * row)}
                    enc = tc.encode(arr, encoding, segment_weights=segment_weights, threads=jobs,
                                    chk_interval=C.DEFAULT_CHK_INTERVAL if index else 0, **band)
                    if enc.nbytes >= arr.nbytes:
                        enc = None
                        rec["note"] = "not smaller when encoded"
                elif dt != "BF16":
                    passthrough_dtypes.add(dt)
                if enc is None:
                    shards.add_group([(name, dt, shape, arr)], raw_crc=(name, raw_crc32(arr, jobs)))
                    rec.update(encoding="raw", stored_bytes=e - b)
                else:
                    items = [(name + suf, tc._st_dtype(a), a.shape, a) for suf, a in enc.planes.items()]
                    shards.add_group(items)
                    rec.update(encoding=enc.header.encoding_name, stored_bytes=enc.nbytes,
                               grid=[enc.header.rows_per_group, enc.header.cols_per_chunk], **enc.stats)
                tensors.append(rec)
                c = cats.setdefault(rec["category"], {"orig_bytes": 0, "stored_bytes": 0, "weights": 0})
                c["orig_bytes"] += rec["orig_bytes"]
                c["stored_bytes"] += rec["stored_bytes"]
                c["weights"] += int(arr.size)
                del arr, enc
                ck.release(name)
                bar.update(e - b)
            files = shards.finish()
        except BaseException:
            shards.abort()
            raise
        finally:
            bar.close()
        t_enc = time.perf_counter() - t0
        cfg = ck.config()
        quant = {"quant_method": C.QUANT_METHOD, "format_version": C.FORMAT_VERSION, "encoding": encoding,
                 "encoded_dtype": "bfloat16", "tool_version": __version__}
        out_cfg = dict(cfg or {})
        text = out_cfg.get("text_config")
        if out_cfg.get("quantization_config"):
            # A model quantized by another method (fp8 block scales, int4 experts, ...): its
            # tensors are stored as they are (only BF16 is encoded) and decompress puts its
            # config back; runtimes hand that method its own tensors (FORMAT.md, "Checkpoint container").
            quant["source_quantization_config"] = out_cfg["quantization_config"]
        elif isinstance(text, dict) and text.get("quantization_config"):
            # (a multimodal model may keep it under its language model's config, where it stays:
            # readers such as vLLM take the top-level block first)
            quant["source_quantization_config"] = text["quantization_config"]
            quant["source_quantization_config_in"] = "text_config"
        out_cfg["quantization_config"] = quant
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(out_cfg, f, indent=2)
        write_index(tmp, shards.weight_map, shards.file_sizes, {"format_version": C.FORMAT_VERSION})
        copied = copy_side_files(ck.folder, tmp, SKIP_FILES)
        verified = False
        if verify:
            out = CompressedCheckpoint(tmp)
            try:
                verify_checkpoint(out, jobs)
            finally:
                out.close()
            verified = True
        total_out = sum(shards.file_sizes.values())
        in_files = sum(os.path.getsize(f.path) for f in ck.files)
        enc_recs = [t for t in tensors if t["encoding"] != "raw"]
        report = {
            "tool": "unweight", "tool_version": __version__, "format_version": C.FORMAT_VERSION,
            "source": src, "source_path": os.path.abspath(local), "encoding": encoding, "jobs": jobs,
            "input_bytes": in_files, "output_bytes": total_out, "tensor_bytes_in": total_in,
            "ratio": total_out / in_files, "bits_per_weight": 8 * total_out / max(1, sum(c["weights"] for c in cats.values())),
            "encoded_tensors": len(enc_recs), "raw_tensors": len(tensors) - len(enc_recs),
            "passthrough_dtypes": sorted(passthrough_dtypes),
            "categories": cats, "files": files, "copied_files": copied,
            "encode_seconds": t_enc, "total_seconds": time.perf_counter() - t0, "verified": verified,
            "tensors": tensors,
        }
        report["gb_per_s"] = in_files / report["total_seconds"] / 1e9
        ck.close()
        with open(os.path.join(tmp, C.REPORT_NAME), "w") as f:
            json.dump(report, f, indent=2)
    return report


def decompress(src, dst, *, overwrite: bool = False, jobs: int | None = None,
               max_shard_size="5GB", progress: bool = True) -> dict:
    """Write a standard checkpoint whose tensors are byte-identical to the original ones.

    Every tensor is checked against its stored crc32 (encoded and raw alike) before the
    output is renamed into place; any mismatch leaves no output."""
    src, dst = sources.as_path(src, "src"), sources.as_path(dst, "dst")
    jobs = _jobs(jobs)
    max_bytes = parse_size(max_shard_size)
    t0 = time.perf_counter()
    if not os.path.exists(src):
        raise InputError(f"{src}: no such file or folder")
    if same_or_inside(src, dst):
        raise InputError(f"SRC and DST overlap ({src} / {dst}): choose another output folder")
    ck = CompressedCheckpoint(src)
    n_out = 0
    try:
        check_records(ck)
        with staged_output(dst, overwrite) as tmp:
            order = ck.tensor_order()
            headers = {base: ck.header(base) for base in order if base in ck.encoded}
            plan = []
            for base in order:
                if base in headers:
                    h = headers[base]
                    plan.append([(base, "BF16", h.shape, h.numel * 2)])
                else:
                    dt, shape, b, e = ck.info(base)
                    plan.append([(base, dt, shape, e - b)])
            shards = ShardSet(tmp, max_bytes, {"format": "pt"}, False, plan)
            try:
                for base in order:
                    if base in headers:
                        h = headers[base]
                        w = decode_verified(h, ck.planes(base), jobs, where=ck.location(base),
                                            done=sm_release(ck, base, h))
                        ck.release_encoded(base)  # the planes' pages go before the output is written
                        shards.add_group([(base, "BF16", w.shape, w)])
                    else:
                        dt, shape, b, e = ck.info(base)
                        arr = ck.array(base)
                        check_raw(ck, base, arr, jobs)
                        shards.add_group([(base, dt, shape, arr)])
                        ck.release(base)
                    n_out += 1
                files = shards.finish()
            except BaseException:
                shards.abort()
                raise
            if len(files) > 1:
                write_index(tmp, shards.weight_map, shards.file_sizes)
            cfg = ck.config()
            if cfg is not None:
                qc = cfg.pop("quantization_config", None) or {}
                if qc.get("source_quantization_config") and not qc.get("source_quantization_config_in"):
                    cfg["quantization_config"] = qc["source_quantization_config"]
                if cfg:
                    with open(os.path.join(tmp, "config.json"), "w") as f:
                        json.dump(cfg, f, indent=2)
            copy_side_files(ck.folder, tmp, SKIP_FILES)
    finally:
        ck.close()
    return {"tensors": n_out, "files": files, "seconds": time.perf_counter() - t0, "output": os.path.abspath(dst)}


def _written_by_unweight(ck: Checkpoint) -> bool:
    """Whether a checkpoint says it is an unweight one: its config's quant method or a shard's
    format version record."""
    try:
        qc = (ck.config() or {}).get("quantization_config")
    except (FormatError, AttributeError):
        qc = None  # no readable config: the shards decide
    if isinstance(qc, dict) and qc.get("quant_method") == C.QUANT_METHOD:
        return True
    return any(f.metadata.get("unweight_format_version") for f in ck.files)


def _is_compressed(ck: Checkpoint) -> bool:
    """Whether a checkpoint given as an original is an unweight one: it would otherwise only
    show up as "tensor sets differ" (its planes are not the original's tensor names)."""
    return _written_by_unweight(ck) or any(split_name(n)[1] for n in ck.names())


def verify(path, against=None, jobs: int | None = None) -> dict:
    """Check integrity (stored checksums and the checkpoint's records) or, with `against`
    (the original: folder, .safetensors file, bundled name or hub id), also byte equality
    with it.

    Raises ChecksumError / FormatError / MismatchError on the first difference, InputError
    when `against` is itself a compressed checkpoint.
    """
    path = sources.as_path(path, "path")
    against = None if against is None else sources.as_path(against, "against")
    jobs = _jobs(jobs)
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file or folder")
    if against is None:
        ck = CompressedCheckpoint(path)
        try:
            r = verify_checkpoint(ck, jobs)
        finally:
            ck.close()
        return {"ok": True, "mode": "checksums", "tensors_checked": r["encoded_checked"] + r["raw_checked"], **r}
    orig = Checkpoint(sources.resolve(against, what="against"))
    try:
        if _is_compressed(orig):
            raise InputError(f"--against {against} is a compressed checkpoint: it must be the original, "
                             "uncompressed one")
        ck = CompressedCheckpoint(path)
    except BaseException:
        orig.close()
        raise
    try:
        check_records(ck)
        a, b = set(orig.names()), set(ck.tensor_order())
        if a != b:
            only_o, only_c = sorted(a - b), sorted(b - a)
            what = f"missing from compressed: {only_o[0]}" if only_o else f"not in original: {only_c[0]}"
            raise MismatchError(f"tensor sets differ ({len(only_o)} missing, {len(only_c)} extra; {what})")
        for name in orig.names():
            dt, shape, _, _ = orig.info(name)
            ref = orig.array(name)
            if name in ck.encoded:
                h = ck.header(name)
                got = decode_verified(h, ck.planes(name), jobs, where=ck.location(name))
                got_dt, got_shape = "BF16", h.shape
            else:
                got_dt, got_shape, _, _ = ck.info(name)
                got = ck.array(name)
                check_raw(ck, name, got, jobs)
            if got_dt != dt or tuple(got_shape) != tuple(shape):
                raise MismatchError(f"tensor {name!r}: dtype/shape {got_dt}{list(got_shape)} != original {dt}{list(shape)}")
            if not np.array_equal(np.ascontiguousarray(got).reshape(-1).view(np.uint8),
                                  np.ascontiguousarray(ref).reshape(-1).view(np.uint8)):
                raise MismatchError(f"tensor {name!r} differs from the original")
        return {"ok": True, "mode": "against", "tensors_checked": len(a)}
    finally:
        ck.close()
        orig.close()


def inspect(path, jobs: int | None = None) -> dict:
    """Per-tensor encoding, shape, ratio, exponent entropy, palette coverage, verbatim fraction.

    Reads every tensor, so it checks each against its stored crc32 on the way."""
    path = sources.as_path(path, "path")
    jobs = _jobs(jobs)
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file or folder")
    ck = CompressedCheckpoint(path)
    rows, tot_o, tot_s, tot_w = [], 0, 0, 0
    try:
        check_records(ck)
        for base in ck.tensor_order():
            if base in ck.encoded:
                h = ck.header(base)
                planes = ck.planes(base)
                w = decode_verified(h, planes, jobs, where=ck.location(base))
                st = tc.analyze(w, jobs)
                if h.encoding == C.ENC_PALETTE:
                    nb = h.n_matrices * h.rows * -(-h.cols // C.PAL_BLOCK)
                    st["verbatim_fraction"] = h.num_verbatim / nb
                stored = sum(int(a.nbytes) for a in planes.values())
                orig = w.nbytes
                r = {"name": base, "encoding": h.encoding_name, "shape": list(h.shape), "dtype": "BF16",
                     "orig_bytes": orig, "stored_bytes": stored, "ratio": stored / orig,
                     "grid": [h.rows_per_group, h.cols_per_chunk], **st}
                tot_w += w.size
            else:
                dt, shape, b, e = ck.info(base)
                check_raw(ck, base, threads=jobs)
                r = {"name": base, "encoding": "raw", "shape": list(shape), "dtype": dt,
                     "orig_bytes": e - b, "stored_bytes": e - b, "ratio": 1.0}
                tot_w += int(np.prod(shape)) if shape else 1
            tot_o += r["orig_bytes"]
            tot_s += r["stored_bytes"]
            rows.append(r)
        files = sum(os.path.getsize(f.path) for f in ck.files)
    finally:
        ck.close()
    return {"path": os.path.abspath(path), "tensors": rows,
            "totals": {"tensors": len(rows), "encoded": sum(r["encoding"] != "raw" for r in rows),
                       "orig_bytes": tot_o, "stored_bytes": tot_s, "ratio": tot_s / tot_o if tot_o else 1.0,
                       "file_bytes": files, "bits_per_weight": 8 * files / max(1, tot_w)}}


def tune_shapes(path, tp: int = 1, dp: int = 1) -> list[tuple[int, int]]:
    """The [N, K] matrix shapes a GPU runs for a compressed checkpoint's encoded tensors (an
    expert stack's per-expert matrix), sorted.  tp > 1: the shapes of one rank's block under
    tensor parallelism, split by rows (column-parallel layers) and by columns (row-parallel
    layers), each where the axis splits into tp equal parts (on the segment grid or not: the
    loaders recode a block off it; the architecture, which says which split applies, is not
    read), and the whole shape (replicated layers).  dp > 1: a MoE's experts (tensors named
    ``.experts.``) also split into tp * dp parts, as vLLM splits them over its TP x DP ranks
    under data parallelism without expert parallelism.  Each set
    of sibling projections (runtime/stacking.py: q/k/v, gate/up) adds its stacked shape, as a
    runtime that stacks them runs it (runtime/siblings.py; with tp, the rank's row blocks
    stacked).  Llama 4's expert stacks (``gate_up_proj`` [E, H, 2I], ``down_proj`` [E, I, H])
    add the blocks vLLM holds them as, transposed (integrations/vllm/moe.py): gate and up
    [I / t, H], down [H, I / t] for t = tp (and tp * dp), and [I, H], [H, I] (whole experts,
    as vLLM's expert parallelism holds them at any TP size; per-expert 2-D tensors are in the
    set whole)."""
    path = sources.as_path(path, "path")
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file or folder")
    from .runtime.stacking import sibling_tensors
    ck = CompressedCheckpoint(path)
    shapes = set()
    try:
        for base in ck.encoded:
            h = ck.header(base)
            shapes.add((int(h.rows), int(h.cols)))
            leaf = base.rpartition(".")[2]
            splits = {1, tp} | ({tp * dp} if ".experts." in f".{base}." else set())
            for t in splits - {1}:
                if h.rows % t == 0:
                    shapes.add((int(h.rows) // t, int(h.cols)))
                if h.cols % t == 0:
                    shapes.add((int(h.rows), int(h.cols) // t))
            for t in splits:  # (whole experts: TP 1, or expert parallelism at any TP)
                if h.stack and leaf == "gate_up_proj" and h.cols % (2 * t) == 0:
                    shapes.add((int(h.cols) // 2 // t, int(h.rows)))
                elif h.stack and leaf == "down_proj" and h.rows % t == 0:
                    shapes.add((int(h.cols), int(h.rows) // t))
        for group in sibling_tensors(ck.encoded):
            hs = [ck.header(b) for b in group]
            if len({int(h.cols) for h in hs}) != 1 or any(h.stack for h in hs):
                continue
            shapes.add((sum(int(h.rows) for h in hs), int(hs[0].cols)))
            if tp > 1 and all(h.rows % tp == 0 for h in hs):
                shapes.add((sum(int(h.rows) // tp for h in hs), int(hs[0].cols)))
    finally:
        ck.close()
    return sorted(shapes)


def _cuda_device(device: str, what: str):
    """torch.device of `device`, a visible CUDA GPU with the CUDA extension built; else one
    InputError line beginning with `what` ("unweight tune measures")."""
    try:
        import torch
    except ImportError:
        raise InputError(f"{what} on a CUDA GPU and needs torch (pip install unweight[runtime])") from None
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise InputError(f"bad device {device!r}") from None
    if dev.type != "cuda":
        raise InputError(f"{what} on a CUDA GPU, not on {device}")
    if not torch.cuda.is_available():
        raise InputError(f"{what} on a CUDA GPU, and none is visible here")
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        raise InputError(f"no CUDA device {device} here ({torch.cuda.device_count()} visible)")
    from .ops import cuda_kernels_built
    if not cuda_kernels_built():
        raise InputError(f"{what} with the CUDA extension (unweight._cuda), which this install lacks")
    return dev


def selftest(*, device: str = "cuda") -> dict:
    """Run on this machine's CUDA GPU the checks a load runs before it uses the GPU's kernels:
    the CRC-32 kernel of the load check against zlib (ops.checksum), each fused matmul path the
    tuning table may pick on this GPU, the embedding row gathers and the expert-slot kernels of
    vLLM's MoE layers (runtime/selftest.py).  A kernel that fails is one a load takes out in
    favour of a slower path with the right bits.  Returns {"device", "crc32", "fused":
    {"checked", "failed"}, "row_gathers", "expert_slots", "passed", "seconds"}."""
    dev = _cuda_device(device, "unweight selftest checks kernels")
    import torch
    from .ops import checksum
    from .runtime import policy as policies
    from .runtime import selftest as st
    t0 = time.perf_counter()
    crc = bool(checksum.self_test(dev))
    fused = st.check_fused_paths(policies.measured(), dev)
    failed = sorted({f"{p}{' (tile-major)' if o is True else ' (stack matrix)' if o == st.STACK else ''} at "
                     f"batch {m}: {r.get('error') or 'max error %.3g against %.3g' % (r['max_err'], r['bound'])}"
                     for (p, o, m), r in fused.items() if not r["passed"]})
    gathers = st.check_gather(dev, again=True)
    slots = st.check_slots(dev, again=True)
    return {"device": torch.cuda.get_device_name(dev), "crc32": crc,
            "fused": {"checked": len(fused), "failed": failed}, "row_gathers": gathers, "expert_slots": slots,
            "passed": crc and not failed and all(gathers.values()) and all(slots.values()),
            "seconds": time.perf_counter() - t0}


def tune(path, *, device: str = "cuda", encodings=("palette", "huffman"), buckets=None, tp: int = 1,
         dp: int = 1, cache: str | None = None, iters: int = 50) -> dict:
    """Measure, on this machine's CUDA GPU, which path runs each of a compressed checkpoint's
    matrix shapes fastest at each batch bucket, and which decoder variant decodes it fastest
    (unweight.tools.tune, on N(0, 0.02) weights of each shape and encoding); the choices go
    to the tuning cache (`cache`, default $UNWEIGHT_TUNING_CACHE or
    ~/.cache/unweight/tuning.json), which models loaded afterwards dispatch by.  Returns the
    device name, the cache path and the choices."""
    if tp < 1 or dp < 1:
        raise InputError(f"tp and dp must be at least 1, got {tp} and {dp}")
    encodings = tuple(encodings)
    for e in encodings:
        if e not in ("palette", "huffman"):
            raise InputError(f"unknown encoding {e!r}; one of palette, huffman")
    shapes = tune_shapes(path, tp, dp)
    dev = _cuda_device(device, "unweight tune measures")
    import torch
    from .runtime.tuning_table import BUCKETS, default_cache_path, split_key
    if buckets is not None:
        bad = [b for b in buckets if b not in BUCKETS]
        if bad:
            raise InputError(f"unknown batch bucket {bad[0]!r}; one of {', '.join(BUCKETS)}")
    from .tools import tune as tuner
    cache = os.path.expanduser(cache) if cache else default_cache_path()
    t0 = time.perf_counter()
    table = tuner.tune([(n, k, e) for n, k in shapes for e in encodings], device=dev, buckets=buckets, iters=iters,
                       path=cache)
    name = torch.cuda.get_device_name(dev)
    mine = set(shapes)
    paths, decoders = [], []
    for key, e in sorted(table.entries.items()):
        dev_name, n, k, enc, b = split_key(key)
        base, _, order = enc.partition(":")
        if dev_name == name and (n, k) in mine and base in encodings:
            paths.append({"N": n, "K": k, "encoding": base, "plane_order": order or "file", "bucket": b,
                          "choice": table.lookup(name, n, k, enc, e["M"]), "times_ms": e["times_ms"]})
    for key, e in sorted(table.decoders.items()):
        dev_name, n, k, enc, s = split_key(key)
        if dev_name == name and (n, k) in mine and enc in encodings:
            decoders.append({"N": n, "K": k, "encoding": enc, "S": int(s), "choice": e["choice"],
                             "times_ms": e["times_ms"]})
    # The order a palette weight of each shape is held in under plane_order="auto".
    orders = {f"{n}x{k}": table.plane_order(name, n, k) for n, k in shapes} if "palette" in encodings else {}
    return {"device": name, "cache": cache, "shapes": [list(s) for s in shapes], "paths": paths,
            "decoders": decoders, "plane_orders": orders, "seconds": time.perf_counter() - t0}
