"""Load-time check that every weight a model holds is the checkpoint's, where it is held.

Each encoded tensor's header carries the crc32 of its original BF16 bytes.  With
``prepare(verify=...)`` (what transformers' loader asks for unless verification is off or
UNWEIGHT_VERIFY=host) every weight is checked after its mode has been applied, in the form a
forward reads it:

* a compressed module on a GPU: its planes as held (transcoded, indexed, tile-major, paired
  palette) decoded by the decode a forward runs into the device scratch, and hashed there
  (ops.crc32_ranges);
* an expert stack on a GPU: each expert decoded into the scratch the same way, each piece's
  rows hashed, a stored stack's matrices combined into its crc32 (codec.crc);
* a weight decoded to dense at load: the dense tensor's own bytes, on its device;
* anything held on the CPU: the CPU codec's decode of the held planes
  (codec.verify.decode_verified, which also checks a stored checkpoint index exactly).

The GPU side copies nothing back to the host but the crcs, and no CPU decodes a GPU's weights:
the check costs one decode and one hash per weight at device speed, where a host pass before
the load costs a CPU decode of the whole checkpoint.  One host sync per check; a corrupt plane
the decoders counted is a FormatError naming the device.

A weight held on a GPU that does not match its crc32 is then decoded from the planes it holds
by the CPU codec, so that the one-line error says which side is wrong: a ChecksumError naming
the tensor and its file where the planes themselves are corrupt, a DeviceFaultError naming the
tensor, the device and its decoder where they decode to the checkpoint's weight on the CPU (a
device kernel fault: such a model must not load either, since its forwards run that device's
kernels).  The hash itself cannot be the faulty side: ops.crc32_ranges self-tests its kernel
on each device against zlib and hashes on the host where that fails.

Under tensor parallelism a rank holds a block of a tensor, whose crc32 no header stores: the
block makes a codec.shard_check record instead (HeldCheck's shards; held_shard_record and
shard_record_of for vLLM's layers), and the group combines the records into the stored crc32.
"""
from __future__ import annotations

import functools
import logging
import os

import numpy as np
import torch
from torch import Tensor

from .. import ops
from ..codec.crc import combine_row_shard_crcs
from ..codec.shard_check import decode_record, shard_record
from ..codec.verify import decode_verified
from ..format.errors import ChecksumError, DeviceFaultError, FormatError
from ..format.header import TensorHeader
from . import dispatch, scratch

log = logging.getLogger(__name__)


def verify_setting(default: bool = True) -> str | None:
    """The load's decode-and-checksum pass as UNWEIGHT_VERIFY sets it: None for 0 / false /
    no (off: the structure and raw checksums are still checked), "host" for the CPU codec's
    pass over the stored planes before placing, else "held" (each weight checked once placed,
    where it is held); unset, "held" when `default` (the loader's verify option), else None."""
    v = os.environ.get("UNWEIGHT_VERIFY")
    if v is None:
        return "held" if default else None
    if v in ("0", "false", "no"):
        return None
    return "host" if v.lower() == "host" else "held"


def piece_key(name: str, piece: int, expert: int) -> str:
    """How an expert's piece of a stack made of per-expert checkpoint tensors is named."""
    return f"{name} (piece {piece}) expert {expert}"


def shard_record_of(out: Tensor, rows: tuple, cols: tuple, full_cols: int) -> tuple:
    """codec.shard_check's record of a tensor-parallel rank's block, decoded (bf16 [r1-r0, c1-c0],
    contiguous) on its device and hashed there: each row's crc32 for a block of columns, the
    block's for a block of whole rows.  One host sync (the records are gathered next)."""
    per_row = tuple(cols) != (0, full_cols)
    c = ops.crc32_ranges(out, out.size(0) if per_row else 1)
    crcs = [int(x) for x in c.view(torch.int32).cpu().numpy().view(np.uint32)]
    return ("cols", int(cols[0]), int(cols[1]), crcs) if per_row else ("rows", int(rows[0]), int(rows[1]), crcs[0])


def _decode_held(w, policy=None) -> Tensor:
    """A held weight (an EncodedWeight on a GPU, as a forward reads it) decoded into the device
    scratch (reserved by the caller) by the decoder a forward runs: bf16 [rows, cols]."""
    return dispatch.decode_into([w], scratch.weights(w.device, w.rows * w.cols), w.rows, w.cols, policy)


def held_shard_record(w, rows: tuple, cols: tuple, full_cols: int, policy=None) -> tuple:
    """shard_record_of a held piece decoded into the device scratch (_decode_held)."""
    return shard_record_of(_decode_held(w, policy), rows, cols, full_cols)


def block_fault(name: str, device, record: tuple, host_record) -> DeviceFaultError | None:
    """After the group's check of a stored crc32 failed: a DeviceFaultError when this rank's
    `record` of its block, decoded on `device`, differs from host_record() (the CPU codec's
    decode of the same planes: a device kernel fault), else None (the planes themselves, here
    or on another rank, differ from the checkpoint)."""
    if host_record() == record:
        return None
    return DeviceFaultError(f"{name}: this rank's block decoded on {device} differs from the CPU codec's decode of "
                            "the same planes: a fault of that device's kernels, not a corrupt checkpoint")


def _deferred(check):
    """A HeldCheck method whose ChecksumError / FormatError (a CPU decode of corrupt planes, a
    host-side kernel run) is kept for finish, which raises it after the group's gather: a rank
    holding corrupt weights that other ranks do not hold (expert parallelism, one rank's block)
    still meets them there.  After an error, later checks are skipped."""
    @functools.wraps(check)
    def run(self, where: str, *args, **kwargs):
        if self._error is not None:
            return
        try:
            check(self, where, *args, **kwargs)
        except (ChecksumError, FormatError) as e:
            # (a decoder's own message may not say which weight it was decoding)
            self._error = e if where in str(e) else type(e)(f"{self._where(where)}: {e}")
    return run


class HeldCheck:
    """Checks queued weight by weight (each call launches its device work and returns), then
    compared in ``finish``.  policy: the DispatchPolicy whose decoders the forwards run (None:
    the extension's default decoders; every decoder gives the same bits)."""

    def __init__(self, policy=None, locations: dict | None = None, shards: dict | None = None,
                 group_check=None):
        """locations: {weight name: where the checkpoint holds it (name and file)}, for messages.
        shards: {weight name: (checkpoint name, rows, cols, the whole tensor's header)} of the
        weights this rank holds a tensor-parallel block of (rows or cols None: all of them),
        and of the stacked experts tensors it holds an expert-parallel slice of (rows of the
        stack taken as one [E * rows, cols] matrix, which the header then describes);
        each makes a codec.shard_check record, and finish hands the records and headers, keyed
        by checkpoint name, to group_check(records, headers), which gathers them over the group
        and checks them against the stored crc32s."""
        self.policy = policy
        self.locations = locations or {}
        self.shards = shards or {}
        self.group_check = group_check
        self._records, self._record_headers = {}, {}
        # checkpoint name -> (device, the host's record of the same held block): a diagnosis of
        # a group check that fails (finish)
        self._host_records = {}
        self.checked = 0  # checkpoint tensors checked
        # (where, stored crc32, uint32 [n] crcs of consecutive pieces, bytes of each, diagnose):
        # diagnose() runs on a mismatch (see _fault); None where nothing is left to decode again.
        self._pending = []
        self._devices = {}  # device -> its error counter before the first decode queued here
        self._error = None  # the first check's error (_deferred), raised by finish after the group check

    @staticmethod
    def on_device(device: torch.device) -> bool:
        """Whether weights on `device` are checked there (a GPU with the kernels built)."""
        return device.type == "cuda" and ops.cuda_kernels_built()

    def _where(self, name: str) -> str:
        return self.locations.get(name, name)

    def _device(self, device: torch.device) -> None:
        # Only what this check's decodes count is its own: an earlier load may have left counts.
        if device not in self._devices:
            self._devices[device] = scratch.device_errors(device)

    def _add(self, where: str, crc: int, crcs: Tensor, nbytes: list, diagnose=None) -> None:
        self._pending.append((self._where(where), int(crc), crcs, nbytes, diagnose))
        self.checked += 1

    def _fault(self, where: str, h: TensorHeader, host_planes, device: torch.device, decoder: str = ""):
        """diagnose() of a weight decoded on `device` from planes it still holds: the CPU codec
        decodes them (host_planes(): {suffix: array} as stored) and raises the codec's
        ChecksumError / FormatError, naming the tensor and file, where they are corrupt; else
        returns the DeviceFaultError to raise."""
        def diagnose():
            at = self._where(where)
            decode_verified(h, host_planes(), where=at, keep=False)
            by = f" by its {decoder} decoder" if decoder else ""
            return DeviceFaultError(f"{at}: decoded on {device}{by} the weight does not match its crc32, while the "
                                    "CPU codec decodes the planes held there to it: a fault of that device's kernels, "
                                    "not a corrupt checkpoint")
        return diagnose

    def _record(self, shard: tuple, record: tuple) -> None:
        base, _, _, full = shard
        self._records[base], self._record_headers[base] = record, full
        self.checked += 1

    @staticmethod
    def _block(shard: tuple) -> tuple:
        """(rows, cols) of a shard entry, each a range (a None side is the whole)."""
        _, rows, cols, full = shard
        return tuple(rows) if rows is not None else (0, full.rows), tuple(cols) if cols is not None else (0, full.cols)

    def _shard(self, where: str, shard: tuple, m) -> None:
        rows, cols = self._block(shard)
        full = shard[3]
        def host_record():  # the CPU codec's record of the block (a diagnosis on a GPU)
            return decode_record(m.header, m.owner().host_planes(), rows, cols, full.cols, self._where(where))[1]
        if self.on_device(m.device):
            self._device(m.device)
            self._record(shard, held_shard_record(m.encoded(), rows, cols, full.cols, self.policy))
            self._host_records[shard[0]] = (m.device, host_record)
            return
        self._record(shard, host_record())

    @_deferred
    def module(self, where: str, m) -> None:
        """A compressed module (not a tied one) as held, after its mode was applied."""
        shard = self.shards.get(where)
        if shard is not None:
            self._shard(where, shard, m)
            return
        h: TensorHeader = m.header
        if not self.on_device(m.device):
            decode_verified(h, m.owner().host_planes(), where=self._where(where), keep=False)
            self.checked += 1
            return
        w = m.encoded()
        self._device(m.device)
        self._add(where, h.crc32, ops.crc32_ranges(_decode_held(w, self.policy), 1), [w.rows * w.cols * 2],
                  self._fault(where, h, m.owner().host_planes, m.device,
                              dispatch.decoder_name(w, m.device, self.policy)))

    @_deferred
    def dense(self, where: str, h: TensorHeader, weight: Tensor) -> None:
        """A weight decoded to a dense bf16 tensor at load (its bytes hashed where they are)."""
        t = weight.detach()
        if not self.on_device(t.device):
            t = t.cpu()
        shard = self.shards.get(where)
        if shard is not None:
            self._record(shard, shard_record_of(t.contiguous(), *self._block(shard), shard[3].cols))
            return
        self._add(where, h.crc32, ops.crc32_ranges(t.contiguous(), 1), [t.numel() * t.element_size()])

    @staticmethod
    def stack_headers(st) -> list:
        """Per piece of an ExpertStack (row order): its stacked tensor's header, or the list of
        its experts' headers (read before a dense conversion drops the planes)."""
        return [[p.header for p in src] if isinstance(src, list) else src.header for src in st.sources]

    def _stack_crcs(self, where: str, headers: list, rows_of_expert, n_experts: int, cols: int,
                    sources: list | None = None, device: torch.device | None = None) -> None:
        """rows_of_expert(e): expert e as a bf16 [rows, cols] tensor on the device, its pieces'
        rows in order; each piece's rows hashed, compared per stored tensor.  sources: the
        stack's (ExpertStack.sources, whose planes a mismatch is decoded from on the CPU)."""
        crcs = [[] for _ in headers]
        for e in range(n_experts):
            w = rows_of_expert(e)
            r0 = 0
            for k, h in enumerate(headers):
                n = (h[e] if isinstance(h, list) else h).rows
                crcs[k].append(ops.crc32_ranges(w[r0:r0 + n], 1))
                r0 += n

        def diagnose(name, p):  # p: the _Planes a mismatch is decoded again from (None: no planes)
            return self._fault(name, p.header, p.host_planes, device) if p is not None else None
        for k, h in enumerate(headers):
            src = sources[k] if sources is not None else None
            if isinstance(h, list):
                for e, he in enumerate(h):
                    name = piece_key(where, k, e)
                    self._add(name, he.crc32, crcs[k][e], [he.rows * cols * 2],
                              diagnose(name, src[e] if src is not None else None))
            else:
                # (joined through int32 views: torch's CUDA uint32 support is partial)
                joined = torch.cat([c.view(torch.int32) for c in crcs[k]]).view(torch.uint32)
                self._add(where, h.crc32, joined, [h.rows * cols * 2] * n_experts, diagnose(where, src))

    def _stack_shard(self, where: str, shard: tuple, n_experts: int, rows: int, cols: int, rows_of_expert,
                     host_record, device: torch.device) -> None:
        """The record of an expert-parallel rank's experts of a stacked tensor: rows [r0, r1) of
        the stack taken as one [E * rows, cols] matrix (shard[3]), from each expert's crc32 on
        its device (rows_of_expert(e): bf16 [rows, cols]) combined on the host, or from
        host_record() (the CPU codec's decode) on the CPU."""
        if not self.on_device(device):
            self._record(shard, host_record())
            return
        self._device(device)
        crcs = torch.cat([ops.crc32_ranges(rows_of_expert(e), 1).view(torch.int32) for e in range(n_experts)])
        crc = combine_row_shard_crcs(crcs.cpu().numpy().view(np.uint32), [rows * cols * 2] * n_experts)
        r0, r1 = self._block(shard)[0]
        self._record(shard, ("rows", r0, r1, int(crc)))
        self._host_records[shard[0]] = (device, host_record)

    @_deferred
    def stack(self, where: str, st) -> None:
        """A compressed ExpertStack as held, after its mode was applied."""
        shard = self.shards.get(where)
        if shard is not None:  # an expert-parallel rank's slice of one stacked tensor
            p, (r0, r1) = st.sources[0], self._block(shard)[0]
            n = st.rows * st.cols
            buf = scratch.weights(st.device, n)[:n] if self.on_device(st.device) else None
            self._stack_shard(where, shard, st.num_experts, st.rows, st.cols, lambda e: st.decode_expert(e, buf),
                              lambda: decode_record(p.header, p.host_planes(), (r0, r1), None, st.cols,
                                                    self._where(where))[1], st.device)
            return
        if not self.on_device(st.device):
            for k, src in enumerate(st.sources):
                for e, p in enumerate(src) if isinstance(src, list) else [(None, src)]:
                    name = where if e is None else piece_key(where, k, e)
                    decode_verified(p.header, p.host_planes(), where=self._where(name), keep=False)
                    self.checked += 1
            return
        n = st.rows * st.cols
        self._device(st.device)
        buf = scratch.weights(st.device, n)[:n]
        self._stack_crcs(where, self.stack_headers(st), lambda e: st.decode_expert(e, buf), st.num_experts, st.cols,
                         st.sources, st.device)

    @_deferred
    def dense_stack(self, where: str, headers: list, param: Tensor) -> None:
        """A stack decoded to a dense [E, rows, cols] parameter at load (headers: stack_headers
        of the stack it replaced)."""
        t = param.detach()
        if not self.on_device(t.device):
            t = t.cpu()
        t = t.contiguous()
        shard = self.shards.get(where)
        if shard is not None:  # an expert-parallel rank's slice of one stacked tensor
            r0, r1 = self._block(shard)[0]
            self._stack_shard(where, shard, t.size(0), t.size(1), t.size(2), lambda e: t[e],
                              lambda: shard_record(t.view(torch.int16).numpy().view(np.uint16), rows=(r0, r1)),
                              t.device)
            return
        self._stack_crcs(where, headers, lambda e: t[e], t.size(0), t.size(2))

    @staticmethod
    def _block_fault(records: dict, host_records: dict) -> DeviceFaultError | None:
        """block_fault of the first of this rank's blocks decoded on a device that has one."""
        for base, (device, host) in host_records.items():
            fault = block_fault(base, device, records[base], host)
            if fault is not None:
                return fault
        return None

    def finish(self) -> int:
        """Wait for the queued device work (one copy of the crcs per device), hand the
        tensor-parallel records to group_check (before raising anything of this rank's own, so
        no other rank waits in the gather for it), then raise ChecksumError at the first weight
        whose bytes differ from its stored crc32 (or, where the CPU codec decodes the planes
        the device holds to the stored weight, DeviceFaultError), and FormatError where a
        decoder counted corrupt data; returns the number of checkpoint tensors checked."""
        by_dev: dict = {}
        for j, (_, _, c, _, _) in enumerate(self._pending):
            by_dev.setdefault(c.device, []).append(j)
        got = [None] * len(self._pending)
        for js in by_dev.values():
            host = torch.cat([self._pending[j][2].view(torch.int32) for j in js]).cpu().numpy().view(np.uint32)
            i = 0
            for j in js:
                n = self._pending[j][2].numel()
                got[j], i = host[i:i + n], i + n
        bad = diagnose = None
        for (where, want, c, nbytes, diag), g in zip(self._pending, got):
            crc = int(g[0]) if len(g) == 1 else int(combine_row_shard_crcs(g, nbytes))
            if crc != want:
                bad = ChecksumError(f"{where}: the weight held on {c.device} does not match its crc32 "
                                    f"(0x{crc:08x}, stored 0x{want:08x}): the checkpoint or the load is corrupt")
                diagnose = diag
                break
        found = {dev: scratch.device_errors(dev) - before for dev, before in self._devices.items()}
        records, headers, host_records = self._records, self._record_headers, self._host_records
        n, self._pending, self._devices = self.checked, [], {}
        self._records, self._record_headers, self._host_records = {}, {}, {}
        error, self._error = self._error, None
        # Every rank given shard entries gathers, its own records or none (a host check failed).
        if records or (self.shards and self.group_check is not None):
            if self.group_check is None:
                raise ValueError("HeldCheck: tensor-parallel records without a group_check")
            try:
                self.group_check(records, headers)
            except ChecksumError as e:
                raise error or self._block_fault(records, host_records) or e from None
        if error is not None:
            raise error
        if bad is not None:
            raise (diagnose() if diagnose is not None else None) or bad
        for dev, k in sorted(found.items(), key=lambda kv: str(kv[0])):
            if k:
                raise FormatError(f"load check: {k} corrupt segment(s) or block(s) found by the decoders on "
                                  f"{scratch.device_key(dev)}")
        log.info("unweight: %d weight(s) checked against their crc32 where they are held", n)
        return n
