#!/usr/bin/env python3
"""Per-kernel resource usage of the CUDA build, from ptxas -v.

setup.py compiles every .cu file with ``-Xptxas -v`` and keeps the per-kernel lines in
``build/ptxas-sm_<arch>.txt``.  This script turns them into one table (kernel, arch,
registers, static shared memory, stack frame, spill stores / loads, source file) and a JSON
file, by default ``benchmarks/results/ptxas/ptxas-<date>-<commit>.json``.

Shared memory here is what ptxas sees: static ``__shared__`` arrays (the Huffman decoders'
32 KiB LUT).  Dynamic shared memory is sized at launch (the palette GEMM's cp.async rings,
kernel_plan.h PMMA_SMEM_BYTES; the transcode's tables) and shows as 0.

Usage: python scripts/ptxas_report.py [--build-dir build] [--out PATH] [--no-write]
"""
from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\w+)'")
PROPS = re.compile(r"Function properties for (\S+)")
STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"Used (\d+) registers")
BARRIERS = re.compile(r"used (\d+) barriers")
SMEM = re.compile(r"(\d+) bytes smem")


def parse(path: str) -> list[dict]:
    """Entries of one build/ptxas-sm_<arch>.txt, in file order."""
    out: list[dict] = []
    by_symbol: dict[str, dict] = {}
    source, props_of = None, None
    with open(path) as fh:
        for line in fh:
            line = line.rstrip("\n")
            if line.startswith("# "):
                source = line[2:].strip()
                continue
            m = ENTRY.search(line)
            if m:
                e = {"symbol": m.group(1), "arch": m.group(2), "source": source, "registers": None,
                     "barriers": 0, "shared_bytes": 0, "stack_frame_bytes": 0,
                     "spill_store_bytes": 0, "spill_load_bytes": 0}
                out.append(e)
                by_symbol[e["symbol"]] = e
                props_of = None
                continue
            m = PROPS.search(line)
            if m:
                props_of = by_symbol.get(m.group(1))  # None for a non-entry device function
                continue
            m = STACK.search(line)
            if m and props_of is not None:
                props_of["stack_frame_bytes"], props_of["spill_store_bytes"], props_of["spill_load_bytes"] = \
                    (int(g) for g in m.groups())
                continue
            m = USED.search(line)
            if m and out:
                e = props_of if props_of is not None else out[-1]
                e["registers"] = int(m.group(1))
                if (b := BARRIERS.search(line)):
                    e["barriers"] = int(b.group(1))
                if (s := SMEM.search(line)):
                    e["shared_bytes"] = int(s.group(1))
    return out


def demangle(symbols: list[str]) -> dict[str, str]:
    """Mangled -> demangled names, through c++filt when it is installed (else unchanged)."""
    tool = shutil.which("c++filt")
    if not tool or not symbols:
        return {s: s for s in symbols}
    res = subprocess.run([tool], input="\n".join(symbols), capture_output=True, text=True, check=False)
    names = res.stdout.splitlines()
    if res.returncode != 0 or len(names) != len(symbols):
        return {s: s for s in symbols}
    return dict(zip(symbols, names))


def short_name(demangled: str) -> str:
    """'void unweight::cuda::detail::(anonymous namespace)::k<16, false>(Args, ...)' -> 'k<16, false>'."""
    name = re.sub(r"^void ", "", demangled)
    name = name.replace("(anonymous namespace)::", "")
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):  # the parameter list starts at the first '(' outside <...>
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            cut = i
            break
    name = name[:cut]
    return re.sub(r"^unweight::cuda::(detail::)?", "", name)


def git(*args: str) -> str:
    res = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    return res.stdout.strip() if res.returncode == 0 else ""


def build_stamp() -> dict:
    """What every report of a build records first: today's date, the commit, and whether the
    native sources differ from it (a build from uncommitted sources is not the commit's)."""
    return {"date": datetime.date.today().isoformat(), "commit": git("rev-parse", "--short", "HEAD") or "nocommit",
            "native_sources_modified": bool(git("status", "--porcelain", "--", "csrc", "setup.py"))}


def write_report(doc: dict, out: str | None, folder: str, prefix: str) -> None:
    """Writes a report's JSON to `out`, by default benchmarks/results/<folder>/<prefix>-<date>-<commit>.json
    (doc holds build_stamp()'s date and commit), and prints where."""
    out = out or os.path.join(ROOT, "benchmarks", "results", folder, f"{prefix}-{doc['date']}-{doc['commit']}.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as fh:
        json.dump(doc, fh, indent=1)
        fh.write("\n")
    print(f"wrote {os.path.relpath(out, ROOT)}")


def nvcc_version() -> str:
    nvcc = shutil.which("nvcc")
    if not nvcc:
        return ""
    res = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=False)
    lines = [ln for ln in res.stdout.splitlines() if "release" in ln]
    return lines[0].strip() if lines else ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build"), help="where setup.py wrote ptxas-sm_*.txt")
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/ptxas/ptxas-<date>-<commit>.json)")
    ap.add_argument("--no-write", action="store_true", help="print the table only")
    args = ap.parse_args()

    files = sorted(glob.glob(os.path.join(args.build_dir, "ptxas-sm_*.txt")))
    if not files:
        print(f"no ptxas-sm_*.txt in {args.build_dir}: build the CUDA extension first "
              "(python3 setup.py build_ext --inplace)", file=sys.stderr)
        return 1
    entries = [e for f in files for e in parse(f)]
    names = demangle(sorted({e["symbol"] for e in entries}))
    for e in entries:
        e["symbol"] = names[e["symbol"]]
        e["kernel"] = short_name(e["symbol"])
    # Natural order, so palette_gemm_kernel<2> comes before <10>.
    def natural(text: str) -> list:
        return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text)]
    entries.sort(key=lambda e: (e["arch"], e["source"] or "", natural(e["kernel"])))

    cols = ["kernel", "arch", "registers", "shared_bytes", "stack_frame_bytes", "spill_store_bytes",
            "spill_load_bytes", "source"]
    heads = ["kernel", "arch", "regs", "smem B", "stack B", "spill st B", "spill ld B", "source"]
    rows = [[str(e[c]) if c != "source" else os.path.basename(e[c] or "") for c in cols] for e in entries]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(heads)]
    print("  ".join(h.ljust(w) for h, w in zip(heads, widths)))
    for r in rows:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths)))
    spills = [e for e in entries if e["spill_store_bytes"] or e["spill_load_bytes"]]
    print(f"{len(entries)} kernels over {len({e['arch'] for e in entries})} targets; "
          f"{len(spills)} with spills" + (": " + ", ".join(sorted({e['kernel'] for e in spills})) if spills else ""))

    if args.no_write:
        return 0
    doc = {
        "benchmark": "ptxas_report",
        **build_stamp(),
        "nvcc": nvcc_version(),
        "archs": sorted({e["arch"] for e in entries}),
        "note": "shared_bytes is static shared memory as ptxas reports it; dynamic shared memory "
                "(the palette GEMM's cp.async rings, kernel_plan.h PMMA_SMEM_BYTES; the transcode's tables) is "
                "sized at launch and not included",
        "kernels": [{c: e[c] for c in ["kernel", "arch", "registers", "barriers", "shared_bytes",
                                      "stack_frame_bytes", "spill_store_bytes", "spill_load_bytes",
                                      "source", "symbol"]} for e in entries],
    }
    write_report(doc, args.out, "ptxas", "ptxas")
    return 0


if __name__ == "__main__":
    sys.exit(main())
