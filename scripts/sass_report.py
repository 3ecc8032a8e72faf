#!/usr/bin/env python3
"""Instruction counts of the CUDA kernels' machine code (SASS), from cuobjdump of the build.

Nothing here runs a kernel: these are static counts of what the compiler emitted, the
numbers docs/design/gpu-kernels.md quotes for the decoders' loops.  For every kernel of every
object file in ``build/temp*/cuda/`` (setup.py's build) and the chosen target it reports the
instruction count and each loop (a backward branch and the code it jumps over) with the
instructions that matter for the decoders: shared-memory loads (LDS: the Huffman table
lookups), tensor-core mma (HMMA), 16-byte global loads and stores, byte loads (LDG.E.U8: the
Huffman readers' bytewise tail) and calls.  For a kernel without a loop it reports the span
from its first global load to its last 16-byte store (the palette decode's vector path).  A table goes to stdout and JSON, by default to
``benchmarks/results/sass/sass-<date>-<commit>.json``.

cuobjdump ships with the CUDA toolkit or as the wheel nvidia-cuda-cuobjdump; without it the
script says so in one line and exits with status 2.

Usage: python scripts/sass_report.py [--arch sm_90a] [--kernel REGEX] [--out PATH] [--no-write]
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ptxas_report as pr  # noqa: E402  (demangling and short names, shared with the ptxas table)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FUNCTION = re.compile(r"^\s*Function : (\S+)")
INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
BRANCH = re.compile(r"\bBRA\s+(0x[0-9a-f]+)")
# What a loop is described by: opcode prefix -> key.
# hgmma / wgmma_waits: warpgroup MMAs and the waits on them (WARPGROUP.DEPBAR); a wait after
# every HGMMA of a loop is what ptxas's serialisation (advisory C7514) looks like.
COUNTED = (("LDS", "lds"), ("HMMA", "hmma"), ("HGMMA", "hgmma"), ("WARPGROUP.DEPBAR", "wgmma_waits"),
           ("LDG.E.U8", "byte_loads"), ("CALL", "calls"))


def find_cuobjdump() -> str | None:
    """cuobjdump on PATH, in $CUDA_HOME/bin, or from the nvidia-cuda-cuobjdump wheel."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    cands = [os.path.join(home, "bin", "cuobjdump")]
    for p in sys.path:
        cands += glob.glob(os.path.join(p, "nvidia", "*", "bin", "cuobjdump"))
    return next((c for c in cands if os.path.isfile(c) and os.access(c, os.X_OK)), None)


def _version(tool: str) -> str:
    res = subprocess.run([tool, "--version"], capture_output=True, text=True, check=False)
    lines = [ln.strip() for ln in res.stdout.splitlines() if "release" in ln or "version" in ln.lower()]
    return lines[-1] if lines else os.path.basename(tool)


def parse_functions(sass: str) -> dict[str, list[tuple[int, str, str]]]:
    """{mangled name: [(address, opcode, operands)]} of a cuobjdump -sass listing."""
    out: dict[str, list] = {}
    cur = None
    for line in sass.splitlines():
        m = FUNCTION.match(line)
        if m:
            cur = out.setdefault(m.group(1), [])
            continue
        m = INSTR.search(line)
        if m and cur is not None:
            cur.append((int(m.group(1), 16), m.group(2), m.group(3)))
    return out


def _counts(instrs) -> dict:
    c = {key: 0 for _, key in COUNTED}
    c["ldg_16B"] = c["stg_16B"] = 0
    for _, op, _ in instrs:
        for prefix, key in COUNTED:
            if op.startswith(prefix):
                c[key] += 1
        if op.startswith("LDG") and ".128" in op:
            c["ldg_16B"] += 1
        if op.startswith("STG") and ".128" in op:
            c["stg_16B"] += 1
    return c


def loops(instrs) -> list[dict]:
    """Each backward branch as a loop: its first and last address, instruction count and the
    counted instructions inside, innermost (smallest) first."""
    out = []
    for addr, op, rest in instrs:
        m = BRANCH.search(op + " " + rest) if op.startswith("BRA") else None
        if not m:
            continue
        target = int(m.group(1), 16)
        if target >= addr:
            continue
        body = [i for i in instrs if target <= i[0] <= addr]
        out.append({"from": hex(target), "to": hex(addr), "instructions": len(body), **_counts(body)})
    return sorted(out, key=lambda lp: lp["instructions"])


def vector_span(instrs) -> int | None:
    """Instructions from the first global load (not a byte load) to the last 16-byte store, or
    None."""
    loads = [k for k, (_, op, _) in enumerate(instrs) if op.startswith("LDG") and ".U8" not in op]
    stores = [k for k, (_, op, _) in enumerate(instrs) if op.startswith("STG") and ".128" in op]
    if not loads or not stores or stores[-1] < loads[0]:
        return None
    return stores[-1] - loads[0] + 1


def describe(instrs) -> dict:
    ops = Counter(op.split(".")[0] for _, op, _ in instrs)
    return {"instructions": len(instrs), "loops": loops(instrs), "vector_span": vector_span(instrs),
            "opcodes_top": dict(ops.most_common(8)), **_counts(instrs)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--kernel", default="", help="regex on the short kernel name (default: all)")
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/sass/sass-<date>-<commit>.json)")
    ap.add_argument("--no-write", action="store_true", help="print the table only")
    args = ap.parse_args(argv)
    tool = find_cuobjdump()
    if tool is None:
        print("sass_report: cuobjdump not found (CUDA toolkit, or pip install nvidia-cuda-cuobjdump)", file=sys.stderr)
        return 2
    objs = sorted(glob.glob(os.path.join(args.build_dir, "temp*", "cuda", "*.cu.o")))
    if not objs:
        print(f"sass_report: no CUDA objects under {args.build_dir}: build the extension first "
              "(python3 setup.py build_ext --inplace)", file=sys.stderr)
        return 1
    funcs: dict[str, tuple[str, list]] = {}
    for o in objs:
        res = subprocess.run([tool, "-sass", "-arch", args.arch, o], capture_output=True, text=True, check=False)
        for name, instrs in parse_functions(res.stdout).items():
            funcs[name] = (os.path.basename(o), instrs)
    if not funcs:
        # (cuobjdump 13 prints SASS through nvdisasm; without it, only the fatbin's headers)
        hint = "" if shutil.which("nvdisasm") else " (or nvdisasm is not on PATH: pip install nvidia-cuda-nvdisasm)"
        print(f"sass_report: no {args.arch} code in the objects under {args.build_dir}{hint}", file=sys.stderr)
        return 1
    names = pr.demangle(sorted(funcs))
    pat = re.compile(args.kernel)
    kernels = []
    for mangled, (obj, instrs) in sorted(funcs.items(), key=lambda kv: pr.short_name(names[kv[0]])):
        short = pr.short_name(names[mangled])
        if not pat.search(short):
            continue
        kernels.append({"kernel": short, "object": obj, "symbol": names[mangled], **describe(instrs)})
    for k in kernels:
        # Loops holding table lookups or mma, innermost first, and none that merely nests one.
        hot = [lp for lp in k["loops"] if lp["lds"] or lp["hmma"] or lp["hgmma"]]
        inner = [lp for lp in hot if not any(o is not lp and int(o["from"], 16) >= int(lp["from"], 16)
                                             and int(o["to"], 16) <= int(lp["to"], 16) for o in hot)]
        what = "; ".join(f"loop {lp['instructions']} instr: {lp['lds']} LDS, {lp['hmma']} HMMA, "
                         + (f"{lp['hgmma']} HGMMA, {lp['wgmma_waits']} wgmma waits, " if lp["hgmma"] else "")
                         + f"{lp['byte_loads']} byte loads, {lp['calls']} calls" for lp in inner) or (
            f"first load to last 16-B store: {k['vector_span']} instr" if k["vector_span"] else "")
        print(f"{k['kernel']:<40} {k['instructions']:>6} instr  {what}")
    if args.no_write:
        return 0
    doc = {"benchmark": "sass_report", **pr.build_stamp(), "arch": args.arch, "nvcc": pr.nvcc_version(),
           "cuobjdump": _version(tool), "kernels": kernels}
    pr.write_report(doc, args.out, "sass", "sass")
    return 0

if __name__ == "__main__":
    sys.exit(main())
