"""The ``unweight`` command: compress, decompress, verify, inspect, eval.  Every failure
prints ``error: <one line>`` and exits non-zero (2 for a usage error or bad input, 130 / 143
for SIGINT / SIGTERM); set UNWEIGHT_DEBUG=1 to see a traceback instead.  The console entry
point is unweight/__main__.py (it installs the signal handling before this module's imports);
``run`` is the command line."""
from __future__ import annotations

import errno
import json
import logging
import os
import sys

import click

from . import _signals
from .format import staging
from .format.errors import InputError, UnweightError


CATS = ("mlp", "attention", "embedding", "other")
JOBS = click.IntRange(min=1)  # no "0 = all cores": leaving -j out means that


def _gb(n):
    return f"{n / 1e9:.3f} GB" if n >= 1e8 else f"{n / 1e6:.2f} MB"


def _table(rows, headers):
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) if rows else len(str(h)) for i, h in enumerate(headers)]
    line = "  ".join(str(h).ljust(w) for h, w in zip(headers, widths))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    return "\n".join(out)


def _compress_summary(r):
    rows = []
    for c in CATS:
        v = r["categories"].get(c)
        if v:
            rows.append([c, _gb(v["orig_bytes"]), _gb(v["stored_bytes"]), f"{v['stored_bytes'] / v['orig_bytes']:.4f}",
                         f"{8 * v['stored_bytes'] / v['weights']:.3f}"])
    rows.append(["total (files)", _gb(r["input_bytes"]), _gb(r["output_bytes"]), f"{r['ratio']:.4f}",
                 f"{r['bits_per_weight']:.3f}"])
    s = _table(rows, ["category", "original", "compressed", "ratio", "bits/weight"])
    s += (f"\n{r['encoded_tensors']} tensors encoded ({r['encoding']}), {r['raw_tensors']} stored unchanged"
          f"{' (dtypes passed through: ' + ', '.join(r['passthrough_dtypes']) + ')' if r['passthrough_dtypes'] else ''}; "
          f"{r['total_seconds']:.1f} s, {r['gb_per_s']:.2f} GB/s, {r['jobs']} threads; "
          f"verified: {'yes' if r['verified'] else 'skipped (--no-verify)'}")
    return s


def _interrupted() -> int:
    """Print the interrupted line, naming the output if it was already in place."""
    return _signals.say_interrupted(staging.written[-1] if staging.written else None)


class _StdoutFailed(Exception):
    """Writing the command's result to stdout failed (full disk, closed pipe); args[0] is the OSError."""


def _echo(text: str):
    # Raised as our own type so click's handling of a broken pipe (exit 1, silently) does not
    # apply and run() gives every stdout failure the same treatment.
    try:
        click.echo(text)
    except OSError as e:
        raise _StdoutFailed(e) from None


def _result(text: str):
    """Print the command's result, its last act: a signal after this changes nothing."""
    _echo(text)
    _signals.finished()


def _run(fn, *a, **k):
    try:
        r = fn(*a, **k)
        _signals.check()  # a signal that came as fn's objects were finalized
        return r
    except UnweightError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        sys.exit(_interrupted())
    except MemoryError:
        click.echo("error: out of memory", err=True)
        sys.exit(1)
    except OSError as e:
        if os.environ.get("UNWEIGHT_DEBUG"):
            raise
        why = "no space left on device" if e.errno == errno.ENOSPC else (e.strerror or str(e))
        click.echo(f"error: {why}{': ' + e.filename if getattr(e, 'filename', None) else ''}; "
                   "the output was not written", err=True)
        sys.exit(1)
    except Exception as e:  # noqa: BLE001 - the promise is one line, never a traceback
        if os.environ.get("UNWEIGHT_DEBUG"):
            raise
        click.echo(f"error: internal error {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} "
                   "(set UNWEIGHT_DEBUG=1 for a traceback)", err=True)
        sys.exit(1)


class _Group(click.Group):
    def invoke(self, ctx):
        # A signal between a command's steps (after _run, while it prints): handled here, not
        # by click, which would print a blank line first.
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            sys.exit(_interrupted())


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="unweight")
@click.option("-v", "--verbose", is_flag=True, help="Log progress details to stderr.")
def main(verbose):
    """Lossless BF16 weight compression (format v1)."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(message)s")


@main.command()
@click.argument("src", default="smollm2-135m")
@click.argument("dst")
@click.option("--encoding", type=click.Choice(["huffman", "palette", "auto"]), default="huffman", show_default=True,
              help="huffman is smallest; the loader can transcode it to palette.")
@click.option("-j", "--jobs", type=JOBS, default=None, help="Threads (default: all cores).")
@click.option("--overwrite", is_flag=True, help="Replace DST if it exists.")
@click.option("--include", multiple=True, help="Only encode tensors matching this glob (repeatable).")
@click.option("--exclude", multiple=True, help="Never encode tensors matching this glob (repeatable).")
@click.option("--no-verify", is_flag=True, help="Skip decoding the output back before renaming it into place.")
@click.option("--max-shard-size", default="5GB", show_default=True)
@click.option("--revision", default=None, help="Hub revision (branch, tag or commit) for hub ids.")
@click.option("--segment-weights", type=click.IntRange(min=1), default=8192, show_default=True,
              help="Target weights per Huffman segment (smaller: more GPU parallelism, bigger index).")
@click.option("--index", is_flag=True,
              help="Store the GPU decoder's checkpoint index (~0.014 bit/weight); otherwise built at GPU load.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def compress(src, dst, encoding, jobs, overwrite, include, exclude, no_verify, max_shard_size, revision,
             segment_weights, index, as_json):
    """Compress SRC (folder, .safetensors file, hub id, or bundled: smollm2-135m, minilm-l6) into DST."""
    from . import api
    r = _run(api.compress, src, dst, encoding=encoding, jobs=jobs, overwrite=overwrite, include=list(include),
             exclude=list(exclude), verify=not no_verify, max_shard_size=max_shard_size, revision=revision,
             segment_weights=segment_weights, index=index)
    _result(json.dumps({k: v for k, v in r.items() if k != "tensors"}, indent=2) if as_json else _compress_summary(r))


@main.command()
@click.argument("src")
@click.argument("dst")
@click.option("--overwrite", is_flag=True)
@click.option("-j", "--jobs", type=JOBS, default=None)
@click.option("--max-shard-size", default="5GB", show_default=True)
def decompress(src, dst, overwrite, jobs, max_shard_size):
    """Write a standard BF16 checkpoint from a compressed one (byte-identical tensors)."""
    from . import api
    r = _run(api.decompress, src, dst, overwrite=overwrite, jobs=jobs, max_shard_size=max_shard_size)
    _result(f"wrote {r['tensors']} tensors to {r['output']} ({', '.join(r['files'])}) in {r['seconds']:.1f} s")


@main.command()
@click.argument("path")
@click.option("--against", default=None, help="Original checkpoint to compare with, tensor by tensor.")
@click.option("-j", "--jobs", type=JOBS, default=None)
def verify(path, against, jobs):
    """Check a compressed checkpoint: stored checksums, or byte equality --against the original."""
    from . import api
    r = _run(api.verify, path, against=against, jobs=jobs)
    how = "byte-identical to the original" if r["mode"] == "against" else "match their stored checksums"
    _result(f"ok: {r['tensors_checked']} tensors {how}")


@main.command()
@click.argument("path")
@click.option("--json", "as_json", is_flag=True)
@click.option("-j", "--jobs", type=JOBS, default=None)
def inspect(path, as_json, jobs):
    """Per-tensor encoding, shape, ratio, exponent entropy, palette coverage, verbatim fraction."""
    from . import api
    r = _run(api.inspect, path, jobs=jobs)
    if as_json:
        _result(json.dumps(r, indent=2))
        return
    rows = []
    for t in r["tensors"]:
        enc = t["encoding"] != "raw"
        rows.append([t["name"], t["encoding"], "x".join(map(str, t["shape"])), f"{t['ratio']:.4f}",
                     f"{t['exp_entropy']:.3f}" if enc else "-", f"{t['palette_coverage']:.5f}" if enc else "-",
                     f"{t['verbatim_fraction']:.4f}" if enc else "-"])
    tot = r["totals"]
    _result(_table(rows, ["tensor", "encoding", "shape", "ratio", "exp H", "pal cov", "verbatim"]) + "\n" +
            f"{tot['tensors']} tensors, {tot['encoded']} encoded; tensor bytes {_gb(tot['orig_bytes'])} -> "
            f"{_gb(tot['stored_bytes'])} (ratio {tot['ratio']:.4f}); files {_gb(tot['file_bytes'])}, "
            f"{tot['bits_per_weight']:.3f} bits/weight")


def _tune_buckets() -> list:
    """The batch buckets a fused kernel takes (runtime.tuning_table, no torch)."""
    from .runtime.tuning_table import BUCKET_BATCH
    from .runtime.kernel_plan import PMMA_MAX_M
    return [b for b, m in BUCKET_BATCH.items() if m <= PMMA_MAX_M]


@main.command()
@click.argument("path")
@click.option("--device", default="cuda", show_default=True, help="The CUDA device to measure on.")
@click.option("--encoding", "encodings", multiple=True, type=click.Choice(["palette", "huffman"]),
              help="Encodings to time each shape in (repeatable; default: both).")
@click.option("--bucket", "buckets", multiple=True, type=click.Choice(_tune_buckets()),
              help="Batch buckets to time (repeatable; default: all a fused kernel takes).")
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True,
              help="Also time one rank's blocks under this tensor-parallel size.")
@click.option("--dp", type=click.IntRange(min=1), default=1, show_default=True,
              help="Also time the experts' blocks split over TP x DP ranks (vLLM's data parallelism without "
                   "expert parallelism).")
@click.option("--cache", default=None, help="Tuning cache to update (default: $UNWEIGHT_TUNING_CACHE or "
                                            "~/.cache/unweight/tuning.json).")
@click.option("--json", "as_json", is_flag=True, help="Print the choices as JSON.")
def tune(path, device, encodings, buckets, tp, dp, cache, as_json):
    """Time the kernels on this GPU for PATH's matrix shapes and record the fastest in the tuning cache."""
    from . import api
    r = _run(api.tune, path, device=device, encodings=encodings or ("palette", "huffman"),
             buckets=list(buckets) or None, tp=tp, dp=dp, cache=cache)
    if as_json:
        _result(json.dumps(r, indent=2))
        return
    dec = {(d["N"], d["K"], d["encoding"]): d["choice"] for d in r["decoders"]}
    orders = r.get("plane_orders", {})
    rows = [[f"{p['N']}x{p['K']}", p["encoding"], p["plane_order"], p["bucket"], p["choice"],
             dec.get((p["N"], p["K"], p["encoding"]), "-"),
             orders.get(f"{p['N']}x{p['K']}", "-") if p["encoding"] == "palette" else "-"]
            for p in r["paths"]]
    _result(_table(rows, ["shape", "encoding", "planes", "batch", "path", "decoder", "auto order"]) + "\n" +
            f"{len(r['shapes'])} shapes timed on {r['device']} in {r['seconds']:.0f} s; choices recorded in {r['cache']}")


@main.command()
@click.option("--device", default="cuda", show_default=True, help="The CUDA device to check.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def selftest(device, as_json):
    """Check this GPU's kernels as every load does before it uses them (exit 1 when one fails)."""
    from . import api
    r = _run(api.selftest, device=device)
    if as_json:
        _result(json.dumps(r, indent=2))
    else:
        def verdicts(d: dict) -> str:
            return ", ".join(f"{k} {'ok' if v else 'FAILED'}" for k, v in d.items()) or "not run"
        f = r["fused"]
        rows = [["crc32 kernel (load check)", "ok" if r["crc32"] else "FAILED"],
                ["fused matmul paths", (f"{f['checked']} checks, {len(f['failed'])} failed" if f["checked"]
                                        else "none: the tuning table measured none on this GPU")],
                *[["", why] for why in f["failed"]],
                ["row gathers", verdicts(r["row_gathers"])],
                ["expert slots", verdicts(r["expert_slots"])]]
        verdict = "every check passed" if r["passed"] else "a kernel failed; loads on this GPU take it out"
        _result(_table(rows, ["kernels", "result"]) + f"\n{r['device']}: {verdict} ({r['seconds']:.1f} s)")
    if not r["passed"]:
        sys.exit(1)


def _check_output(output: str):
    """Refuse an --output that cannot be written before the run, not after both models were
    evaluated (hours on a full run).  Missing folders on its way are made when it is written."""
    path = os.path.abspath(output)
    if os.path.isdir(path):
        raise InputError(f"--output {output} is a folder: give a file name, e.g. "
                         f"{os.path.join(output, 'results.json')}")
    parent = os.path.dirname(path)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise InputError(f"--output {output}: {parent} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise InputError(f"--output {output}: not writable")


@main.command("eval")
@click.argument("original")
@click.argument("compressed")
@click.option("--tasks", default=",".join(("arc_easy", "piqa", "hellaswag")), show_default=True,
              help="Comma-separated: arc_easy, arc_challenge, hellaswag, piqa, winogrande, boolq, lambada, "
                   "lambada_ppl, mmlu, mmlu_<subject>.")
@click.option("--limit", type=int, default=None, help="Examples per task (default: the whole validation set).")
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda or cuda:N (both models).")
@click.option("--mode", type=click.Choice(["dense", "huffman", "palette", "auto"]), default="dense", show_default=True,
              help="unweight.load mode of the compressed model.")
@click.option("--batch-size", type=int, default=16, show_default=True)
@click.option("--threads", type=JOBS, default=None, help="torch CPU threads (default: torch's choice).")
@click.option("--ll-tolerance", type=click.FloatRange(min=0), default=0.05, show_default=True,
              help="Fused-kernel modes: max per-request |delta log-likelihood| (nats).")
@click.option("--metric-tolerance", type=click.FloatRange(min=0), default=0.02, show_default=True,
              help="Fused-kernel modes: max absolute metric difference.")
@click.option("--check", type=click.Choice(["auto", "bitwise", "tolerance"]), default="auto", show_default=True,
              help="auto: bitwise where the compressed path is bitwise by construction, else tolerance.")
@click.option("--output", default=None, help="Write the full result (settings, metrics, check) as JSON here.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON instead of the table.")
def eval_(original, compressed, tasks, limit, device, mode, batch_size, threads, ll_tolerance, metric_tolerance,
          check, output, as_json):
    """Run lm-eval on ORIGINAL and COMPRESSED, print them side by side, check per-sample equality.

    ORIGINAL: model folder or bundled name (smollm2-135m); COMPRESSED: a folder from `unweight
    compress`.  Dense mode (and decode + F.linear/cuBLAS) must give bitwise-identical per-sample
    log-likelihoods; fused-kernel modes must stay within the tolerances.  Exits 4 otherwise."""
    from . import evaluation
    from .format.errors import MismatchError
    if output:
        _run(_check_output, output)
        _run(evaluation.probe_output, output)
    say = (lambda s: click.echo(s, err=True)) if not as_json else None
    r = _run(evaluation.run, original, compressed, tasks=tasks, limit=limit, device=device, mode=mode,
             batch_size=batch_size, ll_tolerance=ll_tolerance, metric_tolerance=metric_tolerance, threads=threads,
             check=check, progress=say)
    if output:
        _run(evaluation.write_json, output, r)
        staging.written.append(os.path.abspath(output))  # an interrupt from here on: the file is complete
    text = json.dumps(r, indent=2) if as_json else evaluation.format_table(r)
    if r["check"]["passed"]:
        _result(text)
        return
    _echo(text)
    click.echo(f"error: {r['check']['message']}", err=True)
    _signals.finished()
    sys.exit(MismatchError.exit_code)


def _usage_error(e: click.UsageError, argv) -> int:
    """click's usage error (Usage / Try --help / Error) as one line; exit status 2."""
    msg = " ".join(line.strip() for line in e.format_message().splitlines() if line.strip())
    if e.ctx is not None:
        where = e.ctx.command_path
    else:  # some parser errors (an option missing its value) come without a context
        cmd = next((a for a in (sys.argv[1:] if argv is None else argv) if a in main.commands), None)
        where = f"unweight {cmd}" if cmd else "unweight"
    click.echo(f"error: {msg} (see {where} --help)", err=True)
    return e.exit_code


def _stdout_failed(e: OSError) -> int:
    """One line for a result that could not be written to stdout; returns the exit status."""
    # What is still buffered would fail again when the interpreter flushes stdout at exit,
    # printed as "Exception ignored ..."; let it go to /dev/null instead.
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)
    except (OSError, ValueError):
        pass
    if e.errno == errno.EPIPE:
        return 141  # the reader went away (`| head`): quiet, with the status of a SIGPIPE death
    why = "no space left on device" if e.errno == errno.ENOSPC else (e.strerror or str(e))
    done = f"; {staging.written[-1]} was written and is complete" if staging.written else ""
    click.echo(f"error: cannot write the result to standard output: {why}{done}", err=True)
    return 1


# click >= 8.2 shows the help for a bare `unweight` through this usage error; kept as it is.
_NO_ARGS = getattr(click.exceptions, "NoArgsIsHelpError", ())


def run(argv=None) -> int:
    """Run the command line (argv: sys.argv[1:] when None); returns the exit status.  Errors
    inside a command exit through _run; this handles what click raises around them."""
    try:
        rv = main.main(args=argv, prog_name="unweight", standalone_mode=False)
        return rv if isinstance(rv, int) else 0
    except SystemExit as e:  # from _run and _Group.invoke
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except click.exceptions.Abort:
        # click turns a KeyboardInterrupt during its own work (parsing arguments, echoing a
        # result) into Abort.
        return _interrupted()
    except _StdoutFailed as e:
        return _stdout_failed(e.args[0])
    except _NO_ARGS as e:
        e.show()
        return e.exit_code
    except click.UsageError as e:
        return _usage_error(e, argv)
    except click.ClickException as e:
        click.echo(f"error: {e.format_message()}", err=True)
        return e.exit_code
    except OSError as e:  # click's own output (--help, --version) to a full or closed stdout
        return _stdout_failed(e)
    finally:
        _signals.finished()


if __name__ == "__main__":
    _signals.install()
    sys.exit(run())
