"""A kernel run as this user (no sandbox), its channels on Unix sockets of its own.

jupyter_client's default transport is TCP: the manager finds five free ports by binding to port 0
and letting go, and the kernel binds them a moment later. Any process of the machine can take one
in between (another grading process's kernel, a browser, the outgoing connection of any client),
and the kernel then dies before it replies: "Address already in use", then "Kernel died before
replying to kernel_info" (seen in the suite, 2026-12-07, with a notebook executed while the graded
class ran beside it). A submission graded that way would score 0 for the machine's doing. Unix
sockets in a folder made for the kernel (graders.isolation.scratch) leave no such window; the
sandbox's kernels (graders.isolation.sandbox) use them already. Where the platform has none
(Windows), TCP as before.

    LocalKernelManager          async (nbclient, nbgrader's Execute): kernel_manager_class=...
    BlockingLocalKernelManager  jupyter_client's blocking API: start_kernel(), client()
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from jupyter_client.manager import AsyncKernelManager, KernelManager

from graders.isolation import scratch as host_scratch

PREFIX = "fa-kernel-"
# <folder>/kernel-<n>: the parent leaves room for the folder's name and the longest socket's
TAIL = len(f"/{PREFIX}{2**22}-abcdefgh/kernel-99")


class _UnixSockets:
    """What both managers add: the folder of the sockets, made before the kernel's first start
    (a restart keeps it, so clients reconnect to the same paths), removed at its shutdown."""

    _sockets: Path | None = None

    async def _async_pre_start_kernel(self, **kw):
        if os.name == "posix" and self._sockets is None:
            self._sockets = host_scratch.make_dir(PREFIX, host_scratch.socket_parent(TAIL))
            self.transport = "ipc"
            self.cache_ports = False
            self.connection_file = str(self._sockets / "kernel.json")
            self.ip = str(self._sockets / "kernel")
        return await super()._async_pre_start_kernel(**kw)

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart=restart)
        if not restart and self._sockets is not None:
            shutil.rmtree(self._sockets, ignore_errors=True)
            self._sockets = None


class LocalKernelManager(_UnixSockets, AsyncKernelManager):
    """AsyncKernelManager on Unix sockets (see the module doc)."""

    pre_start_kernel = _UnixSockets._async_pre_start_kernel
    cleanup_resources = _UnixSockets._async_cleanup_resources


class BlockingLocalKernelManager(_UnixSockets, KernelManager):
    """KernelManager on Unix sockets (see the module doc): its blocking methods (start_kernel,
    shutdown_kernel) run the async ones above."""
