"""GPU benchmarks of the course's kernels: `python -m benchmarks.attention` (see RESULTS.md)."""
