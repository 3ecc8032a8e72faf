"""The package version: the one source (pyproject.toml reads it; compress records it)."""
__version__ = "0.1.0"
