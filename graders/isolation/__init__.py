"""Keeping a student's code apart from the grader: the sandbox and its control groups, the
stripped course package, verdicts computed outside the kernel, the scan for patches, and the
host-side scratch that outlives no grader."""
