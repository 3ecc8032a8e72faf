"""unweight.runtime.scratch: per-device buffers that outlive the forward that made them."""
import pytest

torch = pytest.importorskip("torch")

from unweight.runtime import scratch  # noqa: E402


def test_buffers_first_made_under_inference_mode_stay_writable():
    """A first forward under torch.inference_mode() may create the error counter, the decode
    scratch and the fused kernel's counters; later forwards under no_grad (or none) write into
    them in place, which an inference tensor would refuse."""
    dev = "cpu"
    stores = (scratch._ERR, scratch._COUNTERS, scratch._WEIGHTS)
    saved = [st.pop(dev, None) for st in stores]
    try:
        with torch.inference_mode():
            err = scratch.error_counter(dev)
            cnt = scratch.counters(dev, 16)
            buf = scratch.reserve(dev, 1 << 20)
        for t in (err, cnt, buf):
            assert not t.is_inference()
        scratch.reset_device_errors(dev)
        cnt.zero_()
        buf[:4].fill_(1)
        assert scratch.device_errors(dev) == 0
    finally:
        for store, old in zip(stores, saved):
            store.pop(dev, None)
            if old is not None:
                store[dev] = old
