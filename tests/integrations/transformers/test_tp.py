"""transformers tensor parallelism on unweight checkpoints (integrations/transformers/tp.py): torchrun, 2 ranks,
gloo on CPU, ``DistributedConfig(tp_plan="auto")``.

One torchrun launch loads four models in turn (BF16 and compressed, tied and untied Llama);
one plain process gives the TP=1 references.  Checked: logits bit-identical and greedy tokens
identical to the BF16 model under the same TP=2 run; tokens identical to TP=1 wherever the
BF16 model itself agrees between TP=1 and TP=2; each rank holds only its block of every
column-/row-parallel weight, still compressed, decoding to exactly that block of the original.
Mixture-of-experts models: experts the plan leaves alone are held whole and compressed on
every rank; experts it shards are refused in one line.
"""
import json
import os
import shutil
import socket
import subprocess
import sys

import pytest
import torch

from unweight import api

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")


def _tp_api():
    """transformers >= 5.24's tensor parallelism (a mesh manager), which the integration uses;
    the torchrun tests skip under older releases, where the load is refused (last test)."""
    from transformers import PreTrainedModel
    if not hasattr(PreTrainedModel, "_resolve_parallel_plans"):
        pytest.skip("this transformers has no mesh-manager tensor parallelism (needs >= 5.24)")

# Row-parallel shards of huffman tensors must start on a column-chunk edge (codec/shard.py);
# the writer's grid cuts every multiple of 256 into 8 chunks (C = 128 here).
CFG = dict(vocab_size=320, hidden_size=1024, intermediate_size=2048, num_hidden_layers=2, num_attention_heads=8,
           num_key_value_heads=4, max_position_embeddings=64, initializer_range=0.05, pad_token_id=0,
           bos_token_id=1, eos_token_id=2)

# Each worker's last lines: its results, one file per rank, then the group's end.
_WORKER_END = r'''
    res[key] = r
    del m
with open(f"{out_path}.{rank}.json", "w") as f:
    json.dump(res, f)
if dist.is_initialized():
    dist.barrier()
    dist.destroy_process_group()
'''

WORKER = r'''
import hashlib, json, os, sys
import torch
import torch.distributed as dist
import unweight
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
from transformers.distributed import DistributedConfig
from unweight.runtime.modules import compressed_modules

tp, out_path, paths = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
if os.environ.get("HELD_CHECK_AS_ON_A_GPU"):  # the load check's GPU branch, on this CPU
    from unweight.runtime import verify
    verify.HeldCheck.on_device = staticmethod(lambda device: True)
rank = int(os.environ.get("RANK", 0))
ids = torch.tensor([[1, 5, 9, 77, 100, 3, 250, 17]])
res = {}
for key, (path, src) in paths.items():
    kw = {"distributed_config": DistributedConfig(tp_plan="auto")} if tp > 1 else {}
    m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, **kw).eval()
    with torch.no_grad():
        logits = m(ids).logits
        toks = m.generate(ids, max_new_tokens=10, do_sample=False)[0].tolist()
    r = {"tokens": toks, "logits": hashlib.sha1(logits.float().numpy().tobytes()).hexdigest(), "modules": {}}
    if src is not None:
        ref = load_file(os.path.join(src, "model.safetensors"))
        layout = getattr(m, "_unweight_tp_layout", {})
        for n, mod in compressed_modules(m):
            info = {"n_rows": mod.n_rows, "n_cols": mod.n_cols, "held": mod.held_bytes(), "tied": mod.is_tied,
                    "full": [mod.in_features, mod.out_features] if hasattr(mod, "in_features") else None,
                    "sm": list(mod.owner().weight__sm.shape), "encoding": mod.encoding_name}
            lay = layout.get(n)
            info["layout"] = lay
            if not mod.is_tied:
                w = ref[n + ".weight"]
                if lay and lay["rows"]:
                    w = w[lay["rows"][0]:lay["rows"][1]]
                if lay and lay["cols"]:
                    w = w[:, lay["cols"][0]:lay["cols"][1]]
                info["matches_block"] = bool(torch.equal(mod.decode_weight(), w))
            r["modules"][n] = info
''' + _WORKER_END


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def tp_models(tmp_path_factory):
    """(root, {key: [folder, BF16 source folder or None]}) of tied and untied Llamas."""
    _tp_api()
    from transformers import LlamaConfig, LlamaForCausalLM
    root = tmp_path_factory.mktemp("unweight_tp")
    paths = {}
    for tie in (False, True):
        torch.manual_seed(0)
        m = LlamaForCausalLM(LlamaConfig(tie_word_embeddings=tie, **CFG)).to(torch.bfloat16).eval()
        src, dst = str(root / f"tie{int(tie)}-src"), str(root / f"tie{int(tie)}-huffman")
        m.save_pretrained(src)
        api.compress(src, dst, progress=False)
        paths[f"bf16-tie{int(tie)}"] = [src, None]
        paths[f"uw-tie{int(tie)}"] = [dst, src]
    # The untied model with a grid no TP-2 block lies on: 48-row groups, one chunk of every
    # row; each rank decodes its blocks from the segments that hold them and encodes them anew.
    from unittest import mock

    from unweight.codec import tensor_codec as tc
    coarse = str(root / "tie0-coarse")
    with mock.patch.object(tc, "choose_grid", lambda rows, cols, *a, **k: (min(rows, 48), cols)):
        api.compress(paths["bf16-tie0"][0], coarse, progress=False)
    paths["uw-coarse"] = [coarse, paths["bf16-tie0"][0]]
    (root / "worker.py").write_text(WORKER)
    return root, paths


def _env(**extra):
    return dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", **extra)


def _torchrun(root, *args, nproc=2, timeout=300, **env):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-port",
           str(_free_port()), str(root / "worker.py"), str(nproc), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env(**env), cwd=str(root))


@pytest.fixture(scope="module")
def tp_runs(tp_models):
    root, paths = tp_models
    out = {}
    cmd1 = [sys.executable, str(root / "worker.py"), "1", str(root / "tp1"), json.dumps(paths)]
    for tp in (2, 1):
        if tp == 2:
            p = _torchrun(root, str(root / "tp2"), json.dumps(paths))
        else:
            p = subprocess.run(cmd1, capture_output=True, text=True, timeout=300, env=_env(), cwd=str(root))
        assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-6000:])
        for rank in range(tp):
            with open(root / f"tp{tp}.{rank}.json") as f:
                out[(tp, rank)] = json.load(f)
    return out


@pytest.mark.parametrize("tie", [0, 1])
def test_tp2_matches_bf16_tp2_and_tp1(tp_runs, tie):
    bf, uw = f"bf16-tie{tie}", f"uw-tie{tie}"
    for rank in (0, 1):
        assert tp_runs[(2, rank)][uw]["logits"] == tp_runs[(2, rank)][bf]["logits"]
        assert tp_runs[(2, rank)][uw]["tokens"] == tp_runs[(2, rank)][bf]["tokens"]
    assert tp_runs[(2, 0)][uw]["tokens"] == tp_runs[(2, 1)][uw]["tokens"]
    # TP=1: compressed equals BF16 exactly; TP=2 equals TP=1 wherever BF16 itself does
    # (transformers' TP reduces partial sums in another order: near-tied logits can flip).
    assert tp_runs[(1, 0)][uw]["logits"] == tp_runs[(1, 0)][bf]["logits"]
    assert tp_runs[(1, 0)][uw]["tokens"] == tp_runs[(1, 0)][bf]["tokens"]
    if tp_runs[(1, 0)][bf]["tokens"] == tp_runs[(2, 0)][bf]["tokens"]:
        assert tp_runs[(2, 0)][uw]["tokens"] == tp_runs[(1, 0)][uw]["tokens"]
    if tie == 0:  # this seed's untied model agrees between TP=1 and TP=2 (checked in BF16 above)
        assert tp_runs[(1, 0)][bf]["tokens"] == tp_runs[(2, 0)][bf]["tokens"]


def test_tp2_blocks_off_the_segment_grid_are_recoded(tp_runs):
    """A file whose grid no TP-2 block lies on (48-row groups, whole-row chunks): logits and
    tokens bit-equal to the BF16 model's under TP=2; every rank's block of every sharded
    matrix decodes to exactly that block of the original."""
    for rank in (0, 1):
        r = tp_runs[(2, rank)]
        assert r["uw-coarse"]["logits"] == r["bf16-tie0"]["logits"]
        assert r["uw-coarse"]["tokens"] == r["bf16-tie0"]["tokens"]
        sharded = [i for i in r["uw-coarse"]["modules"].values() if i["layout"] and (i["layout"]["rows"] or
                                                                                 i["layout"]["cols"])]
        assert len(sharded) >= 14 and all(i["matches_block"] for i in sharded)


COLWISE = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROWWISE = ("o_proj", "down_proj")


@pytest.mark.parametrize("tie", [0, 1])
def test_each_rank_holds_only_its_compressed_shard(tp_runs, tie):
    H, I, V = CFG["hidden_size"], CFG["intermediate_size"], CFG["vocab_size"]
    kv = CFG["num_key_value_heads"] * H // CFG["num_attention_heads"]
    full = {"q_proj": (H, H), "k_proj": (kv, H), "v_proj": (kv, H), "o_proj": (H, H), "gate_proj": (I, H),
            "up_proj": (I, H), "down_proj": (H, I)}
    for rank in (0, 1):
        mods = tp_runs[(2, rank)][f"uw-tie{tie}"]["modules"]
        assert len(mods) == 7 * CFG["num_hidden_layers"] + 2
        for n, info in mods.items():
            assert info["encoding"] == "huffman"  # mode "auto" keeps TP shards compressed
            leaf = n.rsplit(".", 1)[-1]
            if leaf in full:
                N, K = full[leaf]
                if leaf in COLWISE:
                    assert (info["n_rows"], info["n_cols"]) == (N // 2, K)
                    assert info["layout"]["rows"] == [rank * N // 2, (rank + 1) * N // 2]
                else:
                    assert (info["n_rows"], info["n_cols"]) == (N, K // 2)
                    assert info["layout"]["cols"] == [rank * K // 2, (rank + 1) * K // 2]
                assert info["sm"] == [info["n_rows"], info["n_cols"]]  # the planes are the shard's
                assert info["full"] == [K, N]  # in/out_features keep the global widths
                assert 0 < info["held"] < info["n_rows"] * info["n_cols"] * 2  # compressed, below the BF16 shard
                assert info["matches_block"], n
        emb = mods["model.embed_tokens"]
        assert (emb["n_rows"], emb["n_cols"]) == (V, H) and emb["matches_block"]  # replicated, compressed
        head = mods["lm_head"]
        if tie:
            assert head["tied"] and head["held"] == 0 and (head["n_rows"], head["n_cols"]) == (V, H)
        else:  # colwise_gather_output: a vocab block of rows, gathered by transformers' TP class
            assert (head["n_rows"], head["n_cols"]) == (V // 2, H) and head["matches_block"]
            assert head["layout"]["rows"] == [rank * V // 2, (rank + 1) * V // 2]


def _corrupt_copy(tp_models):
    """A copy of the tied huffman checkpoint with a flipped bit in rank 1's rows of
    layer 0's q_proj (made once per module)."""
    import struct
    root, paths = tp_models
    bad = root / "bad"
    if not bad.exists():
        shutil.copytree(paths["uw-tie0"][0], bad)
        f = bad / "model.safetensors"
        b = bytearray(f.read_bytes())
        n = struct.unpack("<Q", bytes(b[:8]))[0]
        meta = json.loads(bytes(b[8:8 + n]))
        e = meta["model.layers.0.self_attn.q_proj.weight__sm"]
        b[8 + n + e["data_offsets"][0] + 700 * CFG["hidden_size"] + 5] ^= 0x40  # row 700: rank 1's half
        f.write_bytes(bytes(b))
    return bad


def test_corrupt_shard_fails_the_tp_load(tp_models):
    """A flipped bit in rank 1's rows of one colwise weight: every rank stops with the
    tensor's name (each rank decodes only its shard; the group checks the stored crc32)."""
    root, _ = tp_models
    bad = _corrupt_copy(tp_models)
    p = _torchrun(root, str(root / "bad-out"), json.dumps({"bad": [str(bad), None]}))
    assert p.returncode != 0
    msg = p.stdout + p.stderr
    assert "model.layers.0.self_attn.q_proj.weight: checksum mismatch across the tensor-parallel shards" in msg
    assert msg.count("ChecksumError") >= 2  # both ranks, not only the one holding the bad bytes


def test_blocks_checked_as_a_gpu_checks_them(tp_models, tp_runs):
    """The load check's GPU branch (each rank's blocks decoded and hashed where they are held,
    runtime/verify.py; the records gathered and checked as the host's are), taken on this CPU:
    the same logits and tokens as the load through the host branch, and a flipped bit in one
    rank's block stops both ranks naming the tensor."""
    root, paths = tp_models
    p = _torchrun(root, str(root / "held"), json.dumps({k: paths[k] for k in ("uw-tie0", "uw-tie1")}),
                  HELD_CHECK_AS_ON_A_GPU="1")
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-6000:])
    for rank in range(2):
        with open(root / f"held.{rank}.json") as f:
            got = json.load(f)
        for k in ("uw-tie0", "uw-tie1"):
            assert got[k]["tokens"] == tp_runs[(2, rank)][k]["tokens"]
            assert got[k]["logits"] == tp_runs[(2, rank)][k]["logits"]
    p = _torchrun(root, str(root / "held-bad"), json.dumps({"bad": [str(_corrupt_copy(tp_models)), None]}),
                  HELD_CHECK_AS_ON_A_GPU="1")
    msg = p.stdout + p.stderr
    assert p.returncode != 0 and msg.count("ChecksumError") >= 2
    assert "model.layers.0.self_attn.q_proj.weight: checksum mismatch across the tensor-parallel shards" in msg


def test_wrong_checkpoint_index_fails_the_tp_load(tp_models):
    """A flipped bit in a stored checkpoint index (the GPU decoders start chains at it; the CPU
    decoders ignore it): the rank whose shard holds it stops naming the tensor."""
    import struct
    root, paths = tp_models
    bad = root / "bad-index"
    if not bad.exists():
        api.compress(paths["uw-tie0"][1], str(bad), index=True, progress=False)
        f = bad / "model.safetensors"
        b = bytearray(f.read_bytes())
        n = struct.unpack("<Q", bytes(b[:8]))[0]
        e = json.loads(bytes(b[8:8 + n]))["model.layers.0.self_attn.q_proj.weight__chk"]["data_offsets"]
        b[8 + n + (e[0] + e[1]) // 2] ^= 0x01
        f.write_bytes(bytes(b))
    p = _torchrun(root, str(root / "bad-index-out"), json.dumps({"bad": [str(bad), None]}))
    assert p.returncode != 0
    assert "checkpoint index of model.layers.0.self_attn.q_proj.weight" in p.stdout + p.stderr


# Every side a multiple of 256 (vocab included, for the colwise lm_head) and head counts that
# divide 8: the writer's grid splits each matrix 8 ways on both axes however small it is.
CFG8 = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=1, num_attention_heads=8,
            num_key_value_heads=8, max_position_embeddings=64, initializer_range=0.05, pad_token_id=0,
            bos_token_id=1, eos_token_id=2)


def test_tp8_logits_bitwise_equal_to_bf16_tp8(tmp_path):
    """TP=8 (8 gloo processes) on a tiny untied Llama: compressed logits and tokens bitwise equal
    to the BF16 model's under the same TP=8 run; every rank holds exactly its 1/8 block of every
    column- and row-parallel weight, compressed."""
    _tp_api()
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    m = LlamaForCausalLM(LlamaConfig(tie_word_embeddings=False, **CFG8)).to(torch.bfloat16).eval()
    src, dst = str(tmp_path / "src"), str(tmp_path / "huffman")
    m.save_pretrained(src)
    api.compress(src, dst, progress=False)
    (tmp_path / "worker.py").write_text(WORKER)
    paths = {"bf16": [src, None], "uw": [dst, src]}
    p = _torchrun(tmp_path, str(tmp_path / "tp8"), json.dumps(paths), nproc=8, timeout=600)
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-6000:])
    H, I, V = CFG8["hidden_size"], CFG8["intermediate_size"], CFG8["vocab_size"]
    full = {"q_proj": (H, H), "k_proj": (H, H), "v_proj": (H, H), "o_proj": (H, H), "gate_proj": (I, H),
            "up_proj": (I, H), "down_proj": (H, I), "lm_head": (V, H)}
    for rank in range(8):
        with open(tmp_path / f"tp8.{rank}.json") as f:
            r = json.load(f)
        assert r["uw"]["logits"] == r["bf16"]["logits"], rank
        assert r["uw"]["tokens"] == r["bf16"]["tokens"], rank
        for n, info in r["uw"]["modules"].items():
            leaf = n.rsplit(".", 1)[-1]
            if leaf not in full:
                continue
            N, K = full[leaf]
            lay = info["layout"]
            if leaf in ROWWISE:
                assert (info["n_rows"], info["n_cols"]) == (N, K // 8) and lay["cols"] == [rank * K // 8,
                                                                                          (rank + 1) * K // 8]
            else:  # colwise, lm_head included (colwise_gather_output)
                assert (info["n_rows"], info["n_cols"]) == (N // 8, K) and lay["rows"] == [rank * N // 8,
                                                                                          (rank + 1) * N // 8]
            assert info["matches_block"] and 0 < info["held"] < info["n_rows"] * info["n_cols"] * 2, (rank, n)


def test_tp_through_an_older_transformers_api_is_refused():
    """transformers before 5.24 sets ``_tp_size`` but shards through a bare device mesh: loading
    there would leave every rank with whole tensors, so it is refused in one line."""
    import torch.nn as nn

    from unweight.format.errors import InputError
    from unweight.integrations.transformers import tp
    m = nn.Linear(2, 2)
    m._unweight_tp = {"folder": "unused", "bases": {}}
    m._tp_size = 2
    with pytest.raises(InputError, match=r"need transformers >= 5\.24"):
        tp.load_tp_planes(m)


MOE_WORKER = r"""
import hashlib, json, os, sys
import torch
import torch.distributed as dist
import unweight
from transformers import AutoModelForCausalLM
from transformers.distributed import DistributedConfig
from unweight.runtime.experts import expert_stacks
from unweight.runtime.modules import compressed_modules

out_path, paths = sys.argv[2], json.loads(sys.argv[3])
rank = int(os.environ.get("RANK", 0))
ids = torch.tensor([[1, 5, 9, 77, 100, 3, 250, 17]])
sha = lambda t: hashlib.sha1(t.contiguous().view(torch.int16).numpy().tobytes()).hexdigest()
res = {}
for key, path in paths.items():
    m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16,
                                             distributed_config=DistributedConfig(tp_plan="auto")).eval()
    with torch.no_grad():
        logits = m(ids).logits
    r = {"logits": hashlib.sha1(logits.float().numpy().tobytes()).hexdigest(), "experts": {}}
    stacks = expert_stacks(m)
    if stacks:
        for n, _, _, st in stacks:
            r["experts"][n] = {"sha": sha(st.materialize()), "held": st.held_bytes(), "bf16": st.decoded_bytes()}
        r["sharded"] = sorted(n for n, mod in compressed_modules(m)
                              if getattr(m, "_unweight_tp_layout", {}).get(n, {}).get("kind") in ("rows", "cols"))
    else:
        for n, mod in m.named_modules():
            if type(mod).__name__.endswith("Experts"):
                for a, t in mod.named_parameters(recurse=False):
                    r["experts"][f"{n}.{a}"] = {"sha": sha(t.detach())}
""" + _WORKER_END


def _moe_checkpoints(root, archs):
    from tests.integrations.vllm_model import make_moe
    paths = {}
    for arch in archs:
        src, dst = str(root / f"{arch}-bf16"), str(root / f"{arch}-huffman")
        make_moe(src, arch)
        api.compress(src, dst, progress=False)
        paths[f"bf16-{arch}"], paths[f"uw-{arch}"] = src, dst
    (root / "worker.py").write_text(MOE_WORKER)
    return paths


def test_moe_experts_stay_whole_and_compressed_where_the_plan_leaves_them(tmp_path):
    """Qwen3-MoE, Mixtral and DeepSeek-V3 (MLA: kv_a_proj_with_mqa under its own style, a
    replicated weight; routed and shared experts) under TP=2 with transformers' own plans,
    which give the routed experts no style: every rank holds every expert compressed and
    whole (decoding to the BF16 model's experts, bit for bit) beside its sharded attention,
    and the logits equal the BF16 model's under the same TP run, bit for bit."""
    _tp_api()
    archs = ("qwen3_moe", "mixtral", "deepseek_v3")
    paths = _moe_checkpoints(tmp_path, archs)
    p = _torchrun(tmp_path, str(tmp_path / "moe"), json.dumps(paths), timeout=600)
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-6000:])
    for rank in range(2):
        with open(tmp_path / f"moe.{rank}.json") as f:
            r = json.load(f)
        for arch in archs:
            bf, uw = r[f"bf16-{arch}"], r[f"uw-{arch}"]
            assert uw["logits"] == bf["logits"], (rank, arch)
            assert sorted(uw["experts"]) == sorted(bf["experts"]) and uw["experts"], (rank, arch)
            for n, e in uw["experts"].items():
                assert e["sha"] == bf["experts"][n]["sha"] and 0 < e["held"] < 0.8 * e["bf16"], (rank, arch, n)
            assert any(n.endswith("o_proj") for n in uw["sharded"]), (rank, arch)


def test_experts_the_plan_shards_are_refused(tmp_path):
    """Llama 4's plan shards its experts (moe_tp_experts on the experts module): compressed
    stacks cannot follow it, so both ranks stop before loading with one line naming the
    module, the style and the ways out, rather than compute with misplaced weights."""
    _tp_api()
    paths = _moe_checkpoints(tmp_path, ("llama4_text",))
    p = _torchrun(tmp_path, str(tmp_path / "l4"), json.dumps({"uw": paths["uw-llama4_text"]}))
    msg = p.stdout + p.stderr
    assert p.returncode != 0 and msg.count("InputError") >= 2
    assert ("plan gives model.layers.0.feed_forward.experts the style 'moe_tp_experts', which compressed experts "
            "(model.layers.0.feed_forward.experts.") in msg


def test_styles_that_place_blocks_otherwise_are_refused_and_mla_kv_a_is_replicated():
    """tp._shard_kind on a compressed Linear: colwise / rowwise give the rank's rows / columns;
    a subclass that places blocks its own way (unit_colwise: whole heads per rank, replicated
    when there are fewer heads than ranks) and packed styles are refused in one line, not
    read as contiguous blocks; MLA's kv_a_proj style keeps the weight whole."""
    _tp_api()
    import torch.nn as nn
    from transformers.distributed.tensor_parallel import ALL_PARALLEL_STYLES

    from unweight.format.errors import InputError
    from unweight.integrations.transformers import tp
    from unweight.runtime.modules import CompressedLinear
    lin = nn.Linear(64, 64, bias=False).to(torch.bfloat16)
    m = CompressedLinear.from_linear(lin)
    kind = {s: tp._shard_kind("x.k_proj", m, s, ALL_PARALLEL_STYLES[s])
            for s in ("colwise", "rowwise", "mla_kv_a_proj")}
    assert kind == {"colwise": "rows", "rowwise": "cols", "mla_kv_a_proj": "full"}
    for s in ("unit_colwise", "unit_rowwise", "packed_colwise", "packed_rowwise", "all_reduce"):
        with pytest.raises(InputError, match=f"tensor-parallel style '{s}' of x.k_proj .* is not supported"):
            tp._shard_kind("x.k_proj", m, s, ALL_PARALLEL_STYLES[s])
