"""mlo.torch — model-level offload for PyTorch / diffusers pipelines, on
libmlo (docs/python.md).

    import mlo.torch
    mlo.torch.enable_model_offload(pipe, device="cuda")      # or "host:capacity=4G"
    frames = pipe(prompt, num_inference_steps=40).frames
    mlo.torch.disable_model_offload(pipe)

Each DiT, encoder and VAE module becomes a component of a libmlo pipeline:
every parameter and buffer (a tied one once) is a tensor of it, copied once
into the component's host slab, and the module's tensors are rebound to
views of that slab; when libmlo makes a component resident its tensors are
rebound to views of the device block, and back to the slab when it is
evicted.  torch never copies, allocates or pins weights; libmlo decides
every load and eviction (the specification's exclusion rule, or the budget
policy) and orders compute after loads.  Forward pre/post hooks acquire and
release; a VAE's decode/encode are wrapped the same way (C17).
"""
import abc
import ctypes
import warnings

import torch

from . import Component, MloError, Pipeline, Platform, lib, role_from_class, role_guess

__all__ = ["enable_model_offload", "disable_model_offload", "SupportsComponentDiscovery",
           "OffloadDelegate", "Offload"]

_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
           torch.float64: "F64", torch.int64: "I64", torch.int32: "I32", torch.int16: "I16",
           torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}
for _name, _code in (("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2")):
    if hasattr(torch, _name):
        _DTYPES[getattr(torch, _name)] = _code


class SupportsComponentDiscovery:
    """A pipeline's own declaration of its components: subclass it and set
    the module attribute names per role (as vLLM-Omni's protocol of the
    same name).  A pipeline may instead set a ``mlo_components`` dict
    {"dit": [...], "encoder": [...], "vae": [...]} on itself."""
    _dit_modules = ()
    _encoder_modules = ()
    _vae_modules = ()


class OffloadDelegate(abc.ABC):
    """A pipeline whose mutually exclusive parts are nested inside one module
    (C10) provides its own pair: enable_model_offload calls
    ``mlo_enable_offload(backend)`` instead of installing the generic hooks
    (the delegate declares components with backend.add_module and hooks them
    with backend.hook), and disable calls ``mlo_disable_offload(backend)``,
    which must remove every hook it installed and move nothing."""

    @abc.abstractmethod
    def mlo_enable_offload(self, backend):
        ...

    @abc.abstractmethod
    def mlo_disable_offload(self, backend):
        ...


def discover(pipe):
    """[(name, module, role)] in the pipeline's order: its own declaration
    (SupportsComponentDiscovery, or a mlo_components dict), else diffusers'
    components by class and name, as libmlo reads a checkpoint's
    (mlo_role_from_class, then mlo_role_guess with one warning naming every
    guess)."""
    declared = getattr(pipe, "mlo_components", None)
    if declared is None and isinstance(pipe, SupportsComponentDiscovery):
        declared = {"dit": pipe._dit_modules, "encoder": pipe._encoder_modules,
                    "vae": pipe._vae_modules}
    out = []
    if declared is not None:
        for role in ("encoder", "dit", "vae"):
            for name in declared.get(role, ()):
                module = getattr(pipe, name, None)
                if module is None:
                    raise ValueError("the pipeline declares %s '%s', which it does not have"
                                     % (role, name))
                out.append((name, module, role))
        return out
    comps = getattr(pipe, "components", None)
    if comps is None:
        raise ValueError("cannot discover components: the pipeline has neither a declaration "
                         "(SupportsComponentDiscovery, mlo_components) nor diffusers' .components")
    guessed = []
    for name, module in comps.items():
        if not isinstance(module, torch.nn.Module):
            continue
        # as libmlo reads a checkpoint: the model class when it knows it,
        # else its name heuristic, which warns
        cls = type(module).__name__
        role = role_from_class(cls)
        if role is None:
            role = role_guess(name, cls)
            if role != "other":
                guessed.append("%s (%s)" % (name, role))
        if role != "other":
            out.append((name, module, role))
    if guessed:
        warnings.warn("mlo: roles guessed from diffusers' component names: " + ", ".join(guessed),
                      stacklevel=3)
    return out


def _view(ptr, t_like, nbytes):
    """A torch tensor over nbytes at ptr with t_like's dtype and shape."""
    if nbytes == 0 or not ptr:
        return torch.empty(t_like.shape, dtype=t_like.dtype, device="cpu")
    buf = (ctypes.c_char * nbytes).from_address(ptr)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "non-writable buffer": ctypes arrays are writable
        flat = torch.frombuffer(buf, dtype=torch.uint8)
    return flat.view(t_like.dtype).view(t_like.shape)


class _Entry:
    """One tensor of a component: where it sits in the module tree."""
    __slots__ = ("owner", "attr", "is_param", "handle", "nbytes", "like")

    def __init__(self, owner, attr, is_param, handle, nbytes, like):
        self.owner, self.attr, self.is_param = owner, attr, is_param
        self.handle, self.nbytes, self.like = handle, nbytes, like


class _Managed:
    def __init__(self, name, module, role, comp):
        self.name, self.module, self.role, self.comp = name, module, role, comp
        self.entries = []
        self.bound = None  # "host", "device", or None (torch's own memory)
        self.bound_ptr = None
        self.hooks = []
        self.patched = {}


def _resolve(module, qualified):
    *path, attr = qualified.split(".")
    owner = module
    for p in path:
        owner = getattr(owner, p)
    return owner, attr


class Offload:
    """The backend behind enable_model_offload: one libmlo pipeline over a
    pipeline's modules.  Kept on the pipeline as ``pipe._mlo_offload``; its
    memory holds the modules' weights as long as the pipeline lives."""

    def __init__(self, device, policy, budget, reserve, prefetch):
        self.settings = (device, policy, budget, reserve, prefetch)
        self.platform = Platform(_platform_spec(device))
        self.caps = self.platform.caps()
        self.device_type = "cuda" if self.platform.name == "cuda" else "cpu"
        self.pipeline = Pipeline(self.platform)
        self.managed = []
        self.owner_of = {}  # data_ptr -> _Managed that stores it (C6)
        self.enabled = False
        self._originals = []

    # -- declaring --------------------------------------------------------
    def add_module(self, name, module, role):
        """Declares module as a component: each parameter and buffer once
        (tied ones once, tensors another component owns not at all)."""
        comp = self.pipeline.add_component(name, role)
        m = _Managed(name, module, role, comp)
        seen = set()
        items = [(n, t, True) for n, t in module.named_parameters(remove_duplicate=True)]
        items += [(n, t, False) for n, t in module.named_buffers(remove_duplicate=True)]
        for qname, t, is_param in items:
            if t is None:
                continue
            if t.device.type != "cpu":
                raise ValueError("%s.%s is on %s: load the pipeline on the CPU; mlo moves it"
                                 % (name, qname, t.device))
            key = t.data_ptr() if t.numel() else id(t)
            if key in seen:
                continue  # another name of a tensor this component has (tied)
            seen.add(key)
            if t.numel() and key in self.owner_of:
                continue  # another component's: a reference, never moved with this one (C6)
            dtype = _DTYPES.get(t.dtype)
            if dtype is None:
                raise ValueError("%s.%s has dtype %s, which mlo does not move" %
                                 (name, qname, t.dtype))
            data = t.detach().contiguous()
            handle = comp.add_tensor(qname, dtype, list(data.shape),
                                     data.data_ptr() if data.numel() else None,
                                     buffer=not is_param)
            owner, attr = _resolve(module, qname)
            self._originals.append((owner, attr, is_param, t, data))
            m.entries.append(_Entry(owner, attr, is_param, handle, Component.nbytes(handle),
                                    data))
            if t.numel():
                self.owner_of[key] = m
        self.managed.append(m)
        return m

    # -- binding ----------------------------------------------------------
    def _bind(self, m, where):
        for e in m.entries:
            ptr = Component.host_data(e.handle) if where == "host" else \
                Component.device_ptr(e.handle)
            if where == "device" and self.caps["device_pointers"] and not self.caps[
                    "host_addressable"]:
                view = _cuda_view(ptr, e.like, e.nbytes)
            else:
                view = _view(ptr, e.like, e.nbytes)
            if e.is_param:
                getattr(e.owner, e.attr).data = view
            else:
                e.owner._buffers[e.attr] = view
        m.bound = where
        m.bound_ptr = self._first_device_ptr(m) if where == "device" else None

    def _first_device_ptr(self, m):
        for e in m.entries:
            if e.nbytes:
                return Component.device_ptr(e.handle)
        return None

    def sync_bindings(self):
        """Every component's tensors where libmlo has its bytes now: a
        resident one's device block, anything else its host slab."""
        for m in self.managed:
            if m.comp.resident:
                if m.bound != "device" or m.bound_ptr != self._first_device_ptr(m):
                    self._bind(m, "device")
            elif m.bound != "host":
                self._bind(m, "host")

    # -- entry points -------------------------------------------------------
    def acquire(self, m):
        m.comp.acquire()
        self.sync_bindings()

    def release(self, m):
        m.comp.release()

    def acquired(self, m):
        """A context manager: m resident (and bound) inside, for entry points
        other than forward (C17)."""
        backend = self

        class _Scope:
            def __enter__(self):
                backend.acquire(m)
                return m.module

            def __exit__(self, *exc):
                backend.release(m)
                return False

        return _Scope()

    def hook(self, m):
        """Forward pre/post hooks on m's module (the post hook runs even when
        the forward raises, so an acquire is never left held); a VAE's
        decode and encode are wrapped as well.  On a GPU, diffusers is told
        where the module executes (its pipelines ask an `_hf_hook` for the
        execution device; a module not yet loaded sits on its slab)."""
        if self.device_type != "cpu" and not hasattr(m.module, "_hf_hook"):
            m.module._hf_hook = _ExecutionDevice(self.device_type)
            m.patched["_hf_hook"] = None
        pre = m.module.register_forward_pre_hook(lambda mod, args: self.acquire(m))
        post = m.module.register_forward_hook(lambda mod, args, out: self.release(m),
                                              always_call=True)
        m.hooks += [pre, post]
        for method in ("decode", "encode"):  # their _decode/_encode run inside: one acquire
            fn = m.module.__dict__.get(method) or getattr(type(m.module), method, None)
            if fn is None or method in m.patched:
                continue
            bound = getattr(m.module, method)

            def wrapped(*a, __fn=bound, **k):
                with self.acquired(m):
                    return __fn(*a, **k)

            m.patched[method] = m.module.__dict__.get(method)
            setattr(m.module, method, wrapped)

    def unhook(self, m):
        for h in m.hooks:
            h.remove()
        m.hooks = []
        for method, old in m.patched.items():
            if old is None:
                delattr(m.module, method)
            else:
                setattr(m.module, method, old)
        m.patched = {}

    # -- life cycle -----------------------------------------------------------
    def start(self):
        """Materializes (the one copy into the slabs), rebinds every module
        to its slab, enables offload, binds what enable made resident."""
        self.pipeline.materialize()
        for m in self.managed:
            self._bind(m, "host")
        device, policy, budget, reserve, prefetch = self.settings
        self.pipeline.enable(policy=policy, budget=budget, reserve=reserve, prefetch=prefetch)
        self.enabled = True
        self.sync_bindings()
        self._originals = []  # torch's own copies go: the slabs hold the weights now

    def restore(self):
        """After a failed enable: every module back on torch's own tensors."""
        for owner, attr, is_param, t, data in self._originals:
            if is_param:  # data shares the parameter's original storage
                getattr(owner, attr).data = data
            else:
                owner._buffers[attr] = t
        self._originals = []


class _ExecutionDevice:
    """What diffusers' DiffusionPipeline._execution_device reads."""

    def __init__(self, device):
        self.execution_device = torch.device(device)


def _cuda_view(ptr, like, nbytes):
    """A CUDA tensor over a device block's bytes (no copy): the bytes as
    uint8 through __cuda_array_interface__, then viewed as the tensor's
    dtype and shape (bf16 and fp8 have no typestr of their own)."""
    if nbytes == 0 or not ptr:
        return torch.empty(like.shape, dtype=like.dtype, device="cuda")

    class _Iface:
        __cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                    "version": 3, "strides": None}

    return torch.as_tensor(_Iface(), device="cuda").view(like.dtype).view(like.shape)


def _platform_spec(device):
    if isinstance(device, str) and device.startswith("cuda") and "stream=" not in device:
        # compute is torch's current stream: loads are ordered against it (C8)
        index = device.split(":")[1] if ":" in device else "0"
        stream = torch.cuda.current_stream(int(index)).cuda_stream
        return "cuda:%s:stream=%d" % (index, stream)
    return device


def enable_model_offload(pipe, device="host", policy="strict", budget=0, reserve=0,
                         prefetch=True):
    """Model-level offload of a diffusers (or any) pipeline through libmlo.

    device: a libmlo platform spec ("cuda", "cuda:1", "host:capacity=4G").
    policy: "strict" (the specification: a DiT's forward evicts encoders and
    the other DiTs, an encoder's evicts the DiTs; VAEs stay) or "budget"
    (keep what fits in `budget` bytes, evict by next use, prefetch).
    Idempotent with the same arguments (C11); different ones raise MloError
    (EOWNED, C16).  On failure the modules are left as they were (C15).
    Returns the backend (pipe._mlo_offload)."""
    current = getattr(pipe, "_mlo_offload", None)
    args = (device, policy, budget, reserve, prefetch)
    if current is not None:
        if current.settings != args:
            raise MloError(-13, "offload is already enabled with other settings")
        if not current.enabled:
            _reenable(pipe, current)
        return current
    backend = Offload(device, policy, budget, reserve, prefetch)
    try:
        if isinstance(pipe, OffloadDelegate):
            pipe.mlo_enable_offload(backend)
            if not backend.enabled:
                backend.start()
        else:
            for name, module, role in discover(pipe):
                backend.add_module(name, module, role)
            if not any(m.role == "dit" for m in backend.managed):
                raise ValueError("no DiT found (declare the components: SupportsComponentDiscovery)")
            backend.start()
            for m in backend.managed:
                backend.hook(m)
    except BaseException:
        for m in backend.managed:
            backend.unhook(m)
        backend.restore()
        if isinstance(pipe, OffloadDelegate) and backend.enabled:
            pipe.mlo_disable_offload(backend)
        raise
    pipe._mlo_offload = backend
    return backend


def _reenable(pipe, backend):
    device, policy, budget, reserve, prefetch = backend.settings
    backend.pipeline.enable(policy=policy, budget=budget, reserve=reserve, prefetch=prefetch)
    backend.enabled = True
    backend.sync_bindings()
    if isinstance(pipe, OffloadDelegate):
        pipe.mlo_enable_offload(backend)
    else:
        for m in backend.managed:
            backend.hook(m)


def disable_model_offload(pipe):
    """Removes every hook and moves nothing (C14); idempotent (C11).  The
    weights stay in libmlo's memory, where the modules' tensors point: the
    backend stays on the pipeline, and enabling again reuses it."""
    backend = getattr(pipe, "_mlo_offload", None)
    if backend is None or not backend.enabled:
        return
    if isinstance(pipe, OffloadDelegate):
        pipe.mlo_disable_offload(backend)
    for m in backend.managed:
        backend.unhook(m)
    backend.pipeline.disable()
    backend.enabled = False
