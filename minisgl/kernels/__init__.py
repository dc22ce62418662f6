"""Small vectorized helpers used by the engine's hot paths."""
