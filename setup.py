"""Build of unweight's native parts.

* ``unweight._C``: the pybind11 C++17 CPU codec (csrc/cpu/, csrc/bindings_cpu.cpp).  Always
  built.
* ``unweight._cuda``: the CUDA decode kernels (csrc/cuda/; pybind11, raw device pointers +
  stream, no libtorch ABI).  Built when ``nvcc`` is found (``$CUDA_HOME/bin/nvcc`` or on PATH).
  A failed CUDA build prints a warning and leaves a working CPU install.

Environment switches:

* ``UNWEIGHT_SKIP_CUDA=1``: do not build ``unweight._cuda``.
* ``UNWEIGHT_CUDA_ARCHS`` (default ``"80;90a"``): the SM targets, ``;``-separated.
* ``CUDA_HOME`` (or ``CUDA_PATH``): the toolkit, when ``nvcc`` on PATH is not the one wanted.
* ``UNWEIGHT_LINEINFO=1``: compile the kernels with ``-lineinfo`` (source lines in profiler and
  sanitizer reports); release builds leave it out.
* ``UNWEIGHT_WERROR=1``: warnings in our own sources, host and device code, fail the build (CI
  sets it; third-party and toolkit headers are included as system headers, so their warnings
  never count).  Off by default, so a compiler newer than the ones the sources were checked
  with cannot break a user's install.
* ``UNWEIGHT_BUILD_JOBS`` (default: the number of CPUs): how many compiler processes run at
  once, for each extension's sources.

Besides the package, an install puts ``unweight-transformers.pth`` at the root of site-packages:
the code of ``unweight/integrations/transformers/startup.py`` on one line, which Python runs at
start-up so that transformers knows the "unweight" quant method in every process (see that file).

Every CUDA build writes ptxas's per-kernel registers, shared memory, stack and spills to
``build/ptxas-sm_<arch>.txt`` (one file per target); ``scripts/ptxas_report.py`` turns them
into a table and JSON.
"""
import concurrent.futures
import glob
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension, build_ext
from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def env_flag(name, default):
    return os.environ.get(name, "1" if default else "0") == "1"


def build_jobs():
    """UNWEIGHT_BUILD_JOBS, else (unset or 0) the CPU count: pybind11's ParallelCompile rule."""
    n = os.environ.get("UNWEIGHT_BUILD_JOBS", "0").strip()
    if not n.isdigit():
        raise SystemExit(f"UNWEIGHT_BUILD_JOBS must be a whole number, not {n!r}")
    return int(n) or os.cpu_count() or 1


WERROR = env_flag("UNWEIGHT_WERROR", False)
# Warning flags for host code we write (the CPU codec, the CUDA bindings, the host side of the
# .cu files).  pybind11's and Python's headers come in through -isystem, so a warning inside
# them is not ours to fix and does not fail the build.
HOST_WARNINGS = ["-Wall", "-Wextra"] + (["-Werror"] if WERROR else [])


def third_party_includes():
    import pybind11
    return [pybind11.get_include(), sysconfig.get_paths()["include"]]


def find_nvcc():
    if os.environ.get("UNWEIGHT_SKIP_CUDA", "0") == "1":
        return None
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and os.path.exists(os.path.join(home, "bin", "nvcc")):
        return os.path.join(home, "bin", "nvcc")
    return shutil.which("nvcc")


def find_cuda_home(nvcc):
    """The toolkit root holding include/cuda_runtime.h.  nvcc may be a wrapper script (as on
    machines where /usr/local/bin/nvcc execs the real one), so its own path is not enough."""
    cands = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"),
             os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))]
    # nvcc names its own root (TOP=) only when it plans a compile: ask for the plan of one.
    try:
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "probe.cu")
            with open(src, "w") as f:
                f.write("int main() { return 0; }\n")
            out = subprocess.run([nvcc, "--dryrun", "-c", src, "-o", os.path.join(tmp, "probe.o")],
                                 capture_output=True, text=True, timeout=60, check=False)
        for line in (out.stdout + out.stderr).splitlines():
            if "TOP=" in line:
                cands.append(line.split("TOP=", 1)[1].strip().strip('"'))
    except (OSError, subprocess.SubprocessError):
        pass
    cands += ["/usr/local/cuda"]
    for c in cands:
        if c and os.path.exists(os.path.join(c, "include", "cuda_runtime.h")):
            return c
    raise RuntimeError("CUDA toolkit headers not found (set CUDA_HOME)")


# ptxas -v lines kept for the report: the entry being compiled (and its target), its stack
# and spills, its registers and static shared memory.
PTXAS_KEEP = re.compile(r"Compiling entry function|Function properties for|bytes stack frame|Used \d+ registers")
PTXAS_TARGET = re.compile(r"for '(sm_\w+)'")
PTXAS_INFO = re.compile(r"^ptxas info|^\s+\d+ bytes stack frame")
# ptxas's performance advisories arrive as "ptxas info" lines too, but say a kernel lost what it
# was written for (C7514: every wgmma of the kernel serialised): shown, and errors under WERROR.
PTXAS_ADVISORY = re.compile(r"Potential Performance Loss")


def split_ptxas(source, text, per_arch):
    """Appends the ptxas -v lines of one translation unit to per_arch[sm_xx], each unit's
    lines under a '# <source>' line."""
    arch = None
    for line in text.splitlines():
        if not PTXAS_KEEP.search(line):
            continue
        m = PTXAS_TARGET.search(line)
        if m:
            arch = m.group(1)
        if arch is None:
            continue
        lines = per_arch.setdefault(arch, {}).setdefault(source, [])
        lines.append(line)


class CudaExtension(Pybind11Extension):
    """Marker: sources ending in .cu go through nvcc, the rest through the C++ compiler."""


class BuildExt(build_ext):
    def build_extensions(self):
        cuda = [e for e in self.extensions if isinstance(e, CudaExtension)]
        self.extensions = [e for e in self.extensions if not isinstance(e, CudaExtension)]
        super().build_extensions()
        built = []
        for ext in cuda:
            try:
                self._build_cuda(ext)
                built.append(ext)
            except Exception as exc:  # noqa: BLE001 - any failure leaves the CPU build usable
                sys.stderr.write(f"WARNING: unweight CUDA extension not built ({exc}); "
                                 "the CPU codec is installed and GPU modes fall back to dense.\n")
        # Back on the list so setuptools copies them in place (--inplace, editable installs)
        # and into wheels like any other extension.
        self.extensions += built

    def _build_cuda(self, ext):
        nvcc = find_nvcc()
        archs = [a.strip() for a in os.environ.get("UNWEIGHT_CUDA_ARCHS", "80;90a").split(";") if a.strip()]
        gencode = []
        # PTX of the lowest portable target rides along (code=compute_XX), so a GPU newer than
        # every listed target can JIT the kernels; arch-specific targets ("90a") have no
        # forward-compatible PTX.
        portable = sorted((a for a in archs if a.isdigit()), key=int)
        for a in archs:
            code = f"[sm_{a},compute_{a}]" if portable and a == portable[0] else f"sm_{a}"
            gencode += ["-gencode", f"arch=compute_{a},code={code}"]
        cuda_home = find_cuda_home(nvcc)
        build_temp = os.path.join(self.build_temp, "cuda")
        os.makedirs(build_temp, exist_ok=True)
        ours = [f"-I{os.path.join(HERE, 'csrc')}"]
        system = [f for i in third_party_includes() for f in ("-isystem", i)]
        # -Werror all-warnings makes nvcc's own diagnostics (front end, device passes) errors;
        # the host compiler gets HOST_WARNINGS through -Xcompiler.  Checked with CUDA 13.0:
        # its headers trip neither, so no flag needed backing off.  -Xptxas -v: the per-kernel
        # resource lines saved to build/ptxas-sm_<arch>.txt below.
        nvcc_flags = ["-O3", "-std=c++17", "--expt-relaxed-constexpr", "-Xcompiler", ",".join(["-fPIC"] + HOST_WARNINGS),
                      "-Xptxas", "-v"] + gencode
        if WERROR:
            nvcc_flags += ["-Werror", "all-warnings"]
        if env_flag("UNWEIGHT_LINEINFO", False):
            nvcc_flags.append("-lineinfo")
        cxx = os.environ.get("CXX", "c++")
        jobs = []
        for src in ext.sources:
            obj = os.path.join(build_temp, os.path.basename(src) + ".o")
            if src.endswith(".cu"):
                cmd = [nvcc, "-c", src, "-o", obj] + nvcc_flags + ours
            else:
                cmd = [cxx, "-c", src, "-o", obj, "-O3", "-std=c++17", "-fPIC", "-fvisibility=hidden"] + HOST_WARNINGS + \
                      ours + ["-isystem", os.path.join(cuda_home, "include")] + system
            jobs.append((src, obj, cmd))

        def run(job):
            cmd = job[2]
            sys.stderr.write(" ".join(cmd) + "\n")
            return subprocess.run(cmd, capture_output=True, text=True, check=False)  # failures reported below

        # nvcc invocations are independent and each mostly single-threaded: run them side by side.
        with concurrent.futures.ThreadPoolExecutor(max_workers=build_jobs()) as pool:
            results = list(pool.map(run, jobs))
        per_arch = {}
        failed = []
        for (src, _, _), res in zip(jobs, results):
            out = res.stdout + res.stderr
            split_ptxas(src, out, per_arch)
            # Everything but ptxas's resource lines is worth showing (warnings, errors).
            rest = "\n".join(line for line in out.splitlines()
                             if not PTXAS_INFO.search(line) or PTXAS_ADVISORY.search(line))
            if rest.strip():
                sys.stderr.write(rest + "\n")
            if res.returncode != 0 or (WERROR and PTXAS_ADVISORY.search(out)):
                failed.append(src)
        if failed:
            raise RuntimeError("compiling " + ", ".join(failed) + " failed")
        report_dir = os.path.join(HERE, "build")
        os.makedirs(report_dir, exist_ok=True)
        for stale in glob.glob(os.path.join(report_dir, "ptxas-sm_*.txt")):  # targets this build dropped
            os.remove(stale)
        for arch, units in sorted(per_arch.items()):
            path = os.path.join(report_dir, f"ptxas-{arch}.txt")
            with open(path, "w") as fh:
                for src, lines in units.items():
                    fh.write(f"# {src}\n" + "\n".join(lines) + "\n")
            sys.stderr.write(f"ptxas resource usage ({arch}): {path}\n")
        out = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        libdirs = [os.path.join(cuda_home, d) for d in ("lib64", "lib", "targets/x86_64-linux/lib")]
        cmd = [cxx, "-shared", "-o", out] + [obj for _, obj, _ in jobs] + \
              [f"-L{d}" for d in libdirs if os.path.isdir(d)] + ["-lcudart_static", "-ldl", "-lrt", "-lpthread"]
        sys.stderr.write(" ".join(cmd) + "\n")
        subprocess.check_call(cmd)


# The C++ sources of each extension compile side by side (UNWEIGHT_BUILD_JOBS processes).
ParallelCompile("UNWEIGHT_BUILD_JOBS").install()

CPU_SOURCES = ("thread_pool.cpp", "cpu_features.cpp", "crc32.cpp", "host_alloc.cpp", "huffman_encode.cpp",
               "huffman_decode.cpp", "palette.cpp")
ext_modules = [
    Pybind11Extension(
        "unweight._C",
        [os.path.join("csrc", "cpu", f) for f in CPU_SOURCES] + ["csrc/bindings_cpu.cpp"],
        include_dirs=["csrc"],
        cxx_std=17,
        extra_compile_args=["-O3"] + HOST_WARNINGS + [f for i in third_party_includes() for f in ("-isystem", i)],
        libraries=["z"],
    )
]
CUDA_SOURCES = ("huffman_decode.cu", "palette_decode.cu", "transcode.cu", "palette_matmul.cu", "palette_gemv.cu",
                "prefetch.cu", "crc32.cu", "launch.cu", "emulate.cu", "emu/selftest.cu", "emu/fiber.cpp",
                "bindings_cuda.cpp")
cuda_sources = [os.path.join("csrc", "cuda", f) for f in CUDA_SOURCES]
if find_nvcc() and all(os.path.exists(os.path.join(HERE, s)) for s in cuda_sources):
    ext_modules.append(CudaExtension("unweight._cuda", cuda_sources))

STARTUP_PTH = "unweight-transformers.pth"


def startup_pth_line() -> str:
    """startup.py's code as the one ``import`` line a .pth file may run (site.addpackage
    executes a line that starts with ``import``)."""
    with open(os.path.join(HERE, "unweight", "integrations", "transformers", "startup.py")) as f:
        return f"import sys; exec({f.read()!r})\n"


class BuildPy(build_py):
    """build_py that also writes STARTUP_PTH at the root of the build tree, where wheels and
    installs take it to the root of site-packages."""

    def run(self):
        super().run()
        dests = [self.build_lib]
        if getattr(self, "editable_mode", False):
            # An editable wheel takes only the package's location from the build tree; what
            # belongs at the root of site-packages goes straight into the wheel being
            # assembled, which is the install command's install_lib (setuptools'
            # editable_wheel._configure_build).
            dests.append(self.distribution.get_command_obj("install").install_lib)
        for d in filter(None, dests):
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, STARTUP_PTH), "w") as f:
                f.write(startup_pth_line())

    def get_outputs(self, include_bytecode=True):
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, STARTUP_PTH)]


setup(ext_modules=ext_modules, cmdclass={"build_ext": BuildExt, "build_py": BuildPy})
