"""`autograder.check_function`, the course's checks for anyone's own Function: Functions written
the way real projects write them, right (no false alarm, with or without a reference) and wrong
(the course's message); a custom op and torch.compile; the `autograder check` command; the
pytest plugin in a sample project's test run; and a sample of the side-by-side measurement
against gradcheck (bench/function_check_vs_stock.py, `make bench-function-check`)."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest
import torch

from autograder import check_function
from autograder.student.report import CheckFailed
from real_functions import RIGHT, WRONG, Real

pytest_plugins = ["pytester"]


@pytest.mark.parametrize("real", RIGHT, ids=lambda real: real.label)
def test_right_functions_pass_without_a_false_alarm(real: Real, capsys):
    check_function(real.function, real.inputs, **real.options)
    check_function(real.function, real.inputs, real.reference, **real.options)
    printed = capsys.readouterr()
    assert printed.out.count("✔") >= 6 and printed.err == "", printed


@pytest.mark.parametrize("real", WRONG, ids=lambda real: real.label)
def test_wrong_functions_fail_with_the_course_message(real: Real, capsys):
    """Each mistake is caught without a reference (the checks that need none) and with one."""
    said = (real.caught, real.caught) if isinstance(real.caught, str) else real.caught
    for reference, expected in zip((None, real.reference), said):
        with pytest.raises(CheckFailed) as failed:
            check_function(real.function, real.inputs, reference, **real.options)
        message = str(failed.value)
        assert expected in message, message
        assert capsys.readouterr().err == ""


def test_a_surrogate_gradient_fails_gradcheck_unless_it_is_declared():
    straight = next(real for real in RIGHT if real.function.__name__ == "RoundSTE")
    with pytest.raises(CheckFailed) as failed:
        check_function(straight.function, straight.inputs)
    assert "gradcheck failed" in str(failed.value) and "surrogate_gradient=True" in str(failed.value)


def test_what_is_saved_is_reported(capsys):
    norm = next(real for real in RIGHT if real.function.__name__ == "RMSNorm")
    check_function(norm.function, norm.inputs, **norm.options)
    printed = capsys.readouterr().out
    assert "on the first input, saved 3 tensors, 496 bytes (48 of them in intermediates" in printed, printed
    assert "the input `weight` of shape (8,), 64 bytes, float64" in printed, printed


class Cube(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 3

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return 3 * x * x * grad_output


def test_inputs_are_one_call_a_list_of_calls_or_a_seeded_function(capsys):
    check_function(Cube, torch.randn(3))
    check_function(Cube, [(torch.randn(3),), torch.randn(2, 2)])
    check_function(Cube, lambda generator: (torch.randn(4, generator=generator),), seed=7)
    assert "run on 2 input(s)" in capsys.readouterr().out
    with pytest.raises(TypeError, match="give the arguments of a call"):
        check_function(Cube, [])


@torch.library.custom_op("function_check_test::cube", mutates_args=())
def cube(x: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(x.detach().cpu().numpy() ** 3).to(x.device)


@cube.register_fake
def _(x):
    return x.new_empty(x.shape[:-1])  # wrong: the op keeps x's shape


cube.register_autograd(lambda ctx, grad: 3 * ctx.saved_tensors[0] ** 2 * grad,
                       setup_context=lambda ctx, inputs, output: ctx.save_for_backward(inputs[0]))


def test_a_custom_op_whose_fake_kernel_lies_fails():
    with pytest.raises(CheckFailed) as failed:
        check_function(cube, torch.randn(3, 2), lambda x: x ** 3)
    assert "the fake kernel says shape (3,)" in str(failed.value), str(failed.value)


class ListSquare(torch.autograd.Function):
    """Right in eager mode; torch.compile cannot trace a round trip through a Python list into
    one graph."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.tensor(x.tolist(), dtype=x.dtype, device=x.device) ** 2

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return 2 * x * grad_output


def test_compile_on_request_and_in_one_graph(capsys):
    check_function(ListSquare, torch.randn(4), double_backward=False, compile=True)
    assert "torch.compile(backend='aot_eager'): outputs and gradients agree" in capsys.readouterr().out
    with pytest.raises(CheckFailed) as failed:
        check_function(ListSquare, torch.randn(4), double_backward=False, compile="fullgraph")
    assert "fullgraph=True" in str(failed.value), str(failed.value)


# --- The command -----------------------------------------------------------------------------

LAYERS = '''
import torch

class Swish(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return grad_output * (s + x * s * (1 - s))

class NaiveSwish(Swish):
    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        e = torch.exp(x)
        return grad_output * (e / (1 + e)) * (1 + x / (1 + e))

def swish(x):
    return x * torch.sigmoid(x)

def examples(generator):
    return [(torch.randn(4, 3, generator=generator),), (torch.randn(5, generator=generator),)]
'''


def test_the_command_prints_a_line_per_check_and_exits_for_ci(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from autograder.cli import app

    (tmp_path / "layers.py").write_text(LAYERS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # (the command puts the file's folder first)
    monkeypatch.setitem(sys.modules, "checked_layers", None)  # (and imports it under this name)

    def check(*args: str):
        return CliRunner().invoke(app, ["check", *args])

    right = check("layers.py:Swish", "--inputs", "[4, 3]", "--reference", "swish")
    assert right.exit_code == 0, right.output
    assert right.stdout.startswith("✔ Swish: forward and backward run on 1 input(s)"), right.stdout
    assert "\n✔ Swish: forward, backward and double backward agree with the reference" in right.stdout
    wrong = check("layers.py:NaiveSwish", "--inputs", "examples")
    assert wrong.exit_code == 1 and wrong.stderr == "", wrong.stderr
    assert "\n✘ NaiveSwish: the gradient for `x` is nan at index (" in wrong.stdout, wrong.stdout
    assert "), where `x` = 1000 (finite differences of your own forward give" in wrong.stdout, wrong.stdout
    misspelt = check("layers.py:Swsh", "--inputs", "[4]")
    assert misspelt.exit_code == 2 and "layers.py defines no 'Swsh' (did you mean Swish" in misspelt.output, \
        misspelt.output
    assert "Traceback" not in misspelt.output


# --- The pytest plugin -----------------------------------------------------------------------

def test_the_plugin_is_installed_with_the_package():
    plugins = {entry.value for entry in metadata.entry_points(group="pytest11")}
    assert "autograder.checks.pytest_plugin" in plugins


def test_the_plugin_in_a_sample_projects_test_run(pytester):
    """One line per Function in a project's own tests; a failure shows the course's message,
    not a traceback through the checks; a test that does not use it keeps pytest's report."""
    pytester.makepyfile(layers=LAYERS)
    pytester.makepyfile(test_layers=textwrap.dedent('''
        import torch
        from layers import NaiveSwish, Swish, swish

        def test_swish(function_check):
            function_check(Swish, torch.randn(4, 3), swish)

        def test_naive_swish(function_check):
            function_check(NaiveSwish, torch.randn(4, 3))

        def test_something_else():
            assert 1 + 1 == 3
    '''))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "0")
    result.assert_outcomes(passed=1, failed=2)
    output = result.stdout.str()
    assert "CheckFailed: NaiveSwish: the gradient for `x` is nan at index (" in output, output
    assert "Likely cause: a formula that computes 0 / 0" in output, output
    assert "anyfunction.py" not in output and "def test_naive_swish" not in output, output
    assert "assert (1 + 1) == 3" in output, output  # the other failure as pytest reports it


def test_the_student_package_has_it_without_the_grader(tmp_path):
    """What `pip install` of the course's student package gives: `from autograder import
    check_function`, and the plugin's entry point."""
    from autograder import publish

    out = publish.build_package(tmp_path / "student")
    assert '[project.entry-points.pytest11]\nautograd_course = "autograder.checks.pytest_plugin"' in \
        (out / "pyproject.toml").read_text()
    run = textwrap.dedent(f'''
        import sys, torch
        import autograder
        assert autograder.__file__.startswith({str(out)!r}), autograder.__file__
        from autograder import check_function
        check_function(lambda x: x.exp(), torch.randn(3), double_backward=False)
        assert not [m for m in sys.modules if m.startswith(("autograder.grader", "autograder.cli"))]
    ''')
    done = subprocess.run([sys.executable, "-c", run], cwd=out, env={"PYTHONPATH": str(out), "PATH": ""},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "✔ <lambda>: forward and backward run" in done.stdout, done.stdout + done.stderr


# --- The side-by-side measurement, on a sample -------------------------------------------------

def test_a_sample_of_the_side_by_side_measurement():
    """03's ClippedReLU with two wrong and two right answers: what gradcheck misses, check_function
    catches, and it raises no false alarm (the whole run: make bench-function-check)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    import function_check_vs_stock as bench
    from grading import namespace

    target = next(t for t in bench.TARGETS if t.slug == "03_function_basics" and t.exercise == "clipped_relu")
    rows = bench.run_target(target, namespace(target.slug), answers_per_kind=4)
    wrong = [r for r in rows if r.kind == "wrong"]
    assert all(r.tools["course"].caught for r in wrong)
    assert all(r.tools["alone"].caught and r.tools["reference"].caught for r in wrong)
    assert not all(r.tools["gradcheck"].caught for r in wrong)  # the mask made on the CPU
    assert not any(r.tools[t].caught for r in rows if r.kind != "wrong" for t in bench.TOOLS)
    assert not any(v.crashed for r in rows for v in r.tools.values())
    table = bench.table(rows)
    assert "| **all** | 4 | " in table and "| false alarms on 4 right answers | | 0 | 0 | 0 | 0 |" in table, table
