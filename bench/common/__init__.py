"""What several benchmarks share, one place each: statistics and timing, targets, the registry, session and stream
helpers, the glass-to-glass analysis; bench/README.md lists them."""
