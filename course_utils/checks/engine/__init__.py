"""The engine behind every notebook's checks: run cases, compare, name the mistake.

One module per job; nothing here computes an exercise's answer, so the grader copies this folder
whole into a graded kernel (graders/isolation/student_build.py).

    failures            CheckFailure, Mistake, the mistakes of any exercise, misconception_slug
    cases               Case, frozen, run_cases: one pass line or the smallest failing case
    display             describe(value), fmt_bytes: values as feedback shows them
    tracing             Traced arrays and their LoadLog: which elements the learner's code loads
    watch               instrumented_call: read-only inputs, the reference watch, spies, memory
    rules               Rule: a memory budget, tiles, single pass, helpers called (judged after
                        the values are right)
    feedback            comparisons, diagnose (which Mistake matches), the failure's lines
    quizzes             check_answer, hinted_answer, Question/Option and check_choice
    array_libraries     torch, JAX, ... in a NumPy exercise (the memory budget cannot see them)
    kernels             a learner's Triton kernel run by a check: its error in a few lines
    interpreter_limits  valid Triton that Triton's CPU interpreter refuses, said in one line
    wire                the wire format between a grader and the learner's process
    remote              the learner's side of a graded check: run what the grader asks

The modules import one another in this order (no circles): failures, display, tracing, watch,
feedback, rules, cases, quizzes.
"""
