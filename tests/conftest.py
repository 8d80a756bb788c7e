from autograder.authoring import use_this_environment

# nbgrader (in-process and as a subprocess) runs `alembic` by name.
use_this_environment()
