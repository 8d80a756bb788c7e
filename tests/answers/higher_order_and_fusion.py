"""02_higher_order_and_fusion: wrong answers that must lose points, unusual right ones that must not."""
from . import right, wrong

SECOND_GRAD = "(Hv,) = grad((g * v).sum(), [x])"
TOTAL = "dL_dt_total = add_optional(dL_dt, None if dL_dr is None else dL_dr * b)"
DA = "dL_da = None if dL_dt_total is None else dL_dt_total * t"
DB = "dL_db = None if dL_dr is None else dL_dr * t"

MUTANTS = [
    wrong("hvp", "returns the first gradient", (SECOND_GRAD, "Hv = g")),
    wrong("hvp", "detaches the gradient", (SECOND_GRAD, "(Hv,) = grad((Variable(g.value) * v).sum(), [x])")),
    wrong("hvp", "forgets v", (SECOND_GRAD, "(Hv,) = grad(g.sum(), [x])")),
    wrong("hvp", "differentiates the squared gradient", (SECOND_GRAD, "(Hv,) = grad((g * g).sum(), [x])")),
    wrong("tape_reading", "blames b", ('"escaped": "t"', '"escaped": "b"')),
    wrong("tape_reading", "thinks the entry was skipped", ('"why_none": "escape"', '"why_none": "skipped"')),
    wrong("tape_reading", "thinks first order is wrong too",
          ('"first_order_right": "yes"', '"first_order_right": "no"')),
    wrong("exp_mul", "the escaping intermediate", source='''
def operator_exp_mul(a, b):
    t = Variable(a.value.exp())
    r = Variable(t.value * b.value)

    def propagate(dL_doutputs):
        (dL_dr,) = dL_doutputs
        return [dL_dr * b * t, dL_dr * t]

    record("exp_mul", [a, b], [r], propagate)
    return r
'''),
    wrong("exp_mul", "ignores the gradient arriving at t",
          (TOTAL, "dL_dt_total = None if dL_dr is None else dL_dr * b")),
    wrong("exp_mul", "adds None gradients", (TOTAL, "dL_dt_total = dL_dt + dL_dr * b")),
    wrong("exp_mul", "gradient of b uses b",
          ("dL_db = None if dL_dr is None else dL_dr * t", "dL_db = None if dL_dr is None else dL_dr * b")),
    # Right to first order, not differentiable again: a value that escapes the tape.
    wrong("exp_mul", "a fresh Variable of t inside propagate",
          (DA, "dL_da = None if dL_dt_total is None else dL_dt_total * Variable(t.value)")),
    wrong("exp_mul", "recomputes t from a.value inside propagate",
          (DB, "dL_db = None if dL_dr is None else dL_dr * Variable(a.value.exp())")),
    # Issue 16: zeros where the text asks for None (each kept its points before).
    wrong("exp_mul", "materialises zeros for None gradients", source='''
def operator_exp_mul(a, b):
    t = Variable(a.value.exp())
    r = Variable(t.value * b.value)

    def propagate(dL_doutputs):
        dL_dr, dL_dt = dL_doutputs
        if dL_dr is None:
            dL_dr = Variable(torch.zeros_like(r.value))
        if dL_dt is None:
            dL_dt = Variable(torch.zeros_like(t.value))
        return [(dL_dt + dL_dr * b) * t, dL_dr * t]

    record("exp_mul", [a, b], [r, t], propagate)
    return r
'''),
    wrong("exp_mul", "zeros instead of None for b",
          (DB, "dL_db = Variable(torch.zeros_like(b.value)) if dL_dr is None else dL_dr * t")),
    wrong("pytorch_names", "confuses needs_input_grad and set_materialize_grads",
          ('"b": "set_materialize_grads"', '"b": "needs_input_grad"'),
          ('"g": "needs_input_grad"', '"g": "set_materialize_grads"')),
    wrong("pytorch_names", "propagate is grad_fn", ('"f": "backward"', '"f": "grad_fn"'),
          ('"d": "grad_fn"', '"d": "backward"')),
    wrong("pytorch_names", "intermediate saved instead of returned",
          ('"c": "extra output"', '"c": "save_for_backward"')),
]

VARIANTS = [
    right("hvp", "one expression, v first", source='''
def hvp(f, x, v):
    gx = grad(f(x), [x])[0]
    return None if gx is None else grad((v * gx).sum(), [x])[0]
'''),
    right("tape_reading", "capitals and spaces", source='''
tape_reading = {"escaped": " T", "why_none": "Escape", "first_order_right": "YES"}
'''),
    right("exp_mul", "recomputes t in propagate", source='''
def operator_exp_mul(a, b):
    r = Variable(a.value.exp() * b.value)

    def propagate(dL_doutputs):
        (dL_dr,) = dL_doutputs
        t = a.exp()  # recomputed on the tape: nothing escapes
        return [dL_dr * b * t, dL_dr * t]

    record("exp_mul", [a, b], [r], propagate)
    return r
'''),
    right("exp_mul", "specialises on which gradients arrive", source='''
def operator_exp_mul(a, b):
    t = Variable(a.value.exp())
    r = Variable(t.value * b.value)

    def propagate(dL_doutputs):
        dL_dr, dL_dt = dL_doutputs
        if dL_dt is None:  # a single backward
            return [dL_dr * b * t, dL_dr * t]
        if dL_dr is None:  # only t is used: b gets nothing
            return [dL_dt * t, None]
        return [(dL_dt + dL_dr * b) * t, dL_dr * t]

    record("exp_mul", [a, b], [r, t], propagate)
    return r
'''),
    right("pytorch_names", "upper case", source='''
pytorch_names = {"a": "SAVE_FOR_BACKWARD", "b": "Set_Materialize_Grads", "c": "Extra Output", "d": "grad_fn",
                 "e": "next_functions", "f": "Backward", "g": "needs_input_grad"}
'''),
]
