"""The grader's connection to nbgrader's gradebook: one transaction per submission.

nbgrader's Gradebook commits after every change, and its writing preprocessors
(SaveAutoGrades, AssignLatePenalties) each open a Gradebook of their own. Inside
`transaction`, the Gradebook's session joins one database transaction (SQLAlchemy's
"rollback_only" join mode: its commits only flush), and those preprocessors are lent
that Gradebook instead of opening another (`nbgrader_adapter.lent`) (`SubmissionGradebook`,
which looks rows up in bulk). Either all of a submission's rows are written or none
are: a grader killed mid-way leaves no partial records. One Gradebook serves a whole
run (`Released` also for nbgrader's sanitizing preprocessors).
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Any, Iterator

from nbgrader.api import Assignment, BaseCell, Comment, Grade, Gradebook, Notebook
from nbgrader.preprocessors import latesubmissions, saveautogrades
from sqlalchemy.exc import SAWarning
from sqlalchemy.orm import scoped_session, selectinload, sessionmaker

from . import nbgrader_adapter

# nbgrader's add_submission links rows before it adds them to the session; SQLAlchemy 2
# warns when it autoflushes in between (the rows are added right after: nothing is lost).
warnings.filterwarnings("ignore", r"Object of type <Submitted\w+> not in session", SAWarning)

_WRITING_MODULES = (saveautogrades, latesubmissions)  # nbgrader modules that open a Gradebook to write


class _Lent:
    """A Gradebook lent to a preprocessor: closing it does nothing."""

    def __init__(self, gradebook: Gradebook) -> None:
        self._gradebook = gradebook

    def __enter__(self) -> Gradebook:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._gradebook, name)


class Released(_Lent):
    """A Gradebook for reading what was released (notebooks, their source and graded
    cells), which does not change while grading: each lookup is made once per run."""

    LOOKUPS = ("find_notebook", "find_source_cell", "find_graded_cell")

    def __init__(self, gradebook: Gradebook) -> None:
        super().__init__(gradebook)
        self._found: dict[tuple[Any, ...], object] = {}

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._gradebook, name)
        if name not in self.LOOKUPS:
            return method

        def memoized(*args: Any) -> Any:
            if (name, args) not in self._found:
                self._found[name, args] = method(*args)
            return self._found[name, args]

        return memoized


class SubmissionGradebook(_Lent):
    """The Gradebook of one submission's transaction. A notebook's grades and comments, which
    nbgrader's SaveAutoGrades looks up one by one (a query joining seven tables each), are
    loaded with one query each; the assignment's notebooks and cells, which nbgrader's
    add_submission walks (lazily, a query per notebook and kind of cell), with a few."""

    def __init__(self, gradebook: Gradebook) -> None:
        super().__init__(gradebook)
        self._rows: dict[tuple[Any, ...], dict[str, object]] = {}

    def update_or_create_submission(self, assignment: str, student: str, **kwargs: Any) -> Any:
        self._gradebook.db.query(Assignment).options(
            selectinload(Assignment.notebooks).selectinload(Notebook._base_cells)
        ).filter(Assignment.name == assignment).all()
        return self._gradebook.update_or_create_submission(assignment, student, **kwargs)

    def grades(self, notebook: str, assignment: str, student: str) -> dict[str, Grade]:
        return self._of(Grade, notebook, assignment, student)

    def find_grade(self, grade_cell: str, notebook: str, assignment: str, student: str) -> Grade:
        return self._of(Grade, notebook, assignment, student)[grade_cell]

    def find_comment(self, solution_cell: str, notebook: str, assignment: str, student: str) -> Comment:
        return self._of(Comment, notebook, assignment, student)[solution_cell]

    def _of(self, kind: type[Any], notebook: str, assignment: str, student: str) -> dict[str, Any]:
        key = (kind, notebook, assignment, student)
        if key not in self._rows:
            row = self._gradebook.find_submission_notebook(notebook, assignment, student)
            found = self._gradebook.db.query(kind, BaseCell.name).join(BaseCell, BaseCell.id == kind.cell_id) \
                .filter(kind.notebook_id == row.id).all()
            self._rows[key] = {name: item for item, name in found}
        return self._rows[key]


def lent(gradebook: Gradebook | _Lent, modules: tuple[Any, ...]) -> contextlib.AbstractContextManager[Any]:
    """nbgrader's preprocessors from `modules` use `gradebook` instead of opening their own."""
    return nbgrader_adapter.lent(gradebook if isinstance(gradebook, _Lent) else _Lent(gradebook), modules)


@contextlib.contextmanager
def transaction(gradebook: Gradebook) -> Iterator[SubmissionGradebook]:
    """`gradebook`, whose every write in the block is committed at its end, or not at all
    (as a `SubmissionGradebook`: for the writes of one submission)."""
    with gradebook.engine.connect() as connection:
        outer = connection.begin()
        default, gradebook.db = gradebook.db, scoped_session(
            # nbgrader commits after every change: within this one transaction nothing else writes
            # these rows, so they need not be read again after each commit (expired, each access
            # would be a query).
            sessionmaker(bind=connection, autoflush=True, join_transaction_mode="rollback_only", expire_on_commit=False)
        )
        try:
            lender = SubmissionGradebook(gradebook)
            with lent(lender, _WRITING_MODULES):
                yield lender
            gradebook.db.flush()
            outer.commit()
        except BaseException:
            outer.rollback()
            raise
        finally:
            gradebook.db.remove()
            gradebook.db = default
