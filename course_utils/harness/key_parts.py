"""Notebook 02's key sets: which keys each partial of check_attention_by_parts attends to.

    key_parts([0, 2], [1, 3], [])  -> KeyParts, printed `parts [0, 2] | [1, 3] | []`

The check hands the learner's attention_by_parts a KeyParts (one index array per key set); the
learner iterates over it. It travels to a graded kernel by name (checks.engine.wire).
"""

from __future__ import annotations

import numpy as np

__all__ = ["KeyParts", "key_parts"]


class KeyParts(np.ndarray):
    """A sequence of index arrays (one per key set) that prints as `[0, 2] | [1] | []`.

    Iterating gives the index arrays; len() and indexing work as on a list.
    """

    def __repr__(self) -> str:
        return "parts " + " | ".join(str([int(i) for i in p]) for p in self)

    __str__ = __repr__


def key_parts(*parts) -> KeyParts:
    """KeyParts from lists of key indices, e.g. key_parts([0, 2], [1, 3], [])."""
    out = np.empty(len(parts), dtype=object)
    for i, p in enumerate(parts):
        out[i] = np.asarray(p, dtype=np.intp).reshape(-1)
    return out.view(KeyParts)
