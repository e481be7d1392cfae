"""GPU benchmarks of the course's kernels: `python -m benchmarks.attention`.

Current numbers: benchmarks/RESULTS.md; every run, in order: docs/journal.md."""
