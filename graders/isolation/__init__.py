"""Keeping a student's code apart from the grader: the sandbox and its control groups, the
stripped course package, verdicts computed outside the kernel, and the scan for patches."""
