"""The hook objects mlo.torch puts on a component's modules, each with
install() and remove(): the component's own (acquire before its forward,
release after, its VAE's decode/encode the same way), its blocks' (where
the forward is), and the one over diffusers' layerwise casting (bind each
layer back to mlo's memory after its forward).  They call the backend
(_backend.py), which decides."""
import copy
import dataclasses

import torch

# A hook runs eagerly under torch.compile: what it does (ctypes calls into
# libmlo, swapping a module's tensors) is nothing a graph can hold, and
# traced, each swap recompiled the graph until dynamo gave up on it.
_eager = torch.compiler.disable


def _send(obj, device):
    """obj with every tensor in it on `device` (a torch device string): a
    tensor, or one inside tuples (named ones too), lists, dicts and their
    subclasses (diffusers' and transformers' outputs: copied, then each
    moved entry set) and dataclasses, at any depth.  What needs no move is
    returned as it is, not copied: on one torch device (the host
    stand-ins) nothing is.  Anything else is left alone."""
    if isinstance(obj, torch.Tensor):
        return obj if obj.device == torch.device(device) else obj.to(device)
    if isinstance(obj, (tuple, list)):
        items = [_send(x, device) for x in obj]
        if all(a is b for a, b in zip(items, obj)):
            return obj
        if isinstance(obj, tuple):
            return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
        return items if type(obj) is list else _copy_with(obj, enumerate(items))
    if isinstance(obj, dict):
        moved = [(k, _send(v, device)) for k, v in obj.items()]
        changed = [(k, v) for (k, v), old in zip(moved, obj.values()) if v is not old]
        return _copy_with(obj, changed) if changed else obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changed = []
        for f in dataclasses.fields(obj):
            v = getattr(obj, f.name, None)
            w = _send(v, device)
            if w is not v:
                changed.append((f.name, w))
        if not changed:
            return obj
        out = copy.copy(obj)
        for k, v in changed:
            object.__setattr__(out, k, v)
        return out
    return obj


def _copy_with(obj, changed):
    """A shallow copy of a container with these (key, value) set: a
    ModelOutput's __setitem__ sets its attribute as well."""
    out = copy.copy(obj)
    for k, v in changed:
        out[k] = v
    return out


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
            # several devices: the caller's tensors stay on the first
            m.module._hf_hook = _ExecutionDevice(b.torch_devices[0] if b.moves else
                                                 b.device_type)
            self.patched["_hf_hook"] = None
        if b.moves:
            # several devices (as accelerate's device-alignment hooks do):
            # the forward's tensors to its component's device, its outputs
            # back to the first, where the caller's are
            def pre(mod, args, kwargs):
                b.acquire(m)
                there = b.torch_device_of(m)
                return _send(args, there), _send(kwargs, there)

            def post(mod, args, kwargs, out):
                b.release(m)
                return _send(out, b.torch_devices[0])

            self.handles += [
                m.module.register_forward_pre_hook(_eager(pre), with_kwargs=True),
                m.module.register_forward_hook(_eager(post), with_kwargs=True, always_call=True)]
        else:
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
                    if not b.moves:
                        return __fn(*a, **k)
                    there = b.torch_device_of(m)
                    return _send(__fn(*_send(a, there), **_send(k, there)), b.torch_devices[0])
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
