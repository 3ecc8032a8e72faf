"""transformers expert parallelism on unweight checkpoints (integrations/transformers/ep.py):
torchrun, 2 ranks, gloo on CPU, ``DistributedConfig(tp_size=2, ep_size=2)`` with the models'
own EP plans.

Checked: logits and greedy tokens bitwise equal to the BF16 model's under the same run; each
rank holds exactly its half of every experts parameter, compressed, decoding to the BF16
model's local experts bit for bit, and never the other half's planes (per-expert tensors left
unread, a stacked tensor's slice read alone); a flipped bit in one rank's experts stops the load
naming the tensor, whether that rank checks it alone (per-expert) or the group does (a stack).
"""
import json
import shutil
import subprocess
import sys

import pytest
import torch

from unweight import api

from tests.conftest import flip_stored_byte
from tests.integrations.transformers.test_moe import LAYOUTS, _make
from tests.integrations.transformers.test_tp import _WORKER_END, _env, _free_port, _tp_api

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")

# Per-expert checkpoint tensors (Qwen3-MoE, DeepSeek-V3's routed experts beside a shared one)
# and a stacked one (gpt-oss, with per-expert biases transformers shards itself).
ARCHS = ("qwen3_moe", "deepseek_v3", "gpt_oss")

WORKER = r'''
import hashlib, json, os, sys, traceback
import torch
import torch.distributed as dist
import unweight
from transformers import AutoModelForCausalLM
from transformers.distributed import DistributedConfig
from unweight.runtime.experts import expert_stacks
from unweight.runtime.modules import compressed_modules

out_path, paths, kw = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
forward = not os.environ.get("LOAD_ONLY")
if os.environ.get("HELD_CHECK_AS_ON_A_GPU"):  # the load check's GPU branch, on this CPU
    from unweight.runtime import verify
    verify.HeldCheck.on_device = staticmethod(lambda device: True)
rank = int(os.environ.get("RANK", 0))
ids = torch.tensor([[5, 17, 45, 200, 3, 99, 310, 7, 11, 400], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]])
sha = lambda t: hashlib.sha1(t.contiguous().view(torch.int16).numpy().tobytes()).hexdigest()
res = {}
for key, path in paths.items():
    try:
        m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16,
                                                 distributed_config=DistributedConfig(**kw)).eval()
    except Exception as e:
        res[key] = {"error": f"{type(e).__name__}: {e}"}
        continue
    r = {"experts": {}, "encodings": sorted({c.encoding_name for _, c in compressed_modules(m)})}
    if forward:
        with torch.no_grad():
            r["logits"] = hashlib.sha1(m(ids).logits.float().numpy().tobytes()).hexdigest()
            r["tokens"] = m.generate(ids[:1], max_new_tokens=8, do_sample=False)[0].tolist()
    stacks = expert_stacks(m)
    if stacks:
        for n, mod, _, st in stacks:
            holders = [p.module for src in st.sources if isinstance(src, list) for p in src]
            r["experts"][n] = {"sha": sha(st.materialize()), "held": st.held_bytes(), "n": st.num_experts,
                               "module_n": mod.num_experts, "shape": list(st.shape)}
        # plane buffers of every per-expert holder left in the model
        r["holders"] = sorted(n for n, mod in m.named_modules() if ".experts." in n
                              and any(b.endswith("__sm") for b, _ in mod.named_buffers(recurse=False)))
    else:
        for n, mod in m.named_modules():
            if type(mod).__name__.endswith("Experts"):
                for a, t in mod.named_parameters(recurse=False):
                    if t.dim() == 3:
                        t = t.to_local() if hasattr(t, "to_local") else t
                        r["experts"][f"{n}.{a}"] = {"sha": sha(t.detach()), "n": t.shape[0]}
''' + _WORKER_END


def _run(root, name: str, paths: dict, timeout=600, **env):
    """One torchrun launch of the worker over `paths` under TP = EP = 2; {rank: results}."""
    kw = {"tp_size": 2, "ep_size": 2, **json.loads(env.pop("KW", "{}"))}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(_free_port()),
           str(root / "worker.py"), str(root / name), json.dumps(paths), json.dumps(kw)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env(**env), cwd=str(root))
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-6000:])
    out = {"log": p.stdout + p.stderr}
    for rank in range(2):
        with open(root / f"{name}.{rank}.json") as f:
            out[rank] = json.load(f)
    return out


@pytest.fixture(scope="module")
def ep_models(tmp_path_factory):
    """(root, {key: folder}): each arch in BF16, huffman and palette, and two huffman
    checkpoints whose config asks for another mode."""
    _tp_api()
    root = tmp_path_factory.mktemp("unweight_ep")
    paths = {}
    for arch in ARCHS:
        src = _make(arch, str(root / f"{arch}-bf16"))
        paths[f"bf16-{arch}"] = src
        for enc in ("huffman", "palette"):
            dst = str(root / f"{arch}-{enc}")
            api.compress(src, dst, encoding=enc, progress=False)
            paths[f"{enc}-{arch}"] = dst
    # huffman checkpoints loaded in palette mode (each rank's blocks transcoded on the host) and
    # in dense mode (a stack's slice decoded to a Parameter of this rank's experts)
    for mode, arch in (("palette", "qwen3_moe"), ("dense", "gpt_oss")):
        dst = root / f"{arch}-huffman-as-{mode}"
        shutil.copytree(paths[f"huffman-{arch}"], dst)
        cfg = json.loads((dst / "config.json").read_text())
        cfg["quantization_config"]["mode"] = mode
        (dst / "config.json").write_text(json.dumps(cfg))
        paths[f"{mode}mode-{arch}"] = str(dst)
    (root / "worker.py").write_text(WORKER)
    return root, paths


@pytest.fixture(scope="module")
def ep_runs(ep_models):
    root, paths = ep_models
    return _run(root, "ep", paths)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("enc", ["huffman", "palette"])
def test_ep2_matches_bf16_ep2_and_holds_half_the_experts(ep_models, ep_runs, arch, enc):
    """Logits and greedy tokens equal to the BF16 model's under the same TP = EP = 2 run; each
    rank's experts parameters hold its E / 2 experts (the module's num_experts too), compressed,
    decoding to the BF16 model's local experts; per-expert holders only for those experts; no
    warning from transformers that the plan's rules for the stacks are not applied."""
    E = {k: v for k, v in LAYOUTS[arch][0].items() if k in ("num_experts", "n_routed_experts", "num_local_experts")}
    E = next(iter(E.values()))
    for rank in (0, 1):
        bf, uw = ep_runs[rank][f"bf16-{arch}"], ep_runs[rank][f"{enc}-{arch}"]
        assert "error" not in uw, uw
        assert uw["logits"] == bf["logits"] and uw["tokens"] == bf["tokens"], (rank, arch, enc)
        assert sorted(uw["experts"]) == sorted(bf["experts"]) and uw["experts"], (rank, arch)
        for n, e in uw["experts"].items():
            # this rank's half, decoding to the BF16 model's local experts under the same plan
            assert e["n"] == e["module_n"] == E // 2 == bf["experts"][n]["n"], (rank, n, e)
            assert e["sha"] == bf["experts"][n]["sha"], (rank, arch, enc, n)
            assert 0 < e["held"] < 0.8 * 2 * e["shape"][0] * e["shape"][1] * e["shape"][2], (rank, n)
        # per-expert tensors: only this rank's experts' holders carry planes
        lo, hi = rank * E // 2, (rank + 1) * E // 2
        held = {int(h.split(".experts.")[1].split(".")[0]) for h in uw["holders"]}
        assert LAYOUTS[arch][1] == "stacked" or held == set(range(lo, hi)), (rank, held)
    # transformers' "ep_plan rules [...] match nothing ... will not be applied" about the
    # compressed stacks (not Parameters, yet distributed as the rules ask) is not shown
    assert "`ep_plan` rules" not in ep_runs["log"]


def test_huffman_checkpoints_held_as_palette_and_dense(ep_runs):
    """mode="palette" on a huffman checkpoint: each rank's tensor-parallel blocks (whose headers
    carry no crc32 of their own) are transcoded on the host and checked as held, and the
    experts with them; mode="dense": a gpt-oss stack's slice becomes a Parameter of this rank's
    experts, checked across the group as a compressed slice is.  Logits equal the BF16 model's."""
    for rank in (0, 1):
        bf, uw = ep_runs[rank]["bf16-qwen3_moe"], ep_runs[rank]["palettemode-qwen3_moe"]
        assert "error" not in uw, uw
        assert uw["encodings"] == ["palette"] and uw["logits"] == bf["logits"], (rank, uw["encodings"])
        bf, uw = ep_runs[rank]["bf16-gpt_oss"], ep_runs[rank]["densemode-gpt_oss"]
        assert "error" not in uw, uw
        assert uw["logits"] == bf["logits"] and uw["experts"] == bf["experts"], (rank, uw["experts"])


def test_ep2_with_all_to_all_dispatch(ep_models):
    """ep_implementation="all_to_all": each rank of the TP group sends its half of the tokens
    to the experts' ranks and back (the path transformers takes in training or when the ranks
    hold different batches): logits equal to the BF16 model's under the same dispatch."""
    root, paths = ep_models
    keys = ["bf16-qwen3_moe", "huffman-qwen3_moe", "bf16-gpt_oss", "palette-gpt_oss"]
    runs = _run(root, "a2a", {k: paths[k] for k in keys}, KW=json.dumps({"ep_implementation": "all_to_all"}))
    for rank in (0, 1):
        for arch, enc in (("qwen3_moe", "huffman"), ("gpt_oss", "palette")):
            bf, uw = runs[rank][f"bf16-{arch}"], runs[rank][f"{enc}-{arch}"]
            assert "error" not in uw, uw
            assert uw["logits"] == bf["logits"] and uw["tokens"] == bf["tokens"], (rank, arch)


def _corrupt(root, paths, key, tensor, at):
    bad = root / f"bad-{key}-{tensor.replace('.', '_')}"
    if not bad.exists():
        shutil.copytree(paths[key], bad)
        flip_stored_byte(str(bad / "model.safetensors"), tensor, delta=0x40, at=at)
    return str(bad)


@pytest.mark.parametrize("verify", ["held", "host", "held-as-on-a-gpu"])
def test_a_flipped_bit_in_one_ranks_experts_is_named(ep_models, verify):
    """Rank 1's expert 7 (per-expert: checked by rank 1 alone, which names it; rank 0 never
    reads it) and rank 1's half of a gpt-oss stack (its slice's record fails the EP group's
    check of the stack's crc32 on both ranks), through the check after prepare and through
    UNWEIGHT_VERIFY=host's check as the planes are read, and the check's GPU branch (each expert
    decoded and hashed where it is held, a slice's crcs combined) taken on this CPU."""
    root, paths = ep_models
    per_expert = _corrupt(root, paths, "huffman-qwen3_moe", "model.layers.1.mlp.experts.7.down_proj.weight__sm", 0.5)
    stacked = _corrupt(root, paths, "huffman-gpt_oss", "model.layers.0.mlp.experts.gate_up_proj__sm", 0.75)
    env = {"HELD_CHECK_AS_ON_A_GPU": "1"} if verify == "held-as-on-a-gpu" else {"UNWEIGHT_VERIFY": verify}
    runs = _run(root, f"bad-{verify}", {"per_expert": per_expert, "stacked": stacked,
                                       "good": paths["palette-gpt_oss"]}, LOAD_ONLY="1", **env)
    assert "error" not in runs[0]["good"] and "error" not in runs[1]["good"], runs
    assert "error" not in runs[0]["per_expert"], runs[0]["per_expert"]  # its experts are 0..3
    assert runs[1]["per_expert"]["error"].startswith("ChecksumError"), runs[1]
    assert "model.layers.1.mlp.experts.7.down_proj.weight" in runs[1]["per_expert"]["error"]
    # rank 1 decodes its slice to other bits (a flipped sign+mantissa byte changes the exponents'
    # contexts: the decoder may find the stream corrupt first); rank 0's check of the stack's
    # crc32 then lacks rank 1's record, and stops too
    for rank in (0, 1):
        err = runs[rank]["stacked"].get("error", "")
        assert err.startswith(("ChecksumError", "FormatError")) and "model.layers.0.mlp.experts.gate_up_proj" in err, \
            (rank, err)
    assert runs[0]["stacked"]["error"].startswith("ChecksumError")


@pytest.mark.parametrize("layout, says", [({"tp_size": 1, "fsdp_size": 2}, "FSDP (fsdp_size x dp_replicate_size = 2)"),
                                          ({"tp_size": 1, "ep_size": 1, "pp_size": 2},
                                           "pipeline parallelism (pp_size = 2)")])
def test_fsdp_and_pipeline_parallelism_are_refused_in_one_line(ep_models, layout, says):
    """FSDP wraps Parameters for training, and pipeline parallelism's stage split does not place
    compressed modules: a compressed checkpoint under either stops on every rank with one line
    saying so."""
    root, paths = ep_models
    runs = _run(root, f"refused-{len(says)}", {"uw": paths["huffman-qwen3_moe"]}, LOAD_ONLY="1",
                KW=json.dumps(layout))
    for rank in (0, 1):
        assert runs[rank]["uw"]["error"].startswith(f"InputError: unweight: {says}"), runs[rank]



def test_plans_compressed_experts_cannot_follow_are_refused():
    """ep._style_of: the models' own pair (ep_dispatch_experts on the experts module,
    grouped_gemm or nothing on its parameter) is followed, no style keeps the experts whole;
    any other style on the module, the parameter or a module above them is refused in one
    line naming it."""
    from unweight.format.errors import InputError
    from unweight.integrations.transformers import ep
    mod, full = "model.layers.0.mlp.experts", "model.layers.0.mlp.experts.gate_up_proj"
    assert ep._style_of({mod: "ep_dispatch_experts", full: "grouped_gemm"}, full, mod) == "ep_dispatch_experts"
    assert ep._style_of({mod: "ep_dispatch_experts"}, full, mod) == "ep_dispatch_experts"
    assert ep._style_of({"model.layers.0.self_attn.q_proj": "colwise"}, full, mod) is None
    for plan, named in (({mod: "moe_tp_experts"}, f"{mod} the style 'moe_tp_experts'"),
                        ({mod: "ep_dispatch_experts", full: "packed_rowwise"}, f"{full} the style 'packed_rowwise'"),
                        ({full: "grouped_gemm"}, f"{mod} the style None"),
                        ({"model.layers.0.mlp": "ep_dispatch_experts"}, "model.layers.0.mlp the style")):
        with pytest.raises(InputError, match="expert-parallel plan gives " + named.replace(".", r"\.")):
            ep._style_of(plan, full, mod)


def test_only_warnings_about_compressed_stacks_rules_are_dropped():
    """The filter on transformers' plan logger drops a "rules [...] match nothing" warning only
    when every rule it names is a compressed stack's; any other rule keeps the whole warning."""
    import logging

    from unweight.integrations.transformers.ep import _CompressedStackRules
    f = _CompressedStackRules()
    f.names = {"model.layers.*.mlp.experts.gate_up_proj", "model.layers.*.mlp.experts.down_proj"}

    def shown(rules):
        msg = f"`ep_plan` rules {sorted(rules)} match nothing in Qwen3MoeForCausalLM and will not be applied."
        return f.filter(logging.LogRecord("transformers.distributed.mixin", logging.WARNING, "", 0, msg, None, None))
    assert not shown(f.names)
    assert not shown({"model.layers.*.mlp.experts.down_proj"})
    assert shown(f.names | {"model.layers.*.mlp.gate"})
    assert shown({"model.layers.*.self_attn.q_proj"})
    assert f.filter(logging.LogRecord("transformers.distributed.mixin", logging.WARNING, "", 0, "other", None, None))
