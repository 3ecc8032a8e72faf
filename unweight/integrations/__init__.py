"""Adapters to inference runtimes that are optional dependencies (imported lazily)."""
