"""Grading notebooks: nbgrader's plumbing, the Execute step that survives the kernel, one
submission in a worker process, the cached release template, the dask cluster."""
