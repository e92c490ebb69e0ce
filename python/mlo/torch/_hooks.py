"""The hook objects mlo.torch puts on a component's modules, each with
install() and remove(): the component's own (acquire before its forward,
release after, its VAE's decode/encode the same way), its blocks' (where
the forward is), and the one over diffusers' layerwise casting (bind each
layer back to mlo's memory after its forward).  They call the backend
(_backend.py), which decides."""
import torch

# A hook runs eagerly under torch.compile: what it does (ctypes calls into
# libmlo, swapping a module's tensors) is nothing a graph can hold, and
# traced, each swap recompiled the graph until dynamo gave up on it.
_eager = torch.compiler.disable


class _ExecutionDevice:
    """What diffusers' DiffusionPipeline._execution_device reads."""

    def __init__(self, device):
        self.execution_device = torch.device(device)


class ComponentHooks:
    """Forward pre/post hooks on a component's module: acquire, release (the
    post hook runs even when the forward raises, so an acquire is never left
    held).  A VAE's decode and encode are wrapped as well (their _decode /
    _encode run inside: one acquire, C17).  On a GPU, or with a host budget
    (a module on disk is bound to the meta device between its loads),
    diffusers is told where the module executes: its pipelines ask an
    `_hf_hook` for the execution device."""

    def __init__(self, backend, m):
        self.backend, self.m = backend, m
        self.handles = []
        self.patched = {}  # attribute -> what the module's __dict__ had (None: nothing)

    def install(self):
        b, m = self.backend, self.m
        if (b.device_type != "cpu" or b.settings.host_budget) and \
                not hasattr(m.module, "_hf_hook"):
            m.module._hf_hook = _ExecutionDevice(b.device_type)
            self.patched["_hf_hook"] = None
        self.handles += [
            m.module.register_forward_pre_hook(_eager(lambda mod, args: b.acquire(m))),
            m.module.register_forward_hook(_eager(lambda mod, args, out: b.release(m)),
                                           always_call=True)]
        for method in ("decode", "encode"):
            fn = m.module.__dict__.get(method) or getattr(type(m.module), method, None)
            if fn is None or method in self.patched:
                continue
            bound = getattr(m.module, method)

            def wrapped(*a, __fn=bound, **k):
                _eager(b.acquire)(m)
                try:
                    return __fn(*a, **k)
                finally:
                    _eager(b.release)(m)

            self.patched[method] = m.module.__dict__.get(method)
            setattr(m.module, method, wrapped)

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles = []
        for attr, old in self.patched.items():
            if old is None:
                delattr(self.m.module, attr)
            else:
                setattr(self.m.module, attr, old)
        self.patched = {}


class BlockHooks:
    """Each block module's pre/post hooks, for a component that streams or
    loads block by block: mlo_block_begin before the block's forward (its
    compute after its own copy), mlo_block_end after it, even when it
    raises (the backend ends only a block this thread began)."""

    def __init__(self, backend, m):
        self.backend, self.m = backend, m
        self.handles = []

    def install(self):
        b, m = self.backend, self.m
        for block, (module, entries) in m.blocks.items():
            self.handles.append(module.register_forward_pre_hook(_eager(
                lambda mod, args, block=block, entries=entries:
                b._block_begin(m, block, entries))))
            self.handles.append(module.register_forward_hook(_eager(
                lambda mod, args, out, block=block, entries=entries:
                b._block_end(m, block, entries)), always_call=True))

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles = []


class CastHooks:
    """diffusers' layerwise casting (enable_layerwise_casting) on the
    component's layers casts each layer's weights to the compute dtype
    before its forward (new tensors: temporaries) and back to the storage
    dtype after it, which would leave torch's own copy of every layer in
    place of mlo's memory.  After the forward the layer is bound back to
    where libmlo holds its bytes instead: the storage dtype's values, the
    same as the round trip gives (the compute dtype holds them exactly).
    Installed over diffusers' hook (its post_forward), put back on remove."""

    def __init__(self, backend, m):
        self.backend, self.m = backend, m
        self.replaced = []  # (diffusers' fn_ref, its post_forward)

    def install(self):
        b, m = self.backend, self.m
        by_owner = {}
        for e in m.entries:
            by_owner.setdefault(id(e.owner), []).append(e)
        for sub in m.module.modules():
            registry = getattr(sub, "_diffusers_hook", None)
            hook = registry.get_hook("layerwise_casting") if registry is not None else None
            fn_ref = getattr(hook, "fn_ref", None)
            if fn_ref is None:
                continue
            entries = [e for child in sub.modules() for e in by_owner.get(id(child), ())]

            @_eager
            def bind_back(module, output, entries=entries):
                where = "device" if m.bound == "device" or m.streams else "host"
                for e in entries:
                    b._bind_entry(e, where)
                return output

            self.replaced.append((fn_ref, fn_ref.post_forward))
            fn_ref.post_forward = bind_back

    def remove(self):
        for fn_ref, post_forward in self.replaced:
            fn_ref.post_forward = post_forward
        self.replaced = []
