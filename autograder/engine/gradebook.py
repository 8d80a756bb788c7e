"""The grader's connection to nbgrader's gradebook: one transaction per submission.

nbgrader's Gradebook commits after every change, and its writing preprocessors
(SaveAutoGrades, AssignLatePenalties) each open a Gradebook of their own. Inside
`transaction`, the Gradebook's session joins one database transaction (SQLAlchemy's
"rollback_only" join mode: its commits only flush), and those preprocessors are lent
that Gradebook instead of opening another. Either all of a submission's rows are
written or none are: a grader killed mid-way leaves no partial records.
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Iterator
from unittest import mock

from nbgrader.api import Gradebook
from nbgrader.preprocessors import latesubmissions, saveautogrades
from sqlalchemy.exc import SAWarning
from sqlalchemy.orm import scoped_session, sessionmaker

# nbgrader's add_submission links rows before it adds them to the session; SQLAlchemy 2
# warns when it autoflushes in between (the rows are added right after: nothing is lost).
warnings.filterwarnings("ignore", r"Object of type <Submitted\w+> not in session", SAWarning)

_WRITING_MODULES = (saveautogrades, latesubmissions)  # nbgrader modules that open a Gradebook to write


class _Lent:
    """The writer's Gradebook, lent to a preprocessor: closing it does nothing."""

    def __init__(self, gradebook: Gradebook) -> None:
        self._gradebook = gradebook

    def __enter__(self) -> Gradebook:
        return self._gradebook

    def __exit__(self, *exc) -> None:
        pass

    def __getattr__(self, name: str):
        return getattr(self._gradebook, name)


@contextlib.contextmanager
def transaction(db_url: str, course_id: str) -> Iterator[Gradebook]:
    """A Gradebook whose every write is committed at the end of the block, or not at all."""
    with Gradebook(db_url, course_id) as gradebook, gradebook.engine.connect() as connection:
        outer = connection.begin()
        gradebook.db = scoped_session(
            sessionmaker(bind=connection, autoflush=True, join_transaction_mode="rollback_only")
        )
        lent = _Lent(gradebook)
        try:
            with contextlib.ExitStack() as patches:
                for module in _WRITING_MODULES:
                    patches.enter_context(mock.patch.object(module, "Gradebook", lambda *args, **kwargs: lent))
                yield gradebook
            gradebook.db.flush()
            outer.commit()
        except BaseException:
            outer.rollback()
            raise
        finally:
            gradebook.db.remove()
