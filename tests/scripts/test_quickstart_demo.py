"""scripts/quickstart_demo.py: the quickstart's last step (original vs compressed generation,
held bytes), its exit codes and its one-line errors."""
import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def demo():
    spec = importlib.util.spec_from_file_location("quickstart_demo", os.path.join(ROOT, "scripts", "quickstart_demo.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(demo, argv, capsys):
    with pytest.raises(SystemExit) as e:
        demo.main(argv)
    return e.value.code, capsys.readouterr()


def test_held_bytes_counts_tied_planes_once(demo, llama_ck):
    import unweight
    m = unweight.load(llama_ck[1]["huffman"], device="cpu", mode="huffman")
    held, bf16 = demo.held_bytes(m)
    assert (held, bf16) == (m.unweight_info["held_bytes"], m.unweight_info["bf16_bytes"])
    assert 0 < held < 0.8 * bf16


def test_bad_input_is_one_line(demo, llama_ck, tmp_path, capsys):
    src, comp = llama_ck[0], llama_ck[1]["huffman"]
    cases = [([str(tmp_path / "missing")], "not a folder"),
             ([src, "--original", src], "not an unweight checkpoint"),
             ([comp, "--original", src], "cannot load the original model or its tokenizer"),  # no tokenizer
             ([comp, "--original", str(tmp_path / "none")], "no such file or folder"),
             ([comp, "--tokens", "0"], "--tokens")]
    for argv, words in cases:
        code, out = _run(demo, argv, capsys)
        assert code == 2, argv
        assert out.err.count("\n") == 1 and out.err.startswith("error: ") and words in out.err, out.err


@pytest.mark.slow
def test_smollm2_identical_generation(demo, smol_ck, capsys):
    src, comp = smol_ck
    assert demo.main([comp, "--original", src, "--tokens", "8"]) == 0
    out = capsys.readouterr().out
    assert "identical token for token (8 of 8 tokens)" in out
    assert "compressed model holds" in out and "(0.66" in out


@pytest.mark.slow
def test_different_tokens_exit_1(demo, smol_ck, capsys, monkeypatch):
    src, comp = smol_ck
    outputs = iter([([1, 2, 3], 0.0), ([1, 2, 4], 0.0)])
    monkeypatch.setattr(demo, "generate", lambda *a, **k: next(outputs))
    assert demo.main([comp, "--original", src, "--tokens", "3"]) == 1
    assert "DIFFERENT: the token sequences part at token 2" in capsys.readouterr().out
