"""What several benchmarks share: statistics and timing (``stats``), the live benchmarks' push and start-up settings (``live``),
the README's targets (``targets``), and the helpers of one benchmark that another reuses."""
