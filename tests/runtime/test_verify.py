"""The load check of the weights a model holds (unweight/runtime/verify.py): every encoded
tensor reached, each in the form a forward reads, and a weight that differs named in one line.

On this CPU the GPU branch (decode into the scratch, hash with ops.crc32_ranges, combine) runs
through the ops' CPU kernels by treating the CPU as a device that checks its own weights
(HeldCheck.on_device patched); the CUDA kernel's body is tested in tests/cuda/test_crc_logic.py.
"""
import numpy as np
import pytest
import torch

import unweight
from unweight.format.checkpoint import CompressedCheckpoint
from unweight.format.errors import ChecksumError, DeviceFaultError, FormatError
from unweight.runtime import prepare as prep
from unweight.runtime import verify as rv
from unweight.runtime.modules import compressed_modules

from tests.conftest import flip_stored_byte, n_encoded


@pytest.fixture(params=["host", "device"])
def where(request, monkeypatch):
    """Which branch checks the CPU's weights: the CPU codec's ("host") or the one a GPU takes."""
    if request.param == "device":
        monkeypatch.setattr(rv.HeldCheck, "on_device", staticmethod(lambda device: True))
    return request.param


@pytest.mark.parametrize("mode", ["huffman", "palette", "dense"])
@pytest.mark.parametrize("enc", ["huffman", "palette"])
def test_every_encoded_tensor_is_checked_once_placed(llama_ck, where, mode, enc):
    path = llama_ck[1][enc]
    m = unweight.load(path, device="cpu", mode=mode)
    assert m.unweight_info["verified_tensors"] == n_encoded(path)


def test_host_pass_before_placing_or_none(llama_ck, monkeypatch):
    path = llama_ck[1]["huffman"]
    monkeypatch.setenv("UNWEIGHT_VERIFY", "host")
    assert unweight.load(path, device="cpu", mode="huffman").unweight_info["verified_tensors"] is None
    monkeypatch.setenv("UNWEIGHT_VERIFY", "0")
    assert unweight.load(path, device="cpu", mode="huffman").unweight_info["verified_tensors"] is None


def _flip_held(module, suffix: str = "__sm"):
    t = getattr(module, "weight" + suffix)
    t.view(torch.uint8).view(-1)[t.numel() // 2] ^= 1


@pytest.mark.parametrize("mode", ["huffman", "palette"])
def test_a_weight_changed_after_placing_is_named(llama_ck, where, mode):
    m = unweight.load(llama_ck[1]["huffman"], device="cpu", mode=mode, verify=False)
    name, q = next((n, x) for n, x in compressed_modules(m) if n.endswith("layers.1.self_attn.q_proj"))
    _flip_held(q)
    check = rv.HeldCheck(locations={f"{name}.weight": f"{name}.weight (model.safetensors)"})
    with pytest.raises(ChecksumError) as e:  # (the CPU codec raises at once, a device at finish)
        for n, x in compressed_modules(m):
            if not x.is_tied:
                check.module(f"{n}.weight", x)
        check.finish()
    msg = str(e.value)
    assert "q_proj" in msg and "model.safetensors" in msg and "\n" not in msg


def test_a_dense_weight_is_checked_by_its_own_bytes(llama_ck, where):
    m = unweight.load(llama_ck[1]["palette"], device="cpu", mode="dense")
    w = m.model.layers[0].mlp.down_proj.weight
    check = rv.HeldCheck()
    hdr = CompressedCheckpoint(llama_ck[1]["palette"])
    try:
        h = hdr.header("model.layers.0.mlp.down_proj.weight")
    finally:
        hdr.close()
    check.dense("down_proj", h, w)
    assert check.finish() == 1
    with torch.no_grad():
        w.view(torch.int16)[3, 5] ^= 1
    check.dense("down_proj", h, w)
    with pytest.raises(ChecksumError, match="down_proj"):
        check.finish()


def test_a_check_that_misses_a_tensor_fails_the_load(llama_ck, monkeypatch):
    real = rv.HeldCheck.module
    skipped = []

    def module(self, where, m):
        if not skipped:
            skipped.append(where)
            return
        real(self, where, m)

    monkeypatch.setattr(rv.HeldCheck, "module", module)
    with pytest.raises(FormatError, match="reached") as e:
        unweight.load(llama_ck[1]["huffman"], device="cpu", mode="huffman")
    assert "\n" not in str(e.value)


def test_corrupt_file_found_after_placing_names_tensor_and_file(llama_ck, tmp_path, where):
    import shutil
    dst = str(tmp_path / "ck")
    shutil.copytree(llama_ck[1]["palette"], dst)
    name = "model.layers.1.mlp.up_proj.weight"
    flip_stored_byte(dst + "/model.safetensors", name + "__sm", delta=1, at=0.5)
    with pytest.raises(FormatError) as e:
        unweight.load(dst, device="cpu", mode="palette")
    msg = str(e.value)
    assert name in msg and "model.safetensors" in msg and "\n" not in msg


def test_finish_syncs_once_per_device_and_resets(llama_ck, where):
    m = unweight.load(llama_ck[1]["palette"], device="cpu", mode="palette", verify=False)
    check = rv.HeldCheck()
    owners = [(n, x) for n, x in compressed_modules(m) if not x.is_tied]
    for n, x in owners:
        check.module(n, x)
    assert check.finish() == len(owners)
    assert check.finish() == len(owners)  # the count is kept; nothing is compared twice


def test_prepare_without_verify_checks_nothing(llama_ck):
    m = unweight.load(llama_ck[1]["palette"], device="cpu", mode="palette", verify=False)
    info = prep.prepare(m, "palette")
    assert info["verified_tensors"] is None


def test_errors_counted_before_the_check_are_not_its_own(llama_ck, monkeypatch):
    from unweight.runtime import scratch
    monkeypatch.setattr(rv.HeldCheck, "on_device", staticmethod(lambda device: True))
    m = unweight.load(llama_ck[1]["palette"], device="cpu", mode="palette", verify=False)
    scratch.error_counter("cpu").add_(3)  # an earlier load's corrupt input
    try:
        check = rv.HeldCheck()
        for n, x in compressed_modules(m):
            if not x.is_tied:
                check.module(n, x)
        assert check.finish() > 0
        check.module("q", next(x for _, x in compressed_modules(m) if not x.is_tied))
        scratch.error_counter("cpu").add_(1)  # a decode of this check counting a corrupt block
        with pytest.raises(FormatError, match="load check: 1 corrupt"):
            check.finish()
    finally:
        scratch.reset_device_errors("cpu")


@pytest.mark.parametrize("block", ["rows", "cols"])
def test_a_ranks_record_from_its_device_is_the_hosts(block):
    """The tensor-parallel record a rank makes from its block decoded on its device
    (shard_record_of, held_shard_record: vLLM's GPU load) is the one the host codec makes."""
    from unweight.codec import tensor_codec as tc
    from unweight.codec.shard_check import check_shard_records, shard_record
    from unweight.runtime.weights import EncodedWeight
    g = torch.Generator().manual_seed(1)
    full = (torch.randn(24, 40, generator=g) * 0.02).to(torch.bfloat16)
    bits = full.view(torch.int16).numpy().view(np.uint16)
    header = tc.encode(bits, "palette").header
    halves = ([((0, 12), (0, 40)), ((12, 24), (0, 40))] if block == "rows"
              else [((0, 24), (0, 24)), ((0, 24), (24, 40))])
    records = []
    for rows, cols in halves:
        part = np.ascontiguousarray(bits[rows[0]:rows[1], cols[0]:cols[1]])
        want = shard_record(part, cols=cols) if block == "cols" else shard_record(part, rows=rows)
        t = torch.from_numpy(part.view(np.int16)).view(torch.bfloat16)
        assert rv.shard_record_of(t, rows, cols, 40) == want
        enc = tc.encode(part, "huffman")
        w = EncodedWeight.from_header(enc.header, {s: torch.from_numpy(np.ascontiguousarray(a))
                                                   for s, a in enc.planes.items()},
                                      table=torch.from_numpy(np.ascontiguousarray(enc.header.table, dtype=np.uint8)))
        assert rv.held_shard_record(w, rows, cols, 40) == want
        records.append(want)
    assert check_shard_records(records, header, "w") is not False


def _faulty(real, at: int = 0):
    """A decode that gives the real one's bytes with one bit flipped (a device kernel fault)."""
    def decode(*args, **kwargs):
        out = real(*args, **kwargs)
        out.view(torch.int16).view(-1)[at] ^= 1
        return out
    return decode


@pytest.mark.parametrize("enc", ["huffman", "palette"])
def test_a_device_decode_fault_is_told_from_a_corrupt_checkpoint(llama_ck, monkeypatch, enc):
    """A GPU's decode that differs from the CPU codec's on intact planes is a DeviceFaultError
    naming the tensor, the device and the decoder; its planes are not called corrupt."""
    monkeypatch.setattr(rv.HeldCheck, "on_device", staticmethod(lambda device: True))
    monkeypatch.setattr(rv, "_decode_held", _faulty(rv._decode_held, at=7))
    with pytest.raises(DeviceFaultError) as e:
        unweight.load(llama_ck[1][enc], device="cpu", mode=enc)
    msg = str(e.value)
    assert "model.safetensors" in msg and "cpu" in msg and "\n" not in msg
    assert f"{'ring' if enc == 'huffman' else 'wide'} decoder" in msg and "not a corrupt checkpoint" in msg
    assert not isinstance(e.value, FormatError)


def test_corrupt_planes_stay_a_checksum_error_when_a_device_decodes_them(llama_ck, monkeypatch):
    """The CPU codec's second decode of held planes that changed names them as corrupt."""
    monkeypatch.setattr(rv.HeldCheck, "on_device", staticmethod(lambda device: True))
    m = unweight.load(llama_ck[1]["palette"], device="cpu", mode="palette", verify=False)
    name, q = next((n, x) for n, x in compressed_modules(m) if n.endswith("layers.0.mlp.gate_proj"))
    _flip_held(q)
    check = rv.HeldCheck()
    for n, x in compressed_modules(m):
        if not x.is_tied:
            check.module(f"{n}.weight", x)
    with pytest.raises(ChecksumError, match="gate_proj") as e:
        check.finish()
    assert not isinstance(e.value, DeviceFaultError)


@pytest.mark.parametrize("faulty", [False, True])
def test_a_failed_group_check_names_a_device_fault_on_the_rank_that_has_one(llama_ck, monkeypatch, faulty):
    """Under tensor parallelism the stored crc32 is checked from the group's records; when
    that fails, a rank whose device decoded its block to other bytes than the CPU codec does
    from the same held planes says so (DeviceFaultError), and the others keep the group's
    ChecksumError."""
    monkeypatch.setattr(rv.HeldCheck, "on_device", staticmethod(lambda device: True))
    if faulty:
        monkeypatch.setattr(rv, "_decode_held", _faulty(rv._decode_held, at=11))
    m = unweight.load(llama_ck[1]["palette"], device="cpu", mode="palette", verify=False)
    name, q = next((n, x) for n, x in compressed_modules(m) if n.endswith("layers.0.self_attn.o_proj"))
    seen = {}

    def group_check(records, headers):
        seen.update(records)
        raise ChecksumError("model.layers.0.self_attn.o_proj.weight: the group's crc32 differs (a test)")
    check = rv.HeldCheck(shards={f"{name}.weight": ("ck.o_proj", None, (0, q.header.cols // 2), q.header)},
                         group_check=group_check)
    check.module(f"{name}.weight", q)
    with pytest.raises(ChecksumError if not faulty else DeviceFaultError) as e:
        check.finish()
    assert seen["ck.o_proj"][0] == "cols" and "\n" not in str(e.value)
    assert ("ck.o_proj" in str(e.value) and "cpu" in str(e.value)) if faulty else "(a test)" in str(e.value)
