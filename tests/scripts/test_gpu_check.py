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


def test_committed_results_render_to_the_readme():
    """The README's GPU section is what render_gpu_results.py makes of the committed JSONs."""
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "render_gpu_results.py"), "--check"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]


def test_commit_for_digest():
    """A device record's source digest names the commit that holds its code: HEAD's own digest
    (its tracked sources, read from git) finds HEAD or an older commit with the same sources;
    a digest of no commit finds nothing."""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    try:
        import _bench_util as bu
    finally:
        sys.path.pop(0)
    if not bu.short_commit():
        import pytest
        pytest.skip("not a git checkout")
    assert bu.commit_for_digest("0" * 64) == ""
    clean = not bu._run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=all", "--",
                         *bu.SOURCE_GLOBS])
    if clean:  # the working tree's digest is then HEAD's
        assert bu.commit_for_digest(bu.source_digest())
