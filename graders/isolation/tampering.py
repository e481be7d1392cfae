"""Finding code in a submission that patches shared objects: course, numpy, builtins, IPython.

A patch cannot change a score (the graded test cells run in the grader's own process, see
graders/isolation/remote.py), but the instructor is promised a `needs-review` flag for any
submission whose code patches such an object, however the object was reached. So the flag follows
what the code does, not how the import is spelled:

  - every code cell is turned into Python by IPython's own TransformerManager, so `!ls`,
    `x = !ls`, `%magic`, `%%cell magic` and `obj?` become the `get_ipython()` calls the kernel
    runs and the rest of the cell is read too (lines that still do not parse are dropped one at a
    time, so one typo does not hide a cell);
  - one small data-flow runs over the notebook's code cells in order, one namespace as in the
    kernel: which names hold a protected object (a module or anything reached from numpy, scipy,
    math, torch, triton, course_utils, builtins / `__builtins__`, sys or IPython, `get_ipython()`,
    `importlib.import_module(...)`, `__import__(...)`, `sys.modules[...]`, `vars(m)`,
    `m.__dict__`, `globals()[...]`), through imports with or without `as`, plain assignment,
    attribute and item access, `getattr`, the return value of the student's own functions and
    their arguments;
  - a patch is: an attribute or item store or delete on a protected object, `setattr`/`delattr`
    (or `__setattr__`, `operator.setitem`) on one, a mutating method call on a protected dict or
    on a list of the import machinery or of IPython (`.update(`, `.append(`, `.register(`, ...),
    `unittest.mock.patch*` aimed at one, and any of these inside `exec("...")`, `eval`,
    `get_ipython().run_cell("...")` or the body of a `%time`-like magic.

Decisions, to keep false positives low: rebinding a name of the student's namespace is not a patch
(`print = my_print`, `np = other`, `globals()["np"] = x`, `__builtins__ = {}`): it changes nothing
the grader or another cell of the course shares. Calls are not patches (`np.random.seed`,
`torch.manual_seed`, `np.set_printoptions`), nor are `sys.path` edits or the documented settings
under `torch.backends`. Only cells the student may edit are reported (answer cells and cells
that are neither locked nor graded); the others are read for the names they bind.

    find_tampering(nb)  ->  ["cell <grade_id or #index>: <code line>", ...]
"""

from __future__ import annotations

import ast
import builtins
import warnings
from dataclasses import dataclass, field, replace

# The roots of the objects a submission must not patch (import names, as sys.modules keys them).
PROTECTED = frozenset(
    {"numpy", "scipy", "math", "torch", "triton", "course_utils", "builtins", "sys", "IPython"}
)
SHELL = "get_ipython()"  # the path of the running IPython shell
_GET_IPYTHON = {
    "builtins.get_ipython",
    "IPython.get_ipython",
    "IPython.core.getipython.get_ipython",
}
_IMPORTERS = {"importlib.import_module", "builtins.__import__"}
_SETTERS = {"builtins.setattr", "builtins.delattr", "operator.setitem", "operator.delitem"}
_DUNDER_SETTERS = {"__setattr__", "__delattr__", "__setitem__", "__delitem__"}
_PATCHERS = {f"unittest.mock.patch{s}" for s in ("", ".object", ".dict", ".multiple")}
# methods that change a dict or an event manager in place: patches on any protected object (of
# the public modules of numpy, scipy, torch, triton and course_utils none has such a function)
_DICT_MUTATORS = {"update", "setdefault", "popitem", "register", "unregister", "set_hook"}
_DICT_MUTATORS |= {"set_custom_exc", "register_magic_function", "register_magics"}
# methods that change a list in place: numpy has functions of these names (np.append, np.insert),
# so they count only on containers (namespace dicts, sys.modules, import hooks, IPython's lists)
_LIST_MUTATORS = {"append", "extend", "insert", "remove", "pop", "clear"}
_CONTAINERS = {"sys.modules", "sys.meta_path", "sys.path_hooks"}
# magics whose argument runs as Python in the user namespace
_PY_MAGICS = {"time", "timeit", "prun", "capture", "debug"}
_RUNNERS = {"run_cell", "ex", "ev"}  # get_ipython() methods that run a string of code
_BUILTIN_NAMES = frozenset(dir(builtins)) | {"display", "get_ipython", "In", "Out", "exit", "quit"}
_DEPTH = 4  # nested exec / magic bodies / calls of the student's functions followed


@dataclass(frozen=True)
class Ref:
    """What a name or expression holds, as far as the scan knows.

    path: dotted name of the object ("numpy.testing", "get_ipython().events");
    protected: patching it is tampering; kind: "obj", "ns" (the namespace dict of `path`),
    "userns" (the student's own namespace: globals()) or "func" (a function the student wrote).
    """

    path: str
    protected: bool = True
    kind: str = "obj"
    node: ast.AST | None = field(default=None, compare=False)
    label: str | None = None
    ret: Ref | None = None


def module_ref(name: str) -> Ref:
    """The module imported as `name` (`mock` is unittest.mock's backport)."""
    if name == "mock" or name.startswith("mock."):
        name = "unittest." + name
    return Ref(name, protected=name.split(".")[0] in PROTECTED)


def _allowed(path: str) -> bool:
    """Stores that are settings, not patches: sys.path (where imports come from), torch.backends."""
    where = path.split("[")[0]
    return where == "sys.path" or where.startswith("torch.backends.")


def _const_str(node) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _transform(source: str) -> str:
    """IPython's own cell transforms (magics, `!`, `?` become get_ipython() calls)."""
    from IPython.core.inputtransformer2 import TransformerManager

    try:
        return TransformerManager().transform_cell(source)
    except Exception:  # IPython gave up on the cell: drop its IPython lines by hand
        return "\n".join(
            "" if line.lstrip().startswith(("%", "!", "?")) or "= !" in line else line
            for line in source.splitlines()
        )


def _parse(code: str) -> ast.Module | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SyntaxWarning: invalid escape sequences
            return ast.parse(code)
    except (SyntaxError, ValueError):
        return None


def to_python(source: str) -> ast.Module:
    """A cell's code as the kernel runs it: IPython's transforms, then Python's parser.

    Lines that still do not parse (a typo, a half-written line) are dropped one at a time, so the
    rest of the cell is still read.
    """
    lines = _transform(source).splitlines()
    for _ in range(len(lines) + 1):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return ast.parse("\n".join(lines))
        except (SyntaxError, ValueError) as exc:
            row = getattr(exc, "lineno", None)
            if not row or not 1 <= row <= len(lines) or not lines[row - 1]:
                break
            lines[row - 1] = ""
    return ast.Module(body=[], type_ignores=[])


def _initial_env() -> dict:
    env = {"__builtins__": Ref("builtins")}
    for name in ("setattr", "delattr", "getattr", "vars", "globals", "locals", "__import__"):
        env[name] = Ref(f"builtins.{name}")
    for name in ("exec", "eval", "get_ipython"):
        env[name] = Ref(f"builtins.{name}")
    return env


class _Scan:
    """The data-flow over one notebook; `found` collects the report lines in order."""

    def __init__(self):
        self.found: list[str] = []
        self.label = ""
        self.report = True
        self.depth = 0
        self.returns: list[list[Ref]] = []
        self.current: ast.stmt | None = None  # the statement being scanned

    # -- reporting ---------------------------------------------------------------------------

    def flag(self) -> None:
        """Report the statement being scanned (its first line)."""
        if not self.report or self.current is None:
            return
        line = ast.unparse(self.current).splitlines()[0]
        line = line if len(line) <= 200 else line[:197] + "..."
        entry = f"cell {self.label}: {line}"
        if entry not in self.found:
            self.found.append(entry)

    # -- values ------------------------------------------------------------------------------

    def lookup(self, name: str, env: dict) -> Ref | None:
        if name in env:
            return env[name]
        stars = env.get("*", ())
        if stars and name not in _BUILTIN_NAMES:
            return Ref(f"{stars[-1]}.{name}")  # from a protected module import *
        return None

    def value(self, e, env: dict) -> Ref | None:
        """The protected (or tracked) object `e` evaluates to, or None."""
        if isinstance(e, ast.Name):
            return self.lookup(e.id, env)
        if isinstance(e, ast.Attribute):
            base = self.value(e.value, env)
            if base is None or base.kind in ("func", "userns"):
                return None
            if e.attr == "__dict__":
                return replace(base, kind="ns")
            if base.path == SHELL and e.attr in ("user_ns", "user_global_ns"):
                return Ref("globals()", protected=False, kind="userns")
            sep = ".__dict__." if base.kind == "ns" else "."
            return Ref(base.path + sep + e.attr, base.protected)
        if isinstance(e, ast.Subscript):
            return self.item(self.value(e.value, env), _const_str(e.slice), env)
        if isinstance(e, ast.Call):
            return self.call_value(e, env)
        if isinstance(e, ast.NamedExpr):
            ref = self.value(e.value, env)
            self.bind(e.target, ref, env, conditional=False)
            return ref
        if isinstance(e, ast.IfExp):
            return self.value(e.body, env) or self.value(e.orelse, env)
        if isinstance(e, ast.BoolOp):
            return next((r for r in (self.value(v, env) for v in e.values) if r), None)
        return None

    def item(self, base: Ref | None, key: str | None, env: dict) -> Ref | None:
        """base[key]: a name of the user namespace, a module of sys.modules, a module's attr."""
        if base is None or base.kind == "func":
            return None
        if base.kind == "userns":
            return self.lookup(key, env) if key else None
        if base.path == "sys.modules":
            return module_ref(key) if key else Ref("sys.modules[?]")
        if base.kind == "ns" or base.path == "builtins":  # vars(m)["x"]; __builtins__ as a dict
            return Ref(f"{base.path}.{key or '?'}", base.protected)
        return Ref(base.path + "[]", base.protected)

    def call_value(self, call: ast.Call, env: dict) -> Ref | None:
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr == "get" and call.args:
            base = self.value(func.value, env)  # globals().get("np"), sys.modules.get("numpy")
            if base is not None and (base.kind in ("userns", "ns") or base.path == "sys.modules"):
                return self.item(base, _const_str(call.args[0]), env)
        f = self.value(func, env)
        if f is None:
            return None
        args = call.args
        first = self.value(args[0], env) if args else None
        if f.path in _GET_IPYTHON:
            return Ref(SHELL)
        if f.path in _IMPORTERS:
            name = _const_str(args[0]) if args else None
            if name is None:
                return Ref("<module>")  # a module named at run time: any of them
            return module_ref(name if f.path == "importlib.import_module" else name.split(".")[0])
        if f.path == "builtins.vars":
            if not args:
                return Ref("globals()", protected=False, kind="userns")
            return replace(first, kind="ns") if first is not None else None
        if f.path in ("builtins.globals", "builtins.locals"):
            return Ref("globals()", protected=False, kind="userns")
        if f.path == "builtins.getattr" and first is not None and len(args) >= 2:
            return Ref(f"{first.path}.{_const_str(args[1]) or '?'}", first.protected)
        if f.kind == "func":
            return self.call_function(f, call, env)
        return None

    # -- statements --------------------------------------------------------------------------

    def block(self, stmts, env: dict, conditional: bool) -> None:
        for node in stmts:
            self.stmt(node, env, conditional)

    def stmt(self, node, env: dict, conditional: bool) -> None:
        outer, self.current = self.current, node
        try:
            self.statement(node, env, conditional)
        finally:
            self.current = outer

    def statement(self, node, env: dict, conditional: bool) -> None:
        if isinstance(node, ast.Import):
            for a in node.names:
                name = a.asname or a.name.split(".")[0]
                self.bind_name(name, module_ref(a.name if a.asname else name), env, conditional)
        elif isinstance(node, ast.ImportFrom):
            self.import_from(node, env, conditional)
        elif isinstance(node, ast.Assign):
            self.calls(node.value, env)
            for target in node.targets:
                self.store(node, target, env)
                self.assign(target, node.value, env, conditional)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            if node.value is not None:
                self.calls(node.value, env)
            self.store(node, node.target, env)
            if isinstance(node, ast.AnnAssign) and node.value is not None:
                self.assign(node.target, node.value, env, conditional)
        elif isinstance(node, ast.Delete):
            for target in node.targets:
                self.store(node, target, env)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            self.function(node, env)
        elif isinstance(node, ast.ClassDef):
            for e in (*node.decorator_list, *node.bases, *node.keywords):
                self.calls(e, env)
            self.block(node.body, dict(env), conditional=False)
            self.bind_name(node.name, None, env, conditional)
        elif isinstance(node, ast.Return):
            if node.value is not None:
                self.calls(node.value, env)
                ref = self.value(node.value, env)
                if ref is not None and self.returns:
                    self.returns[-1].append(ref)
        elif isinstance(node, ast.For | ast.AsyncFor):
            self.calls(node.iter, env)
            self.loop_target(node.target, node.iter, env)
            self.block(node.body + node.orelse, env, conditional=True)
        elif isinstance(node, ast.With | ast.AsyncWith):
            for item in node.items:
                self.calls(item.context_expr, env)
                if item.optional_vars is not None:
                    self.bind(item.optional_vars, None, env, conditional)
            self.block(node.body, env, conditional)
        else:  # if, while, try, match, expressions: every child, as code that may not run
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    self.stmt(child, env, conditional=True)
                elif isinstance(child, ast.excepthandler):
                    if child.name:
                        self.bind_name(child.name, None, env, conditional=True)
                    self.block(child.body, env, conditional=True)
                elif isinstance(child, ast.expr):
                    self.calls(child, env)
                elif isinstance(child, ast.match_case):
                    self.block(child.body, env, conditional=True)

    def import_from(self, node: ast.ImportFrom, env: dict, conditional: bool) -> None:
        for a in node.names:
            if node.level or not node.module:  # a relative import: the student's own package
                self.bind_name(a.asname or a.name, None, env, conditional)
            elif a.name == "*":
                if module_ref(node.module).protected:
                    env["*"] = (*env.get("*", ()), module_ref(node.module).path)
            else:
                ref = module_ref(f"{node.module}.{a.name}")
                self.bind_name(a.asname or a.name, ref, env, conditional)

    def store(self, stmt, target, env: dict) -> None:
        """Flag `stmt` when it stores into (or deletes from) a protected object."""
        if isinstance(target, ast.Tuple | ast.List):
            for t in target.elts:
                self.store(stmt, t, env)
        elif isinstance(target, ast.Starred):
            self.store(stmt, target.value, env)
        elif isinstance(target, ast.Attribute | ast.Subscript):
            self.calls(target, env)
            base = self.value(target.value, env)
            if base is None or not base.protected or base.kind in ("userns", "func"):
                return
            attr = f".{target.attr}" if isinstance(target, ast.Attribute) else "[]"
            if not _allowed(base.path + attr):
                self.flag()

    def assign(self, target, value, env: dict, conditional: bool) -> None:
        if isinstance(target, ast.Tuple | ast.List):
            elts = value.elts if isinstance(value, ast.Tuple | ast.List) else None
            for i, t in enumerate(target.elts):
                pair = elts[i] if elts and len(elts) == len(target.elts) else None
                if pair is None:
                    self.bind(t, None, env, conditional)
                else:
                    self.assign(t, pair, env, conditional)
        elif isinstance(target, ast.Subscript):  # globals()["m"] = np binds m
            base = self.value(target.value, env)
            key = _const_str(target.slice)
            if base is not None and base.kind == "userns" and key:
                self.bind_name(key, self.value(value, env), env, conditional)
        else:
            self.bind(target, self.value(value, env), env, conditional)

    def bind(self, target, ref: Ref | None, env: dict, conditional: bool) -> None:
        if isinstance(target, ast.Name):
            self.bind_name(target.id, ref, env, conditional)
        elif isinstance(target, ast.Tuple | ast.List | ast.Starred):
            for t in target.elts if not isinstance(target, ast.Starred) else [target.value]:
                self.bind(t, None, env, conditional)

    def bind_name(self, name: str, ref: Ref | None, env: dict, conditional: bool) -> None:
        """Bind `name`; in code that may not run, a protected binding is kept (may hold it)."""
        if ref is not None or not conditional or env.get(name) is None:
            env[name] = ref

    def loop_target(self, target, iterable, env: dict) -> None:
        """`for m in (np, cu):` binds m to a protected module; other loops bind plain values."""
        refs = []
        if isinstance(iterable, ast.Tuple | ast.List | ast.Set):
            refs = [r for r in (self.value(e, env) for e in iterable.elts) if r and r.protected]
        self.bind(target, refs[0] if refs else None, env, conditional=True)

    # -- functions ---------------------------------------------------------------------------

    def function(self, node, env: dict) -> None:
        args = node.args
        for e in (*node.decorator_list, *args.defaults, *(d for d in args.kw_defaults if d)):
            self.calls(e, env)
        ref = Ref(node.name, protected=False, kind="func", node=node, label=self.label)
        env[node.name] = ref  # recursion sees the function itself
        ret = self.body(ref, env, {})
        env[node.name] = replace(ref, ret=ret)

    def body(self, ref: Ref, env: dict, bound: dict) -> Ref | None:
        """Scan a function's body with its parameters bound as `bound` says; its return value."""
        node = ref.node
        a = node.args
        params = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
        params += [p.arg for p in (a.vararg, a.kwarg) if p is not None]
        local = dict(env)
        for p in params:
            local[p] = bound.get(p)
        label, self.label = self.label, ref.label or self.label
        self.returns.append([])
        self.depth += 1
        try:
            self.block(node.body, local, conditional=False)
        finally:
            self.depth -= 1
            self.label = label
            rets = self.returns.pop()
        return next((r for r in rets if r.protected), None)

    def call_function(self, f: Ref, call: ast.Call, env: dict) -> Ref | None:
        """A call of the student's function: scanned again with the protected arguments bound."""
        a = f.node.args
        names = [p.arg for p in (*a.posonlyargs, *a.args)]
        bound = {n: self.value(v, env) for n, v in zip(names, call.args, strict=False)}
        bound |= {k.arg: self.value(k.value, env) for k in call.keywords if k.arg}
        if not any(r is not None and r.protected for r in bound.values()):
            return f.ret
        if self.depth >= _DEPTH:
            return None
        return self.body(f, env, bound)

    # -- calls -------------------------------------------------------------------------------

    def calls(self, e, env: dict) -> None:
        """Check every call inside the expression `e` (lambdas and comprehensions scoped)."""
        if isinstance(e, ast.Lambda):
            local = dict(env)
            a = e.args
            for p in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg):
                if p is not None:
                    local[p.arg] = None
            self.calls(e.body, local)
            return
        if isinstance(e, ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp):
            local = dict(env)
            for gen in e.generators:
                self.calls(gen.iter, local)
                self.loop_target(gen.target, gen.iter, local)
                for cond in gen.ifs:
                    self.calls(cond, local)
            for part in (e.key, e.value) if isinstance(e, ast.DictComp) else (e.elt,):
                self.calls(part, local)
            return
        if isinstance(e, ast.NamedExpr):
            self.calls(e.value, env)
            self.value(e, env)
            return
        for child in ast.iter_child_nodes(e):
            if isinstance(child, ast.expr | ast.keyword):
                self.calls(child, env)
        if isinstance(e, ast.Call):
            self.check_call(e, env)

    def check_call(self, call: ast.Call, env: dict) -> None:
        func, args = call.func, call.args
        f = self.value(func, env)
        first = self.value(args[0], env) if args else None
        hits_first = first is not None and first.protected and first.kind != "userns"
        path = f.path if f is not None else ""
        if path in _SETTERS and hits_first:
            self.flag()
        elif path in _PATCHERS and self.patch_target(call, first):
            self.flag()
        elif path in ("builtins.exec", "builtins.eval") and args:
            self.nested(args[0], env)
        elif f is not None and f.kind == "func":
            self.call_function(f, call, env)
        if not isinstance(func, ast.Attribute):
            return
        recv = self.value(func.value, env)
        if func.attr in _DUNDER_SETTERS:  # np.__setattr__(...), object.__setattr__(np, ...)
            if (recv is not None and recv.protected and recv.kind != "userns") or hits_first:
                self.flag()
            return
        if recv is None or not recv.protected or recv.kind in ("userns", "func"):
            return
        container = recv.kind == "ns" or recv.path in _CONTAINERS or recv.path.startswith(SHELL)
        if func.attr in _DICT_MUTATORS or (func.attr in _LIST_MUTATORS and container):
            self.flag()
        elif recv.path == SHELL and func.attr in _RUNNERS and args:
            self.nested(args[0], env)
        elif recv.path == SHELL and func.attr in ("run_line_magic", "run_cell_magic"):
            if len(args) >= 2 and _const_str(args[0]) in _PY_MAGICS:
                self.nested(args[-1], env, magic_options=func.attr == "run_line_magic")

    def patch_target(self, call: ast.Call, first: Ref | None) -> bool:
        """unittest.mock.patch("numpy.allclose"), patch.object(np, ...), patch.dict(sys.modules)."""
        if first is not None and first.protected:
            return True
        named = [k.value for k in call.keywords if k.arg in ("target", "in_dict")]
        target = _const_str((call.args or named or [None])[0])
        return bool(target) and target.split(".")[0] in PROTECTED

    def nested(self, arg, env: dict, magic_options: bool = False) -> None:
        """Code given as a string (exec, run_cell, a magic's body): scanned in this namespace."""
        src = _const_str(arg)
        if src is None or self.depth >= _DEPTH:
            return
        words = src.split()
        tries = [" ".join(words[i:]) for i in range(min(len(words), 6))] if magic_options else [src]
        for code in tries:  # %timeit -n 1 -r 1 code: drop the options until the rest parses
            tree = _parse(_transform(code))
            if tree is None and code is tries[-1]:
                tree = to_python(code)
            if tree is None:
                continue
            self.depth += 1
            try:
                self.block(tree.body, env, conditional=False)
            finally:
                self.depth -= 1
            return


def _editable(meta: dict) -> bool:
    """A cell the student may change: an answer cell, or one neither locked nor graded."""
    return bool(meta.get("solution")) or not (meta.get("locked") or meta.get("grade"))


def _source(source) -> str:
    return "".join(source) if isinstance(source, list | tuple) else str(source or "")


def find_tampering(nb) -> list[str]:
    """Lines of student-editable code cells that patch course, numpy, builtins or IPython objects.

    Returns "cell <grade_id or #index>: <code line>" for each patch, in notebook order, once
    each. Every code cell is read (in order, one namespace) for the names it binds; locked and
    graded cells are not reported (nbgrader puts the release's copy back before running them).
    """
    scan, env = _Scan(), _initial_env()
    for idx, cell in enumerate(nb.cells):
        if cell.get("cell_type") != "code":
            continue
        meta = cell.get("metadata", {}).get("nbgrader", {}) or {}
        scan.label = meta.get("grade_id") or f"#{idx}"
        scan.report = _editable(meta)
        scan.block(to_python(_source(cell.get("source"))).body, env, conditional=False)
    return scan.found
