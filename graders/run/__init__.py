"""Grading notebooks: nbgrader's plumbing, the Execute step that survives the kernel, one
submission in a worker process (forked from a server that preloads what grading imports), the
cached release template, the dask cluster, and the kernel run without a sandbox (on Unix
sockets)."""
