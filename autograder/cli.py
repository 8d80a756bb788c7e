"""The `autograder` command."""
from __future__ import annotations

import typer

from . import authoring

app = typer.Typer(help="The autograd course's instructor tools.", no_args_is_help=True, add_completion=False)


@app.command()
def release() -> None:
    """Normalise the notebooks in solutions/ and regenerate the student notebooks in course/."""
    for slug in authoring.normalize_all():
        typer.echo(f"normalised solutions/{slug}")
    authoring.release()
    typer.echo("course/ regenerated from solutions/")


@app.callback()
def main() -> None:
    """Instructor tools of the autograd course."""
