"""01_tape_autograd: wrong answers that must lose points, unusual right ones that must not."""
from . import right, wrong

MUL = "return [dL_dr * rhs, dL_dr * self]"
ACCUMULATE = "dL_d[name] = dL_d[name] + dL_dinput if name in dL_d else dL_dinput"
SKIP = "if all(g is None for g in dL_doutputs):"
RESULT = "return [dL_d.get(x.name) for x in desired_results]"

MUTANTS = [
    wrong("basic_ops", "mul gradients swapped", (MUL, "return [dL_dr * self, dL_dr * rhs]")),
    wrong("basic_ops", "sum backward not expanded",
          ("return [dL_dr.expand(tuple(self.value.shape))]", "return [dL_dr]")),
    wrong("basic_ops", "expand backward not summed", ("return [dL_dr.sum()]", "return [dL_dr]")),
    wrong("basic_ops", "mul computes on .value (leaves the tape)",
          (MUL, "return [Variable(dL_dr.value * rhs.value), Variable(dL_dr.value * self.value)]")),
    wrong("basic_ops", "add ignores dL_dr",
          ("return [dL_dr, dL_dr]", "return [Variable(torch.ones_like(dL_dr.value))] * 2")),
    wrong("grad", "overwrites instead of adding", (ACCUMULATE, "dL_d[name] = dL_dinput")),
    wrong("grad", "never skips entries without gradient",
          ("        if all(g is None for g in dL_doutputs):\n            continue  # known to be zero: skip the work\n",
           "")),
    wrong("grad", "adds on .value",
          (ACCUMULATE, "dL_d[name] = Variable(dL_d[name].value + dL_dinput.value) if name in dL_d else dL_dinput")),
    wrong("grad", "does not skip None input gradients",
          ("            if dL_dinput is None:\n                continue\n", "")),
    # Issue 16: promises of the text that no check enforced (each kept its points before).
    wrong("grad", "skips an entry when any output gradient is None", (SKIP, "if any(g is None for g in dL_doutputs):")),
    wrong("grad", "skips an entry when its first output gradient is None", (SKIP, "if dL_doutputs[0] is None:")),
    wrong("grad", "zeros for inputs L does not depend on",
          (RESULT, "return [dL_d.get(x.name, Variable(torch.zeros_like(x.value))) for x in desired_results]")),
    wrong("grad", "walks the tape even when an order is given",
          ("for entry in entries:", "for entry in reversed(gradient_tape):")),
    wrong("more_ops", "exp recomputed from .value",
          ("return [dL_dr * r]", "return [dL_dr * Variable(self.value.exp())]")),
    wrong("more_ops", "cos derivative without the minus",
          ("return [-(dL_dr * self.sin())]", "return [dL_dr * self.sin()]")),
    wrong("more_ops", "matmul factors in the wrong order",
          ("return [dL_dr @ rhs.t(), self.t() @ dL_dr]", "return [rhs.t() @ dL_dr, dL_dr @ self.t()]")),
    wrong("more_ops", "sin derivative is sin", ("return [dL_dr * self.cos()]", "return [dL_dr * self.sin()]")),
    wrong("topological_order", "recursive depth-first search", source='''
def topological_order(root):
    order, visited = [], set()

    def visit(entry):
        visited.add(entry)
        for child in entry.next_entries:
            if child is not None and child not in visited:
                visit(child)
        order.append(entry)

    visit(root)
    return order[::-1]
'''),
    wrong("topological_order", "depth-first pre-order", source='''
def topological_order(root):
    order, visited, stack = [], {root}, [root]
    while stack:
        entry = stack.pop()
        order.append(entry)
        for child in entry.next_entries:
            if child is not None and child not in visited:
                visited.add(child)
                stack.append(child)
    return order
'''),
    wrong("topological_order", "breadth-first order", source='''
from collections import deque

def topological_order(root):
    order, visited, queue = [], {root}, deque([root])
    while queue:
        entry = queue.popleft()
        order.append(entry)
        for child in entry.next_entries:
            if child is not None and child not in visited:
                visited.add(child)
                queue.append(child)
    return order
'''),
    wrong("topological_order", "no visited set: shared entries twice", source='''
def topological_order(root):
    order, stack = [], [(root, iter(root.next_entries))]
    while stack:
        entry, children = stack[-1]
        child = next((c for c in children if c is not None), None)
        if child is not None:
            stack.append((child, iter(child.next_entries)))
        else:
            stack.pop()
            order.append(entry)
    return order[::-1]
'''),
    wrong("topological_order", "recursion with the recursion limit raised inside", source='''
import sys


def topological_order(root):
    sys.setrecursionlimit(100_000)
    order, visited = [], set()

    def visit(entry):
        visited.add(entry)
        for child in entry.next_entries:
            if child is not None and child not in visited:
                visit(child)
        order.append(entry)

    visit(root)
    return order[::-1]
'''),
    wrong("topological_order", "recursion with the recursion limit raised in the answer cell", source='''
import sys

sys.setrecursionlimit(100_000)


def topological_order(root):
    order, visited = [], set()

    def visit(entry):
        visited.add(entry)
        for child in entry.next_entries:
            if child is not None and child not in visited:
                visit(child)
        order.append(entry)

    visit(root)
    return order[::-1]
'''),
    wrong("topological_order", "a recursive generator (yield from), the limit raised", source='''
import sys


def topological_order(root):
    sys.setrecursionlimit(100_000)
    visited = {root}

    def post_order(entry):
        for child in entry.next_entries:
            if child is not None and child not in visited:
                visited.add(child)
                yield from post_order(child)
        yield entry

    return list(post_order(root))[::-1]
'''),
]

VARIANTS = [
    right("basic_ops", "factors swapped and a repeated list", source='''
def operator_mul(self, rhs):
    r = Variable(self.value * rhs.value)
    record("mul", [self, rhs], [r], lambda g: [rhs * g[0], self * g[0]])
    return r


def operator_add(self, rhs):
    r = Variable(self.value + rhs.value)
    record("add", [self, rhs], [r], lambda g: g * 2)
    return r


def operator_sum(self):
    r = Variable(self.value.sum())
    record("sum", [self], [r], lambda g: [g[0].expand(self.value.shape)])
    return r


def operator_expand(self, sizes):
    r = Variable(self.value.expand(sizes))
    record("expand", [self], [r], lambda g: [g[0].sum()])
    return r
'''),
    right("grad", "defaultdict-free walk by index over a copied tape", source='''
def grad(L, desired_results, order=None):
    entries = list(reversed(gradient_tape)) if order is None else list(order)
    dL_d = {L.name: Variable(torch.ones_like(L.value))}
    for i in range(len(entries)):
        entry = entries[i]
        outs = [dL_d[n] if n in dL_d else None for n in entry.outputs]
        if not any(o is not None for o in outs):
            continue
        for name, g in zip(entry.inputs, entry.propagate(outs)):
            if g is not None:
                dL_d[name] = g if name not in dL_d else g + dL_d[name]
    return [dL_d.get(x.name, None) for x in desired_results]
'''),
    right("grad", "counts the live output gradients, walks a list copy of `entries`", source='''
def grad(L, desired_results, order=None):
    entries = reversed(gradient_tape) if order is None else order
    totals = {L.name: Variable(torch.ones_like(L.value))}
    for entry in list(entries):
        arriving = [totals.get(name, None) for name in entry.outputs]
        if sum(g is not None for g in arriving) == 0:
            continue
        for name, g in zip(entry.inputs, entry.propagate(arriving)):
            if g is None:
                continue
            totals[name] = totals[name] + g if name in totals else g
    return [totals[x.name] if x.name in totals else None for x in desired_results]
'''),
    right("more_ops", "output-based exp, transposes taken differently", source='''
def operator_exp(self):
    r = Variable(self.value.exp())
    record("exp", [self], [r], lambda g: [r * g[0]])
    return r


def operator_sin(self):
    r = Variable(self.value.sin())
    record("sin", [self], [r], lambda g: [self.cos() * g[0]])
    return r


def operator_cos(self):
    r = Variable(self.value.cos())
    record("cos", [self], [r], lambda g: [-self.sin() * g[0]])
    return r


def operator_matmul(self, rhs):
    r = Variable(self.value @ rhs.value)
    record("matmul", [self, rhs], [r], lambda g: [(rhs @ g[0].t()).t(), (g[0].t() @ self).t()])
    return r
'''),
    right("topological_order", "two stacks, and a helper function called once per entry", source='''
def topological_order(root):
    def unseen_children(entry, seen):
        return [c for c in entry.next_entries if c is not None and c not in seen]

    seen, todo, finished = set(), [(root, False)], []
    while todo:
        entry, expanded = todo.pop()
        if expanded:
            finished.append(entry)
        elif entry not in seen:
            seen.add(entry)
            todo.append((entry, True))
            todo.extend((child, False) for child in unseen_children(entry, seen))
    return finished[::-1]
'''),
    right("topological_order", "Kahn's algorithm with consumer counts", source='''
from collections import Counter

def topological_order(root):
    consumers, seen, stack = Counter(), {root}, [root]
    while stack:
        for child in stack.pop().next_entries:
            if child is not None:
                consumers[child] += 1
                if child not in seen:
                    seen.add(child)
                    stack.append(child)
    order, ready = [], [root]
    while ready:
        entry = ready.pop()
        order.append(entry)
        for child in entry.next_entries:
            if child is not None:
                consumers[child] -= 1
                if consumers[child] == 0:
                    ready.append(child)
    return order
'''),
]
