"""Build of unweight's native parts.

* ``unweight._C``: the pybind11 C++17 CPU codec.  Always built.
* ``unweight._cuda``: the CUDA decode kernels (pybind11, raw device pointers + stream, no
  libtorch ABI).  Built when ``nvcc`` is found (``$CUDA_HOME/bin/nvcc`` or on PATH) unless
  ``UNWEIGHT_SKIP_CUDA=1``.  A failed CUDA build prints a warning and leaves a working CPU
  install.  ``UNWEIGHT_CUDA_ARCHS`` (default "80;90a") selects the SM targets.
"""
import os
import shutil
import subprocess
import sys
import sysconfig

from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup

HERE = os.path.dirname(os.path.abspath(__file__))


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
    try:
        out = subprocess.run([nvcc, "--dryrun", "--version"], capture_output=True, text=True, timeout=60)
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
        archs = os.environ.get("UNWEIGHT_CUDA_ARCHS", "80;90a").split(";")
        gencode = []
        for a in archs:
            a = a.strip()
            gencode += ["-gencode", f"arch=compute_{a},code=sm_{a}"]
        cuda_home = find_cuda_home(nvcc)
        build_temp = os.path.join(self.build_temp, "cuda")
        os.makedirs(build_temp, exist_ok=True)
        objects = []
        import pybind11
        includes = [os.path.join(HERE, "csrc"), pybind11.get_include(), sysconfig.get_paths()["include"]]
        for src in ext.sources:
            obj = os.path.join(build_temp, os.path.basename(src) + ".o")
            if src.endswith(".cu"):
                cmd = [nvcc, "-c", src, "-o", obj, "-O3", "-std=c++17", "--expt-relaxed-constexpr",
                       "-Xcompiler", "-fPIC", "-lineinfo"] + gencode + [f"-I{i}" for i in includes]
            else:
                cmd = [os.environ.get("CXX", "c++"), "-c", src, "-o", obj, "-O3", "-std=c++17", "-fPIC",
                       "-fvisibility=hidden", f"-I{os.path.join(cuda_home, 'include')}"] + [f"-I{i}" for i in includes]
            sys.stderr.write(" ".join(cmd) + "\n")
            subprocess.check_call(cmd)
            objects.append(obj)
        out = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        libdirs = [os.path.join(cuda_home, d) for d in ("lib64", "lib", "targets/x86_64-linux/lib")]
        cmd = [os.environ.get("CXX", "c++"), "-shared", "-o", out] + objects + \
              [f"-L{d}" for d in libdirs if os.path.isdir(d)] + ["-lcudart_static", "-ldl", "-lrt", "-lpthread"]
        sys.stderr.write(" ".join(cmd) + "\n")
        subprocess.check_call(cmd)


CPU_SOURCES = ("thread_pool.cpp", "cpu_features.cpp", "crc32.cpp", "host_alloc.cpp", "huffman_encode.cpp",
               "huffman_decode.cpp", "palette.cpp")
ext_modules = [
    Pybind11Extension(
        "unweight._C",
        [os.path.join("csrc", "cpu", f) for f in CPU_SOURCES] + ["csrc/bindings_cpu.cpp"],
        include_dirs=["csrc"],
        cxx_std=17,
        extra_compile_args=["-O3"],
        libraries=["z"],
    )
]
CUDA_SOURCES = ("huffman_decode.cu", "palette_decode.cu", "transcode.cu", "palette_matmul.cu", "huffman_matmul.cu",
                "launch.cu", "emulate.cu", "bindings_cuda.cpp")
cuda_sources = [os.path.join("csrc", "cuda", f) for f in CUDA_SOURCES]
if find_nvcc() and all(os.path.exists(os.path.join(HERE, s)) for s in cuda_sources):
    ext_modules.append(CudaExtension("unweight._cuda", cuda_sources))

setup(ext_modules=ext_modules, cmdclass={"build_ext": BuildExt})
