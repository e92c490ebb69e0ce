"""What mlo.torch patches on a pipeline while it offloads: pipe.to (a
device ignored, a dtype refused), diffusers' own offload entry points
(refused), and the methods that write into the weights (run with the
offload paused)."""
import warnings

import torch

from ._discovery import _DIFFUSERS_OFFLOAD

# diffusers' methods that write into the weights themselves: run with the
# offload paused (disable, write, enable), which writes back what they
# changed on the device and drops a streamed component's slots, so a
# block copied ahead of the write is never used.
_WEIGHT_WRITERS = ("fuse_lora", "unfuse_lora")


def _offload_paused(pipe, method):
    from ._api import _reenable, disable_model_offload  # _api imports this module

    def paused(*args, **kwargs):
        backend = pipe._mlo_offload
        disable_model_offload(pipe)
        try:
            return method(*args, **kwargs)
        finally:
            _reenable(pipe, backend)
    return paused


def _refusing(what):
    def refuse(*args, **kwargs):
        raise RuntimeError("%s on a pipeline offloaded by mlo: two offload systems would fight "
                           "over the same weights; call mlo.torch.disable_model_offload(pipe) "
                           "first" % what)
    return refuse


def _guarded_to(obj, managed):
    """obj.to (a pipeline's or a module's) while mlo holds the weights: a
    device is mlo's to choose (ignored, with a warning); another dtype is
    refused, before anything is converted."""
    original = obj.to

    def to(*args, **kwargs):
        dtypes = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.dtype)]
        for m in managed:
            for e in m.entries:
                if e.like.is_floating_point() and any(d != e.like.dtype for d in dtypes):
                    raise RuntimeError(
                        "%s.to(%s) while mlo offloads it: mlo holds %s as %s; call "
                        "mlo.torch.disable_model_offload(pipe) and enable again after "
                        "converting" % (type(obj).__name__, ", ".join(map(str, dtypes)),
                                        e.name, e.like.dtype))
        if any(not isinstance(a, torch.dtype) for a in args) or \
                any(k in kwargs for k in ("device", "torch_device")):
            warnings.warn("mlo: %s.to(device) ignored: mlo places the weights (it loads each "
                          "component before it runs)" % type(obj).__name__, stacklevel=2)
        return obj

    to.mlo_original = original
    return to


def _guard_pipeline(pipe, backend):
    """pipe.to and diffusers' own offload entry points, guarded while mlo
    offloads (instance attributes over the class's methods, removed at
    disable)."""
    pipe_patched = {}
    for method in _DIFFUSERS_OFFLOAD:
        if hasattr(pipe, method):
            pipe_patched[method] = pipe.__dict__.get(method)
            setattr(pipe, method, _refusing("pipe.%s()" % method))
    if hasattr(pipe, "to") and not isinstance(pipe, torch.nn.Module):
        pipe_patched["to"] = pipe.__dict__.get("to")
        pipe.to = _guarded_to(pipe, backend.managed)
    for method in _WEIGHT_WRITERS:
        if hasattr(pipe, method):
            pipe_patched[method] = pipe.__dict__.get(method)
            setattr(pipe, method, _offload_paused(pipe, getattr(pipe, method)))
    backend.pipe_patched = (pipe, pipe_patched)


def _unguard_pipeline(backend):
    pipe, patched = getattr(backend, "pipe_patched", (None, {}))
    for method, old in patched.items():
        if old is None:
            pipe.__dict__.pop(method, None)
        else:
            setattr(pipe, method, old)
    backend.pipe_patched = (None, {})
