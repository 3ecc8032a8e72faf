"""Tools built on the runtime (tuning measurements); the runtime never imports them."""
