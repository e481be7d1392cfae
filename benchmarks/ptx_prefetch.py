"""An L2 prefetch-size hint on the decode kernel's K/V copies, for measuring (not a default).

Triton compiles the partials kernel's K and V loads to `cp.async.cg.shared.global [dst], [src],
16`: 16 bytes per thread into shared memory, fetched by L2 in 32-byte sectors. PTX lets a copy
ask L2 to fetch a larger aligned block around it (`.L2::64B`, `.L2::128B`, `.L2::256B`), as
CUTLASS's Ampere copies do. Triton has no switch for it, so `install` rewrites the PTX of the
named kernels through Triton's compile-stage hook (`knobs.runtime.add_stages_inspection_hook`) and
moves Triton's cache to a directory of its own (the hook is not part of the cache key).

    from benchmarks import ptx_prefetch
    ptx_prefetch.install("256B")   # before the first launch of the kernel
"""

from __future__ import annotations

import re
import tempfile

SIZES = ("64B", "128B", "256B")
KERNELS = ("_decode_partials_kernel",)
_COPY = re.compile(r"cp\.async\.cg\.shared\.global(?=\s)")


def add_hint(ptx: str, size: str) -> tuple[str, int]:
    """ptx with `.L2::<size>` on every 16-byte global-to-shared copy that bypasses L1, and how
    many copies it changed."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES}, got {size!r}")
    return _COPY.subn(f"cp.async.cg.shared.global.L2::{size}", ptx)


def install(size: str, kernels: tuple[str, ...] = KERNELS) -> None:
    """Rewrite the PTX of `kernels` (by name) as add_hint does, from now on, in this process."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES}, got {size!r}")
    from triton import knobs

    knobs.cache.dir = tempfile.mkdtemp(prefix=f"triton-l2-{size}-")

    def hook(backend, stages, options, language, capability):
        make_ptx = stages["ptx"]

        def ptx_stage(src, metadata):
            ptx = make_ptx(src, metadata)
            if metadata.get("name") in kernels:
                ptx, count = add_hint(ptx, size)
                if not count:
                    raise RuntimeError(f"no cp.async.cg copy in {metadata['name']}'s PTX")
            return ptx

        stages["ptx"] = ptx_stage

    knobs.runtime.add_stages_inspection_hook = hook
