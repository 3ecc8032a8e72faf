"""The measured dispatch table: which path runs a compressed linear on a given device, and
which CUDA decoder variant decodes each weight there.

Pure data (no torch): the dispatch policy (runtime/policy.py) looks a choice up per forward
under the key

    (device name, N, K, encoding, batch bucket)  ->  "decode_cublas" | "palette_gemm" | "palette_gemm_wide"
                                                     | "palette_gemm_xs" | "palette_gemm_wg" | "palette_gemv"
                                                     | "palette_gemv_deep"
                                                     | "palette_gemv_staged" | "palette_gemv_mma"
                                                     | "palette_gemv_mma_staged" | "palette_gemv_mma_prefetch"
                                                     | "palette_gemv_mma_bulk"

with N, K the weight's [N, K] shape, encoding "huffman" / "palette" / "palette:tiled" (a palette
weight whose planes are held tile-major, ops/layout.py: the same kernels reading other
addresses, so measured apart; ``table_encoding``), and the batch bucket of
M = x.numel() // K one of BUCKETS ("1", "2-4", "5-16", "17-32", "33-64", "65-256", ">256").

Rules:
  * a fused path is chosen only from measurements, and only when it was strictly faster than
    decode + cuBLAS timed in the same run (``choose``); the lookup re-applies that rule to
    the recorded times, so a hand-edited or stale entry can never select a slower path;
  * no measurement for the device / shape / bucket -> decode + cuBLAS, or, where the policy
    asks (``nearest_choice``, DispatchPolicy's default), the choice of the nearest shape
    measured on that device, encoding and bucket, when that choice beat decode + cuBLAS there
    by EXTRAPOLATE_MARGIN or more and takes this shape.  On every shape the H200 measured,
    the fastest fused path took 0.3-0.6x decode + cuBLAS's time at batch 1-16 (the fourth
    H200 run, README "GPU results"), so for a shape no run
    measured (a mixture of experts' experts, another model's projections) the nearest
    shape's winner is the better bet than the path that is slowest there.

The same entries decide the order a runtime holds a palette matmul weight's planes in
(``plane_order``, for plane_order="auto"): tile-major only where the table timed the shape in
both orders and the best path's time was lower tile-major (geometric mean over the buckets
timed in both); file order otherwise.

Where the measurements live:
  * shipped defaults: ``unweight/runtime/tuning_defaults.json``, written by
    ``scripts/bench_kernels.py --write-defaults`` from a benchmark run;
  * the user's tuning cache: ``$UNWEIGHT_TUNING_CACHE`` or ``~/.cache/unweight/tuning.json``,
    written by ``unweight.tools.tune.tune()`` (or ``bench_kernels.py --write-cache``); its
    entries override the shipped ones key by key.

The same table names the CUDA decoder each weight is decoded with (the decode of the
decode + cuBLAS path, of MoE experts, of a module's decode_weight and of a load-time dense
conversion, transformers' and vLLM's), under the key

    (device name, N, K, encoding, S)  ->  a decoder variant of kernel_plan.HUFF_VARIANTS /
                                          PAL_VARIANTS ("ahead", "ring", ...; "wide", "vec8")

with S the Huffman checkpoint interval the weight is decoded with (0 without an index; 0 for
palette).  Every variant writes the same bits, so this choice changes speed only.  Rule: a
variant other than the extension's default is chosen only when it was strictly faster than
the default timed in the same run (``choose_decoder``); no measurement -> the default.

File format (both files)::

    {"schema": 1, "comment": "...",
     "entries": {"<device>|<N>|<K>|<encoding>|<bucket>":
                 {"M": 16, "choice": "palette_gemm",
                  "times_ms": {"decode_cublas": 0.031, "palette_gemm": 0.019}}},
     "decoders": {"<device>|<N>|<K>|<encoding>|<S>":
                  {"default": "ahead", "choice": "ahead2",
                   "times_ms": {"ahead": 0.217, "ahead2": 0.206, "chain": 0.233}}}}

("decoders" is optional: a file without it chooses no decoder, and readers that predate it
ignore it.)
"""
from __future__ import annotations

import json
import logging
import math
import os

from ..format.staging import write_atomic
from . import kernel_plan as kp

log = logging.getLogger(__name__)

SCHEMA = 1
DECODE_CUBLAS = "decode_cublas"
PALETTE_GEMM = "palette_gemm"
# The same kernel with two tiles per copy stage (whole 128-byte lines per copy): the same
# bits, a different memory access pattern; the table keeps whichever measured faster.
PALETTE_GEMM_WIDE = "palette_gemm_wide"
# The same kernel with x copied into shared memory once per CTA for its four warps (rather than
# loaded by each): the same bits, a quarter of the x traffic, which from batch ~8 rivals the
# weight stream.
PALETTE_GEMM_XS = "palette_gemm_xs"
# The same kernel on Hopper's warpgroup MMA (sm_90 with an sm_90a build): x copied per CTA in the
# layout wgmma reads from shared memory, up to 128 batch rows per CTA; the tensor cores' sums in
# the same order (the emulator's bits are PALETTE_GEMM's; the hardware may round differently).
PALETTE_GEMM_WG = "palette_gemm_wg"
# Batches of 1..4 on CUDA cores: a warp streams a weight row into registers (ops.palette_gemv);
# other sums' order than the GEMM's, within the same error bound.
PALETTE_GEMV = "palette_gemv"
# The GEMV with twice the loads in flight per lane at two CTAs per SM (kernel_plan.h, DEEP):
# the same bits as PALETTE_GEMV, another balance of bytes in flight against resident warps.
PALETTE_GEMV_DEEP = "palette_gemv_deep"
# The GEMV with its loads landing in per-warp shared-memory rings through cp.async
# (kernel_plan.h, STAGED): in-flight bytes that cost no registers; the same bits as PALETTE_GEMV.
PALETTE_GEMV_STAGED = "palette_gemv_staged"
# Batches of 1..32 on the tensor cores: a warp streams a 16-row tile into registers and feeds
# mma.sync (kernel_plan.h, MMA): tensor-core sums, within the GEMM's error bound.
PALETTE_GEMV_MMA = "palette_gemv_mma"
# The tensor-core GEMV with its loads landing in per-warp shared-memory rings through cp.async
# (kernel_plan.h, MMA_STAGED): three steps in flight per warp at no register cost; the same
# bits as PALETTE_GEMV_MMA.
PALETTE_GEMV_MMA_STAGED = "palette_gemv_mma_staged"
# The tensor-core GEMV with an L2 prefetch of the steps past its loads (kernel_plan.h,
# MMA_PREFETCH): more asked of DRAM at no register cost; the same bits as PALETTE_GEMV_MMA.
PALETTE_GEMV_MMA_PREFETCH = "palette_gemv_mma_prefetch"
# The tensor-core GEMV fed by the copy engine (kernel_plan.h, MMA_BULK: cp.async.bulk into
# per-warp rings counted on mbarriers; sm_90+): only for weights held tile-major, where a warp's
# part is one run of bytes per plane; the same bits as PALETTE_GEMV_MMA.
PALETTE_GEMV_MMA_BULK = "palette_gemv_mma_bulk"
# The tensor-core GEMV with a tile's steps cut into units handed out from a queue to a
# persistent grid (kernel_plan.h, MMA_QUEUE; ops.palette_gemv_queue): the warps that stream
# faster take more units, and no second wave; its own unit count sets the order of the sums.
PALETTE_GEMV_MMA_QUEUE = "palette_gemv_mma_queue"
# The GEMV paths and the kernel variant each runs (ops.palette_gemv's `variant`).
GEMV_PATHS = {PALETTE_GEMV: kp.PGEMV_VARIANT_DEFAULT, PALETTE_GEMV_DEEP: kp.PGEMV_VARIANT_DEEP,
              PALETTE_GEMV_STAGED: kp.PGEMV_VARIANT_STAGED, PALETTE_GEMV_MMA: kp.PGEMV_VARIANT_MMA,
              PALETTE_GEMV_MMA_STAGED: kp.PGEMV_VARIANT_MMA_STAGED,
              PALETTE_GEMV_MMA_PREFETCH: kp.PGEMV_VARIANT_MMA_PREFETCH,
              PALETTE_GEMV_MMA_BULK: kp.PGEMV_VARIANT_MMA_BULK, PALETTE_GEMV_MMA_QUEUE: kp.PGEMV_VARIANT_MMA_QUEUE}
# Paths that run only on tile-major planes: never chosen for a file-order entry.
TILED_ONLY = tuple(p for p, v in GEMV_PATHS.items() if kp.pgemv_needs_tiled(v))
# A shape with no measurement runs the fused path chosen for the nearest measured shape only
# when that path took at most 1 / EXTRAPOLATE_MARGIN of decode + cuBLAS's time there.
EXTRAPOLATE_MARGIN = 1.25

# Times recorded under other names (a fused Huffman kernel some earlier tables list) are kept
# out of every choice: only these paths exist.
CHOICES = (DECODE_CUBLAS, PALETTE_GEMM, PALETTE_GEMM_WIDE, PALETTE_GEMM_XS, PALETTE_GEMM_WG, PALETTE_GEMV,
           PALETTE_GEMV_DEEP, PALETTE_GEMV_STAGED, PALETTE_GEMV_MMA, PALETTE_GEMV_MMA_STAGED,
           PALETTE_GEMV_MMA_PREFETCH, PALETTE_GEMV_MMA_BULK, PALETTE_GEMV_MMA_QUEUE)
FUSED = (PALETTE_GEMM, PALETTE_GEMM_WIDE, PALETTE_GEMM_XS, PALETTE_GEMM_WG, PALETTE_GEMV, PALETTE_GEMV_DEEP,
         PALETTE_GEMV_STAGED, PALETTE_GEMV_MMA, PALETTE_GEMV_MMA_STAGED, PALETTE_GEMV_MMA_PREFETCH,
         PALETTE_GEMV_MMA_BULK, PALETTE_GEMV_MMA_QUEUE)

# (upper bound inclusive, name); the last bucket is open-ended.
# (17-32 and 33-64 are apart because the tensor-core GEMV takes batches up to 32.)
_BUCKET_BOUNDS = ((1, "1"), (4, "2-4"), (16, "5-16"), (32, "17-32"), (64, "33-64"), (256, "65-256"))
BUCKETS = tuple(name for _, name in _BUCKET_BOUNDS) + (">256",)
# The batch a bucket is measured at: its upper end (the slowest case a bucket must cover for
# the memory-bound fused kernels), 512 for the open bucket.
BUCKET_BATCH = {"1": 1, "2-4": 4, "5-16": 16, "17-32": 32, "33-64": 64, "65-256": 256, ">256": 512}
# Buckets of earlier tables and the buckets that cover their batches now: an entry under an
# old bucket (measured at its upper end) stands for each of them until they are measured.
LEGACY_BUCKETS = {"17-64": ("17-32", "33-64")}

ENV_CACHE = "UNWEIGHT_TUNING_CACHE"
DEFAULTS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tuning_defaults.json")
NO_MEASUREMENT_COMMENT = ("Shipped dispatch defaults, written by scripts/bench_kernels.py --write-defaults. "
                          "No entries: every (device, shape, batch) runs decode + cuBLAS.")


TILED = ":tiled"


def table_encoding(encoding: str, tiled: bool = False) -> str:
    """The encoding field of an entry key: "palette:tiled" for a palette weight held
    tile-major, else the encoding itself."""
    return encoding + TILED if tiled and encoding == "palette" else encoding


def bucket(M: int) -> str:
    """Batch bucket of M rows (M >= 1; M <= 0 maps to "1", an empty batch costs nothing)."""
    for hi, name in _BUCKET_BOUNDS:
        if M <= hi:
            return name
    return BUCKETS[-1]


def bucket_bounds(name: str) -> tuple:
    """(lowest, highest) batch of a bucket of BUCKETS (highest None for the open one)."""
    lo = 1
    for hi, n in _BUCKET_BOUNDS:
        if n == name:
            return lo, hi
        lo = hi + 1
    if name == BUCKETS[-1]:
        return lo, None
    raise ValueError(f"unknown batch bucket {name!r}")


def default_cache_path() -> str:
    """The user's tuning cache: $UNWEIGHT_TUNING_CACHE, else ~/.cache/unweight/tuning.json."""
    env = os.environ.get(ENV_CACHE)
    if env:
        return os.path.expanduser(env)
    return os.path.join(os.path.expanduser("~"), ".cache", "unweight", "tuning.json")


def _finite(t) -> bool:
    return isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t > 0


def choose(times_ms: dict, encoding: str = "") -> str:
    """The path to run from times measured in one run: the fastest fused path that is strictly
    faster than decode_cublas; decode_cublas when it was not measured (or not validly).  A
    TILED_ONLY path counts only for an encoding held tile-major ("palette:tiled")."""
    base = times_ms.get(DECODE_CUBLAS)
    if not _finite(base):
        return DECODE_CUBLAS
    best, best_t = DECODE_CUBLAS, base
    tiled = encoding.endswith(TILED)
    for path in FUSED:  # in this order: a tie keeps the first
        if path in TILED_ONLY and not tiled:
            continue
        t = times_ms.get(path)
        if _finite(t) and t < best_t:
            best, best_t = path, t
    return best


def candidates(encoding: str, M: int, K: int, cols_per_chunk: int = 0) -> list[str]:
    """Fused paths that can run y = x @ W^T for this encoding and problem (besides
    decode_cublas): the palette GEMM in its copy layouts (one- and two-tile stages, shared x,
    wgmma)
    and the palette GEMV's variants (batch 1..4 on CUDA cores, 1..32 on the tensor cores), for
    palette weights within their batch and shape limits; none for Huffman weights
    (cols_per_chunk is accepted for callers that pass the grid)."""
    if encoding not in ("palette", "palette" + TILED):
        return []
    out = [p for p in FUSED if p not in GEMV_PATHS] if kp.pmma_supported(M, K) else []
    tiled = encoding.endswith(TILED)
    return out + [p for p, v in GEMV_PATHS.items()
                  if kp.pgemv_supported(M, K, v) and (tiled or p not in TILED_ONLY)]


def entry_key(device: str, N: int, K: int, encoding: str, bucket_name: str) -> str:
    return f"{device}|{int(N)}|{int(K)}|{encoding}|{bucket_name}"


def decoder_names(encoding: str) -> dict:
    """{variant name: variant number} of an encoding's CUDA decoders."""
    return kp.HUFF_VARIANTS if encoding == "huffman" else kp.PAL_VARIANTS


def default_decoder(encoding: str) -> str:
    """The name of the variant the extension runs for an encoding when none is named."""
    default = kp.HUFF_DEFAULT_VARIANT if encoding == "huffman" else kp.PAL_DEFAULT_VARIANT
    return next(n for n, v in decoder_names(encoding).items() if v == default)


def choose_decoder(times_ms: dict, default: str, names) -> str:
    """The decoder to run from times measured in one run: the fastest of `names` strictly
    faster than `default`; `default` when it was not (validly) measured."""
    base = times_ms.get(default)
    if not _finite(base):
        return default
    best, best_t = default, base
    for name in sorted(names):  # sorted: a tie between two others keeps the same one every time
        t = times_ms.get(name)
        if name != default and _finite(t) and t < best_t:
            best, best_t = name, t
    return best


def decoder_key(device: str, N: int, K: int, encoding: str, S: int = 0) -> str:
    return f"{device}|{int(N)}|{int(K)}|{encoding}|{int(S) if encoding == 'huffman' else 0}"


def split_key(key: str) -> tuple:
    """(device, N, K, encoding, last) of an entry_key or decoder_key (last: the bucket name, or
    S as a string); the device name may itself hold "|"."""
    device, n, k, encoding, last = key.rsplit("|", 4)
    return device, int(n), int(k), encoding, last


class TuningTable:
    """The dispatch table: entries keyed by entry_key(), each {"M", "choice", "times_ms"}."""

    def __init__(self, entries: dict | None = None, comment: str = "", decoders: dict | None = None):
        self.entries: dict = dict(entries or {})
        self.decoders: dict = dict(decoders or {})
        self.comment = comment
        self._chosen: dict = {}  # lookup()'s choice per key, with the entry object it was made from

    # ------------------------------------------------------------------ files
    @classmethod
    def load(cls, path: str) -> "TuningTable":
        """Read a table file; a missing file is an empty table, an unreadable one is logged and
        ignored (a broken cache must never break inference; it only loses the fused paths)."""
        try:
            with open(path) as f:
                doc = json.load(f)
        except FileNotFoundError:
            return cls()
        except (OSError, ValueError) as e:
            log.warning("unweight: ignoring unreadable tuning file %s (%s)", path, e)
            return cls()
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or not isinstance(doc.get("entries", {}), dict):
            log.warning("unweight: ignoring tuning file %s (not schema %d)", path, SCHEMA)
            return cls()
        entries = {k: v for k, v in doc.get("entries", {}).items()
                   if isinstance(v, dict) and isinstance(v.get("times_ms"), dict)}
        decoders = doc.get("decoders", {})
        decoders = {k: v for k, v in (decoders.items() if isinstance(decoders, dict) else ())
                    if isinstance(v, dict) and isinstance(v.get("times_ms"), dict) and isinstance(v.get("default"), str)}
        return cls(_rekey_legacy(entries), str(doc.get("comment", "")), decoders)

    def to_json(self) -> dict:
        doc = {"schema": SCHEMA, "comment": self.comment, "entries": dict(sorted(self.entries.items()))}
        if self.decoders:
            doc["decoders"] = dict(sorted(self.decoders.items()))
        return doc

    def save(self, path: str) -> str:
        """Write atomically (temp file + rename), creating the folder.  Returns the path."""
        return write_atomic(os.path.expanduser(path), json.dumps(self.to_json(), indent=1) + "\n", ".tuning-")

    # ------------------------------------------------------------------ entries
    def record(self, device: str, N: int, K: int, encoding: str, M: int, times_ms: dict) -> str:
        """Store the times measured at batch M (into M's bucket) and return the choice they give."""
        times = {k: float(v) for k, v in times_ms.items() if k in CHOICES and _finite(v)}
        choice = choose(times, encoding)
        self.entries[entry_key(device, N, K, encoding, bucket(M))] = {"M": int(M), "choice": choice,
                                                                       "times_ms": times}
        return choice

    def lookup(self, device: str, N: int, K: int, encoding: str, M: int) -> str:
        """The path for a forward with M rows; decode_cublas when nothing was measured."""
        k = entry_key(device, N, K, encoding, bucket(M))
        e = self.entries.get(k)
        if e is None:
            return DECODE_CUBLAS
        # Re-derived from the times, not read from e["choice"]: only a recorded win counts.  Every
        # forward asks, so the choice is kept while the entry is the same object (record()
        # replaces it).
        memo = self._chosen.get(k)
        if memo is not None and memo[0] is e:
            return memo[1]
        path = choose(e["times_ms"], encoding)
        self._chosen[k] = (e, path)
        return path

    def has(self, device: str, N: int, K: int, encoding: str, M: int) -> bool:
        """Whether the table holds a measurement for this key at M's bucket."""
        return entry_key(device, N, K, encoding, bucket(M)) in self.entries

    def _nearest(self, device: str, N: int, K: int, encoding: str, M: int) -> tuple | None:
        """(N', K', entry) of the shape measured on `device` with this encoding at M's bucket
        nearest [N, K] (the least |ln N/N'| + |ln K/K'|; ties to the larger); None: none."""
        b = bucket(M)
        best = None
        for key, e in self.entries.items():
            d, n, k, enc, bb = split_key(key)
            if d != device or enc != encoding or bb != b or n <= 0 or k <= 0:
                continue
            rank = (abs(math.log(n / N)) + abs(math.log(k / K)), -n, -k)
            if best is None or rank < best[0]:
                best = (rank, n, k, e)
        return None if best is None else best[1:]

    @staticmethod
    def _won_by_margin(e: dict, path: str) -> bool:
        """Whether entry e timed `path` at most 1 / EXTRAPOLATE_MARGIN of decode + cuBLAS's time."""
        t, base = e["times_ms"].get(path), e["times_ms"].get(DECODE_CUBLAS)
        return path != DECODE_CUBLAS and _finite(t) and _finite(base) and base >= EXTRAPOLATE_MARGIN * t

    def nearest_choice(self, device: str, N: int, K: int, encoding: str, M: int) -> tuple | None:
        """For a shape the table did not measure at M's bucket: (path, (N', K')), the choice of
        the nearest measured shape (_nearest), where that choice is a fused path that took at
        most 1 / EXTRAPOLATE_MARGIN of decode + cuBLAS's time there and can take [N, K] at
        batch M (``candidates``); else (decode_cublas, (N', K')).  None: nothing measured on
        that device, encoding and bucket."""
        near = self._nearest(device, N, K, encoding, M)
        if near is None:
            return None
        n, k, e = near
        path = self.lookup(device, n, k, encoding, M)
        if not self._won_by_margin(e, path) or path not in candidates(encoding, M, K):
            return DECODE_CUBLAS, (n, k)
        return path, (n, k)

    def nearest_faster(self, device: str, N: int, K: int, encoding: str, M: int, path: str) -> bool:
        """For a shape the table did not measure at M's bucket: whether the nearest measured
        shape (_nearest) timed `path` at most 1 / EXTRAPOLATE_MARGIN of decode + cuBLAS's time."""
        near = self._nearest(device, N, K, encoding, M)
        return near is not None and self._won_by_margin(near[2], path)

    def faster(self, device: str, N: int, K: int, encoding: str, M: int, path: str) -> bool:
        """Whether `path` was timed strictly faster than decode_cublas in the same run for this
        key at batch M (whether or not it was the fastest path there)."""
        e = self.entries.get(entry_key(device, N, K, encoding, bucket(M)))
        if e is None or (path in TILED_ONLY and not encoding.endswith(TILED)):
            return False
        t, base = e["times_ms"].get(path), e["times_ms"].get(DECODE_CUBLAS)
        return _finite(t) and _finite(base) and t < base

    def best_ms(self, device: str, N: int, K: int, encoding: str, bucket_name: str,
                path: str | None = None) -> float | None:
        """The time of the path lookup() runs for this key, or of `path` (None: not measured)."""
        e = self.entries.get(entry_key(device, N, K, encoding, bucket_name))
        if e is None:
            return None
        t = e["times_ms"].get(path or choose(e["times_ms"], encoding))
        return float(t) if _finite(t) else None

    def _palette_orders(self, device: str) -> dict:
        """{(N, K): the palette table encodings ("palette", "palette:tiled") `device` timed it in}."""
        out = {}
        for key in self.entries:
            d, n, k, enc, _ = split_key(key)
            if d == device and enc in ("palette", "palette" + TILED) and n > 0 and k > 0:
                out.setdefault((n, k), set()).add(enc)
        return out

    def orders_timed(self, device: str, N: int, K: int) -> set:
        """The palette table encodings ("palette", "palette:tiled") `device` timed [N, K] in."""
        return self._palette_orders(device).get((N, K), set())

    def nearest_order(self, device: str, N: int, K: int) -> str | None:
        """plane_order of the shape nearest [N, K] (|ln N/N'| + |ln K/K'|; ties to the larger)
        among those `device` timed in both plane orders; None when it timed none so."""
        shapes = [nk for nk, encs in self._palette_orders(device).items() if len(encs) == 2]
        if not shapes:
            return None
        n, k = min(shapes, key=lambda nk: (abs(math.log(nk[0] / N)) + abs(math.log(nk[1] / K)), -nk[0], -nk[1]))
        return self.plane_order(device, n, k)

    def plane_order(self, device: str, N: int, K: int) -> str:
        """"tiled" when the palette [N, K] weight was timed in both plane orders on `device`
        and, over the buckets timed in both, the geometric mean of (best tile-major time /
        best file-order time) is below 1; else "file" (nothing measured keeps the stored order)."""
        ratios = []
        for b in BUCKETS:
            f, t = (self.best_ms(device, N, K, enc, b) for enc in ("palette", "palette" + TILED))
            if f is not None and t is not None:
                ratios.append(math.log(t / f))
        return "tiled" if ratios and sum(ratios) < 0 else "file"

    def record_decoders(self, device: str, N: int, K: int, encoding: str, S: int, times_ms: dict,
                        default: str | None = None) -> str:
        """Store the decoder variants' times of one weight shape (keyed by variant name, the
        run's default among them) and return the choice they give.  default: the variant the
        run's unnamed decode ran (the extension's default when it was built), else this
        build's default."""
        names = decoder_names(encoding)
        default = default or default_decoder(encoding)
        times = {k: float(v) for k, v in times_ms.items() if k in names and _finite(v)}
        choice = choose_decoder(times, default, names)
        self.decoders[decoder_key(device, N, K, encoding, S)] = {"default": default, "choice": choice,
                                                                 "times_ms": times}
        return choice

    def decoder(self, device: str, N: int, K: int, encoding: str, S: int = 0) -> int:
        """The decoder variant number for a weight (0: the extension's default): a variant
        recorded as strictly faster than this build's default timed in the same run.  An entry
        that did not time this build's default (a table older than the default) chooses
        nothing."""
        e = self.decoders.get(decoder_key(device, N, K, encoding, S))
        if e is None:
            return 0
        names, default = decoder_names(encoding), default_decoder(encoding)
        # Re-derived from the times, not read from e["choice"]: only a recorded win counts.
        choice = choose_decoder(e["times_ms"], default, names)
        return 0 if choice == default else names[choice]

    def update(self, other: "TuningTable") -> "TuningTable":
        """Overlay other's entries and decoders on this table (other wins key by key).  Returns self."""
        self.entries.update(other.entries)
        self.decoders.update(other.decoders)
        return self


def _rekey_legacy(entries: dict) -> dict:
    """Entries under a retired bucket (LEGACY_BUCKETS) filed under each bucket that replaced
    it, where that bucket has no entry of its own: the same measurement governs the same
    batches as before."""
    out = {k: v for k, v in entries.items() if k.rsplit("|", 1)[-1] not in LEGACY_BUCKETS}
    for k, v in entries.items():
        head, _, b = k.rpartition("|")
        for nb in LEGACY_BUCKETS.get(b, ()):
            out.setdefault(f"{head}|{nb}", v)
    return out


def load_table() -> TuningTable:
    """The shipped defaults overlaid with the user's cache (read from disk on each call)."""
    return TuningTable.load(DEFAULTS_PATH).update(TuningTable.load(default_cache_path()))
