"""08_memory_checkpointing: wrong answers that must lose points, unusual right ones that must not."""
from . import right, wrong

MUTANTS = [
    # Checkpoint
    wrong("manual_checkpoint", "does not restore the random generator (preserve_rng_state=False)",
          ("            torch.set_rng_state(ctx.states[0])\n", "")),
    wrong("manual_checkpoint", "restores the generator without fork_rng (moves the caller's generator)",
          ("with torch.random.fork_rng(devices=ctx.devices), torch.enable_grad():", "with torch.enable_grad():")),
    wrong("manual_checkpoint", "returns None for the parameters (the guide's CheckpointedSequential)",
          ("return (None, *(next(grads) if t.requires_grad else None for t in inputs))",
           "return (None, next(grads) if inputs[0].requires_grad else None, *[None] * (len(inputs) - 1))")),
    wrong("manual_checkpoint", "saves the output too",
          ("        ctx.save_for_backward(*inputs)\n"
           "        return run(*inputs)  # forward records nothing: no intermediate of run is kept",
           "        output = run(*inputs)\n        ctx.save_for_backward(*inputs, output)\n        return output"),
          ("zip(ctx.saved_tensors, ctx.needs_input_grad[1:])",
           "zip(ctx.saved_tensors[:-1], ctx.needs_input_grad[1:])")),
    wrong("manual_checkpoint", "keeps forward's graph on ctx instead of recomputing", source='''
class Checkpoint(torch.autograd.Function):
    @staticmethod
    def forward(ctx, run, *inputs):
        with torch.enable_grad():
            ctx.inputs = [t.detach().requires_grad_() for t in inputs]
            ctx.output = run(*ctx.inputs)
        return ctx.output.detach()

    @staticmethod
    def backward(ctx, grad_output):
        return (None, *torch.autograd.grad(ctx.output, ctx.inputs, grad_output))
''', flag="asks autograd for the gradient inside backward"),
    wrong("manual_checkpoint", "recomputes from inputs that do not require grad",
          ("inputs = [t.detach().requires_grad_(needs) for t, needs in zip(ctx.saved_tensors, "
           "ctx.needs_input_grad[1:])]",
           "inputs = [t.detach() for t in ctx.saved_tensors]")),
    wrong("manual_checkpoint", "recomputes without recording (no enable_grad)",
          ("with torch.random.fork_rng(devices=ctx.devices), torch.enable_grad():",
           "with torch.random.fork_rng(devices=ctx.devices):")),
    # save_as_bf16
    wrong("save_as_bf16", "unpack gives back bfloat16", ("return t if dtype is None else t.to(dtype)", "return t")),
    wrong("save_as_bf16", "compresses the parameters too",
          ("if t.dtype in (torch.float32, torch.float64) and not (t.is_leaf and t.requires_grad):",
           "if t.dtype in (torch.float32, torch.float64):")),
    wrong("save_as_bf16", "compresses every tensor, indices and masks included",
          ("if t.dtype in (torch.float32, torch.float64) and not (t.is_leaf and t.requires_grad):",
           "if not (t.is_leaf and t.requires_grad):")),
    wrong("save_as_bf16", "float16 instead of bfloat16 (overflows above 65504)",
          ("return (t.dtype, t.to(torch.bfloat16))", "return (t.dtype, t.to(torch.float16))")),
    wrong("save_as_bf16", "compresses float32 only (float64 kept as it is)",
          ("if t.dtype in (torch.float32, torch.float64) and", "if t.dtype == torch.float32 and")),
    wrong("save_as_bf16", "unpack always gives back float32", ("return t if dtype is None else t.to(dtype)",
                                                               "return t if dtype is None else t.float()")),
    wrong("save_as_bf16", "offloads to the CPU and forgets the device",
          ("return (t.dtype, t.to(torch.bfloat16))", "return (t.dtype, t.to('cpu', torch.bfloat16))")),
    wrong("save_as_bf16", "compresses nothing", ("return (t.dtype, t.to(torch.bfloat16))", "return (None, t)")),
    # A tensor kept outside ctx: invisible to the hooks and to ctx, alive after backward
    wrong("manual_checkpoint", "saves the inputs, and logs them through a helper with a list default argument",
          ("class Checkpoint(torch.autograd.Function):",
           "def logged(*tensors, _log=[]):  # a record of every call, for debugging\n    _log.append(tensors)\n"
           "    return tensors\n\n\nclass Checkpoint(torch.autograd.Function):"),
          ("        ctx.save_for_backward(*inputs)\n", "        ctx.save_for_backward(*logged(*inputs))\n")),
    wrong("manual_checkpoint", "keeps the inputs in a class attribute instead of saving them",
          ("        ctx.save_for_backward(*inputs)\n", "        Checkpoint.inputs = inputs\n"),
          ("zip(ctx.saved_tensors, ctx.needs_input_grad[1:])", "zip(Checkpoint.inputs, ctx.needs_input_grad[1:])")),
    # checkpoint_with_hooks
    wrong("hooked_checkpoint", "pack keeps the tensor with its handle (recomputes, but keeps everything)",
          ("        return next(handles)\n", "        return next(handles), t\n"),
          ("        if handle not in recomputed:", "        handle = handle[0]\n        if handle not in recomputed:")),
    wrong("hooked_checkpoint", "pack keeps the tensor and unpack returns it (no checkpoint at all)",
          ("        return next(handles)\n", "        return t\n"),
          ("        if handle not in recomputed:  # the first unpack of this backward\n            recompute()\n"
           "        return recomputed.pop(handle)", "        return handle")),
    wrong("hooked_checkpoint", "recomputes at every unpack",
          ("        if handle not in recomputed:  # the first unpack of this backward\n            recompute()\n",
           "        recompute()\n")),
    wrong("hooked_checkpoint", "the recomputation does not restore the random generator",
          ("            torch.set_rng_state(states[0])\n", "")),
    wrong("hooked_checkpoint", "the recomputation moves the caller's generator (no fork_rng)",
          ("with torch.random.fork_rng(devices=devices), torch.enable_grad(), \\", "with torch.enable_grad(), \\")),
    wrong("hooked_checkpoint", "the recomputation runs without recording (no enable_grad)",
          ("with torch.random.fork_rng(devices=devices), torch.enable_grad(), \\",
           "with torch.random.fork_rng(devices=devices), \\")),
    wrong("hooked_checkpoint", "recomputes from detached inputs (they save less)",
          ("            run(*inputs)\n", "            run(*[t.detach() for t in inputs])\n")),
    wrong("hooked_checkpoint", "hands the recomputed tensors out in forward's order, not by handle",
          ("return recomputed.pop(handle)", "return recomputed.pop(min(recomputed))")),
    wrong("hooked_checkpoint", "also logs every saved tensor in a module global list",
          ("import itertools\n", "import itertools\n\nSAVED = []  # every tensor forward saves, to look at later\n"),
          ("        return next(handles)\n", "        SAVED.append(t)\n        return next(handles)\n")),
    # ... memory held while backward runs, let go of only when the graph is (after backward nothing is left)
    wrong("hooked_checkpoint", "unpack keeps every recomputed tensor in its dict until the graph is freed",
          ("return recomputed.pop(handle)", "return recomputed[handle]")),
    wrong("hooked_checkpoint", "unpack hands out a copy and keeps the recomputed tensor",
          ("return recomputed.pop(handle)", "return recomputed.get(handle).clone()")),
    wrong("hooked_checkpoint", "keeps a trace of every recomputed tensor beside the dict, for debugging",
          ("    recomputed = {}  # handle -> the tensor the recomputation saved in that place\n",
           "    recomputed = {}  # handle -> the tensor the recomputation saved in that place\n"
           "    trace = []  # every tensor recomputed, to look at when something goes wrong\n"),
          ("            recomputed[next(position)] = t.detach()\n",
           "            trace.append(t.detach())\n            recomputed[next(position)] = trace[-1]\n")),
    # True or false
    wrong("claims", "thinks a view kept on ctx keeps only the elements it shows", ('"a": "false"', '"a": "true"')),
    wrong("claims", "thinks a saved mask keeps the tensor it was computed from", ('"b": "false"', '"b": "true"')),
    wrong("claims", "thinks the best segment length does not depend on the number of layers",
          ('"d": "true"', '"d": "false"')),
    wrong("claims", "thinks the reentrant checkpoint sees a weight the block reads from outside",
          ('"g": "false"', '"g": "true"')),
    wrong("claims", "thinks float16 keeps bfloat16's range (1e-8 non-zero)", ('"h": "false"', '"h": "true"')),
    wrong("claims", "thinks a checkpoint recomputes once per graph, not once per backward",
          ('"i": "true"', '"i": "false"')),
]

# Float32 inputs: the recomputation in float64 gives float64 gradients, which autograd's engine casts back to
# float32 without a word: only the float32 run's watch for float64 steps tells.
MUTANTS += [
    wrong("manual_checkpoint", "recomputes run in float64 (the engine casts the gradients back to float32)",
          ("            output = ctx.run(*inputs)\n",
           "            output = ctx.run(*[t.double() for t in inputs])\n"
           "        grad_output = grad_output.double()\n")),
    wrong("hooked_checkpoint", "recomputes run in float64 (for accuracy: the graph's float32 tensors get float64 "
          "ones back)", ("            run(*inputs)\n", "            run(*[t.double() for t in inputs])\n")),
]

VARIANTS = [
    right("manual_checkpoint",
          "the state saved for backward, restored by hand instead of fork_rng, all inputs differentiated",
          ("        ctx.run = run\n        ctx.devices = sorted({t.device.index or 0 for t in inputs if t.is_cuda})\n"
           "        ctx.states = [torch.get_rng_state(), *(torch.cuda.get_rng_state(d) for d in ctx.devices)]\n"
           "        ctx.save_for_backward(*inputs)\n",
           "        ctx.run = run\n        ctx.save_for_backward(torch.get_rng_state(), *inputs)\n"),
          ("        inputs = [t.detach().requires_grad_(needs) for t, needs in zip(ctx.saved_tensors, "
           "ctx.needs_input_grad[1:])]\n        with torch.random.fork_rng(devices=ctx.devices), torch.enable_grad():\n"
           "            torch.set_rng_state(ctx.states[0])\n"
           "            for device, state in zip(ctx.devices, ctx.states[1:]):\n"
           "                torch.cuda.set_rng_state(state, device)\n"
           "            output = ctx.run(*inputs)\n",
           "        state, *saved = ctx.saved_tensors\n"
           "        inputs = [t.detach().requires_grad_() for t in saved]\n"
           "        callers = torch.get_rng_state()\n"
           "        torch.set_rng_state(state)\n"
           "        try:\n"
           "            with torch.enable_grad():\n"
           "                output = ctx.run(*inputs)\n"
           "        finally:\n"
           "            torch.set_rng_state(callers)\n"),
          ("return (None, *(next(grads) if t.requires_grad else None for t in inputs))", "return (None, *grads)")),
    right("manual_checkpoint", "Tensor.backward on the replay, every input requiring grad, the state saved", source='''
class Checkpoint(torch.autograd.Function):
    @staticmethod
    def forward(ctx, run, *inputs):
        ctx.run = run
        ctx.save_for_backward(torch.get_rng_state(), *inputs)
        return run(*inputs)

    @staticmethod
    def backward(ctx, grad_output):
        state, *inputs = ctx.saved_tensors
        inputs = [t.detach().requires_grad_() for t in inputs]
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(state)
            with torch.enable_grad():
                ctx.run(*inputs).backward(grad_output)
        return (None, *(t.grad for t in inputs))
''', flag="asks autograd for the gradient inside backward"),
    right("hooked_checkpoint",
          "holder objects and a WeakKeyDictionary, as torch does it; no pop, the CPU generator only", source='''
import weakref


class Holder:
    """What the graph keeps for one saved tensor."""


def checkpoint_with_hooks(run, *inputs):
    state = torch.get_rng_state()
    holders = []  # weak references, in the order forward saved
    recomputed = weakref.WeakKeyDictionary()  # holder -> tensor, gone with the holder

    def pack(t):
        holder = Holder()
        holders.append(weakref.ref(holder))
        return holder

    def unpack(holder):
        if holder not in recomputed:
            alive = iter([ref() for ref in holders])

            def keep(t):
                owner = next(alive)
                if owner is not None:
                    recomputed[owner] = t.detach()

            with torch.random.fork_rng(devices=[]):
                torch.set_rng_state(state)
                with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(keep, lambda _: None):
                    run(*inputs)
        return recomputed[holder]

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        return run(*inputs)
'''),
    right("hooked_checkpoint", "pack keeps the inputs themselves (the caller holds them anyway), handles for the rest",
          ("    def pack(t):\n        return next(handles)\n",
           "    def pack(t):\n        handle = next(handles)\n"
           "        return t if any(t is a for a in inputs) else handle\n"),
          ("        if handle not in recomputed:  # the first unpack of this backward",
           "        if isinstance(handle, torch.Tensor):\n            return handle\n"
           "        if handle not in recomputed:  # the first unpack of this backward")),
    right("save_as_bf16", "float32 rounded to bfloat16 bits by hand, a dict, float64 via .to", source='''
class save_as_bf16(torch.autograd.graph.saved_tensors_hooks):
    def __init__(self):
        def pack(t):
            if (t.is_leaf and t.requires_grad) or not t.is_floating_point() or t.element_size() < 4:
                return {"how": "as is", "t": t}
            if t.dtype == torch.float32:  # round to nearest even, keep the upper 16 bits
                bits = t.detach().contiguous().view(torch.int32)
                top = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
                return {"how": "bits", "t": top.to(torch.int16)}
            return {"how": "cast", "t": t.to(torch.bfloat16), "dtype": t.dtype}

        def unpack(packed):
            if packed["how"] == "bits":
                return (packed["t"].to(torch.int32) << 16).view(torch.float32)
            if packed["how"] == "cast":
                return packed["t"].to(packed["dtype"])
            return packed["t"]

        super().__init__(pack, unpack)
'''),
    right("claims", "capitals and spaces", source='''
claims = {"a": "False", "b": " false", "c": "FALSE", "d": "True", "e": "true ", "f": "TRUE", "g": "False", "h": "false",
          "i": " True"}
'''),
]
