"""unweight.evaluation.compare.judge: a tolerance check (chosen beforehand for fused-kernel modes)
whose samples all came out bitwise identical says so, and still records which check was applied."""
from unweight import evaluation as ev


def _mc(*lls):
    """resps of a multiple-choice sample: one [(ll, is_greedy)] per choice."""
    return [[(float(x), False)] for x in lls]


def _rows(a=0.5, b=0.5):
    return ev.compare_metrics({"t": {"acc,none": a, "alias": "t"}}, {"t": {"acc,none": b, "alias": "t"}})


def test_tolerance_check_on_identical_samples_says_bitwise_identical():
    a = {"t": {0: _mc(-1.0, -2.0), 1: _mc(-0.5, -3.25)}}
    r = ev.compare_samples(a, {"t": {0: _mc(-1.0, -2.0), 1: _mc(-0.5, -3.25)}})
    assert r["identical"] and r["samples"] == 2 and r["values"] == 8
    v = ev.judge(r, _rows(), bitwise=False, ll_tolerance=0.05, metric_tolerance=0.02)
    assert v["passed"] and v["kind"] == "tolerance" and v["identical"] is True
    prefix = "per-sample log-likelihoods bitwise identical (2 samples, 8 values) under a tolerance check: "
    assert v["message"].startswith(prefix)
    assert v["message"][len(prefix):] == ("max per-request |delta log-likelihood| 0 (tolerance 0.05), "
                                          "max metric difference 0 (tolerance 0.02); "
                                          "0 of 2 samples not bitwise identical")
    assert "\n" not in v["message"]


def test_tolerance_check_within_tolerance_is_not_called_identical():
    r = ev.compare_samples({"t": {0: _mc(-1.0, -2.0)}}, {"t": {0: _mc(-1.01, -2.0)}})
    v = ev.judge(r, _rows(), bitwise=False)
    assert v["passed"] and v["kind"] == "tolerance" and "identical" not in v
    assert v["message"].startswith("max per-request |delta log-likelihood| 0.01")


def test_identical_samples_failing_the_metric_tolerance_are_not_called_identical():
    a = {"t": {0: _mc(-1.0, -2.0)}}
    r = ev.compare_samples(a, {"t": {0: _mc(-1.0, -2.0)}})
    v = ev.judge(r, _rows(0.5, 0.6), bitwise=False, metric_tolerance=0.02)
    assert not v["passed"] and "identical" not in v and "> 0.02" in v["message"]
    assert not v["message"].startswith("per-sample log-likelihoods bitwise identical")


def test_bitwise_check_message_unchanged():
    a = {"t": {0: _mc(-1.0, -2.0)}}
    v = ev.judge(ev.compare_samples(a, {"t": {0: _mc(-1.0, -2.0)}}), [], bitwise=True)
    assert v == {"kind": "bitwise", "ll_tolerance": None, "metric_tolerance": None, "passed": True,
                 "message": "per-sample log-likelihoods bitwise identical (1 samples, 4 values)"}
