"""Format v1: constants (the one source), per-tensor header, checkpoint container, errors."""
