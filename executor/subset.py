"""The language subset a remote task may use: hygiene in front of the container, never the boundary.

One file of over 500 lines on purpose: executor/checker.py loads this file by its path into a `python -I -S`
child (standard library only, no package on its path), so the Python and the JavaScript checks cannot be split
into modules that import each other.

The container is the boundary (no network, read-only root, no capabilities, a uid of its own, seccomp, limits).
This check only refuses, early and cheaply, code that plainly reaches for what a mesh task has no business doing,
so that such offers are queued for the cloud with a clear reason instead of failing in odd ways inside the
sandbox. It is a
denylist and can be evaded by a determined author (string building, getattr chains); that is acceptable only
because the container does not depend on it.

`check_subset` is total: it never raises. Code the parser cannot take (nesting deeper than its own guards, or more
than it can hold) is a violation, "code nests too deeply to check" or "code too complex to check": CPython's
compiler uses the same parser, so such code could not run anyway. The tree is walked iteratively, so a deep tree
that did parse cannot exhaust the Python stack. The executor runs the check in a separate process with rlimits
(executor/checker.py): parsing 128 KiB of dense code costs about 0.3 s of CPU and 130 MiB of memory.

Python (AST, so strings and comments never match; a SyntaxError is not a violation: the program runs and fails
the way Python says):
- dynamic evaluation: eval, exec, compile, __import__, importlib, builtins, breakpoint, and the introspection
  attributes of sandbox escapes (__subclasses__, __globals__, __builtins__, __code__, ...);
- process control: os.system/popen/exec*/spawn*/fork/kill/..., subprocess, multiprocessing, pty, signal;
- file access beyond reading: open() with a mode that writes, appends, creates or updates (w, a, x, +) or a mode
  that is not a literal; os-level file mutation (remove, unlink, rmdir, rename, chmod, os.open, ...), shutil,
  tempfile, and pathlib's mutating methods when pathlib is imported. Reading files stays allowed;
- network: socket, ssl, urllib, http, ftplib, smtplib, poplib, imaplib, telnetlib, xmlrpc, socketserver,
  asyncio's connection/server/subprocess helpers;
- native code: ctypes, cffi, mmap.

JavaScript (no parser here, so a small tokenizer first drops comments and keeps string literals as values):
- eval (and globalThis.eval / global.eval), new Function / Function(...), `.constructor(` (the Function
  constructor reached from any function), dynamic import(...);
- require(...) of child_process, fs, fs/promises, net, http, https, http2, dgram, dns, tls, vm, worker_threads,
  cluster, inspector, v8, module (with or without the `node:` prefix), and require with a non-literal argument;
  static `import ... from` of the same modules;
- process.binding, process._linkedBinding, process.dlopen, process.kill, process.mainModule.
  process.exit stays allowed: it only ends the program with a status, which the container reports anyway.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

# A construct names what was found, and travels back to the offerer: never an echo of a whole program.
MAX_CONSTRUCT_CHARS = 200
TOO_DEEP = "code nests too deeply to check"
TOO_COMPLEX = "code too complex to check"


@dataclass(frozen=True, slots=True)
class SubsetViolation:
    construct: str
    line: int | None

    def __post_init__(self) -> None:
        if len(self.construct) > MAX_CONSTRUCT_CHARS:
            object.__setattr__(self, "construct", self.construct[: MAX_CONSTRUCT_CHARS - 3] + "...")


def check_subset(language: str, code: str) -> SubsetViolation | None:
    """The first construct outside the subset, or None. Unknown languages are violations. Never raises."""
    try:
        if language == "python":
            return _check_python(code)
        if language == "javascript":
            return _check_javascript(code)
        return SubsetViolation(f"language {language!r}", None)
    except RecursionError:
        return SubsetViolation(TOO_DEEP, None)
    except MemoryError:
        return SubsetViolation(TOO_COMPLEX, None)
    except Exception as exc:  # a checker bug must refuse the offer, never end the node
        return SubsetViolation(f"code the subset check could not read ({type(exc).__name__})", None)


# -- Python -----------------------------------------------------------------------------------------------------

_PY_FORBIDDEN_CALLS = {"eval", "exec", "compile", "__import__", "breakpoint"}
_PY_FORBIDDEN_NAMES = {"__builtins__", "__loader__", "__spec__"}
_PY_FORBIDDEN_ATTRS = {
    "__subclasses__",
    "__globals__",
    "__builtins__",
    "__code__",
    "__closure__",
    "__bases__",
    "__mro__",
    "__loader__",
    "f_globals",
    "f_locals",
    "f_back",
    "gi_frame",
}
# Modules refused wholesale, by their top-level name.
_PY_FORBIDDEN_MODULES = {
    "importlib",
    "builtins",
    "subprocess",
    "multiprocessing",
    "pty",
    "signal",
    "shutil",
    "tempfile",
    "socket",
    "ssl",
    "urllib",
    "http",
    "ftplib",
    "smtplib",
    "poplib",
    "imaplib",
    "telnetlib",
    "xmlrpc",
    "socketserver",
    "ctypes",
    "cffi",
    "mmap",
    "_posixsubprocess",
    "posix",
    "nt",
    "_thread",
}
_OS_FORBIDDEN = re.compile(
    r"^(system|popen|exec\w*|spawn\w*|posix_spawn\w*|fork\w*|kill\w*|abort|"
    r"remove\w*|unlink|rmdir|rename\w*|replace|truncate|ftruncate|chmod|lchmod|fchmod|chown|lchown|fchown|"
    r"symlink|link|mkfifo|mknod|mkdir|makedirs|open|openpty|setuid|setgid|seteuid|setegid|setreuid|setregid|"
    r"setgroups|chroot|chdir|putenv|unsetenv|pidfd_open|memfd_create|eventfd)$"
)
_ASYNCIO_FORBIDDEN = {
    "open_connection",
    "open_unix_connection",
    "start_server",
    "start_unix_server",
    "create_subprocess_exec",
    "create_subprocess_shell",
}
_PATHLIB_MUTATORS = {
    "write_text",
    "write_bytes",
    "unlink",
    "rmdir",
    "touch",
    "mkdir",
    "rename",
    "chmod",
    "lchmod",
    "symlink_to",
    "hardlink_to",
}
_WRITE_MODE_CHARS = set("wax+")


def _check_python(code: str) -> SubsetViolation | None:
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        # Not a violation: it runs and fails with Python's own message. A null byte is a SyntaxError since 3.11.4,
        # a ValueError before.
        return None
    except RecursionError:  # "maximum recursion depth exceeded during ast construction"
        return SubsetViolation(TOO_DEEP, None)
    except MemoryError:  # the parser's own stack guard ("too complex"), or memory really ran out
        return SubsetViolation(TOO_COMPLEX, None)
    finder = _PythonFinder()
    finder.walk(tree)
    if not finder.found:
        return None
    return min(finder.found, key=lambda v: v.line or 0)


class _PythonFinder:
    """Visits every node in the order of `ast.NodeVisitor` (depth first, fields in order), with a stack of its own
    instead of recursion: a tree that parsed can still be deeper than the interpreter's recursion limit."""

    def __init__(self) -> None:
        self.found: list[SubsetViolation] = []
        self.module_aliases: dict[str, str] = {}  # local name -> module it is bound to (os, asyncio, ...)
        self.uses_pathlib = False

    def walk(self, tree: ast.AST) -> None:
        stack = [tree]
        while stack:
            node = stack.pop()
            handler = self._HANDLERS.get(type(node))
            if handler is not None:
                handler(self, node)
            stack.extend(reversed(list(ast.iter_child_nodes(node))))

    def flag(self, construct: str, node: ast.AST) -> None:
        self.found.append(SubsetViolation(construct, getattr(node, "lineno", None)))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.check_module(alias.name, node)
            self.module_aliases[(alias.asname or alias.name).split(".")[0]] = (
                alias.name if alias.asname else alias.name.split(".")[0]
            )

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        self.check_module(module, node)
        for alias in node.names:
            if module == "os" and _OS_FORBIDDEN.match(alias.name):
                self.flag(f"os.{alias.name}", node)
            elif module == "asyncio" and alias.name in _ASYNCIO_FORBIDDEN:
                self.flag(f"asyncio.{alias.name}", node)
            elif module in ("os", "asyncio") and alias.name == "*":
                self.flag(f"from {module} import *", node)

    def check_module(self, module: str, node: ast.AST) -> None:
        top = module.split(".")[0]
        if top in _PY_FORBIDDEN_MODULES:
            self.flag(f"import {module}", node)
        if top == "pathlib":
            self.uses_pathlib = True

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in _PY_FORBIDDEN_NAMES:
            self.flag(node.id, node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in _PY_FORBIDDEN_ATTRS:
            self.flag(node.attr, node)
        if isinstance(node.value, ast.Name):
            module = self.module_aliases.get(node.value.id)
            if module == "os" and _OS_FORBIDDEN.match(node.attr):
                self.flag(f"os.{node.attr}", node)
            elif module == "asyncio" and node.attr in _ASYNCIO_FORBIDDEN:
                self.flag(f"asyncio.{node.attr}", node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name):
            if func.id in _PY_FORBIDDEN_CALLS:
                self.flag(f"{func.id}()", node)
            elif func.id == "open":
                self.check_open_mode(node)
            elif func.id == "getattr" and len(node.args) >= 2:
                self.check_getattr(node)
        elif isinstance(func, ast.Attribute) and self.uses_pathlib and func.attr in _PATHLIB_MUTATORS:
            self.flag(f"pathlib .{func.attr}()", node)
        elif isinstance(func, ast.Attribute) and func.attr == "open" and self.uses_pathlib:
            self.check_open_mode(node, mode_position=0)

    def check_open_mode(self, node: ast.Call, mode_position: int = 1) -> None:
        mode: ast.expr | None = None
        if len(node.args) > mode_position:
            mode = node.args[mode_position]
        for keyword in node.keywords:
            if keyword.arg == "mode":
                mode = keyword.value
            elif keyword.arg is None:  # open(**options): the mode cannot be known
                self.flag("open(**kwargs)", node)
        if any(isinstance(arg, ast.Starred) for arg in node.args):
            self.flag("open(*args)", node)
        elif mode is None:
            return  # default "r"
        elif not (isinstance(mode, ast.Constant) and isinstance(mode.value, str)):
            self.flag("open() with a computed mode", node)
        elif _WRITE_MODE_CHARS & set(mode.value):
            self.flag(f"open(mode={mode.value!r})", node)

    def check_getattr(self, node: ast.Call) -> None:
        # getattr(os, "system") is os.system spelled differently.
        target, name = node.args[0], node.args[1]
        if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
            return
        attribute = ast.Attribute(value=target, attr=name.value, ctx=ast.Load())
        ast.copy_location(attribute, node)
        self.visit_Attribute(attribute)
        if isinstance(target, ast.Name) and target.id in ("__builtins__", "builtins"):
            self.flag(f"getattr(builtins, {name.value!r})", node)

    _HANDLERS: ClassVar[dict[type[ast.AST], Callable[[_PythonFinder, Any], None]]] = {
        ast.Import: visit_Import,
        ast.ImportFrom: visit_ImportFrom,
        ast.Name: visit_Name,
        ast.Attribute: visit_Attribute,
        ast.Call: visit_Call,
    }


# -- JavaScript -------------------------------------------------------------------------------------------------

_JS_FORBIDDEN_MODULES = {
    "child_process",
    "fs",
    "fs/promises",
    "net",
    "http",
    "https",
    "http2",
    "dgram",
    "dns",
    "dns/promises",
    "tls",
    "vm",
    "worker_threads",
    "cluster",
    "inspector",
    "v8",
    "module",
}
_JS_FORBIDDEN_PROCESS = {"binding", "_linkedBinding", "dlopen", "kill", "mainModule"}
_JS_GLOBAL_OBJECTS = {"globalThis", "global", "window", "self"}

_IDENT = re.compile(r"[A-Za-z_$][\w$]*")
_NUMBER = re.compile(r"(?:0[xXoObB][\da-fA-F_]+|\d[\d_]*\.?[\d_]*(?:[eE][+-]?\d+)?|\.\d[\d_]*(?:[eE][+-]?\d+)?)n?")
# After these tokens a `/` starts a regular expression literal rather than a division.
_REGEX_PRECEDERS = set("(,=:[!&|?{};+-*%<>~^") | {
    "return",
    "typeof",
    "instanceof",
    "in",
    "of",
    "new",
    "delete",
    "void",
    "throw",
    "case",
    "do",
    "else",
    "yield",
    "await",
    "=>",
}


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # "ident" | "string" | "punct"
    value: str
    line: int


def _check_javascript(code: str) -> SubsetViolation | None:
    tokens = _tokenize_js(code)
    for index, token in enumerate(tokens):
        construct = _js_construct_at(tokens, index)
        if construct is not None:
            return SubsetViolation(construct, token.line)
    return None


def _js_construct_at(tokens: list[_Token], i: int) -> str | None:
    token = tokens[i]
    if token.kind != "ident":
        return None

    def at(offset: int) -> _Token | None:
        j = i + offset
        return tokens[j] if 0 <= j < len(tokens) else None

    def is_punct(tok: _Token | None, value: str) -> bool:
        return tok is not None and tok.kind == "punct" and tok.value == value

    before, after = at(-1), at(1)
    member = is_punct(before, ".")
    owner = at(-2) if member else None
    name = token.value
    if name == "eval" and (not member or (owner is not None and owner.value in _JS_GLOBAL_OBJECTS)):
        return "eval"
    if name == "Function" and not member and (is_punct(after, "(") or (before is not None and before.value == "new")):
        return "Function constructor"
    if name == "constructor" and member and is_punct(after, "("):
        return ".constructor()"
    if name == "import" and not member and is_punct(after, "("):
        return "import()"
    if name == "require" and not member and is_punct(after, "("):
        argument, closing = at(2), at(3)
        if argument is None or argument.kind != "string" or not is_punct(closing, ")"):
            return "require(<computed>)"
        module = argument.value.removeprefix("node:")
        if module in _JS_FORBIDDEN_MODULES:
            return f"require('{module}')"
    if name in ("from", "import") and not member and after is not None and after.kind == "string":
        module = after.value.removeprefix("node:")
        if module in _JS_FORBIDDEN_MODULES:
            return f"import '{module}'"
    if member and owner is not None and owner.value == "process" and name in _JS_FORBIDDEN_PROCESS:
        return f"process.{name}"
    if name in ("process", *_JS_GLOBAL_OBJECTS) and is_punct(after, "["):
        # process["binding"], globalThis["eval"]: the same members written as computed keys.
        key = at(2)
        if key is not None and key.kind == "string" and (key.value in _JS_FORBIDDEN_PROCESS or key.value == "eval"):
            return f"{name}[{key.value!r}]"
    return None


def _tokenize_js(code: str) -> list[_Token]:
    """Identifiers, string values and punctuation; comments and regex literals dropped.

    Template literals keep their `${...}` expressions as code (tracked with a brace stack) and their text
    parts as strings. The tokenizer never raises: anything unexpected is skipped one character at a time.
    """
    tokens: list[_Token] = []
    line = 1
    i, n = 0, len(code)
    # One entry per open `{`: True when that brace opened a template substitution `${`.
    braces: list[bool] = []

    def previous_allows_regex() -> bool:
        if not tokens:
            return True
        last = tokens[-1]
        return last.value in _REGEX_PRECEDERS if last.kind != "string" else False

    while i < n:
        c = code[i]
        if c == "\n":
            line += 1
            i += 1
        elif c in " \t\r\f\v\u00a0\ufeff\u2028\u2029":
            i += 1
        elif code.startswith("//", i):
            end = code.find("\n", i)
            i = n if end < 0 else end
        elif code.startswith("/*", i):
            end = code.find("*/", i + 2)
            end = n if end < 0 else end + 2
            line += code.count("\n", i, end)
            i = end
        elif c in "'\"":
            value, i, line = _read_quoted(code, i, line)
            tokens.append(_Token("string", value, line))
        elif c == "`" or (c == "}" and braces and braces[-1]):
            if c == "}":
                braces.pop()
            value, i, line, opened = _read_template_part(code, i + 1, line)
            tokens.append(_Token("string", value, line))
            if opened:
                braces.append(True)
        elif c == "/" and previous_allows_regex():
            i, line = _skip_regex(code, i, line)
        elif match := _IDENT.match(code, i):
            tokens.append(_Token("ident", match.group(), line))
            i = match.end()
        elif match := _NUMBER.match(code, i):
            i = match.end()
        else:
            if c == "{":
                braces.append(False)
            elif c == "}" and braces:
                braces.pop()
            punct = "=>" if code.startswith("=>", i) else c
            tokens.append(_Token("punct", punct, line))
            i += len(punct)
    return tokens


_SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f", "v": "\v", "0": "\0"}


def _read_quoted(code: str, i: int, line: int) -> tuple[str, int, int]:
    quote = code[i]
    i += 1
    out: list[str] = []
    while i < len(code) and code[i] != quote:
        if code[i] == "\\" and i + 1 < len(code):
            escaped = code[i + 1]
            if escaped == "\n":
                line += 1
            out.append(_SIMPLE_ESCAPES.get(escaped, escaped))
            i += 2
            continue
        if code[i] == "\n":  # unterminated string: stop at the line end, as the JS parser would fail there
            break
        out.append(code[i])
        i += 1
    return "".join(out), i + 1, line


def _read_template_part(code: str, i: int, line: int) -> tuple[str, int, int, bool]:
    """Text of a template literal up to its end (`) or a substitution (${); True when a substitution opened."""
    out: list[str] = []
    while i < len(code):
        c = code[i]
        if c == "\\" and i + 1 < len(code):
            out.append(code[i + 1])
            i += 2
            continue
        if c == "`":
            return "".join(out), i + 1, line, False
        if code.startswith("${", i):
            return "".join(out), i + 2, line, True
        if c == "\n":
            line += 1
        out.append(c)
        i += 1
    return "".join(out), i, line, False


def _skip_regex(code: str, i: int, line: int) -> tuple[int, int]:
    i += 1
    in_class = False
    while i < len(code):
        c = code[i]
        if c == "\\":
            i += 2
            continue
        if c == "\n":  # a regex cannot span lines: it was a division after all
            return i, line
        if c == "[":
            in_class = True
        elif c == "]":
            in_class = False
        elif c == "/" and not in_class:
            i += 1
            while i < len(code) and (code[i].isalnum() or code[i] == "_"):
                i += 1  # flags
            return i, line
        i += 1
    return i, line
