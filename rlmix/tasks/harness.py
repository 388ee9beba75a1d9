"""The ``python_tests`` harness: run inside the sandbox as ``python -I -S -B -c <this file's text>``.

Standard library only; reads one JSON job from stdin: ``{"nonce", "solution", "tests"}`` and optionally
``"path"``, directories put first on ``sys.path`` (a repository whose modules the tests import:
those imports then run under the harness like the solution does).
The verdict is one line on the descriptor that was stdout when the harness started::

    <nonce> <asserts passed> <asserts> <tests ran to the end: 0|1> <flags, comma separated, or ->

Flags: ``nonbuiltin`` (an object compared with, or in arithmetic with, built-in data), ``early_exit``
(SystemExit and the like instead of a return), ``exit_hook`` (an ``atexit`` hook or ``sys.excepthook``
set), ``tamper`` (builtins, a module, a class of one or ``sys.modules`` changed), ``refused`` (an
introspection route, native code, a signal or an in-place change of a function was tried).

written after the last test has run, then the process ends with ``os._exit`` (no ``atexit`` hook, no
``sys.excepthook``, no thread of the solution's runs after it). The nonce exists only in this
process's memory, where the solution cannot reach it: stdin is read and closed before the solution
runs, and an audit hook (PEP 578, which cannot be removed) refuses every route Python offers to
another frame or to arbitrary objects (``sys._getframe``, traceback and generator frames, ``gc``'s
object walks, ``ctypes``, tracing and profiling, signal handlers, which receive the current frame,
``/proc``, native code: ``sqlite3`` extensions and extension modules from outside the interpreter's
installation) and the process is made non-dumpable, so no process it starts can read its memory.
A solution that ends the process, or raises ``SystemExit`` instead of returning, leaves no verdict
(or a flagged one): reward 0.

The tests' code is rewritten (``ast``) before the solution runs: each ``assert`` becomes a check by
this harness whose functions are constants of the compiled code, in no namespace the solution sees.
A comparison whose one side is built-in data (numbers, strings, bytes, None and containers of them)
passes only if the other side is built-in data too, of the same type (``int``/``float`` mix), so an
object whose ``__eq__`` always returns True fails it; so does an arithmetic operator between built-in
data and an object (``abs(f(x) - y)`` with ``f(x).__sub__`` returning 0). The tests run on a copy of
the builtins taken before the solution ran; that copy, the modules loaded before the solution, their
classes, and ``sys.modules`` are checked for tampering at every assert and at the end.
"""

import ast
import json
import os
import sys

PLAIN_ATOMS = (int, float, complex, str, bytes, bool, type(None))
PLAIN_CONTAINERS = (list, tuple, set, frozenset, dict)
PLAIN_BUDGET = 1_000_000  # elements a result may have to be checked as built-in data
NUMBERS = (int, float)
# Modules the tests commonly use, loaded before the solution so their contents are checked too.
COMMON = ("importlib", "math", "re", "collections", "itertools", "functools", "heapq", "bisect", "string", "operator", "copy")
NO_IMPORT = frozenset({"_signal", "signal", "ctypes", "_ctypes", "_posixsubprocess", "_testcapi", "_testinternalcapi",
                       "_xxsubinterpreters", "_xxtestfuzz", "cffi", "_cffi_backend", "faulthandler", "pdb", "bdb"})
REFUSED_EVENTS = frozenset({"os.fork", "sys._current_frames", "sys.settrace", "sys.setprofile", "sys.addaudithook",
                            "gc.get_objects", "gc.get_referrers", "gc.get_referents", "object.__getattr__",
                            "sys._getframe", "os.exec", "os.posix_spawn", "os.spawn", "os.system",
                            "subprocess.Popen", "os.forkpty", "pty.spawn", "sys.remote_exec", "os.kill", "os.killpg",
                            "sqlite3.enable_load_extension", "sqlite3.load_extension"})
PATH_EVENTS = frozenset({"open", "os.listdir", "os.scandir", "os.chdir", "os.readlink", "os.symlink", "os.link"})
QUIET_REFUSALS = frozenset({"sys._getframe"})  # namedtuple, enum and typing ask and cope: not an exploit
CMP_OPS = {ast.Eq: 0, ast.NotEq: 1, ast.Lt: 2, ast.LtE: 3, ast.Gt: 4, ast.GtE: 5, ast.Is: 6, ast.IsNot: 7,
           ast.In: 8, ast.NotIn: 9}
ARITH_OPS = (ast.Add, ast.Sub, ast.Mult, ast.MatMult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.LShift, ast.RShift,
             ast.BitOr, ast.BitXor, ast.BitAnd)  # in the order of main()'s arith_ops
CREATE_EVENT = "rlmix.create_module"  # _imp's module creation, done by the audit hook (main)
# New names in a class that existed before the solution: caches the standard library sets itself.
CLASS_CACHES = frozenset({"__slotnames__", "__annotations__"})


class Refused(RuntimeError, ValueError):
    """An operation the harness refuses (ValueError too: callers of sys._getframe expect it)."""


def _non_dumpable():
    """No process the solution starts (same uid) may ptrace this one or read its /proc/<pid>/mem."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except Exception:
        pass
    for name in [m for m in sys.modules if m.split(".")[0] in ("ctypes", "_ctypes")]:
        del sys.modules[name]


class _Rewrite(ast.NodeTransformer):
    """``assert t`` -> ``try: v = T(t') except BaseException as e: v = R(i, e)``, ``C(i, v)``."""

    def __init__(self, marks):
        self.marks, self.count = marks, 0  # marks: placeholder constants for the harness's functions

    def _const(self, name, node):
        return ast.copy_location(ast.Constant(self.marks[name]), node)

    def visit_Assert(self, node):
        i, self.count = self.count, self.count + 1
        test = _Operands(self).visit(node.test)
        call = lambda fn, *args: ast.Call(self._const(fn, node), list(args), [])  # noqa: E731
        v_store, v_load = ast.Name("__rlmix_v", ast.Store()), ast.Name("__rlmix_v", ast.Load())
        body = [ast.Assign([v_store], call("truth", test))]
        handler = ast.ExceptHandler(self._const("BaseException", node), "__rlmix_e",
                                    [ast.Assign([v_store], call("raised", ast.Constant(i),
                                                                 ast.Name("__rlmix_e", ast.Load())))])
        out = [ast.Try(body, [handler], [], []), ast.Expr(call("check", ast.Constant(i), v_load))]
        return [ast.fix_missing_locations(ast.copy_location(s, node)) for s in out]


class _Operands(ast.NodeTransformer):
    """Inside an assert's test: comparisons and ``not`` go through the harness."""

    def __init__(self, rewrite):
        self.r = rewrite

    def visit_Compare(self, node):
        self.generic_visit(node)
        ops = ast.Tuple([ast.Constant(CMP_OPS[type(op)]) for op in node.ops], ast.Load())
        items = ast.Tuple([node.left, *node.comparators], ast.Load())
        return ast.copy_location(ast.Call(self.r._const("compare", node), [ops, items], []), node)

    def visit_UnaryOp(self, node):
        self.generic_visit(node)
        if isinstance(node.op, ast.Not):
            return ast.copy_location(ast.Call(self.r._const("truth_not", node), [node.operand], []), node)
        return node

    def visit_BinOp(self, node):
        """``abs(f(x) - y) < 1e-6`` compares only built-in data when ``f(x).__sub__`` returns 0.0."""
        self.generic_visit(node)
        op = ast.Constant(ARITH_OPS.index(type(node.op)))
        return ast.copy_location(ast.Call(self.r._const("arith", node), [op, node.left, node.right], []), node)


def _swap_constants(code, table):
    """``code`` with every placeholder constant (nested code objects too) replaced by its object."""
    consts = []
    for c in code.co_consts:
        if type(c) is type(code):
            c = _swap_constants(c, table)
        elif type(c) is str and c in table:
            c = table[c]
        consts.append(c)
    return code.replace(co_consts=tuple(consts))


def main():
    # Private references, taken before any solution code exists: the solution may rebind anything in
    # builtins, in this module or in os, and nothing here looks a name up after it ran.
    _type, _id, _len, _iter, _list, _set, _bool, _str, _int = type, id, len, iter, list, set, bool, str, int
    _sum, _all, _map, _range, _sorted, _getattr, _exec, _isinstance = sum, all, map, range, sorted, getattr, exec, isinstance
    _Exception, _BaseException, _Refused = Exception, BaseException, Refused
    plain_atoms, plain_containers, numbers_, budget0 = PLAIN_ATOMS, PLAIN_CONTAINERS, NUMBERS, PLAIN_BUDGET
    no_import, refused_events, path_events, quiet = NO_IMPORT, REFUSED_EVENTS, PATH_EVENTS, QUIET_REFUSALS
    keys_of, values_of, module_type = dict.keys, dict.values, type(sys)
    write, exit_now, fsdecode, realpath = os.write, os._exit, os.fsdecode, os.path.realpath
    import operator

    from itertools import chain, repeat

    is_, ops = operator.is_, (operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge)
    arith_ops = (operator.add, operator.sub, operator.mul, operator.matmul, operator.truediv, operator.floordiv,
                 operator.mod, operator.pow, operator.lshift, operator.rshift, operator.or_, operator.xor,
                 operator.and_)
    job = json.loads(sys.stdin.buffer.read())
    os.close(0)
    nonce = job["nonce"]
    sys.path[:0] = [os.path.abspath(d) for d in job.get("path", ())]
    out_fd = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)

    def finish(passed, total, complete, flags):
        line = "\n" + " ".join((nonce, _str(passed), _str(total), "1" if complete is True else "0",
                                ",".join(_sorted(flags)) or "-")) + "\n"
        write(out_fd, line.encode())
        exit_now(0)

    flags = _set()
    marks = {name: f"__rlmix_{name}_{os.getpid()}_{_id(job)}" for name in
             ("truth", "truth_not", "compare", "arith", "raised", "check", "BaseException")}
    try:
        rewrite = _Rewrite(marks)
        tree = ast.fix_missing_locations(rewrite.visit(ast.parse(job["tests"], "<tests>")))
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "'str' object is not callable": the placeholders
            tests_code = compile(tree, "<tests>", "exec")
        solution_code = compile(job["solution"], "<solution>", "exec")
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
        finish(0, 0, False, ())
    total = rewrite.count
    del job, tree
    passed = [0] * total  # per assert: 1 held every time it ran, -1 failed once, 0 never ran

    def is_plain(value):
        """Built-in data all the way down (no subclass, no object of the solution's)."""
        stack, seen, budget = [value], _set(), budget0
        while stack:
            v = stack.pop()
            t = _type(v)
            if t in plain_atoms:
                continue
            if t not in plain_containers:
                return False
            if _id(v) in seen:
                continue
            seen.add(_id(v))
            budget -= _len(v)
            if budget < 0:
                return False
            if t is dict:
                stack.extend(_list(keys_of(v)))
                stack.extend(_list(values_of(v)))
            else:
                stack.extend(_iter(v))
        return True

    def truth(value):
        if _type(value) is bool:
            return value
        if is_plain(value):
            return not not value
        flags.add("nonbuiltin")
        return False

    def truth_not(value):
        if _type(value) is bool or is_plain(value):
            return not value
        flags.add("nonbuiltin")
        return False

    def compare_pair(op, a, b):
        if op == 6:
            return a is b
        if op == 7:
            return a is not b
        plain_a, plain_b = is_plain(a), is_plain(b)
        if plain_a is not plain_b:  # built-in data against an object: the classic always-equal hack
            flags.add("nonbuiltin")
            return False
        if op == 8:
            return (a in b) is True
        if op == 9:
            return (a not in b) is True
        ta, tb = _type(a), _type(b)
        if plain_a and op < 2 and ta is not tb and not (ta in numbers_ and tb in numbers_):
            return op == 1  # 1 == True, 2 == 2.0+0j: equal in Python, not the same answer
        return truth(ops[op](a, b))

    def compare(op_codes, items):
        for k in _range(_len(op_codes)):
            if not compare_pair(op_codes[k], items[k], items[k + 1]):
                return False
        return True

    def arith(op, a, b):
        """An operator between built-in data and an object: the object's method decides the value."""
        if _type(a) not in plain_atoms or _type(b) not in plain_atoms:
            if is_plain(a) is not is_plain(b):
                flags.add("nonbuiltin")
                raise _Refused("arithmetic between built-in data and an object")
        return arith_ops[op](a, b)

    def raised(i, err):
        if not _isinstance(err, _Exception):
            flags.add("early_exit")  # SystemExit, KeyboardInterrupt, GeneratorExit from the solution
        return False

    def check(i, ok):
        if not untouched():
            flags.add("tamper")
            ok = False
        if ok is True:
            if passed[i] == 0:
                passed[i] = 1
            return
        passed[i] = -1  # and the tests go on: partial credit counts the asserts that held

    # What the tests run on: a copy of the builtins, modules as loaded now; checked at every assert.
    for name in COMMON:
        __import__(name)
    import _imp
    import builtins

    from importlib.machinery import ModuleSpec

    _non_dumpable()
    sys.modules.pop("_signal", None)  # handlers are called with the current frame: none may be set
    sys.modules.pop("signal", None)
    create_builtin, create_dynamic, audit_event = _imp.create_builtin, _imp.create_dynamic, sys.audit
    installed = tuple({realpath(p) + "/" for p in (sys.base_prefix, sys.base_exec_prefix)})
    refusals = _set()

    def created(kind, spec, args):
        """The module ``_imp`` was asked for, from a spec of plain strings read once (a property could
        answer the check and the loader differently); extension modules only from the interpreter's
        installation, never a library the solution wrote."""
        name, origin = _getattr(spec, "name", None), _getattr(spec, "origin", None)
        if _type(name) is not _str or name.split(".")[0] in no_import:
            refusals.add("import")
            raise _Refused("this module is not importable while grading")
        if kind == "builtin":
            return create_builtin(ModuleSpec(name, None))
        origin = realpath(origin) if _type(origin) is _str else ""
        if not origin.startswith(installed):
            refusals.add("native")
            raise _Refused("only the interpreter's own extension modules load while grading")
        return create_dynamic(ModuleSpec(name, None, origin=origin), *args)

    def guarded(kind):
        # The importer's back door: creating a module without an import event. The check and the
        # original functions live in the audit hook: a wrapper's closure would hand them to the solution.
        def make(spec, *args):
            box = []
            audit_event(create_event, kind, spec, args, box)
            return box[0]
        return make

    import atexit
    import gc

    _imp.create_builtin, _imp.create_dynamic = guarded("builtin"), guarded("dynamic")  # no import until the hook
    tests_builtins = dict(builtins.__dict__)
    # (names, objects, namespace, names it may not gain) per namespace: every name must still hold its
    # object. A module may gain names (importing a submodule sets an attribute on its package), but
    # none that would shadow a builtin for its functions; warnings rebinds its filters. A class that
    # existed before the solution (``Counter.__eq__ = ...`` patches every Counter) gains only caches.
    builtin_names = frozenset(tests_builtins)
    namespaces = [m.__dict__ for name, m in _list(sys.modules.items())
                  if name not in ("sys", "warnings") and _type(m) is module_type]
    classes = {_id(c): c.__dict__ for d in namespaces for v in _list(values_of(d)) if _isinstance(v, type)
               for c in v.__mro__ if not c.__flags__ & 256}  # Py_TPFLAGS_IMMUTABLETYPE: cannot change
    spaces = [*namespaces, tests_builtins, sys.modules, *values_of(classes)]
    may_not_gain = [builtin_names] * _len(namespaces) + [None, frozenset()] + [None] * _len(classes)
    dict_get, proxy_get, missing, class_caches = dict.get, type(type.__dict__).get, object(), CLASS_CACHES
    values_in, everywhere = operator.methodcaller("values"), chain.from_iterable

    def snapshot():  # every namespace's names, objects (in order) and size: ~6,000 names
        return _list(everywhere(spaces)), _list(everywhere(_map(values_in, spaces))), _list(_map(_len, spaces))

    state = [snapshot()]

    def grown():
        """Some namespace has new names: if no old name changed and no new one is forbidden, they
        join what is watched."""
        names, values, sizes = state[0]
        at = 0
        for k in _range(_len(spaces)):
            d, n = spaces[k], sizes[k]
            get = dict_get if _type(d) is dict else proxy_get
            if not _all(_map(is_, _map(get, repeat(d, n), names[at:at + n], repeat(missing)), values[at:at + n])):
                return False
            if _len(d) != n:
                new, forbidden = _set(d) - _set(names[at:at + n]), may_not_gain[k]
                if not new <= class_caches if forbidden is None else not new.isdisjoint(forbidden):
                    return False
            at += n
        state[0] = snapshot()
        return True

    def untouched(names_too=False):
        """At each assert: sizes and objects, in order (a C loop); a name could then change only if
        an equal-sized namespace lost one and gained one for the same object. Before and after the
        tests: the names as well."""
        if _list(_map(_len, spaces)) != state[0][2] and not grown():
            return False
        names, values, _ = state[0]
        if names_too and not _all(_map(is_, everywhere(spaces), names)):
            return False
        return _all(_map(is_, everywhere(_map(values_in, spaces)), values))

    create_event = CREATE_EVENT
    modules, modules_then = sys.modules, dict(sys.modules)

    table = {marks["truth"]: truth, marks["truth_not"]: truth_not, marks["compare"]: compare, marks["arith"]: arith,
             marks["raised"]: raised, marks["check"]: check, marks["BaseException"]: _BaseException}
    tests_code = _swap_constants(tests_code, table)
    del table, marks

    def audit(event, args):
        if event == create_event:
            args[3].append(created(*args[:3]))
            return
        if event in ("object.__setattr__", "object.__delattr__") and (args[1] == "__code__" or _id(args[0]) in before):
            refusals.add(event)  # a function's code, or anything of what existed before the solution ran
            raise _Refused("not permitted while grading")
        if event == "object.__getattr__":  # frames, code objects, defaults of functions and generators
            name = args[1]
            if name in ("__defaults__", "__kwdefaults__") or (
                    name == "__code__" and _getattr(args[0], "__globals__", None) is not tests_ns_holder[0]):
                return  # inspect.signature (dataclasses); the tests' code holds the harness: refused
            refusals.add(name)
            raise _Refused("not permitted while grading")
        if event in refused_events or event[:7] == "ctypes.":
            if event not in quiet:
                refusals.add(event)
            raise _Refused("not permitted while grading")
        if event == "import" and args and _str(args[0]).split(".")[0] in no_import:
            refusals.add(event)
            raise _Refused("not importable while grading")
        if event in path_events and args and _type(args[0]) in (str, bytes):
            path = fsdecode(args[0])
            if path[:5] == "/proc" or realpath(path)[:5] == "/proc":
                refusals.add("/proc")
                raise _Refused("/proc is not readable while grading")

    tests_ns_holder = [None]
    excepthook = sys.excepthook
    existing = gc.get_objects()  # held, so that no id in ``before`` is reused by a new object
    before = _set(_map(_id, existing))
    sys.addaudithook(audit)
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    try:
        _exec(solution_code, namespace)
    except _Exception:
        finish(0, total, False, flags | ({"refused"} if refusals else _set()))
    except _BaseException:  # SystemExit, KeyboardInterrupt: the solution tried to end before the tests
        finish(0, total, False, flags | {"early_exit"})
    if sys.excepthook is not excepthook or atexit._ncallbacks():
        flags.add("exit_hook")  # nothing of the solution's runs at exit (os._exit): the intent counts
    # The tests see the solution's names, never one that would shadow a builtin they rely on; a name
    # of a module loaded before the solution is that module, and another module only if it is the
    # one imported under its name (tests that use a module the solution imported, as HumanEval's do).
    tests_ns = {}
    for k, v in _list(namespace.items()):
        if k in tests_builtins:
            continue
        if k in modules_then:
            v = modules_then[k]
        elif _type(v) is module_type and modules.get(_getattr(v, "__name__", None)) is not v:
            continue
        tests_ns[k] = v
    tests_ns["__builtins__"] = tests_builtins
    tests_ns_holder[0] = tests_ns
    complete = False
    if untouched(True):
        try:
            _exec(tests_code, tests_ns)
            complete = True
        except _Exception:
            pass
        except _BaseException:
            flags.add("early_exit")
    if not untouched(True):
        flags.add("tamper")
    if sys.excepthook is not excepthook or atexit._ncallbacks():
        flags.add("exit_hook")
    if refusals:
        flags.add("refused")
    held = _sum(1 for p in passed if p == 1)
    finish(held, total, complete and held == total, flags)

main()
