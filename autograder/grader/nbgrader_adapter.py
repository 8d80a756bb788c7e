"""The one place where the grader changes another library while it runs: nbgrader.

nbgrader is made for one notebook per process; the grader calls it for a whole class, and
nbgrader offers no hook for what follows, so three of its module attributes are replaced
for the duration of a `with` block (never for good, never outside the grader's process):

- `applied()`: nbgrader builds a new SQLAlchemy engine for every Gradebook it opens
  (`nbgrader.api.create_engine`): engines are shared per database URL instead. And it
  checks every cell's metadata with `jsonschema.validate`, which first checks the schema
  itself against its metaschema (`nbgrader.nbgraderformat.common.jsonschema`): each schema
  is checked once instead. On notebook 03 the two were a third and a quarter of the
  grader's CPU time per notebook. What nbgrader computes is unchanged.
- `lent(gradebook, modules)`: nbgrader's preprocessors open a Gradebook of their own by
  the name `Gradebook` in their module (each one checks the whole schema, ~5 ms): they use
  the grader's instead — for the writing ones, the one whose single transaction makes a
  submission's rows all or nothing (`gradebook.transaction`).

`tests/test_nbgrader_adapter.py` fails when nbgrader changes what these rely on (the
names, and the calls that make them worth it) or when a patch stops changing anything.
"""
from __future__ import annotations

import contextlib
import functools
import json
from types import ModuleType, SimpleNamespace
from typing import Any, Iterator
from unittest import mock

import jsonschema
import nbgrader.api
import sqlalchemy
from nbgrader.nbgraderformat import common


@functools.cache
def _validator(schema_json: str) -> Any:
    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _validate(instance: Any, schema: dict[str, Any]) -> None:
    error = jsonschema.exceptions.best_match(_validator(json.dumps(schema, sort_keys=True)).iter_errors(instance))
    if error is not None:
        raise error


@contextlib.contextmanager
def applied() -> Iterator[None]:
    """Shared engines and schemas checked once, while the block runs."""
    with mock.patch.object(nbgrader.api, "create_engine", functools.cache(sqlalchemy.create_engine)), \
            mock.patch.object(common, "jsonschema", SimpleNamespace(validate=_validate)):
        yield


@contextlib.contextmanager
def lent(gradebook: Any, modules: tuple[ModuleType, ...]) -> Iterator[None]:
    """nbgrader's preprocessors from `modules` use `gradebook` (an object whose closing does
    nothing: `gradebook._Lent`) instead of opening their own, while the block runs."""
    with contextlib.ExitStack() as patches:
        for module in modules:
            patches.enter_context(mock.patch.object(module, "Gradebook", lambda *args, **kwargs: gradebook))
        yield
