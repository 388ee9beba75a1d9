"""The ``python_tests`` harness: run inside the sandbox as ``python -I -S -B -c <this file's text>``.

Standard library only; reads one JSON job from stdin: ``{"nonce", "solution", "tests"}`` and optionally
``"path"``, directories put first on ``sys.path`` once the audit hook is in place (a repository whose
modules the tests import: those imports then run under the harness like the solution does; the harness's
own imports never come from there).
The verdict is one line on the descriptor that was stdout when the harness started::

    <nonce> <asserts passed> <asserts> <tests ran to the end: 0|1> <flags, comma separated, or ->

Flags: ``nonbuiltin`` (an object compared with, or in arithmetic with, built-in data, directly or through
a call), ``early_exit`` (SystemExit and the like instead of a return), ``exit_hook`` (an ``atexit`` hook
or ``sys.excepthook`` set), ``tamper`` (builtins, a module, a class of one or ``sys.modules`` changed),
``refused`` (an introspection route, native code, a signal or an in-place change of a function was tried).

The line is written after the last test has run, then the process ends with ``os._exit`` (no ``atexit`` hook, no
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
data and an object (``abs(f(x) - y)`` with ``f(x).__sub__`` returning 0), and so does a call that would
hand built-in data and such an object to each other: a function that is not the solution's own (``sum``,
``max``, ``sorted``, ``operator.sub``, ``math.*``, ``[1, 2].count``, a helper of the tests) given both
built-in data and an object whose class defines a comparison or arithmetic operator
(``sum([f(x), -y])`` calls ``f(x).__add__(-y)``; ``_call_check``). The tests run on a copy of
the builtins taken before the solution ran; that copy, the modules loaded before the solution (``COMMON`` and the standard-library
modules the tests import), their classes, and ``sys.modules`` are checked for tampering at every assert and
at the end, as are the data of ``sys`` (``SYS_CONSTANTS``) and, where no ``"path"`` is given, the names
``sys.modules`` gains (only the standard library's: ``sys.modules["numpy"] = fake`` is tampering); the
solution may not change ``sys.path``, ``sys.meta_path`` or ``sys.path_hooks``. A comparison outside an
assert (``ok = f(x) == y``, a helper's ``return v == 2``) keeps Python's result unless built-in data meets
an object of a class made since the solution started with operators of its own (flagged, false). Built-in
data is compared as a copy taken at the check (no thread of the solution's can swap an item in between),
in which ``True`` equals no ``1`` and a complex number no int or float, at any depth.
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
# (statistics, fractions, decimal, random: a module first imported after the solution is one it may have
# patched first, and its Python functions count as the solution's own in calls; ~4 ms to load them.)
COMMON = ("importlib", "math", "re", "collections", "itertools", "functools", "heapq", "bisect", "string", "operator",
          "copy", "statistics", "fractions", "decimal", "random")
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
# What an object would see of the test's data through a call: a class (made since the solution started)
# defining one of these hands its object what it is compared with or computed with.
ARITH_NAMES = ("add", "sub", "mul", "matmul", "truediv", "floordiv", "mod", "pow", "lshift", "rshift", "and", "or",
               "xor")
OPERATOR_DUNDERS = frozenset(["__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__contains__", "__divmod__",
                              "__rdivmod__", *(f"__{p}{n}__" for n in ARITH_NAMES for p in ("", "r", "i"))])
# Builtins that never hand their arguments to one another's operators (they ask an object for its own
# answer: its length, type, text, number, truth, attribute): calls of them are not checked.
CALL_EXEMPT = ("len", "isinstance", "issubclass", "type", "id", "repr", "ascii", "str", "format", "hash", "callable",
               "getattr", "hasattr", "print", "bool", "all", "any", "int", "float", "complex", "list", "tuple")
# Builtins that read their caller's frame: called by name in an assert, they stay the test's own call.
FRAME_CALLS = frozenset({"eval", "exec", "locals", "vars", "dir", "globals", "super", "breakpoint"})
# Attributes of ``sys`` the tests may read as data: checked like a module's names (``sys.maxsize = 7``).
SYS_CONSTANTS = ("maxsize", "maxunicode", "float_info", "int_info", "hash_info", "float_repr_style", "byteorder",
                 "version", "version_info", "hexversion", "api_version", "implementation", "platform", "flags",
                 "thread_info", "builtin_module_names", "stdlib_module_names", "path", "meta_path", "path_hooks",
                 "modules", "executable", "prefix", "base_prefix")
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
    """``assert t`` -> ``try: v = T(t') except BaseException as e: v = R(i, e)``, ``C(i, v)``; every other
    comparison (``ok = f(x) == y``, ``if f(x) != y: raise``, a helper's ``return v == 2``) -> ``L(ops, items)``."""

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

    def visit_Compare(self, node):
        self.generic_visit(node)
        if all(type(op) in (ast.Is, ast.IsNot) for op in node.ops):
            return node
        ops = ast.Tuple([ast.Constant(CMP_OPS[type(op)]) for op in node.ops], ast.Load())
        items = ast.Tuple([node.left, *node.comparators], ast.Load())
        return ast.copy_location(ast.Call(self._const("compare_loose", node), [ops, items], []), node)


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

    def visit_Call(self, node):
        """``sum([f(x), -y]) == 0`` compares only built-in data when ``f(x).__add__`` returns 0."""
        self.generic_visit(node)
        if type(node.func) is ast.Name and node.func.id in FRAME_CALLS:
            return node
        return ast.copy_location(ast.Call(self.r._const("call", node), [node.func, *node.args], node.keywords), node)


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


def _call_check(flags, refused, context):
    """The harness's ``call``: ``fn(*args, **kwargs)`` in an assert's test. A function that is not the
    solution's own (a builtin, a C method, a function or class of a module loaded before the solution, a
    function of the tests) handed built-in data and an object whose class defines an operator
    (``OPERATOR_DUNDERS``) would let that object see the expected value: ``sum([f(x), -y])`` calls
    ``f(x).__add__(-y)``. Such a call is flagged ``nonbuiltin`` and refused. ``context`` is filled before
    the solution runs: the ids of what existed then (held, so never reused), then the tests' namespace.
    Names are bound here, before the solution runs. A function that is not the solution's is called from
    a function of an empty namespace: a builtin that reads its caller's frame (``eval`` as a ``key``)
    finds nothing of the harness's there."""
    import builtins
    import functools
    import types
    from collections import deque

    _type, _id, _list, _tuple, _set, _len, _dict = type, id, list, tuple, set, len, dict
    keys_of, values_of = dict.keys, dict.values
    mro_of, dict_of = type.__dict__["__mro__"].__get__, type.__dict__["__dict__"].__get__
    partial_type, method_type, generator_type = functools.partial, types.MethodType, types.GeneratorType
    function_type = types.FunctionType
    ids = lambda objects: frozenset(map(id, objects))  # noqa: E731
    native = ids((types.BuiltinMethodType, types.MethodWrapperType))
    atoms, options, text = ids(PLAIN_ATOMS), ids((bool, type(None))), ids((str, bytes))
    containers = ids((*PLAIN_CONTAINERS, deque))  # walked as stored (a deque: a BFS's answer)
    plain_types = ids((*PLAIN_ATOMS, *PLAIN_CONTAINERS, object))
    exempt = ids(getattr(builtins, name) for name in CALL_EXEMPT)
    dunders, budget0 = OPERATOR_DUNDERS, PLAIN_BUDGET
    namespace = {"__builtins__": {}}
    exec("def invoke(fn, args, kwargs):\n    return fn(*args, **kwargs)\n", namespace)
    invoke = namespace.pop("invoke")

    def kind(t, cache):
        """(``t``, whether its objects are odd, its built-in container base or None). Odd: ``t`` was made
        after the solution started and a class of its MRO (other than built-in data's) defines an
        operator that is not a function of the tests (a ``ListNode.__eq__`` the tests wrote is theirs).
        Cached per call; the entry holds ``t``, so its id is not reused meanwhile."""
        entry = cache.get(_id(t))
        if entry is None:
            base, odd = None, False
            for c in mro_of(t):
                if base is None and _id(c) in containers:
                    base = c
                if _id(c) not in plain_types:
                    d = dict_of(c)
                    for name in dunders.intersection(d):
                        odd = odd or not (_type(d[name]) is function_type and d[name].__globals__ is context[1])
            entry = cache[_id(t)] = (t, odd and _id(t) not in context[0], base)
        return entry

    def contents(v, base):  # as stored: a subclass's own __iter__ is not asked
        return (keys_of(v), values_of(v)) if base is _dict else (base.__iter__(v),)

    def mixed(values, seen):
        """Walks ``values`` breadth first, into built-in containers (their subclasses too) while the
        budget lasts (a container past it is not walked); ``seen``: [built-in data found, an odd object
        found, budget left, kinds], over one call. Built-in data: numbers, strings, bytes; True and None
        are options (``reverse=True``, ``default=None``)."""
        queue, visited, at = _list(values), _set(), 0
        while at < _len(queue):
            v, at = queue[at], at + 1
            t = _type(v)
            if _id(t) in atoms:
                seen[0] = seen[0] or _id(t) not in options
            else:
                _, odd, base = kind(t, seen[3])
                seen[1] = seen[1] or odd
                if base is not None and _id(v) not in visited:
                    visited.add(_id(v))
                    seen[2] -= base.__len__(v)
                    if seen[2] >= 0:
                        for part in contents(v, base):
                            queue.extend(part)
            if seen[0] and seen[1]:
                return True
        return False

    def refuse():
        flags.add("nonbuiltin")
        raise refused("a call handed built-in data and an object with operators of its own to each other")

    def watched(items, seen):
        """A generator's items, walked as they come: they are not there to see before the call."""
        for item in items:
            if mixed([item], seen):
                refuse()
            yield item

    def mixes(values):
        """Built-in data and an object with operators of its own among ``values`` (walked as a call's are)."""
        return mixed(values, [False, False, budget0, {}])

    def others(fn):
        """A function that is not the solution's: it existed before the solution ran, or is the tests'."""
        return _id(fn) in context[0] or (_type(fn) is function_type and fn.__globals__ is context[1])

    def handed(fn):
        """What a call of ``fn`` hands over besides its arguments (a method's object or container's items,
        a partial's arguments), or None: ``fn`` is the solution's own (so are classes made since it
        started), or never hands its arguments to an operator (``CALL_EXEMPT``, methods of text)."""
        held = []
        while _type(fn) is partial_type:
            held += [fn.args, fn.keywords]
            fn = fn.func
        t = _type(fn)
        if _id(fn) in exempt:
            return None
        if t is method_type:  # a Python method: whose function it is decides
            if not others(fn.__func__):
                return None
            held.append(fn.__self__)
        elif _id(t) in native:  # a C method: ``[1, 2].count(x)`` compares x with the list's items
            owner = fn.__self__
            if _id(_type(owner)) in text:  # takes text, or asks for a format or an __index__
                return None
            base = kind(_type(owner), {})[2]
            if base is not None:  # its items, not itself: a list subclass's own __eq__ is not asked
                held.append(owner if _type(owner) is base else [item for part in contents(owner, base)
                                                                 for item in part])
        elif not others(fn):
            return None
        return held

    def call(fn, /, *args, **kwargs):
        if _type(fn) is function_type and not others(fn):
            return fn(*args, **kwargs)  # the solution's own function, in a frame of its own
        held = handed(fn)
        if held is not None:
            seen = [False, False, budget0, {}]
            args = _tuple([watched(a, seen) if _type(a) is generator_type else a for a in args])
            for k, v in _list(kwargs.items()):
                if _type(v) is generator_type:
                    kwargs[k] = watched(v, seen)
            if mixed([*held, *args, *values_of(kwargs)], seen):
                refuse()
        return invoke(fn, args, kwargs)

    return call, mixes


def _tests_imports(tree):
    """The standard-library modules the tests import (``import a.b``: ``a.b``; ``from a import b``: ``a`` and
    perhaps the submodule ``a.b``), in order, once each."""
    stdlib = getattr(sys, "stdlib_module_names", frozenset())
    names = []
    for node in ast.walk(tree):
        if type(node) is ast.Import:
            names += [alias.name for alias in node.names]
        elif type(node) is ast.ImportFrom and node.level == 0 and node.module:
            names += [node.module, *(f"{node.module}.{alias.name}" for alias in node.names if alias.name != "*")]
    return [n for n in dict.fromkeys(names) if n.split(".")[0] in stdlib and n.split(".")[0] not in NO_IMPORT]


def _preload(names):
    """Imports what the tests will, before the solution runs, so those modules are checked for tampering like
    ``COMMON`` and their functions are not the solution's own in calls (a module first imported after the
    solution is one it may have patched first: ``datetime.date = lambda *a: 7``). A module whose import
    brings in one that may not load while grading (``subprocess`` holds ``signal``) is taken back out, with
    everything its import loaded: the solution's import of it meets the refusal then, as without this."""
    for name in names:
        then = set(sys.modules)
        try:
            __import__(name)
        except Exception:  # not there (``from os import path``: no submodule ``os.path``): the tests will say
            pass
        new = [n for n in sys.modules if n not in then]
        loaded = [sys.modules[n] for n in new]
        barred = any(n.split(".")[0] in NO_IMPORT for n in new) or any(
            type(v) is type(sys) and getattr(v, "__name__", "").split(".")[0] in NO_IMPORT
            for m in loaded for v in list(vars(m).values()))
        if not barred:
            continue
        for n in new:
            module = sys.modules.pop(n)
            parent, _, child = n.rpartition(".")
            if parent in then and getattr(sys.modules[parent], child, None) is module:
                delattr(sys.modules[parent], child)


def main():
    # Private references, taken before any solution code exists: the solution may rebind anything in
    # builtins, in this module or in os, and nothing here looks a name up after it ran.
    _type, _id, _len, _iter, _list, _set, _bool, _str, _int = type, id, len, iter, list, set, bool, str, int
    _sum, _all, _map, _range, _sorted, _getattr, _exec, _isinstance = sum, all, map, range, sorted, getattr, exec, isinstance
    _Exception, _BaseException, _Refused = Exception, BaseException, Refused
    plain_atoms, plain_containers, numbers_, budget0 = PLAIN_ATOMS, PLAIN_CONTAINERS, NUMBERS, PLAIN_BUDGET
    no_import, refused_events, path_events, quiet = NO_IMPORT, REFUSED_EVENTS, PATH_EVENTS, QUIET_REFUSALS
    no_climb = frozenset({"proc", ".."})  # components of a relative os.open path refused (``audit``)
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
    # The job's directories join sys.path only once the audit hook is in place: a module of theirs named like
    # one of the standard library's that the harness loads first (``heapq.py``) would run unchecked before it.
    job_path = [os.path.abspath(d) for d in job.get("path", ())]
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
             ("truth", "truth_not", "compare", "compare_loose", "arith", "call", "raised", "check", "BaseException")}
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
    del job
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

    class NotPlain(Exception):
        pass

    bool_mark, complex_mark, items_of, not_plain = object(), object(), dict.items, NotPlain()
    _tuple, _frozenset, _dict, _complex, _next = tuple, frozenset, dict, complex, next

    def plain_copy(value, marked):
        """A copy of built-in data (``not_plain`` for anything else): what is compared is this copy, which no
        thread of the solution's can change between the check and the comparison. ``marked``: ``True`` and
        complex numbers become pairs of their own, so ``[True] == [1]`` is false, as ``True == 1`` is here."""
        budget, done, busy = [budget0], {}, _set()

        def copy(v):
            t = _type(v)
            if t in plain_atoms:
                if marked and (t is _bool or t is _complex):
                    return (bool_mark if t is _bool else complex_mark, v)
                return v
            if t not in plain_containers:
                raise not_plain
            if _id(v) in done:
                return done[_id(v)]
            if _id(v) in busy:  # a cycle through a tuple
                raise not_plain
            busy.add(_id(v))
            parts = _list(items_of(v)) if t is _dict else _list(v)  # one C call: taken whole
            budget[0] -= _len(parts)
            if budget[0] < 0:
                raise not_plain
            if t is _list:
                out = done[_id(v)] = []
                out.extend([copy(x) for x in parts])
                return out
            if t is _dict:
                out = done[_id(v)] = {}
                for key, x in parts:
                    out[copy(key)] = copy(x)
                return out
            out = done[_id(v)] = (_tuple if t is _tuple else _set if t is _set else _frozenset)(
                [copy(x) for x in parts])
            return out

        try:
            return copy(value)
        except NotPlain:
            return not_plain

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
        copy_a, copy_b = plain_copy(a, op < 2), plain_copy(b, op < 2)
        plain_a, plain_b = copy_a is not not_plain, copy_b is not not_plain
        if plain_a is not plain_b:  # built-in data against an object: the classic always-equal hack
            flags.add("nonbuiltin")
            return False
        if plain_a:
            a, b = copy_a, copy_b
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

    all_ops = (*ops, is_, operator.is_not, lambda a, b: a in b, lambda a, b: a not in b)
    set_types = (set, frozenset, dict)

    def compare_loose(op_codes, items):
        """A comparison outside an assert: Python's own result (a chain stops at its first false link), unless
        built-in data meets an object whose class, made since the solution started, has operators of its own
        (``ok = f(x) == 2``, ``if f(x) != 2: raise``): then flagged, and false."""
        result = True
        for k in _range(_len(op_codes)):
            op, a, b = op_codes[k], items[k], items[k + 1]
            if op < 6 and not (_type(a) in plain_atoms and _type(b) in plain_atoms):
                if mixes([a, b]):
                    flags.add("nonbuiltin")
                    return False
            elif op > 7:  # a set's or dict's members: one of them stands for all (no walk per lookup)
                some = ([_next(_iter(b))] if b else []) if _type(b) in set_types else [b]
                if mixes([a, *some]):
                    flags.add("nonbuiltin")
                    return False
            result = all_ops[op](a, b)
            if k + 1 < _len(op_codes) and not result:
                return result
        return result

    def arith(op, a, b):
        """An operator between built-in data and an object: the object's method decides the value."""
        if _type(a) not in plain_atoms or _type(b) not in plain_atoms:
            if is_plain(a) is not is_plain(b):
                flags.add("nonbuiltin")
                raise _Refused("arithmetic between built-in data and an object")
        return arith_ops[op](a, b)

    context = []  # for calls: what existed before the solution ran, then the tests' namespace
    call, mixes = _call_check(flags, _Refused, context)

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
    def shadowed(name):
        """A module of the job's directories has this name: the tests mean it, imported under the audit hook."""
        top = name.split(".")[0]
        return any(os.path.isfile(os.path.join(d, top + ".py")) or os.path.isfile(os.path.join(d, top, "__init__.py"))
                   for d in job_path)

    for name in COMMON:
        if not shadowed(name):
            __import__(name)
    _preload([name for name in _tests_imports(tree) if not shadowed(name)])
    del tree
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
                if d is modules and not job_path and not _all(_map(stdlib_module, new)):
                    return False  # ``sys.modules["numpy"] = fake``: only the standard library is importable here
            at += n
        state[0] = snapshot()
        return True

    def untouched(names_too=False):
        """At each assert: sizes and objects, in order (a C loop); a name could then change only if
        an equal-sized namespace lost one and gained one for the same object. Before and after the
        tests: the names as well."""
        if _list(_map(_len, spaces)) != state[0][2] and not grown():
            return False
        if not _all(_map(is_, _map(sys_get, sys_names), sys_values)):
            return False
        names, values, _ = state[0]
        if names_too and not _all(_map(is_, everywhere(spaces), names)):
            return False
        return _all(_map(is_, everywhere(_map(values_in, spaces)), values))

    create_event = CREATE_EVENT
    modules, modules_then = sys.modules, dict(sys.modules)
    stdlib_names = sys.stdlib_module_names
    stdlib_module = lambda name: name.partition(".")[0] in stdlib_names  # noqa: E731
    sys_get = sys.__dict__.get
    sys_names = [name for name in SYS_CONSTANTS if name in sys.__dict__]
    sys_values = [sys_get(name) for name in sys_names]

    table = {marks["truth"]: truth, marks["truth_not"]: truth_not, marks["compare"]: compare,
             marks["compare_loose"]: compare_loose, marks["arith"]: arith, marks["call"]: call,
             marks["raised"]: raised, marks["check"]: check,
             marks["BaseException"]: _BaseException}
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
            # ``os.open`` (its mode is None) may resolve a relative path against a directory descriptor
            # (``dir_fd``), which no name tells: through one of "/" or "/dev", "proc" or "fd/.." reach /proc.
            by_fd = event == "open" and args[1] is None and path[:1] != "/" and not no_climb.isdisjoint(path.split("/"))
            if path[:5] == "/proc" or realpath(path)[:5] == "/proc" or by_fd:
                refusals.add("/proc")
                raise _Refused("/proc is not readable while grading")

    tests_ns_holder = [None]
    excepthook, exit_hooks_then = sys.excepthook, atexit._ncallbacks()  # a preloaded module's hooks are not its
    existing = gc.get_objects()  # held, so that no id in ``before`` is reused by a new object
    before = frozenset(_map(_id, existing))
    context.append(before | frozenset(_map(_id, state[0][1])))  # with what modules, classes, builtins held
    sys.addaudithook(audit)
    sys.path[:0] = job_path
    # What an import finds modules with: the solution may not add a finder or a directory of its own.
    machinery = [(sys.path, _list(sys.path)), (sys.meta_path, _list(sys.meta_path)),
                 (sys.path_hooks, _list(sys.path_hooks))]
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    try:
        _exec(solution_code, namespace)
    except _Exception:
        finish(0, total, False, flags | ({"refused"} if refusals else _set()))
    except _BaseException:  # SystemExit, KeyboardInterrupt: the solution tried to end before the tests
        finish(0, total, False, flags | {"early_exit"})
    if sys.excepthook is not excepthook or atexit._ncallbacks() != exit_hooks_then:
        flags.add("exit_hook")  # nothing of the solution's runs at exit (os._exit): the intent counts
    if not _all(_len(now) == _len(then) and _all(_map(is_, now, then)) for now, then in machinery):
        flags.add("tamper")
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
    context.append(tests_ns)
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
    if sys.excepthook is not excepthook or atexit._ncallbacks() != exit_hooks_then:
        flags.add("exit_hook")
    if refusals:
        flags.add("refused")
    held = _sum(1 for p in passed if p == 1)
    finish(held, total, complete and held == total, flags)

main()
