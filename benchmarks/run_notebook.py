"""Run a notebook's code cells in order as one Python program, where Jupyter is not installed
(the GPU machine has neither nbformat nor a kernel): the check that a solution notebook runs
end to end on a GPU.

    MPLBACKEND=Agg python -m benchmarks.run_notebook solutions/11_capstone/11_capstone.ipynb

Each cell runs in one shared namespace, as in a kernel; its time is printed after it. The first
cell that raises stops the run with exit status 1 and its traceback. IPython syntax (magics,
`!` commands) is not supported: the course's notebooks use none.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path


def code_cells(path: Path) -> list[str]:
    cells = json.loads(Path(path).read_text())["cells"]
    out = []
    for cell in cells:
        if cell.get("cell_type") == "code":
            src = cell.get("source", "")
            out.append("".join(src) if isinstance(src, list) else src)
    return out


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not Path(args[0]).is_file():
        raise SystemExit("usage: python -m benchmarks.run_notebook NOTEBOOK.ipynb (a file)")
    namespace = {"__name__": "__main__"}
    start = time.perf_counter()
    cells = code_cells(Path(args[0]))
    for i, src in enumerate(cells):
        t0 = time.perf_counter()
        try:
            exec(compile(src, f"<{Path(args[0]).name} code cell {i}>", "exec"), namespace)
        except Exception:
            traceback.print_exc()
            print(f"== code cell {i} of {len(cells)} raised: the run stops", flush=True)
            return 1
        print(f"== code cell {i}: {time.perf_counter() - t0:.1f} s", flush=True)
    print(f"== {len(cells)} code cells ran in {time.perf_counter() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
