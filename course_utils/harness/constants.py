"""Numbers the course's code and a learner's code share (no answer in them).

NEG_INF  -inf: the running max of an empty set of scores, and the lse of an empty partial
         (its weight e^-inf is 0)
LOG2E    log2(e): the kernels use exp2, and exp(x) = exp2(x * LOG2E)
"""

from __future__ import annotations

import numpy as np

NEG_INF = -np.inf
LOG2E = 1.4426950408889634  # log2(e): exp(x) = exp2(x * LOG2E)

__all__ = ["LOG2E", "NEG_INF"]
