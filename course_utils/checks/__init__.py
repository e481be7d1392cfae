"""Learner-facing checks: one pass line, or a failure that names the mistake.

The machinery is in checks/engine; each notebook's checks live in a module (or a small package)
named after the notebook: online_softmax (01), merge_partials (02), tiled_forward (03),
hbm_traffic (04), split_kv (05), triton_forward (06), backward (07), triton_backward (08),
flash_decoding (09), ring_attention (10), capstone (11), and concepts (the concept questions).
"""

from course_utils.checks.engine.cases import Case, run_cases
from course_utils.checks.engine.failures import CheckFailure, Mistake
from course_utils.checks.engine.quizzes import check_answer

__all__ = ["Case", "CheckFailure", "Mistake", "check_answer", "run_cases"]
