"""A static look at what a student wrote, for code that tries to change how it is graded.

Best effort, and only a reason to look: grades never depend on it (trusted verdicts and
the sandbox do the protecting). Only lines the student added or changed are read — the
released notebook's own code (its demonstrations import `gc`, say) is not suspicious.
(`imported` reads the released notebooks themselves, for the warm workers.)
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any

from . import syntax

# Roots whose attributes a student's code has no business assigning.
MODULES = {"builtins", "torch", "autograder", "sys", "os", "IPython", "numpy", "np", "math", "nbformat", "nbgrader",
           "signal"}
# Calls and names worth a look, with why.
PATTERNS = [
    (r"\bbuiltins\b|__builtins__", "touches Python's builtins"),
    (r"input_transformers|ast_transformers|set_custom_exc|showtraceback|events\.register|register_magic",
     "changes how IPython runs cells"),
    (r"\bsys\.(modules|settrace|setprofile|meta_path)|\bgc\.get_(objects|referrers|referents)|\bctypes\b|"
     r"currentframe|_getframe|_current_frames|\.(tb_frame|gi_frame|cr_frame|ag_frame|f_back)\b|"
     r"\binspect\.(stack|trace|getouterframes|getinnerframes)\b|\bwalk_(stack|tb)\b",
     "reaches into the interpreter"),
    (r"\bos\._exit|\bsys\.exit|\bos\.kill|\bsignal\.|\bos\.fork|\bsubprocess\b|\bmultiprocessing\b|\bos\.system",
     "controls processes or signals"),
    (r"\bsocket\b|\burllib\b|\brequests\b|\bhttp\.client|\bftplib\b", "opens network connections"),
    (r"\bopen\(|\bpathlib\b|\bos\.(listdir|walk|scandir|remove|unlink|rename|chmod|makedirs)|\bshutil\b|\bglob\b",
     "reads or writes files"),
    (r"gradebook|\bsolutions/|\bsource/|BEGIN HIDDEN", "mentions the grader's files"),
    # (the student side's public helpers are not: setup, hand-in, graphs, show_saved, the diagnosis cases)
    (r"\bautograder\b(?!\.student(\.handin|\.saved|\.gradcheck)? import "
     r"(setup|hand_in|graphs|show_saved|diagnosis_cases)\s*$)",
     "reaches into the course's grading code"),
]
# What asks autograd for a gradient, and what hides the calls a backward makes (a call's
# function, as written), with why it is worth a look.
IN_BACKWARD = [
    (re.compile(r"autograd\.grad\b|(^|\.)backward$|(^|\.)grad$|torch\.func\.|\bfunc\.(vjp|jvp|jacrev|jacfwd|grad)|"
                r"autograd\.functional|forward_ad|make_dual|_execution_engine|run_backward|"
                r"\bgrad_fn\b|\bnext_functions\b"),  # a node of autograd, called directly
     "asks autograd for the gradient inside"),
    (re.compile(r"DisableTorchFunction|_disabled_torch_function|_is_profiler_enabled|_profiler\b|_profiler_|"
                r"_toggle_collection|profiler\.(?!record_function\b)"),
     "hides what it calls from torch's function handling or meddles with the profiler inside"),
]


@dataclass(frozen=True)
class Finding:
    cell: str  # grade_id, or "cell N"
    line: int
    code: str
    reason: str

    def __str__(self) -> str:
        return f"{self.cell}, line {self.line}: {self.reason}: `{self.code.strip()[:100]}`"


def scan(cells: list[Any], released: list[Any]) -> list[Finding]:
    """Findings in the code cells of a submission that are not in the released notebook."""
    given = {line.strip() for cell in released if cell.get("cell_type") == "code"
             for line in _source(cell).splitlines()}
    found: list[Finding] = []
    parsed: list[tuple[str, ast.Module, list[str], set[int]]] = []
    for index, cell in enumerate(cells):
        if cell.get("cell_type") != "code":
            continue
        meta = cell.get("metadata", {}).get("nbgrader", {})
        name = meta.get("grade_id") or f"cell {index}"
        source = _source(cell)
        new = {n for n, line in enumerate(source.splitlines(), 1) if line.strip() and line.strip() not in given}
        if new:
            found += [f for f in _findings(name, source) if f.line in new]
            tree = _parsed(source)
            if tree is not None:
                parsed.append((name, tree, source.splitlines(), new))
    return found + _autograd_in_backward(parsed)


def _autograd_in_backward(parsed: list[tuple[str, ast.Module, list[str], set[int]]]) -> list[Finding]:
    """Calls that ask autograd for a gradient in a `backward` (or `jvp`, `vjp`) or in any
    function of the notebook it calls or hands on (to a thread, say), directly or through
    others."""
    defined: dict[str, list[tuple[str, ast.AST, list[str], set[int]]]] = {}
    for cell, tree, lines, new in parsed:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                defined.setdefault(node.name, []).append((cell, node, lines, new))
    found: dict[tuple[str, int], Finding] = {}
    for start in ("backward", "jvp", "vjp"):
        todo = [(entry, start) for entry in defined.get(start, [])]
        seen: set[int] = set()
        while todo:
            (cell, node, lines, new), path = todo.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            for inner in ast.walk(node):
                if isinstance(inner, ast.Name) and inner.id in defined:  # passed on (to a thread, say) or called
                    todo += [(entry, f"{path} -> {inner.id}") for entry in defined[inner.id]]
                if not isinstance(inner, ast.Call):
                    continue
                called = _called(inner.func)
                why = next((why for pattern, why in IN_BACKWARD if pattern.search(called)), None)
                if why and inner.lineno in new and not _formula_reused(inner, called):
                    via = f" (reached from {path})" if path != start else ""
                    found.setdefault((cell, inner.lineno), Finding(
                        cell, inner.lineno, lines[inner.lineno - 1], f"{why} {start}{via}"))
                if isinstance(inner.func, ast.Attribute):  # a method: self.helper(...), Helper.compute(...)
                    todo += [(entry, f"{path} -> {inner.func.attr}") for entry in defined.get(inner.func.attr, [])]
    return list(found.values())


def _formula_reused(call: ast.Call, called: str) -> bool:
    """`Other.backward(ctx, ...)`: another Function's formula, called as a function."""
    first = call.args[0] if call.args else None
    return called.endswith(".backward") and isinstance(first, ast.Name) and first.id == "ctx"


def _called(func: ast.expr) -> str:
    """A call's function as written (`torch.autograd.grad`, `helper`, `x.backward`)."""
    try:
        return ast.unparse(func)
    except (ValueError, RecursionError):
        return ""


def _source(cell: dict[str, Any]) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _findings(cell: str, source: str) -> list[Finding]:
    lines = source.splitlines()
    found = [
        Finding(cell, n, line, reason)
        for n, line in enumerate(lines, 1)
        for pattern, reason in PATTERNS
        if re.search(pattern, line)
    ]
    tree = _parsed(source)
    if tree is None:
        return found
    for node in ast.walk(tree):
        for target in _assigned(node):
            root = _root(target)
            if root in MODULES:
                found.append(Finding(cell, target.lineno, lines[target.lineno - 1], f"replaces something in `{root}`"))
    return found


def imported(source: str) -> list[str]:
    """The modules a cell imports (absolute imports; none if it is not valid Python)."""
    tree = _parsed(source)
    if tree is None:
        return []
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def _parsed(source: str) -> ast.Module | None:
    """A cell's syntax tree, IPython lines left out; None if it is not valid Python."""
    try:
        return syntax.parse(_without_magics(source))
    except SyntaxError:
        return None


def _without_magics(source: str) -> str:
    """IPython lines (`%pip ...`, `!ls`) are not Python: blank them, keeping line numbers."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


def _assigned(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return [t for t in node.targets if isinstance(t, (ast.Attribute, ast.Subscript))]
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)) and isinstance(node.target, (ast.Attribute, ast.Subscript)):
        return [node.target]
    if isinstance(node, ast.Delete):
        return [t for t in node.targets if isinstance(t, (ast.Attribute, ast.Subscript))]
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr")
            and node.args):
        return [node.args[0]]
    return []


def _root(node: ast.expr) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None
