"""What a class receives gives no answer away: its hints, and the released notebooks.

A hint comes in tiers (autograder/hints.py): the idea, a pointer to the formula, the steps
in words, and, for the self-study edition only, the formula worked out. A class receives
the first `hint-tiers` (at most CLASS_MOST), so each test here reads the class edition at its
most: the released notebooks with every hint as a class could receive it, whatever
`hint-tiers` says. In it:

- no hint's code, fenced or inline, is a solution line or a near copy of one (a renamed
  variable, another spacing), and the code of an exercise's hints covers no more than a few
  of its solution's lines;
- no hint leaves an expression for the student to fill in (`...` where code would go): a
  hint may name the steps, not the expressions;
- where deriving the formula is the exercise (DERIVED), no hint states an equation;
- no hint of a quiz names one of its questions beside its answer;
- at most GOAL of the solutions' lines that say something have a near copy anywhere in the
  class edition (given code, demos, hints, other notebooks): the near-verbatim share.

test_publish.py searches what students get for the solutions' lines, except those the
released notebooks show: the share measured here is what that search cannot see.
"""
from __future__ import annotations

import ast
import builtins
import difflib
import keyword
import re
from dataclasses import dataclass, field
from functools import cache

import nbformat
import pytest

from autograder import authoring, hints

SLUGS = authoring.assignments()
# Notebooks where deriving a gradient's formula is the exercise: no class hint states one.
DERIVED = ("04_gradient_patterns", "07_double_backward", "09_real_world")

NEAR = 0.9  # a hint line this close to a solution line is a copy of it (difflib's ratio)
LOOSE = 0.75  # ... this close, it gives the line's substance away
COVERED = 1 / 3  # the most of an exercise's solution lines its hints may give away (one line: a half)
SHORTEST = 10  # characters (without spaces): shorter solution lines say too little to count
FENCE = re.compile(r"```[^\n]*\n(.*?)```", re.S)
INLINE = re.compile(r"`([^`\n]+)`")
CONTROL = re.compile(r"^(else|try|finally|except\b.*|return(None|True|False)?|pass|break|continue)\W*$")
HEADER = re.compile(r"^(if|elif|while|for)[^(=]*:$")  # a test or a loop over plain names: structure


def uncommented(line: str) -> str:
    """A line of code without its comment (a `#` inside a string stays)."""
    quote, kept = None, []
    for char in line:
        if quote is None and char == "#":
            break
        if char in "'\"":
            quote = None if quote == char else quote or char
        kept.append(char)
    return "".join(kept)


def normal(line: str) -> str:
    """A line of code without its comment and without any whitespace."""
    return re.sub(r"\s+", "", uncommented(line))


TOKEN = re.compile(r"[A-Za-z_]\w*|\d+\.?\d*(?:e-?\d+)?|\S")
# Kept as they are in a line's shape; `input`, a builtin no solution calls, is the name of many a tensor.
KEPT = {*keyword.kwlist, *dir(builtins), "torch", "F", "np", "math", "ctx", "self"} - {"input"}
FEWEST = 6  # tokens: a shorter line's shape is too common to mean anything


def _named(tokens: list[str], k: int) -> bool:
    """Token k is a name of the line's own (not an attribute, keyword, builtin or module)."""
    t = tokens[k]
    return (t[0].isalpha() or t[0] == "_") and t not in KEPT and (k == 0 or tokens[k - 1] != ".")


def shape(line: str) -> tuple[str, ...]:
    """The tokens of a normalised line with its own names numbered in order of appearance
    (attributes, keywords, builtins and modules kept): a copy with renamed variables has the
    shape of the original."""
    tokens, names = TOKEN.findall(line), {}
    return tuple(names.setdefault(t, f"v{len(names)}") if _named(tokens, k) else t for k, t in enumerate(tokens))


def copied(hint: str, secret: str) -> bool:
    """`hint` is `secret` (normalised lines of one exercise) up to spacing, the names of its
    variables, or a few characters."""
    return (hint == secret or (len(shape(secret)) >= FEWEST and shape(hint) == shape(secret))
            or (len(secret) >= 2 * SHORTEST and similarity(hint, secret) >= NEAR))


def code_in(markdown: str) -> list[str]:
    """The code of a markdown cell: each line of its fenced blocks, each inline span."""
    fenced = [line for block in FENCE.findall(markdown) for line in block.splitlines()]
    inline = INLINE.findall(FENCE.sub("", markdown))
    return [n for n in map(normal, fenced + inline) if n]


@dataclass
class Exercise:
    answer_id: str
    solution: list[str]  # its solution's lines, as written
    hints: list[str]  # the markdown of its hint cells, as a class receives them at most
    question: set[str] = field(default_factory=set)  # what its own goal shows: from its heading to its answer cell


def _between(source: str) -> list[str]:
    found, inside = [], False
    for line in source.splitlines():
        if "### BEGIN SOLUTION" in line:
            inside = True
        elif "### END SOLUTION" in line:
            inside = False
        elif inside:
            found.append(line)
    return found


def _solution(slug: str) -> nbformat.NotebookNode:
    return nbformat.read(authoring.solution_path(slug), as_version=4)


@cache
def class_edition(slug: str) -> nbformat.NotebookNode:
    """The released notebook, with every hint as a class receives it at the most tiers an
    instructor can give (hints.CLASS_MOST)."""
    released = nbformat.read(authoring.ROOT / "course" / slug / f"{slug}.ipynb", as_version=4)
    return hints.for_class(hints.every_tier(released, _solution(slug)), hints.CLASS_MOST)


@cache
def exercises(slug: str) -> tuple[list[Exercise], set[str]]:
    """The exercises of a notebook, and what its class edition shows outside the hints
    (normalised lines of code and of markdown code): solution lines found there are given."""
    solutions = {c.metadata["nbgrader"]["grade_id"]: _between(c.source) for c in _solution(slug).cells
                 if c.metadata.get("nbgrader", {}).get("solution")}
    found: list[Exercise] = []
    shown: set[str] = set()
    question: set[str] = set()  # the code shown since the last heading
    for cell in class_edition(slug).cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        code = code_in(cell.source) if cell.cell_type == "markdown" else \
            [n for n in map(normal, cell.source.splitlines()) if n]
        if cell.cell_type == "markdown" and re.match(r"#+ ", cell.source):
            question = set()
        if grade_id in solutions and cell.metadata["nbgrader"].get("solution") and cell.cell_type == "code":
            # (a written answer, a markdown cell a person grades, has its rubric, not hints)
            found.append(Exercise(grade_id, solutions[grade_id], [], question | set(code)))
        elif cell.cell_type == "markdown" and "<details>" in cell.source and found:
            found[-1].hints.append(cell.source)
            continue
        shown.update(code)
        question |= set(code)
    return found, shown


def secret_lines(exercise: Exercise, shown: set[str]) -> list[str]:
    """The lines of a solution worth keeping: long enough to say something, not mere
    control flow, and not shown by the released notebook anyway."""
    lines = [normal(line) for line in exercise.solution]
    return [n for n in lines if len(n) >= SHORTEST and not CONTROL.match(n) and not HEADER.match(n) and n not in shown]


def similarity(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def copies(slug: str) -> list[str]:
    """Every hint line that is a solution line of the notebook, or a near copy of one of its
    exercise's solution lines."""
    found, shown = exercises(slug)
    secrets = {e.answer_id: secret_lines(e, shown) for e in found}
    leaks = []
    for exercise in found:
        for hint in (line for cell in exercise.hints for line in code_in(cell)):
            for owner, lines in secrets.items():
                for secret in lines:
                    if hint == secret or (owner == exercise.answer_id and copied(hint, secret)):
                        leaks.append(f"{exercise.answer_id}'s hint shows {owner}'s solution line {secret!r} "
                                     f"as {hint!r}")
    return leaks


def coverage(exercise: Exercise, shown: set[str]) -> tuple[float, list[str]]:
    """The share of an exercise's solution lines its hints give away (near copies), and those lines."""
    secrets = secret_lines(exercise, shown)
    hints_code = [line for cell in exercise.hints for line in code_in(cell)]
    given = [s for s in secrets if any(similarity(h, s) >= LOOSE for h in hints_code)]
    return (len(given) / len(secrets) if secrets else 0.0), given


def skeletons_too_full(slug: str) -> list[str]:
    found, shown = exercises(slug)
    leaks = []
    for exercise in found:
        share, given = coverage(exercise, shown)
        if share > 1 / 2 or (share > COVERED and len(given) > 1):
            leaks.append(f"{exercise.answer_id}: the hints give away {share:.0%} of the solution's lines: {given}")
    return leaks


def quiz_answers(exercise: Exercise) -> dict[str, str]:
    """{question: answer} of a quiz (an answer cell that assigns a dict of strings), else {}."""
    try:
        tree = ast.parse("\n".join(line.strip() for line in exercise.solution if line.strip()))
        value = ast.literal_eval(tree.body[0].value) if len(tree.body) == 1 else None
    except (SyntaxError, ValueError, AttributeError):
        return {}
    return value if isinstance(value, dict) and all(isinstance(v, str) for v in value.values()) else {}


def worked_answers(slug: str) -> list[str]:
    """Hint items (paragraphs, list items) that name a quiz question beside its answer."""
    found, _ = exercises(slug)
    leaks = []
    for exercise in found:
        key = quiz_answers(exercise)
        for cell in exercise.hints:
            for item in re.split(r"\n\s*\n|\n(?=\s*[-*] )", cell):
                for question, answer in key.items():
                    q = re.escape(question)
                    named = re.search(rf"\*\*{q}\.?\*\*|[\"'`]{q}[\"'`]|\b(?:for|case|question)\s+{q}\s*[:.)]", item)
                    said = re.search(rf"(?<![\w.]){re.escape(answer)}(?![\w.])", item)
                    if named and said:
                        leaks.append(f"{exercise.answer_id}'s hint answers question {question} ({answer!r}): "
                                     f"{item.strip()[:120]!r}")
    return leaks


# --- skeletons to fill in, and formulas where deriving them is the exercise ------------------

# What a skeleton leaves for the student to write: `...` as a statement, a test, a value assigned
# or returned, or an operand (not Python's own Ellipsis in `x[..., i]`, nor "some arguments" in `f(...)`).
DOTS = r"(\.\.\.|…)"
BLANK = re.compile(rf"^{DOTS}$|^(return|yield|if|elif|while|with|assert)\W{{0,2}}{DOTS}|=\W{{0,2}}{DOTS}"
                   rf"|{DOTS}[*/@+-]|[*/@+-]{DOTS}")


def blanks(slug: str) -> list[str]:
    """Hint code that leaves an expression to fill in (`return ...  # the derivative`)."""
    found, _ = exercises(slug)
    return [f"{e.answer_id}'s hint leaves {line!r} to fill in" for e in found for cell in e.hints
            for line in code_in(cell) if BLANK.search(line)]


MATH = re.compile(r"\$\$(.+?)\$\$|\$([^$\n]+)\$", re.S)
RELATION = re.compile(r"=|\\partial|\\nabla|\\frac\{d|\\mathrm\{d\}|'\s*\(")  # inside math: an equation
DERIVATIVE = re.compile(r"[∂∇′]|\bd\s*/\s*d[a-zα-ω]|\b\w+'\s*\(\s*\w+\s*\)")  # outside math: ∂, ∇, f', d/dx
ARITHMETIC = re.compile(r"[\w)\]]\s*(\*\*|[*/@+-])\s*[\w(]")  # code: an expression computed from names
NUMBER = re.compile(r"\d+\.?\d*e[-+]?\d+")  # 1e-12 is a number, not a subtraction


def formulas(markdown: str) -> list[str]:
    """What states a formula in a hint: an equation or a derivative in its math, a derivative
    in its words, an arithmetic expression in its code."""
    code = code_in(markdown)
    prose = INLINE.sub("", FENCE.sub("", markdown))
    math = [a or b for a, b in MATH.findall(prose)]
    words = MATH.sub("", prose)
    return ([m.strip() for m in math if RELATION.search(m)] + DERIVATIVE.findall(words)
            + [c for c in code if ARITHMETIC.search(NUMBER.sub("0", c))])


def stated_formulas(slug: str) -> list[str]:
    found, _ = exercises(slug)
    return [f"{e.answer_id}'s hint states {f!r}" for e in found for cell in e.hints for f in formulas(cell)]


# --- the near-verbatim share -------------------------------------------------------------------

GOAL = 0.05  # the most of the solutions' measured lines that the class edition may show near-verbatim
MEASURED = 15  # characters (no spaces, no comment): a shorter solution line says too little to measure
INFORMATIVE = 3  # tokens beyond names and punctuation: a renamed copy with fewer says nothing
REORDERED = 12  # tokens: a line this long with another's tokens in another order is a copy of it
HEADERS = re.compile(r"^(import|from|def|class)\b|^@")  # imports, headers and decorators, as written
PLUMBING = [  # solution lines (compact: spaces only between words) that say nothing of the answer:
    re.compile(r"^\(?\w+(,\w+)*,?\)?=(ctx\.saved_tensors|inputs|dL_doutputs)$"),  # unpacking what arrives
    re.compile(r"^return ?[\[(]?\w+(,\w+)*[\])]?$"),  # returning plain names (None among them)
    re.compile(r"^(return )?[\w.]+\((\*?\w+(,\*?\w+)*)?\)$"),  # a call of plain names: ctx's bookkeeping...
    re.compile(r"^ctx\.\w+(,ctx\.\w+)*=[\w.]+(,[\w.]+)*$"),  # plain values kept on ctx
    re.compile(r'^record\("\w+",\[\w+(,\w+)*\],\[\w+(,\w+)*\],\w+\)$'),  # a tape entry of plain names
    re.compile(r"^with [\w.]+\(\):$"),  # a context entered without arguments
]


def compact(line: str) -> str:
    """A line of code without its comment, with spaces only between two words."""
    return re.sub(r"\s*([^\w\s])\s*", r"\1", re.sub(r"\s+", " ", uncommented(line).strip()))


# Lines the class edition shows near-verbatim on purpose: {normalised solution line: why}. Each
# is an idiom the course teaches everywhere, or a demo whose subject needs it; the rest count.
IDIOMS = {
    "x=x.detach().requires_grad_()": "a fresh leaf, in every notebook from 05 on",
    "x=x.clone().requires_grad_()": "a fresh leaf",
    "flat=x.view(-1)": "a flat view, which 5.1's goal recommends",
    "(g,)=torch.autograd.grad(f(x),x,create_graph=True)": "a gradient with a graph: notebook 07's section 1",
    "returntorch.from_numpy(np.asarray(out)).to(device=x.device,dtype=x.dtype)":
        "back from NumPy to the input's device and dtype, as 10's given SquaredDistance does",
    "returnt.untyped_storage().data_ptr()": "a storage's address: 06's section 1 compares storages so",
    "y=torch.sigmoid(x)": "Sigmoid's definition, forward only (6.2's goal allows torch.sigmoid)",
    "returnx*torch.sigmoid(beta*x)": "Swish's definition, forward only",
    "z=torch.zeros_like(x)": "the start of 9.4's iteration, as section 5's unrolled one starts",
    "z_next=torch.tanh(z@W.T+x)": "9.4's equation, which its goal and section 5 state",
    "returnorder[::-1]": "post-order reversed, as topological_order_recursive returns it",
    "expx=torch.exp(x)": "SinhBad's forward (the tutorial's), which 7.2 keeps: it changes what is saved and returned",
    "expnegx=torch.exp(-x)": "SinhBad's forward, which 7.2 keeps",
    "ctx.devices=sorted({t.device.indexor0fortininputsift.is_cuda})":
        "the GPU's generator bookkeeping, which 8.3's goal says the course shows (8.5 gives it)",
    "ctx.states=[torch.get_rng_state(),*(torch.cuda.get_rng_state(d)fordinctx.devices)]":
        "the generator states, as 8.5's given code keeps them",
    "returngrad_output*y*(1-y)": "05's broken Softmax, which 5.4a repairs, treats softmax as a sigmoid; 6.2's goal "
                                 "states the formula (its exercise is what to save)",
    "returngrad_output*(1-y*y)": "07's Tanh, whose graph exercise 7.5 reads; 6.3 is about writing in place",
    "returngrad_output@b.mT,a.mT@grad_output": "a matrix product's gradients: 04's table, 10's autocast demos; 4.2 is "
                                               "about batches (.mT)",
    "dL_dt_total=add_optional(dL_dt,NoneifdL_drisNoneelsedL_dr*b)":
        "the gradient reaching t of r = t·b: section 2 fixes it for simple, 2.3 applies it to t = exp(a)",
}


def says_something(line: str) -> bool:
    """A solution line (as written) that says something of the answer."""
    n = normal(line)
    return (len(n) >= MEASURED and not CONTROL.match(n) and not HEADER.match(n) and not HEADERS.match(line.strip())
            and not any(p.match(compact(line)) for p in PLUMBING))


def measured(line: str) -> bool:
    return says_something(line) and normal(line) not in IDIOMS


def _anonymous(line: str) -> tuple[str, ...]:
    tokens = TOKEN.findall(line)
    return tuple(sorted("v" if _named(tokens, k) else t for k, t in enumerate(tokens)))


@dataclass(frozen=True)
class Shown:
    """Every normalised line of code the class edition shows, indexed for near copies."""

    lines: frozenset[str]
    shapes: frozenset[tuple[str, ...]]
    bags: frozenset[tuple[str, ...]]

    @classmethod
    def of(cls, lines: set[str]) -> Shown:
        return cls(frozenset(lines), frozenset(map(shape, lines)), frozenset(map(_anonymous, lines)))

    def near_copy(self, secret: str) -> bool:
        """`secret` is shown, or a copy of it with renamed variables (enough left to say
        something), reordered terms, or a few characters changed."""
        if secret in self.lines:
            return True
        form = shape(secret)
        informative = sum(not re.fullmatch(r"v\d+|[()\[\]{},.:=\"']", t) for t in form) >= INFORMATIVE
        if len(form) >= FEWEST and informative and form in self.shapes:
            return True
        if len(form) >= REORDERED and informative and _anonymous(secret) in self.bags:
            return True
        if len(secret) < 2 * SHORTEST:
            return False
        matcher = difflib.SequenceMatcher(None, autojunk=False)
        matcher.set_seq2(secret)  # indexed once; each shown line of about its length is compared with it
        for line in self.lines:
            if abs(len(line) - len(secret)) <= 2 * (1 - NEAR) * len(secret):
                matcher.set_seq1(line)
                if matcher.real_quick_ratio() >= NEAR and matcher.quick_ratio() >= NEAR and matcher.ratio() >= NEAR:
                    return True
        return False


@cache
def shown_by_the_class_edition() -> Shown:
    lines: set[str] = set()
    for slug in SLUGS:
        for cell in class_edition(slug).cells:
            code = code_in(cell.source) if cell.cell_type == "markdown" else map(normal, cell.source.splitlines())
            lines.update(n for n in code if n)
    return Shown.of(lines)


def near_verbatim(slug: str) -> tuple[list[str], list[str]]:
    """(the measured lines of the notebook's solutions, those the class edition shows near-verbatim).
    What an exercise's own goal shows (its starting program, its definition) is its question,
    not its answer; quizzes are read by the tests of hints above."""
    found, _ = exercises(slug)
    lines = [normal(line) for e in found if not quiz_answers(e) for line in e.solution
             if measured(line) and not Shown.of(e.question).near_copy(normal(line))]
    shown = shown_by_the_class_edition()
    return lines, [n for n in lines if shown.near_copy(n)]


# What no hint of the class edition may do: show a solution line or a near copy; give away most
# of a solution's lines; leave an expression to fill in; name a quiz question beside its answer.
DETECTORS = [copies, skeletons_too_full, blanks, worked_answers]
CASES = [pytest.param(detector, slug, id=f"{detector.__name__}-{slug}") for detector in DETECTORS for slug in SLUGS]


@pytest.mark.parametrize("detector, slug", CASES)
def test_no_hint_gives_an_answer_away(detector, slug):
    leaks = detector(slug)
    assert not leaks, "\n".join(leaks)


@pytest.mark.parametrize("slug", DERIVED)
def test_no_class_hint_states_a_formula_where_deriving_it_is_the_exercise(slug):
    leaks = stated_formulas(slug)
    assert not leaks, "\n".join(leaks)


def test_the_class_edition_shows_few_solution_lines_near_verbatim():
    """The near-verbatim share of the class edition, over every notebook, within GOAL."""
    counts = {slug: tuple(map(len, near_verbatim(slug))) for slug in SLUGS}
    lines, given = (sum(c[i] for c in counts.values()) for i in (0, 1))
    shown = "\n".join(f"{slug}: {n} of {total}" for slug, (total, n) in counts.items() if n)
    assert given <= GOAL * lines, f"{given} of {lines} solution lines near-verbatim in the class edition:\n{shown}"


def test_every_idiom_is_a_solution_line_the_class_edition_shows():
    """IDIOMS lists no more than it must: each entry is a solution line that would count, and
    that the class edition shows near-verbatim."""
    lines = {normal(line) for slug in SLUGS for e in exercises(slug)[0] for line in e.solution if says_something(line)}
    shown = shown_by_the_class_edition()
    assert [idiom for idiom in IDIOMS if idiom not in lines or not shown.near_copy(idiom)] == []


def test_every_exercise_has_hints_and_a_solution_the_test_reads():
    for slug in SLUGS:
        found, shown = exercises(slug)
        assert found, slug
        for exercise in found:
            assert exercise.hints, f"{slug} {exercise.answer_id}: no hint cell found"
            assert secret_lines(exercise, shown) or quiz_answers(exercise), f"{slug} {exercise.answer_id}"


def test_a_class_receives_the_configured_tiers():
    """course/ holds the tiers 1 to hint-tiers of every hint as solutions/ writes them; each
    exercise's tiers are numbered from 1, none past the self-study edition's."""
    most = hints.class_tiers(authoring.ROOT)
    for slug in SLUGS:
        released = {cell.id: cell for cell in
                    nbformat.read(authoring.ROOT / "course" / slug / f"{slug}.ipynb", as_version=4).cells}
        for cell in _solution(slug).cells:
            if hints.is_hint(cell):
                written = hints.tiers(cell.source)
                given = hints.tiers(released[cell.id].source) if cell.id in released else []
                assert given == [t for t in written if t <= most], (slug, cell.id, written, given)
        for exercise in exercises(slug)[0]:
            tiers = sorted(t for cell in exercise.hints for t in hints.tiers(cell))
            assert tiers == list(range(1, len(tiers) + 1)), (slug, exercise.answer_id, tiers)
        assert all(t <= hints.CLASS_MOST + 1 for cell in _solution(slug).cells for t in hints.tiers(cell.source))


# --- the tests' own detectors, on answers given away on purpose -----------------------------

SOLUTION = ["    (y,) = ctx.saved_tensors", "    return grad_output * y * (1 - y)  # σ' = y (1 - y)"]


@pytest.mark.parametrize("hint, leaks", [
    ("<details>`return grad_output * y * (1 - y)`</details>", True),  # the line itself
    ("<details>\n```python\nreturn grad_output*y*(1-y)\n```\n</details>", True),  # another spacing
    ("<details>`return grad * y * (1 - y)`</details>", True),  # a renamed variable
    ("<details>`return grad_output * ...  # the derivative, from y`</details>", False),  # a skeleton
    ("<details>$\\sigma' = y(1 - y)$</details>", False),  # the formula
])
def test_a_copied_or_renamed_solution_line_is_found(hint, leaks, monkeypatch):
    exercise = Exercise("sigmoid", SOLUTION, [hint])
    monkeypatch.setitem(globals(), "exercises", lambda slug: ([exercise], set()))
    assert bool(copies("any")) == leaks


def test_a_quiz_hint_that_works_out_a_question_is_found(monkeypatch):
    solution = ['what = {', '    "a": "error",', '    "b": "correct",', '}']
    worked = "<details>\n\n- **a.** the version check fails: `\"error\"`.\n- the rule for b\n</details>"
    idea = "<details>\n\n- **a.** what does the version check do here?\n- \"correct\" means no error\n</details>"
    for hint, leaks in ((worked, 1), (idea, 0)):
        exercise = Exercise("what", solution, [hint])
        monkeypatch.setitem(globals(), "exercises", lambda slug, exercise=exercise: ([exercise], set()))
        assert len(worked_answers("any")) == leaks


@pytest.mark.parametrize("hint, found", [
    ("```python\n(y,) = ctx.saved_tensors\nreturn ...  # grad_output times σ'\n```", 1),  # a skeleton
    ("`inside = …`, then return the masked gradient", 1),
    ("Unpack what forward saved, then return the incoming gradient times the derivative.", 0),  # steps
])
def test_a_skeleton_to_fill_in_is_found(hint, found, monkeypatch):
    exercise = Exercise("sigmoid", SOLUTION, [f"<details><summary><b>Hint 3: the steps</b></summary>\n{hint}\n"
                                              "</details>"])
    monkeypatch.setitem(globals(), "exercises", lambda slug: ([exercise], set()))
    assert len(blanks("any")) == found


@pytest.mark.parametrize("hint, found", [
    ("$\\frac{d}{dx}\\bigl[x\\,\\Phi(x)\\bigr] = \\Phi(x) + x\\,\\varphi(x)$", 1),  # LaTeX
    ("∂(grad_out · 3x²)/∂x = grad_out · 6x", 2),  # unicode
    ("$\\tanh'(x) = 1 - y^2$", 1),
    ("the gradient is `grad * 3 * x**2`", 1),  # code
    ("Differentiate $x\\,\\Phi(x)$ with the product rule; `normal_pdf` is Φ's derivative.", 0),  # a pointer
    ("`ctx.needs_input_grad[1]` says whether β's gradient is wanted", 0),
])
def test_a_stated_formula_is_found(hint, found):
    assert len(formulas(f"<details><summary><b>Hint 2: where to look</b></summary>\n{hint}\n</details>")) == found


@pytest.mark.parametrize("secret, shown, near", [
    ("grad_x=grad_output*(s+beta*x*s*(1-s))", "grad_input=grad_output*(s+input*s*(1-s)*beta)", True),  # reordered
    ("returngrad_output*y*(1-y)", "returngrad*out*(1-out)", True),  # renamed
    ("grad_weight=grad_output.T@input", "grad_weight=grad_output.t()@input", True),  # a few characters
    ("analytical=analytical_jacobian(f,inputs)", "out=conv2d(x,w)", False),  # names alone
    ("returngrad_output.expand(ctx.shape)/ctx.shape[ctx.dim],None,None",
     "returngrad_output.expand(ctx.shape),None,None", False),  # Sum's backward is not Mean's
])
def test_a_near_verbatim_line_is_found(secret, shown, near):
    assert Shown.of({shown}).near_copy(secret) == near


@pytest.mark.parametrize("line, says", [
    ("(x,) = ctx.saved_tensors", False), ("return grad_x, None", False), ("ctx.save_for_backward(x, beta)", False),
    ("ctx.shape, ctx.dim = x.shape, dim", False), ("from typing import List", False),
    ("def propagate(dL_doutputs):", False), ("return [dL_da, dL_db]", False),
    ('record("exp_mul", [a, b], [r, t], propagate)', False), ("with torch.no_grad():", False),
    ("ctx.save_for_backward(x if weight_needs else None, mask)", True), ("s = torch.sigmoid(beta * x)", True),
    ("with torch.random.fork_rng(devices=devices), torch.enable_grad():", True),
])
def test_plumbing_says_nothing(line, says):
    assert says_something(line) == says
