"""07_engine_and_dispatcher: wrong answers that must lose points, unusual right ones that must not."""
from . import right, wrong

# --- engine_order ------------------------------------------------------------------------------

_WALK = '''
def reachable(root):
    found, stack = [], [root]
    while stack:
        node = stack.pop()
        if node is None or node in found:
            continue
        found.append(node)
        stack.extend(n for n, _ in node.next_functions)
    return found
'''

_PREORDER = _WALK + '''

def engine_order(root):
    return reachable(root)
'''

_FIFO = _WALK + '''
import collections


def engine_order(root):
    waiting = {n: 0 for n in reachable(root)}
    for node in waiting:
        for n, _ in node.next_functions:
            if n is not None:
                waiting[n] += 1
    ready, ran = collections.deque([root]), []
    while ready:
        node = ready.popleft()  # first come, first served
        ran.append(node)
        for n, _ in node.next_functions:
            if n is not None:
                waiting[n] -= 1
                if waiting[n] == 0:
                    ready.append(n)
    return ran
'''

_SORTED = _WALK + '''

def engine_order(root):
    return sorted(reachable(root), key=lambda n: -n._sequence_nr())
'''

_LEAVES_LAST = _WALK + '''

def engine_order(root):
    nodes = reachable(root)
    inner = [n for n in nodes if type(n).__name__ != "AccumulateGrad"]
    leaves = [n for n in nodes if type(n).__name__ == "AccumulateGrad"]
    return sorted(inner, key=lambda n: -n._sequence_nr()) + leaves
'''

_SENDERS = _WALK + '''
import heapq


def engine_order(root):
    nodes = reachable(root)
    senders = {n: set() for n in nodes}
    for node in nodes:
        for n, _ in node.next_functions:
            if n is not None:
                senders[n].add(node)
    waiting = {n: len(s) for n, s in senders.items()}  # nodes that send, not edges
    ready, ran, k = [(-root._sequence_nr(), 0, root)], [], 1
    while ready:
        node = heapq.heappop(ready)[2]
        ran.append(node)
        for n, _ in node.next_functions:
            if n is not None:
                waiting[n] -= 1
                if waiting[n] == 0:
                    heapq.heappush(ready, (-n._sequence_nr(), k, n))
                    k += 1
    return ran
'''

_REVERSED_POSTORDER = '''
def engine_order(root):
    done, order = set(), []

    def visit(node):
        if node is None or node in done:
            return
        done.add(node)
        for n, _ in node.next_functions:
            visit(n)
        order.append(node)

    visit(root)
    return order[::-1]  # a topological order, but not the engine's
'''

_SHORTCUT = _WALK + '''

def engine_order(root):
    """The nodes by sequence number, each AccumulateGrad right after the last node that feeds it."""
    nodes = reachable(root)
    inner = sorted((n for n in nodes if not hasattr(n, "variable")), key=lambda n: -n._sequence_nr())
    last = {}
    for position, node in enumerate(inner):
        for n, _ in node.next_functions:
            if n is not None and hasattr(n, "variable"):
                last[n] = position
    order = []
    for position, node in enumerate(inner):
        order.append(node)
        order += [leaf for leaf, p in last.items() if p == position]
    return order
'''

_LIST_SCAN = _WALK + '''

def engine_order(root):
    """The engine's rules with a plain list: the ready node with the highest sequence number each time."""
    nodes = reachable(root)
    edges = {n: 0 for n in nodes}
    for node in nodes:
        for n, _ in node.next_functions:
            if n is not None:
                edges[n] += 1
    ready, ran = [root], []
    while ready:
        node = max(ready, key=lambda n: n._sequence_nr())
        ready.remove(node)
        ran.append(node)
        for n, _ in node.next_functions:
            if n is not None:
                edges[n] -= 1
                if not edges[n]:
                    ready.append(n)
    return ran
'''

_RUNS_BACKWARD = '''
from torch.autograd.graph import GradientEdge


def engine_order(root):
    ran, stack, seen = [], [root], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        node.register_prehook(lambda grads, node=node: ran.append(node))
        stack.extend(n for n, _ in node.next_functions)
    torch.autograd.backward(GradientEdge(root, 0), torch.ones(()))  # the engine, from the root node
    return ran
'''

# --- clip_gradients ------------------------------------------------------------------------------

_CLIP_RETURN = "            return grad * (max_norm / norm)  # a new tensor: the incoming one may be shared"

_CLIP_AG_PREHOOK = '''
_kept = []  # a leaf holds its AccumulateGrad only weakly: keep the nodes alive


def clip_gradients(params, max_norm):
    def clip(grads):
        (grad,) = grads
        norm = grad.norm()
        return (grad * (max_norm / norm),) if norm > max_norm else None

    handles = []
    for p in params:
        node = p.view_as(p).grad_fn.next_functions[0][0]
        _kept.append(node)
        handles.append(node.register_prehook(clip))
    return handles
'''

# The same on AccumulateGrad's hook, which runs after the gradient was added to .grad.
_CLIP_AG_POSTHOOK = (_CLIP_AG_PREHOOK
                     .replace("def clip(grads):\n        (grad,) = grads",
                              "def clip(grad_inputs, grad_outputs):\n        (grad,) = grad_outputs")
                     .replace("register_prehook(clip)", "register_hook(clip)"))

_CLIP_POST_ACCUMULATE = '''
def clip_gradients(params, max_norm):
    def clip(p):
        norm = p.grad.norm()
        if norm > max_norm:
            p.grad.mul_(max_norm / norm)

    return [p.register_post_accumulate_grad_hook(clip) for p in params]
'''

# --- step_in_backward ----------------------------------------------------------------------------

_STEP_AT_THE_END = '''
def step_in_backward(params, lr):
    done = []

    def step(p):
        done.append(p)
        if len(done) == len(params):  # when the last one is complete, step them all
            for q in done:
                q.sub_(lr * q.grad)
                q.grad = None
            done.clear()

    return [p.register_post_accumulate_grad_hook(step) for p in params]
'''

_STEP_AG_POSTHOOK = '''
_kept = []


def step_in_backward(params, lr):
    handles = []
    for p in params:
        node = p.view_as(p).grad_fn.next_functions[0][0]
        _kept.append(node)

        def step(grad_inputs, grad_outputs, p=p):  # after AccumulateGrad wrote p.grad
            p.sub_(lr * p.grad)
            p.grad = None

        handles.append(node.register_hook(step))
    return handles
'''

# --- BackwardMemory -------------------------------------------------------------------------------

# The course's own meters are in the student package (its checks run in the student's process):
# the grader's Measure, and 08's PeakMemory with a log added.
_COURSE_MEASURE = """
from autograder.exercises.engine_and_dispatcher import Measure as BackwardMemory
"""

_ON_PEAK_MEMORY = """
from autograder.student.memory import PeakMemory


class BackwardMemory(PeakMemory):
    def __init__(self):
        super().__init__()
        self.log, self.made = [], 0

    def created(self, nbytes):
        super().created(nbytes)
        self.made += nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        before = self.made
        out = super().__torch_dispatch__(func, types, args, kwargs)
        self.log.append((func, self.made - before))
        return out
"""

_TUPLES = ("        for t in tree_leaves(out):  # a tuple of outputs too\n"
           "            if not isinstance(t, torch.Tensor):\n                continue\n")

MUTANTS = [
    wrong("engine_order", "walks the graph depth first (no dependencies counted)", source=_PREORDER),
    wrong("engine_order", "ready nodes first come, first served (a queue, not by sequence number)", source=_FIFO),
    wrong("engine_order", "every node by sequence number, AccumulateGrads first (readiness ignored)", source=_SORTED),
    wrong("engine_order", "AccumulateGrads at the end, not as soon as they are ready", source=_LEAVES_LAST),
    wrong("engine_order", "counts the nodes that send a gradient, not the edges (x * x)", source=_SENDERS),
    wrong("engine_order", "a topological order (reversed depth-first post-order), not the engine's",
          source=_REVERSED_POSTORDER),
    wrong("engine_order", "returns the names of the nodes",
          ("    return ran", "    return [type(n).__name__ for n in ran]")),
    wrong("engine_order", "leaves out the AccumulateGrad nodes",
          ("        ran.append(node)\n", "        if type(node).__name__ != 'AccumulateGrad':\n"
                                       "            ran.append(node)\n")),
    wrong("engine_order", "runs the engine from the root node and records the order", source=_RUNS_BACKWARD),
    wrong("engine_order", "not implemented", source="def engine_order(root):\n    raise NotImplementedError()\n"),

    wrong("clip_gradients", "clips the gradient in place (the shared tensor)",
          (_CLIP_RETURN, "            return grad.mul_(max_norm / norm)")),
    wrong("clip_gradients", "clips .grad after accumulation (earlier micro-batches' too)",
          source=_CLIP_POST_ACCUMULATE),
    wrong("clip_gradients", "a hook on the AccumulateGrad node: it runs after .grad was written",
          source=_CLIP_AG_POSTHOOK),
    wrong("clip_gradients", "rescales every gradient to max_norm, small ones too",
          ("        if norm > max_norm:\n" + _CLIP_RETURN + "\n        return grad\n",
           "        return grad * (max_norm / norm)\n")),
    wrong("clip_gradients", "divides by the norm with no guard: 0/0 for a zero gradient",
          ("        if norm > max_norm:\n" + _CLIP_RETURN + "\n        return grad\n",
           "        return grad / norm * torch.clamp(norm, max=max_norm)\n")),
    wrong("clip_gradients", "computes the clipped gradient and returns nothing",
          (_CLIP_RETURN, "            grad = grad * (max_norm / norm)"), ("\n        return grad\n", "\n")),
    wrong("clip_gradients", "returns only the last handle",
          ("    return [p.register_hook(clip) for p in params]",
           "    return [[p.register_hook(clip) for p in params][-1]]")),
    wrong("clip_gradients", "clamps each entry instead of scaling by the norm",
          ("        norm = grad.norm()\n        if norm > max_norm:\n" + _CLIP_RETURN + "\n        return grad\n",
           "        return grad.clamp(-max_norm, max_norm)\n")),

    wrong("step_in_backward", "steps in a tensor hook, before accumulation (and leaves .grad set)",
          source='''
def step_in_backward(params, lr):
    def hook(p):
        def step(grad):
            p.sub_(lr * grad)
        return step

    return [p.register_hook(hook(p)) for p in params]
'''),
    wrong("step_in_backward", "does not free .grad", ("        p.grad = None\n", "")),
    wrong("step_in_backward", "steps every parameter at the end of backward", source=_STEP_AT_THE_END),
    wrong("step_in_backward", "rebinds the name instead of updating the parameter",
          ("        p.sub_(lr * p.grad)", "        p = p - lr * p.grad")),
    wrong("step_in_backward", "returns no handles",
          ("    return [p.register_post_accumulate_grad_hook(step) for p in params]",
           "    for p in params:\n        p.register_post_accumulate_grad_hook(step)")),

    wrong("backward_memory", "never subtracts freed blocks",
          ("            weakref.finalize(block, self.freed, address)  # the block, not the tensor\n", "")),
    wrong("backward_memory", "counts views and in-place results as new memory",
          ("            if address in given or address in self.blocks:", "            if address in self.blocks:")),
    wrong("backward_memory", "looks at a single output only, not tuples",
          (_TUPLES, "        for t in [out] if isinstance(out, torch.Tensor) else []:\n")),
    wrong("backward_memory", "follows the tensor, not its block",
          ("            weakref.finalize(block, self.freed, address)",
           "            weakref.finalize(t, self.freed, address)")),
    wrong("backward_memory", "counts every block it sees, the inputs' too",
          ("        for t in tree_leaves(out):  # a tuple of outputs too",
           "        for t in tree_leaves((args, kwargs, out)):"),
          ("            if address in given or address in self.blocks:", "            if address in self.blocks:")),
    wrong("backward_memory", "logs only the operations that create memory",
          ("        self.log.append((func, created))",
           "        if created:\n            self.log.append((func, created))")),
    wrong("backward_memory", "is the grader's own meter, imported", source=_COURSE_MEASURE),
    wrong("backward_memory", "08's PeakMemory with a log added", source=_ON_PEAK_MEMORY),

    wrong("engine_answers", "the hook runs once per use; the pre-hook before the tensor hook",
          ('"a": "1"', '"a": "3"'), ('"b": "4"', '"b": "3"')),
    wrong("engine_answers", "node pre-hooks first; the input is saved; a view costs bytes",
          ('"c": "the tensor hook"', '"c": "the Node pre-hook"'), ('"d": "_saved_result"', '"d": "_saved_self"'),
          ('"e": "None"', '"e": "_saved_other"'), ('"h": "0"', '"h": "1"')),
    wrong("engine_answers", "the branch built first runs first; post-accumulate hook runs under grad()",
          ('"f": "branch B"', '"f": "branch A"'), ('"g": "no"', '"g": "yes"')),
]

VARIANTS = [
    right("engine_order", "a plain list scanned for the highest sequence number", source=_LIST_SCAN),
    right("engine_order", "sorted by sequence number, each AccumulateGrad after the last node that feeds it",
          source=_SHORTCUT),
    right("clip_gradients", "a pre-hook on each AccumulateGrad node, kept alive", source=_CLIP_AG_PREHOOK),
    right("clip_gradients", "torch.clamp of the factor, with an epsilon as clip_grad_norm_ has",
          ("        if norm > max_norm:\n" + _CLIP_RETURN + "\n        return grad\n",
           "        return grad * torch.clamp(max_norm / (norm + 1e-12), max=1.0)\n")),
    right("step_in_backward", "a hook on each AccumulateGrad node (it runs after .grad was written), kept alive",
          source=_STEP_AG_POSTHOOK),
    right("step_in_backward", "updates through .data with add_(alpha=)",
          ("        p.sub_(lr * p.grad)", "        p.data.add_(p.grad, alpha=-lr)")),
    right("backward_memory", "weakref.ref with a callback instead of weakref.finalize",
          ("            weakref.finalize(block, self.freed, address)  # the block, not the tensor\n",
           "            self.refs = getattr(self, 'refs', [])\n"
           "            self.refs.append(weakref.ref(block, lambda _, a=address: self.freed(a)))\n")),
    right("engine_answers", "answers written with other capitals and spaces",
          ('"c": "the tensor hook"', '"c": "The  Tensor hook"'), ('"g": "no"', '"g": " No "')),
]
