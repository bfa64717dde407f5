"""What one token costs: resolve a model argument, read its config, and lay out its KV cache."""
