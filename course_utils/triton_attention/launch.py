"""Launching a compiled kernel again without Triton's per-call Python work (the host cost).

`kernel[grid](*args, **constexprs)` binds the arguments, computes the specialization key, looks
the compiled kernel up in the JIT's cache, then launches it. Measured on the H200's host
(2026-12-05, Triton 3.6, the Gluon forward at 1k keys): 47 us a launch through the JIT against
20 us through the compiled kernel, and 9 us to build each host tensor descriptor, whose checks
only repeat what the first launch checked. At 1k keys a forward runs 170 to 350 us on the GPU, so
that Python was most of what a caller waited for (benchmarks/host_cost.py).

A `LaunchCache` keeps, per key the caller computes from everything the kernel is specialized on
(shapes, dtypes, the constexprs, the options, the alignment of pointers it did not allocate), the
compiled kernel the first launch returned, and launches it directly afterwards:

    launches = LaunchCache(kernel)
    launches(key, grid, args, constexprs, options)    the first time: kernel[grid](...) through
                                                       the JIT (compiles); then the compiled one

`descriptor(cls, base, shape, strides, block_shape, layout, checked)` builds a tensor descriptor,
with checked=False without its constructor's checks, for a launch whose first descriptors of the
same shape were checked.

The direct launch uses the compiled kernel's own `kernel[grid](*args)` (the current stream, the
launch hooks honoured), so it is as capturable in a CUDA graph as the JIT's. Should a Triton
version refuse it, the cache falls back to the JIT for good (`FAST` turns False) and says so once.
"""

from __future__ import annotations

import inspect
import warnings

MAX_KEYS = 256  # compiled launches kept per kernel; past it the cache starts again

FAST = True
"""Whether launches after the first go straight to the compiled kernel (False: always the JIT)."""


class LaunchCache:
    """The compiled launches of one @triton.jit or @gluon.jit kernel, by the caller's key."""

    def __init__(self, kernel):
        self.kernel = kernel
        self._runners: dict = {}
        self._signature = inspect.signature(kernel.fn)

    def __contains__(self, key) -> bool:
        """Whether a launch at `key` goes straight to a compiled kernel (its inputs need no
        checked descriptors then)."""
        return FAST and key in self._runners

    def __call__(self, key, grid: tuple, args: tuple, constexprs: dict, options: dict) -> None:
        """Launch kernel[grid](*args, **constexprs, **options).

        key: hashable, equal for two launches only when the kernel the JIT would compile for
            them is the same (what Triton specializes on: dtypes, constexprs, options, integer
            values, pointer alignment) and the grid is the same.
        args: the kernel's leading positional arguments; constexprs: the rest, by name (a
            parameter left out takes its default); options: num_warps, maxnreg, ...
        """
        global FAST
        runner = self._runners.get(key) if FAST else None
        if runner is not None:
            launch, tail = runner
            try:
                launch(*args, *tail)
                return
            except (TypeError, AttributeError, KeyError) as exc:  # this Triton launches otherwise
                FAST = False
                warnings.warn(
                    f"direct launches of compiled Triton kernels failed ({exc}); launching "
                    "through the JIT from now on",
                    RuntimeWarning,
                    stacklevel=2,
                )
        compiled = self.kernel[grid](*args, **constexprs, **options)
        if not FAST or compiled is None or not hasattr(compiled, "__getitem__"):
            return
        bound = self._signature.bind(*args, **constexprs)
        bound.apply_defaults()
        tail = tuple(bound.arguments.values())[len(args) :]
        if len(self._runners) >= MAX_KEYS:
            self._runners.clear()
        grid3 = tuple(grid) + (1,) * (3 - len(grid))
        self._runners[key] = (compiled[grid3], tail)


def descriptor(cls, base, shape: list, strides: list, block_shape: list, layout, checked=True):
    """cls(base, shape, strides, block_shape, layout), a Triton or Gluon TensorDescriptor; with
    checked=False without the constructor's checks: for tensors of a shape, dtype and strides
    that one checked descriptor already took, whose data pointer the caller checked for 16-byte
    alignment. Fields left out keep the class's defaults (padding "zero", no tf32 rounding)."""
    if checked:
        return cls(base, shape, strides, block_shape, layout)
    desc = object.__new__(cls)
    desc.__dict__.update(
        base=base, shape=shape, strides=strides, block_shape=block_shape, layout=layout
    )
    return desc
