"""Entropy codec of format v1: code construction, the C++-backed tensor codec, and the
pure-NumPy reference decoder used by tests."""
