"""The GPU runbook's plan holds without a GPU: scripts/gpu_check.py --dry-run (commands parse,
carried sizes fit, the wheel plan is closed, the JSON writers and the README renderer work on
a fake run, the check groups run through the CPU kernels)."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_gpu_check_dry_run():
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gpu_check.py"), "--dry-run"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "dry run OK" in p.stdout
    for n in (1, 2, 3):
        assert f"--call {n}" in p.stdout


def test_render_without_results_says_so(tmp_path):
    out = tmp_path / "section.md"
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "render_gpu_results.py"), "--results",
                        str(tmp_path), "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    text = out.read_text()
    assert text.startswith("## GPU results\n")
    assert "No GPU run is recorded yet; `python scripts/gpu_check.py` produces this section." in text
