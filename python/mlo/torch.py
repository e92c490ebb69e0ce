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
import gc
import importlib
import json
import logging
import os
import struct
import tempfile
import threading
import warnings
import weakref

import numpy as np
import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from . import (Component, MloError, MloInvalidError, MloOwnedError, MloStateError,
               MloUnsupportedError, Pipeline, Platform, _ESTATE, lib, parse_size, role_from_class,
               role_guess)

__all__ = ["enable_model_offload", "disable_model_offload", "close_model_offload",
           "from_pretrained", "SupportsComponentDiscovery", "OffloadDelegate", "Offload"]

_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
           torch.float64: "F64", torch.int64: "I64", torch.int32: "I32", torch.int16: "I16",
           torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}
for _name, _code in (("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2")):
    if hasattr(torch, _name):
        _DTYPES[getattr(torch, _name)] = _code
_TORCH_DTYPES = {code: dtype for dtype, code in _DTYPES.items()}


_log = logging.getLogger("mlo.torch")


def _format_size(n):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return "%.1f %s" % (n / (1 << shift), unit)
    return "%d B" % n


class _NoBar:
    """A progress bar switched off."""
    total = n = 0

    def update(self, n=1):
        pass

    def refresh(self):
        pass

    def close(self):
        pass


def _bar_config(pipe):
    """How to draw a progress bar as diffusers draws its own while it loads
    (tqdm), None where it is off: diffusers'
    diffusers.utils.logging.disable_progress_bar(), or the pipeline's
    pipe.set_progress_bar_config(disable=True), whose other settings it
    takes too.  Without diffusers, none."""
    try:
        from diffusers.utils import logging as dlogging
        import tqdm.auto  # noqa: F401
    except ImportError:
        return None
    config = dict(getattr(pipe, "_progress_bar_config", None) or {})
    if config.get("disable") or not dlogging.is_progress_bar_enabled():
        return None
    return config


def _progress_bar(pipe, desc, total=None, config=False):
    """A progress bar in bytes (_bar_config: pipe's settings, or config's)."""
    if config is False:
        config = _bar_config(pipe)
    if config is None:
        return _NoBar()
    from tqdm.auto import tqdm
    config = dict(config)
    for k, v in (("desc", desc), ("unit", "B"), ("unit_scale", True), ("unit_divisor", 1024)):
        config.setdefault(k, v)
    return tqdm(total=total, **config)


class _LazyBar:
    """_progress_bar drawn from its first update on: none where nothing
    happens."""

    def __init__(self, pipe, desc):
        self.pipe, self.desc, self.bar = pipe, desc, None

    def update(self, n=1):
        if self.bar is None:
            self.bar = _progress_bar(self.pipe, self.desc)
        self.bar.update(n)

    def close(self):
        if self.bar is not None:
            self.bar.close()


def _materialize_progress(pipeline, config, desc):
    """libmlo's materialization progress (each component's file bytes read
    into its slab) on a progress bar drawn from the first bytes read on,
    its total growing by each component's as it starts.  Returns what
    closes it."""
    done, bar = {}, []
    lock = threading.Lock()

    def on(comp, now, total):
        with lock:
            key = comp.name if comp is not None else None
            if not bar:
                bar.append(_progress_bar(None, desc, total, config))
                done[key] = 0
            elif key not in done:
                done[key] = 0
                bar[0].total = (bar[0].total or 0) + total
                bar[0].refresh()
            bar[0].update(now - done[key])
            done[key] = now

    def close():
        pipeline.set_progress(None)
        with lock:
            if bar:
                bar[0].close()

    pipeline.set_progress(on)
    return close


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


def _view(ptr, t_like, nbytes, keep=None):
    """A torch tensor over nbytes at ptr with t_like's dtype and shape; it
    keeps `keep` (the libmlo pipeline that owns the bytes) alive."""
    if nbytes == 0 or not ptr:
        return torch.empty(t_like.shape, dtype=t_like.dtype, device="cpu")
    buf = (ctypes.c_char * nbytes).from_address(ptr)
    buf._mlo_keep = keep  # the tensor holds buf: the memory outlives no view
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "non-writable buffer": ctypes arrays are writable
        flat = torch.frombuffer(buf, dtype=torch.uint8)
    return flat.view(t_like.dtype).view(t_like.shape)


_SUM_CHUNK = 1 << 20  # elements a fingerprint sums at once on a GPU (8 MiB of int64)


def _host_word_sum(at, n, dtype):
    """The sum, modulo 2^64, of n words of dtype (int32, or uint8 for a last
    partial word) at host address at.  numpy reduces in small buffers: no
    temporary in host memory (torch's int64 sum of a slab made one of twice
    its size, and summed in pieces the freed pieces stayed in the malloc
    heap, 39 MiB of a 151 MiB expert's run under the disk tier's budget)."""
    np_dtype = np.int32 if dtype == torch.int32 else np.uint8
    words = np.frombuffer((ctypes.c_char * (n * np.dtype(np_dtype).itemsize)).from_address(at),
                          dtype=np_dtype)
    return int(words.sum(dtype=np.int64)) % 2**64


class _Entry:
    """One tensor of a component: where it sits in the module tree, its
    dtype and shape (`like`, on the meta device: no bytes of torch's are
    kept), and the address it was last bound to."""
    __slots__ = ("owner", "attr", "is_param", "handle", "nbytes", "like", "name", "ptr",
                 "qname", "source", "places", "composite", "path")

    def __init__(self, owner, attr, is_param, handle, nbytes, like, name, source=None):
        self.owner, self.attr, self.is_param = owner, attr, is_param
        self.handle, self.nbytes, self.like, self.name = handle, nbytes, like, name
        self.qname = name.split(".", 1)[1]
        self.ptr = None
        self.source = source  # (path, offset) where it was declared from a file
        self.places = ()  # the other (owner, attr) holding the same tensor (tied)
        self.composite = None  # the _Composite it is an inner tensor of
        self.path = ()  # its place in that composite's __tensor_flatten__ tree

    def current(self):
        """The tensor the module has in this place now (an inner tensor of a
        tensor subclass: that inner tensor, or the subclass itself where it
        is no longer one of the same kind)."""
        t = getattr(self.owner, self.attr) if self.is_param else \
            self.owner._buffers.get(self.attr)
        if self.composite is not None and type(t) is self.composite.spec[0]:
            for name in self.path:
                t = getattr(t, name)
        return t


def _is_wrapper(t):
    """A tensor subclass made of inner tensors (torchao's quantized
    weights): what mlo moves are those inner tensors' bytes."""
    return is_traceable_wrapper_subclass(t)


def _flatten(t, path=()):
    """t's __tensor_flatten__ tree: (its spec, [(path, plain inner tensor)]).
    A spec is (class, context, size, stride, {inner name: spec or None})."""
    names, ctx = t.__tensor_flatten__()
    inner, leaves = {}, []
    for name in names:
        x = getattr(t, name)
        if _is_wrapper(x):
            inner[name], more = _flatten(x, path + (name,))
            leaves += more
        else:
            inner[name] = None
            leaves.append((path + (name,), x))
    return (type(t), ctx, t.size(), t.stride(), inner), leaves


def _unflatten(spec, tensors, path=()):
    """The tensor subclass spec describes, over tensors {path: tensor}."""
    cls, ctx, size, stride, inner = spec
    parts = {name: tensors[path + (name,)] if sub is None else
             _unflatten(sub, tensors, path + (name,)) for name, sub in inner.items()}
    return cls.__tensor_unflatten__(parts, ctx, size, stride)


class _Composite:
    """A tensor subclass in a module (torchao's Int8Tensor): its spec and
    its inner tensors' entries; bound by building it again over their
    views (__tensor_unflatten__), never through a dequantized copy."""

    def __init__(self, spec, requires_grad):
        self.spec, self.requires_grad, self.members = spec, requires_grad, []

    def build(self, tensors):
        """The subclass over {path: tensor}, as a Parameter if it was one."""
        t = _unflatten(self.spec, tensors)
        return torch.nn.Parameter(t, requires_grad=self.requires_grad) \
            if self.members[0].is_param else t


class _Managed:
    def __init__(self, name, module, role, comp):
        self.name, self.module, self.role, self.comp = name, module, role, comp
        self.entries = []
        self.bound = None  # "host", "device", or None (torch's own memory)
        self.bound_ptr = None
        self.reference = None  # the fingerprint of its slab (check_writes_now)
        self.acquired_since_load = False  # its device copy waited for by an acquire
        self.written_back = 0  # tensors written back to the slab (defect 27.1)
        self.hooks = []
        self.patched = {}
        self.casts = []  # (diffusers' layerwise casting's fn_ref, its post_forward): _hook_casts
        self.streams = False  # its blocks pass through device slots (block streaming)
        self.progressive = False  # it loads block by block, its blocks' hooks saying where
        self.may_progress = False  # each block has a module to hook: progressive once seen
        self.seen = set()  # blocks begun since its acquire (progressive is earned by these)
        self.blocks = {}  # block index -> (its module, its entries)
        self.pieces = []  # its entries by contiguous piece: what a fingerprint sums


def _set_tensor(owner, attr, is_param, value, places=()):
    """value in owner.attr (a parameter's .data, or the buffer), and in the
    other places (owner, attr) that hold the same parameter (tied).  torch
    cannot swap a meta tensor under a Parameter for one with memory or back
    (a component the disk tier keeps in its files is bound to the meta
    device between its loads): there a new Parameter takes every place."""
    if not is_param:
        owner._buffers[attr] = value
        for o, a in places:
            o._buffers[a] = value
        return
    p = getattr(owner, attr)
    if isinstance(value, torch.nn.Parameter):  # a tensor subclass, built whole
        fresh = value
    elif p.is_meta == value.is_meta:
        p.data = value
        return
    elif type(p) is torch.nn.Parameter:
        fresh = torch.nn.Parameter(value, requires_grad=p.requires_grad)
    else:  # a Parameter subclass over plain bytes (diffusers' GGUFParameter): kept one
        fresh = torch.Tensor._make_subclass(type(p), value, p.requires_grad)
        fresh.__dict__.update(p.__dict__)  # its quant_type, ...
    for o, a in ((owner, attr),) + tuple(places):
        if o._parameters.get(a) is p:
            o._parameters[a] = fresh


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

    def __init__(self, device, policy, budget, reserve, prefetch, check_writes=True,
                 progressive=True, host_budget=0):
        self.settings = (device, policy, budget, reserve, prefetch, host_budget)
        self.check_writes = check_writes
        self.progressive = progressive
        spec = _platform_spec(device)
        self.platform = Platform(spec)
        # the stream compute is ordered on (C8): torch's current one at enable
        self.cuda_stream = None
        if spec.startswith("cuda:") and "stream=" in spec:
            self.cuda_stream = (int(spec.split(":")[1]),
                                int(spec.split("stream=")[1].split(",")[0], 0))
        self.torch_device = "cpu"
        if self.platform.name == "cuda":
            # torch's caching allocator holds freed blocks as reserved: mlo
            # counts them free and asks for them before an allocation fails
            index = self.cuda_stream[0] if self.cuda_stream else torch.cuda.current_device()
            self.torch_device = "cuda:%d" % index  # views on the block's own device
            self.platform.set_framework_cache(
                reclaim=torch.cuda.empty_cache,
                cached_bytes=lambda: torch.cuda.memory_reserved(index) -
                torch.cuda.memory_allocated(index))
        self.caps = self.platform.caps()
        self.device_type = "cuda" if self.platform.name == "cuda" else "cpu"
        self.pipeline = Pipeline(self.platform)
        self.managed = []
        self.owner_of = {}  # data_ptr -> _Managed that stores it (C6)
        self.loaded_files = {}  # id(module) -> {name: (path, offset)}: find_loaded_files
        self.enabled = False
        self.closed = False
        self.pipe_ref = None
        self._originals = []
        # the blocks each thread began and has not ended: {(name, block): n}
        self._begun = threading.local()
        # the components each thread acquired and has not released: {name: n}
        self._held = threading.local()

    # -- declaring --------------------------------------------------------
    def add_module(self, name, module, role):
        """Declares module as a component: each parameter and buffer once
        (tied ones once, tensors another component owns not at all).  A
        tensor on the meta device is declared from its range in a file,
        which the module's ``_mlo_files`` {name: (path, offset)} gives
        (from_pretrained sets it): the disk tier may leave it there."""
        comp = self.pipeline.add_component(name, role)
        m = _Managed(name, module, role, comp)
        files = getattr(module, "_mlo_files", None) or {}
        # a loaded module's tensors found in files (or spilled to one) for
        # the disk tier: declared from there, so torch's copies can go
        loaded_files = self.loaded_files.get(id(module), {})
        places = {}  # id(tensor) -> every (owner, attr) that holds it
        for named in (module.named_parameters(remove_duplicate=False),
                      module.named_buffers(remove_duplicate=False)):
            for qname, t in named:
                if t is not None:
                    places.setdefault(id(t), []).append(_resolve(module, qname))
        seen = set()
        items = [(n, t, True) for n, t in module.named_parameters(remove_duplicate=True)]
        items += [(n, t, False) for n, t in module.named_buffers(remove_duplicate=True)]
        for qname, t, is_param in items:
            if t is None:
                continue
            if _is_wrapper(t):
                self._add_composite(m, module, name, qname, t, is_param, places)
                continue
            if t.device.type not in ("cpu", "meta"):
                raise ValueError("%s.%s is on %s: load the pipeline on the CPU; mlo moves it"
                                 % (name, qname, t.device))
            key = id(t) if t.is_meta or not t.numel() else t.data_ptr()
            if key in seen:
                continue  # another name of a tensor this component has (tied)
            seen.add(key)
            if t.numel() and key in self.owner_of:
                continue  # another component's: a reference, never moved with this one (C6)
            dtype = _DTYPES.get(t.dtype)
            if dtype is None:
                raise ValueError("%s.%s has dtype %s, which mlo does not move" %
                                 (name, qname, t.dtype))
            source = None if t.is_meta else loaded_files.get(qname)
            if source is not None:
                data = t.detach()
                handle = comp.add_tensor(qname, dtype, list(t.shape), buffer=not is_param,
                                         file=source[0], file_offset=source[1])
            elif t.is_meta:
                source = files.get(qname)
                if source is None:
                    raise ValueError("%s.%s has no data (a meta tensor) and no file range to read "
                                     "it from: load its weights, or build the pipeline with "
                                     "mlo.torch.from_pretrained" % (name, qname))
                data = t.detach()
                handle = comp.add_tensor(qname, dtype, list(t.shape), buffer=not is_param,
                                         file=source[0], file_offset=source[1])
            else:
                data = t.detach().contiguous()
                handle = comp.add_tensor(qname, dtype, list(data.shape),
                                         data.data_ptr() if data.numel() else None,
                                         buffer=not is_param)
            owner, attr = _resolve(module, qname)
            others = tuple(pl for pl in places.get(id(t), ()) if pl != (owner, attr))
            self._originals.append((owner, attr, is_param, t, data, others))
            e = _Entry(owner, attr, is_param, handle, Component.nbytes(handle),
                       torch.empty(data.shape, dtype=data.dtype, device="meta"),
                       "%s.%s" % (name, qname), source)
            e.places = others
            m.entries.append(e)
            if t.numel():
                self.owner_of[key] = m
        self.managed.append(m)
        return m

    def _add_composite(self, m, module, name, qname, t, is_param, places):
        """A tensor subclass (torchao's quantized weights) as its inner
        tensors, each a tensor of the component named qname.<inner name>,
        so that their bytes move and nothing is dequantized."""
        if t.device.type != "cpu":
            raise ValueError("%s.%s is on %s: load the pipeline on the CPU; mlo moves it"
                             % (name, qname, t.device))
        spec, leaves = _flatten(t)
        composite = _Composite(spec, t.requires_grad)
        owner, attr = _resolve(module, qname)
        others = tuple(pl for pl in places.get(id(t), ()) if pl != (owner, attr))
        self._originals.append((owner, attr, is_param, t, t, others))
        for path, x in leaves:
            dtype = _DTYPES.get(x.dtype)
            if dtype is None or x.device.type != "cpu":
                raise ValueError("%s.%s: its %s (a %s, inside a %s) is %s on %s, which mlo "
                                 "does not move" % (name, qname, ".".join(path),
                                                    type(x).__name__, type(t).__name__,
                                                    x.dtype, x.device))
            data = x.detach().contiguous()
            inner = "%s.%s" % (qname, ".".join(path))
            handle = m.comp.add_tensor(inner, dtype, list(data.shape),
                                       data.data_ptr() if data.numel() else None,
                                       buffer=not is_param)
            e = _Entry(owner, attr, is_param, handle, Component.nbytes(handle),
                       torch.empty(data.shape, dtype=data.dtype, device="meta"),
                       "%s.%s" % (name, inner))
            e.places, e.composite, e.path = others, composite, path
            composite.members.append(e)
            m.entries.append(e)
            if data.numel():
                self.owner_of[data.data_ptr()] = m

    # -- binding ----------------------------------------------------------
    def _entry_view(self, e, where):
        """e's bytes in the slab ("host") or the device block ("device").  A
        streamed block's tensors have a device copy only between its
        block_begin and block_end: outside, "device" is their slab."""
        ptr = Component.host_data(e.handle) if where == "host" else \
            Component.device_ptr(e.handle)
        if where == "device" and not ptr and e.nbytes:
            where, ptr = "host", Component.host_data(e.handle)
        if not ptr and e.nbytes:
            # no host copy: the disk tier keeps it in its file (docs/disk.md);
            # until a load gives it device bytes it is bound to no memory
            return e.like
        if where == "device" and self.caps["device_pointers"] and not self.caps[
                "host_addressable"]:
            return _cuda_view(ptr, e.like, e.nbytes, self.pipeline, self.torch_device)
        return _view(ptr, e.like, e.nbytes, self.pipeline)

    def _bind_entry(self, e, where):
        if e.composite is not None:  # built again over all its inner tensors' views
            views = {x.path: self._entry_view(x, where) for x in e.composite.members}
            _set_tensor(e.owner, e.attr, e.is_param, e.composite.build(views), e.places)
            for x in e.composite.members:
                v = views[x.path]
                x.ptr = v.data_ptr() if v.numel() and not v.is_meta else None
            return
        view = self._entry_view(e, where)
        _set_tensor(e.owner, e.attr, e.is_param, view, e.places)
        e.ptr = view.data_ptr() if view.numel() and not view.is_meta else None

    def _bind(self, m, where, fresh=True):
        built = set()
        for e in m.entries:
            if e.composite is not None:
                if id(e.composite) in built:
                    continue  # bound with its first inner tensor
                built.add(id(e.composite))
            self._bind_entry(e, where)
        m.bound = where
        m.bound_ptr = self._first_device_ptr(m) if where == "device" else None
        if fresh:  # a new load (or none): unchecked until its forward has waited for it
            m.acquired_since_load = False

    # -- writes into the weights (defect 27.1) -----------------------------
    def _span_sum(self, entries, where):
        """The sum, modulo 2^64, of the 32-bit words from the first of these
        entries to the end of the last (a last partial word as bytes), in
        the slab ("host") or on the device, read back.  None where one of
        them has no copy there (a streamed block outside its forward, a
        component the disk tier keeps in its files)."""
        ptr_of = Component.host_data if where == "host" else Component.device_ptr
        spans = [(ptr_of(e.handle), e.nbytes) for e in entries if e.nbytes]
        if not spans or any(not p for p, _ in spans):
            return None
        lo = min(p for p, _ in spans)
        size = max(p + k for p, k in spans) - lo  # exactly what a load copies
        cuda = where == "device" and self.caps["device_pointers"] and \
            not self.caps["host_addressable"]
        sums = []
        for at, n, dtype in ((lo, size // 4, torch.int32), (lo + size // 4 * 4, size % 4,
                                                           torch.uint8)):
            if n:
                sums.append(self._cuda_word_sum(at, n, dtype) if cuda else
                            _host_word_sum(at, n, dtype))
        return tuple(sums)

    def _cuda_word_sum(self, at, n, dtype):
        """_host_word_sum of device memory: summed on the device in chunks
        (torch widens a chunk to int64 before it sums), read back once."""
        like = torch.empty((n,), dtype=dtype, device="meta")
        v = _cuda_view(at, like, n * like.element_size(), self.pipeline, self.torch_device)
        total = torch.zeros((), dtype=torch.int64, device=v.device)
        for i in range(0, n, _SUM_CHUNK):
            total += torch.sum(v[i:i + _SUM_CHUNK], dtype=torch.int64)
        return int(total) % 2**64

    def _sums(self, m, where):
        """m's fingerprint: one sum per piece of m.pieces (plan_blocks)."""
        return tuple(self._span_sum(g, where) for g in m.pieces)

    def _take_reference(self, m):
        """The fingerprint of m's slab: what a load puts on the device.  A
        check compares a loaded component's device bytes with it, so a
        write made on the device at any time after the load is seen.  A
        write into the slab itself (while m is not resident) leaves it
        stale: the next check writes back bytes that are already there."""
        m.reference = self._sums(m, "host") if self.check_writes else None

    def check_writes_now(self, skip=None):
        """Every write into a component's weights reaches its slab before
        libmlo may evict or reload it: a tensor that was replaced (p.data =
        x, a safe LoRA fuse) has its values copied into mlo's memory and is
        bound again; a loaded component whose device bytes no longer match
        its slab's fingerprint (p.data.add_(), load_state_dict, an unsafe
        fuse) is written back.  A replacement of another dtype or shape is
        refused (MloError): mlo cannot keep it.

        Device bytes are read only once the load is known complete: a
        whole load's component has run its forward since (its acquire
        ordered the compute stream after the copy, C8), or libmlo says the
        load is done (load_done; for one loaded block by block whose forward
        ran, after the pipeline's synchronize issued and waited for every
        block the forward did not reach).  A prefetch still in flight is
        never read, nor waited for; a write into one would race its copy
        anyway.  Bytes never copied are never read: read as a write, they
        would be copied over the slab."""
        for m in self.managed:
            if m.bound is None:
                continue
            self._check_replaced(m)
            if m is skip or m.bound != "device" or m.reference is None or \
                    all(r is None for r in m.reference):
                # nothing to compare with: a piece with no host copy (in its
                # files: the disk tier) is reloaded from them at each load,
                # and reading its device bytes would only cost a pass over them
                continue
            if not m.acquired_since_load or m.streams or m.progressive:
                # loaded ahead (a prefetch, enable) and not run yet, or loaded
                # block by block (an acquire waits for its head alone): read
                # once its copy has landed, never waited for
                if not m.comp.load_done:
                    if not m.acquired_since_load:
                        continue  # a prefetch in flight: never read, nor waited for
                    # it ran, but blocks its forward did not begin may still be
                    # copying (on a GPU the host runs ahead), or not issued yet
                    # (a streamed load's kept blocks, issued as its forward
                    # reaches them; a forward that raised, held still here,
                    # never reaches them): the pipeline's synchronize issues
                    # and waits for them all, then read
                    self.pipeline.synchronize()
                    if not m.comp.load_done:
                        # a copy that could not be issued (its block's begin
                        # issues it again): those device bytes were never
                        # copied, and read as a write they would overwrite
                        # the slab; not read
                        continue
                m.acquired_since_load = True
            now = self._sums(m, "device")
            # a piece with no host copy (in its files: the disk tier) has no
            # reference: it is immutable, reloaded from the files at each load
            if any(d is not None and r is not None and d != r
                   for d, r in zip(now, m.reference)):
                with torch.no_grad():
                    loaded = [e for e in m.entries if e.nbytes and Component.device_ptr(e.handle)
                              and Component.host_data(e.handle)]
                    for e in loaded:
                        self._entry_view(e, "host").copy_(self._entry_view(e, "device"))
                m.written_back += len(loaded)
                m.reference = tuple(r if d is None else d for d, r in zip(now, m.reference))
                warnings.warn("mlo: the weights of '%s' were written on the device; %d tensor(s) "
                              "written back to its host slab so no later load loses them"
                              % (m.name, len(loaded)), stacklevel=3)

    def _check_replaced(self, m):
        replaced = []
        for e in m.entries:
            cur = e.current()
            if cur is None or not e.nbytes or (cur.is_meta and e.ptr is None) or \
                    (not cur.is_meta and cur.data_ptr() == e.ptr):
                continue
            if not Component.host_data(e.handle):
                raise MloInvalidError("%s was replaced while offloaded, but it lives in its file "
                                      "(host_memory: the disk tier reads it from there at each "
                                      "load) and mlo has no host copy to keep the new values in; "
                                      "call close_model_offload(pipe) first" % e.name)
            if cur.dtype != e.like.dtype or tuple(cur.shape) != tuple(e.like.shape):
                raise MloInvalidError("%s was replaced by a %s %s tensor while offloaded (it is "
                                      "%s %s): mlo cannot keep it; call disable_model_offload and "
                                      "enable again (diffusers' VAE upcast, force_upcast, does "
                                      "this: run the VAE in float32 or set "
                                      "vae.config.force_upcast = False)" %
                                      (e.name, cur.dtype, tuple(cur.shape), e.like.dtype,
                                       tuple(e.like.shape)))
            replaced.append((e, cur))
        if not replaced:
            return
        landed = m.acquired_since_load and not (m.streams or m.progressive)
        if m.bound == "device" and not (landed or m.comp.load_done):
            # loaded ahead and still loading: its copy would land over the
            # new values (rare: wait for it, then write them on the device)
            self.pipeline.synchronize()
        with torch.no_grad():
            for e, cur in replaced:
                self._entry_view(e, "host").copy_(cur)
                if m.bound == "device":
                    self._entry_view(e, "device").copy_(cur)
        if m.bound == "device" and self.cuda_stream is not None:
            # written outside m's hold: libmlo orders m's eviction after the
            # compute of its last hold only (issue 25.7), so the copies must
            # have landed before the acquire that may evict it
            torch.cuda.current_stream(self.cuda_stream[0]).synchronize()
        self._bind(m, m.bound, fresh=False)
        self._take_reference(m)
        m.written_back += len(replaced)
        warnings.warn("mlo: %d tensor(s) of '%s' were replaced (%s…); their values are now in "
                      "mlo's memory" % (len(replaced), m.name, replaced[0][0].name), stacklevel=4)

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
    def _check_stream(self):
        """The loads are ordered against the stream given at enable; a forward
        launched on another (`with torch.cuda.stream(s):`) would not wait for
        them.  Refused, never run unordered (issue 25.1).  So is a forward
        under CUDA graph capture: a captured graph would replay without
        mlo's loads and evictions."""
        if torch.cuda.is_current_stream_capturing():
            raise MloStateError("mlo offload cannot run under CUDA graph capture: the graph would "
                                "replay without its loads and evictions; capture with the offload "
                                "disabled, or do not capture (torch.compile's "
                                "mode='reduce-overhead' captures)")
        index, handle = self.cuda_stream
        now = torch.cuda.current_stream(index).cuda_stream
        if now != handle:
            raise MloStateError("torch's current stream on cuda:%d is 0x%x, but offload was "
                                "enabled on stream 0x%x: loads are ordered against that one only; "
                                "run the pipeline on the stream it was enabled on, or enable "
                                "inside the same `with torch.cuda.stream(...)`" %
                                (index, now, handle))

    def acquire(self, m):
        if self.cuda_stream is not None:
            self._check_stream()
        if self.check_writes:
            # an acquire may evict others (a switch; the budget policy's
            # prefetch); m itself only when it is not resident
            self.check_writes_now(skip=m if m.bound == "device" else None)
        m.comp.acquire()
        held = self._held_here()  # first: a binding below that raises still releases it
        held[m.name] = held.get(m.name, 0) + 1
        self.sync_bindings()
        m.acquired_since_load = True  # the compute stream waits for its load (C8)

    def _held_here(self):
        """This thread's components acquired and not yet released: the
        module's release hook runs even when its acquire raised (torch
        calls always_call hooks after any exception in the call, a
        pre-hook's included), and libmlo's release from a thread that does
        not hold the component drops another thread's hold (the oldest),
        which lets the component be evicted under that thread's forward."""
        held = getattr(self._held, "comps", None)
        if held is None:
            held = self._held.comps = {}
        return held

    def release(self, m):
        held = self._held_here()
        n = held.get(m.name, 0)
        if not n:  # its acquire raised: nothing of this thread's to release
            return
        if n == 1:
            del held[m.name]
        else:
            held[m.name] = n - 1
        if m.may_progress and not m.progressive and m.blocks and len(m.seen) == len(m.blocks):
            m.progressive = True  # every block's hooks ran: its next load goes block by block
            m.comp.set_progressive(True)
        m.seen.clear()
        # the budget policy prefetches at a release, which may evict
        # anything, m included: writes first, and bindings after
        budget = self.settings[1] == "budget"
        if budget and self.check_writes:
            self.check_writes_now()
        m.comp.release()
        if budget:
            self.sync_bindings()

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
        # with a host budget a module on disk is bound to the meta device
        # between its loads: diffusers must not take its device from it
        if (self.device_type != "cpu" or self.settings[5]) and not hasattr(m.module, "_hf_hook"):
            m.module._hf_hook = _ExecutionDevice(self.device_type)
            m.patched["_hf_hook"] = None
        pre = m.module.register_forward_pre_hook(lambda mod, args: self.acquire(m))
        post = m.module.register_forward_hook(lambda mod, args, out: self.release(m),
                                              always_call=True)
        m.hooks += [pre, post]
        for b, (module, entries) in m.blocks.items():  # streamed or progressive: its blocks
            m.hooks.append(module.register_forward_pre_hook(
                lambda mod, args, b=b, entries=entries: self._block_begin(m, b, entries)))
            m.hooks.append(module.register_forward_hook(
                lambda mod, args, out, b=b, entries=entries: self._block_end(m, b, entries),
                always_call=True))
        self._hook_casts(m)
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

    def _hook_casts(self, m):
        """diffusers' layerwise casting (enable_layerwise_casting) on m's
        layers casts each layer's weights to the compute dtype before its
        forward (new tensors: temporaries) and back to the storage dtype
        after it, which would leave torch's own copy of every layer in place
        of mlo's memory.  After the forward the layer is bound back to where
        libmlo holds its bytes instead: the storage dtype's values, the same
        as the round trip gives (the compute dtype holds them exactly)."""
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

            def bind_back(module, output, entries=entries):
                where = "device" if m.bound == "device" or m.streams else "host"
                for e in entries:
                    self._bind_entry(e, where)
                return output

            m.casts.append((fn_ref, fn_ref.post_forward))
            fn_ref.post_forward = bind_back

    def unhook(self, m):
        for fn_ref, post_forward in m.casts:
            fn_ref.post_forward = post_forward
        m.casts = []
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
        to its slab, enables offload, binds what enable made resident.
        With a host budget, enable materializes: only the slabs that stay in
        host memory are filled (docs/disk.md)."""
        pipe = self.pipe_ref() if self.pipe_ref is not None else None
        end_progress = _materialize_progress(self.pipeline, _bar_config(pipe),
                                             "mlo: reading weights into host slabs")
        try:
            if not self.settings[5]:
                self.pipeline.materialize()
                for m in self.managed:
                    self._bind(m, "host")
            self.enable()
        finally:
            end_progress()
        self._originals = []  # torch's own copies go: the slabs hold the weights now
        self.log_placement()

    def placement(self):
        """Where each component lives now and why: [(name, role, bytes,
        where, why)], where is "device", "host slab" or "disk" (its slab
        left in its files by host_memory)."""
        _, policy, _, _, _, host_budget = self.settings
        size = _format_size(host_budget)
        out = []
        for m in self.managed:
            on_disk = any(e.nbytes and not Component.host_data(e.handle) for e in m.entries)
            if m.comp.resident:
                where = "device"
                why = "the budget policy keeps it (it fits the device budget)" \
                    if policy != "strict" else "the strict policy keeps VAEs resident" \
                    if m.role == "vae" else "the strict policy loads encoders at enable"
            elif on_disk:
                where = "disk"
                why = "read from its files at each load (host_memory %s keeps the slabs of " \
                      "the components loaded most per prompt)" % size
            else:
                where = "host slab"
                why = "loaded from it at its forward (within host_memory %s)" % size \
                    if host_budget else "loaded from it at its forward (no host_memory)"
            if m.streams:
                info = m.comp.stream_info()
                why += ", streaming %d of its %d blocks through the device (larger than " \
                       "the device budget)" % (info["streamed_blocks"], info["blocks"])
            out.append((m.name, m.role, m.comp.bytes, where, why))
        return out

    def log_placement(self):
        """One line at enable: where each component lives, and why."""
        if _log.isEnabledFor(logging.INFO):
            _log.info("mlo: on %s: %s", self.platform.name, "; ".join(
                "%s (%s, %s): %s, %s" % (name, role, _format_size(nbytes), where, why)
                for name, role, nbytes, where, why in self.placement()))

    def enable(self):
        """libmlo's offload on with the settings (at start, and again after a
        disable); each component's blocks planned, its slab's fingerprint
        taken, every module bound where libmlo has its bytes."""
        device, policy, budget, reserve, prefetch, host_budget = self.settings
        for m in self.managed:  # before enable's loads: they go block by block already
            # A forward must be seen to begin every block before loads go block
            # by block (release): hooks on a module torch never calls would
            # let compute read blocks still copying.
            m.may_progress = self.progressive and self._hookable_blocks(m) is not None
            m.progressive = m.progressive and m.may_progress
            m.comp.set_progressive(m.progressive)
        self.pipeline.enable(policy=policy, budget=budget, reserve=reserve, prefetch=prefetch,
                             host_budget=host_budget)
        self.enabled = True
        if policy == "budget":  # nothing declares the calls: learn them (docs/planner.md)
            self.pipeline.learn_schedule(True)
        for m in self.managed:
            self.plan_blocks(m)
        self.sync_bindings()

    def plan_blocks(self, m):
        """Where m streams (the budget policy keeps only some of its blocks
        resident: docs/streaming.md), each block's module: the module its
        tensors' names share (`blocks.3` for blocks.3.attn1...), hooked in
        hook() to say where the forward is (a resident block's begin and
        end cost libmlo nothing).  Then the pieces a fingerprint sums: the
        whole component, or for one that streams each piece (prologue,
        epilogue, each block: each contiguous, the same in the slab and on
        the device, where the slots between resident pieces change at every
        block), and the reference fingerprint of its slab."""
        m.streams = m.comp.stream_info()["slots"] > 0
        m.blocks = {}
        m.pieces = [m.entries]
        if m.streams:
            by_block = self._by_block(m)
            m.pieces = [g for _, g in sorted(by_block.items())]
            for b, entries in sorted(by_block.items()):
                if b >= 0:
                    module = self._block_module(m, entries)
                    if module is None:
                        raise MloUnsupportedError("'%s' streams, but the tensors of its block %d "
                                                  "(%s, ...) share no module to hook; give it a "
                                                  "budget that holds it whole" %
                                                  (m.name, b, entries[0].qname))
                    m.blocks[b] = (module, entries)
        elif m.may_progress:
            m.blocks = self._hookable_blocks(m)
        self._take_reference(m)

    @staticmethod
    def _by_block(m):
        by_block = {}
        for e in m.entries:
            by_block.setdefault(Component.tensor_block(e.handle), []).append(e)
        return by_block

    def _hookable_blocks(self, m):
        """Block index -> (its module, its entries) when every block of m has
        a module of its own to hook (progressive loads: docs/streaming.md);
        None where m has no blocks or one of them has no such module."""
        blocks = {}
        for b, entries in sorted(self._by_block(m).items()):
            if b >= 0:
                module = self._block_module(m, entries)
                if module is None or any(module is mod for mod, _ in blocks.values()):
                    return None
                blocks[b] = (module, entries)
        return blocks or None

    @staticmethod
    def _block_module(m, entries):
        """The module a block's tensors' names share up to the block's number
        (`encoder.block.3` for encoder.block.3.layer.0.SelfAttention.q.weight,
        as libmlo names blocks: not the ModuleList `layer` below it, which is
        never called): its hooks' place (None where they share none)."""
        common = os.path.commonprefix([e.qname.split(".")[:-1] for e in entries])
        while common and not common[-1].isdigit():
            common = common[:-1]
        module = m.module
        for part in common:
            module = getattr(module, part, None)
        if not common or not isinstance(module, torch.nn.Module) or module is m.module:
            return None
        return module

    def _begun_here(self):
        """This thread's blocks begun and not yet ended: a block's end hook
        runs even when its begin raised (torch calls always_call hooks
        after any exception in the call, a pre-hook's included), and libmlo
        refuses the end of a block this thread did not begin (MLO_ESTATE):
        torch would only silence that with a warning."""
        begun = getattr(self._begun, "blocks", None)
        if begun is None:
            begun = self._begun.blocks = {}
        return begun

    def _block_begin(self, m, b, entries):
        try:
            m.comp.block_begin(b)  # compute after the block's copy (C8)
        except MloError as e:
            if m.streams or e.code != _ESTATE:
                raise
            # a block module called outside its component's forward on this
            # thread (a direct call, a recompute): it reads whatever its
            # tensors are bound to, as before progressive loads; where that
            # is a load still landing block by block, wait for all of it
            if m.comp.resident and not m.comp.load_done:
                self.pipeline.synchronize()
            # where another thread's forward is the component's last call
            # and has handed this block's memory to the next component (a
            # joined switch), what it is bound to is not its bytes: refused
            if m.comp.resident and any(e.nbytes and Component.device_status(e.handle) == _ESTATE
                                       for e in entries):
                raise MloStateError("%s: block %d was called outside its forward while that "
                                    "forward gave its memory to the next component (a joined "
                                    "switch); call it after the forward ends" % (m.name, b))
            return
        begun = self._begun_here()  # first: a binding below that raises still ends it
        begun[m.name, b] = begun.get((m.name, b), 0) + 1
        m.seen.add(b)
        if m.streams:
            for e in entries:  # the block's slot, until its end
                self._bind_entry(e, "device")

    def _block_end(self, m, b, entries):
        begun = self._begun_here()
        n = begun.get((m.name, b), 0)
        if not n:  # its begin raised, or was refused outside the forward: no end
            return
        if n == 1:
            del begun[m.name, b]
        else:
            begun[m.name, b] = n - 1
        try:
            m.comp.block_end(b)
        except MloError as e:
            if m.streams or e.code != _ESTATE:
                raise
            return
        if m.streams:
            for e in entries:  # a streamed block's slot is reused after this: its slab again
                self._bind_entry(e, "device")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        """`with enable_model_offload(pipe) as b:` ends as
        close_model_offload(pipe) does."""
        self.close()
        return False

    def close(self):
        """Gives the weights back to torch and frees libmlo's memory: every
        module's tensors become torch-owned CPU tensors holding their current
        values (writes included), the hooks go, the pipeline and platform
        are freed.  Idempotent; the Offload is unusable afterwards."""
        if self.closed:
            return
        pipe = self.pipe_ref() if self.pipe_ref is not None else None
        owned = pipe is not None and getattr(pipe, "_mlo_offload", None) is self
        if self.enabled:
            if owned:
                disable_model_offload(pipe)  # hooks, guards, and every write checked
            else:
                self.settle_and_check()
        else:
            self.pipeline.synchronize()  # no copy in flight under what is read below
        for m in self.managed:
            self.unhook(m)
            owns = {}
            for e in m.entries:
                cur = e.current()
                own = torch.empty(e.like.shape, dtype=e.like.dtype, device="cpu")
                if e.nbytes and cur is not None and cur.is_meta and e.source is not None:
                    _read_range(e.source[0], e.source[1], own)  # on disk: its file's bytes
                elif e.nbytes and cur is not None:
                    own.copy_(cur)
                if e.composite is None:
                    _set_tensor(e.owner, e.attr, e.is_param, own, e.places)
                    continue
                got = owns.setdefault(id(e.composite), {})
                got[e.path] = own
                if len(got) == len(e.composite.members):
                    _set_tensor(e.owner, e.attr, e.is_param, e.composite.build(got), e.places)
            m.bound = None
        self.managed, self.owner_of, self.enabled = [], {}, False
        _unguard_pipeline(self)
        if owned:
            del pipe._mlo_offload
        # No explicit free: a view of libmlo's memory taken before (a
        # state_dict, a .data) keeps its pipeline, and the finalizers free
        # it when the last one goes.  Pipeline and Components form a cycle:
        # collect it now, so with no such view the memory goes at once.
        self.pipeline = self.platform = None
        self.closed = True
        gc.collect()

    def settle_and_check(self):
        """Waits for every copy in flight (a sync point: disable, close), so
        every loaded component's device bytes can be read, then checks them
        all for writes (unless check_writes is off)."""
        self.pipeline.synchronize()
        for m in self.managed:
            if m.bound == "device":
                m.acquired_since_load = True
        if self.check_writes:
            self.check_writes_now()

    def restore(self):
        """After a failed enable: every module back on torch's own tensors."""
        for owner, attr, is_param, t, data, places in self._originals:
            if _is_wrapper(t):  # the tensor subclass itself, as it was
                for o, a in ((owner, attr),) + tuple(places):
                    (o._parameters if is_param else o._buffers)[a] = t
                continue
            # a parameter's data shares its original storage
            _set_tensor(owner, attr, is_param, data if is_param else t, places)
        self._originals = []


class _ExecutionDevice:
    """What diffusers' DiffusionPipeline._execution_device reads."""

    def __init__(self, device):
        self.execution_device = torch.device(device)


def _cuda_view(ptr, like, nbytes, keep=None, device="cuda"):
    """A CUDA tensor over a device block's bytes (no copy): the bytes as
    uint8 through __cuda_array_interface__, then viewed as the tensor's
    dtype and shape (bf16 and fp8 have no typestr of their own).  torch
    keeps the interface object, which keeps `keep` (the pipeline).  device
    is the block's own ("cuda:N"): asked for another, torch would copy."""
    if nbytes == 0 or not ptr:
        return torch.empty(like.shape, dtype=like.dtype, device=device)

    class _Iface:
        __cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                    "version": 3, "strides": None}

    iface = _Iface()
    iface.keep = keep
    return torch.as_tensor(iface, device=device).view(like.dtype).view(like.shape)


def _platform_spec(device):
    """The libmlo platform for what a torch user passes: None (the GPU torch
    sees, else the host stand-in, with a warning), "cpu" / torch.device
    ("cpu"), "cuda", "cuda:N", torch.device("cuda", N), or a libmlo spec
    ("host:capacity=4G", "cuda:0:stream=...")."""
    if device is None:
        if torch.cuda.is_available():
            device = "cuda"
        else:
            warnings.warn("mlo: torch sees no GPU: the weights go to libmlo's host platform, a "
                          "stand-in device in host memory (pass device= to choose)", stacklevel=4)
            return "host"
    if isinstance(device, torch.device):
        if device.type == "cpu":
            return "host"
        if device.type != "cuda":
            raise ValueError("device %s: mlo runs on cuda or the host platform" % device)
        device = "cuda" if device.index is None else "cuda:%d" % device.index
    if not isinstance(device, str):
        raise ValueError("device: %r is neither a str nor a torch.device" % (device,))
    if device == "cpu":
        return "host"
    parts = device.split(":", 2)
    if parts[0] == "cuda" and "stream=" not in device:
        # compute is torch's current stream: loads are ordered against it
        # (C8); the spec's other options (capacity=, ...) are kept
        if len(parts) > 1 and parts[1].isdigit():
            index, opts = parts[1], parts[2] if len(parts) > 2 else ""
        elif len(parts) > 1 and "=" not in parts[1]:
            raise ValueError("device %r: expected cuda, cuda:N or cuda[:N]:options" % device)
        else:
            index, opts = str(torch.cuda.current_device()), ":".join(parts[1:])
        stream = torch.cuda.current_stream(int(index)).cuda_stream
        return "cuda:%s:%sstream=%d" % (index, opts + "," if opts else "", stream)
    return device


_DIFFUSERS_OFFLOAD = ("enable_model_cpu_offload", "enable_sequential_cpu_offload",
                      "enable_group_offload")
# diffusers' hooks that cast, not offload (enable_layerwise_casting): the
# weights stay where they are, in their storage dtype, which mlo moves
_DIFFUSERS_CASTS = {"layerwise_casting", "peft_autocast_disable"}


def _foreign_offload(pipe, modules):
    """What offload hooks of diffusers' or accelerate's are on the pipeline's
    modules: a list of "name: how" strings."""
    found = []
    for name, module in modules:
        for sub in module.modules():
            hook = getattr(sub, "_hf_hook", None)
            if hook is not None and not isinstance(hook, _ExecutionDevice):
                kind = type(hook).__name__
                how = "enable_sequential_cpu_offload" if "AlignDevices" in kind or \
                    "Sequential" in kind else "enable_model_cpu_offload"
                found.append("%s: accelerate's %s (%s; pipe.remove_all_hooks() removes it)"
                             % (name, kind, how))
                break
            registry = getattr(sub, "_diffusers_hook", None)
            hooks = getattr(registry, "hooks", None) if registry is not None else None
            hooks = sorted(set(hooks or ()) - _DIFFUSERS_CASTS)
            if hooks:
                found.append("%s: diffusers' hooks %s (enable_group_offload; the model's "
                             "disable_group_offload() removes it)" % (name, ", ".join(hooks)))
                break
    return found


# diffusers' methods that write into the weights themselves: run with the
# offload paused (disable, write, enable), which writes back what they
# changed on the device and drops a streamed component's slots, so a
# block copied ahead of the write is never used.
_WEIGHT_WRITERS = ("fuse_lora", "unfuse_lora")


def _offload_paused(pipe, method):
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


def enable_model_offload(pipe, device=None, policy="strict", budget=0, reserve=0,
                         prefetch=True, check_writes=True, progressive=True, host_memory=None,
                         scratch_dir=None):
    """Model-level offload of a diffusers (or any) pipeline through libmlo.

    device: where compute runs: None (the GPU torch sees; the host stand-in
    with a warning when there is none), "cuda", "cuda:1", a torch.device,
    "cpu" (the host platform), or a libmlo spec ("host:capacity=4G").
    policy: "strict" (the specification: a DiT's forward evicts encoders and
    the other DiTs, an encoder's evicts the DiTs; VAEs stay) or "budget"
    (keep what fits in `budget` bytes, evict by next use, prefetch from the
    schedule libmlo learns from the first generation's calls).
    check_writes: writes into the weights while offloaded (a LoRA fuse,
    load_state_dict, p.data.mul_()) reach mlo's memory before any eviction
    (a fingerprint of each resident block at each switch; False skips it).
    progressive: a component whose blocks each have a module of their own
    (`blocks.3`) loads block by block once a forward has been seen to run
    every block's hooks, each block's compute then ordered after its own
    copy, so a switch waits for the first block, not the whole component
    (docs/streaming.md); False loads each whole.
    host_memory: host memory the weights may keep ("24G", or bytes; None:
    all of them).  Components declared from files (from_pretrained) that
    do not fit stay there, and each load reads them through a small pinned
    staging ring (docs/disk.md).  A pipeline already loaded into torch
    memory may be sent there too: each tensor is found in the safetensors
    files its model was loaded from (compared byte for byte), or written
    once into a scratch file in scratch_dir (the system's temporary folder
    by default; removed with the offload), with a warning, and torch's
    copies are freed and given back to the OS once enable has succeeded.
    Idempotent with the same arguments (C11); different ones raise MloError
    (EOWNED, C16).  On failure the modules are left as they were (C15).
    Returns the backend (pipe._mlo_offload)."""
    current = getattr(pipe, "_mlo_offload", None)
    host_budget = 0 if host_memory is None else parse_size(host_memory, "host_memory")
    args = (device, policy, budget, reserve, prefetch, host_budget)
    if current is not None and current.closed:
        current = None
    if current is not None:
        if current.settings != args or (current.check_writes, current.progressive) != (
                check_writes, progressive):
            raise MloOwnedError("offload is already enabled with other settings")
        if not current.enabled:
            _reenable(pipe, current)
        return current
    backend = Offload(device, policy, budget, reserve, prefetch, check_writes, progressive,
                      host_budget)
    backend.pipe_ref = weakref.ref(pipe)  # its progress bar settings
    scratch = None
    try:
        if isinstance(pipe, OffloadDelegate):
            pipe.mlo_enable_offload(backend)
            if not backend.enabled:
                backend.start()
        else:
            found = discover(pipe)
            foreign = _foreign_offload(pipe, [(n, mod) for n, mod, _ in found])
            if foreign:
                raise ValueError("the pipeline has another offload installed; remove it before "
                                 "mlo's: " + "; ".join(foreign))
            if host_budget:  # every tensor from a file, so any component may stay on disk
                scratch = _Scratch(scratch_dir)
                spilled, spilled_bytes = _find_loaded_files(backend, found, scratch, pipe)
                scratch.close()  # libmlo checks each range lies inside its file
                if spilled:
                    warnings.warn("mlo: host_memory: %d tensor(s), %.1f MiB, are in no file "
                                  "their model was loaded from (built in memory, or changed "
                                  "since: a fused LoRA; %s, ...): written once to %s for the "
                                  "disk tier to read" % (len(spilled), spilled_bytes / 2**20,
                                                         spilled[0], scratch.path),
                                  stacklevel=2)
            for name, module, role in found:
                backend.add_module(name, module, role)
            if not any(m.role == "dit" for m in backend.managed):
                raise ValueError("no DiT found (declare the components: "
                                 "SupportsComponentDiscovery)")
            backend.start()
            for m in backend.managed:
                backend.hook(m)
            _guard_pipeline(pipe, backend)
    except BaseException:
        for m in backend.managed:
            backend.unhook(m)
        backend.restore()
        if isinstance(pipe, OffloadDelegate) and backend.enabled:
            pipe.mlo_disable_offload(backend)
        if scratch is not None:
            scratch.remove()
        raise
    pipe._mlo_offload = backend
    backend.pipe_ref = weakref.ref(pipe)
    if scratch is not None:
        if scratch.path is not None:  # read by the libmlo pipeline as long as it lives
            weakref.finalize(backend.pipeline, scratch.remove)
        _give_back_freed_memory()  # torch's copies of what went to disk
    return backend


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


def _reenable(pipe, backend):
    backend.settle_and_check()  # writes made while disabled, before enable may evict
    for m in backend.managed:
        if m.streams and m.comp.resident:
            # its slots may hold blocks copied before a write into its slab
            # (made while disabled): drop them, the next forward reloads
            m.comp.evict()
            backend._bind(m, "host")
    backend.enable()
    if isinstance(pipe, OffloadDelegate):
        pipe.mlo_enable_offload(backend)
    else:
        for m in backend.managed:
            backend.hook(m)
        _guard_pipeline(pipe, backend)


def disable_model_offload(pipe):
    """Removes every hook and moves nothing (C14); idempotent (C11).  The
    weights stay in libmlo's memory, where the modules' tensors point: the
    backend stays on the pipeline, and enabling again reuses it."""
    backend = getattr(pipe, "_mlo_offload", None)
    if backend is None or not backend.enabled:
        return
    if isinstance(pipe, OffloadDelegate):
        pipe.mlo_disable_offload(backend)
    backend.settle_and_check()  # no copy in flight after disable, every write kept
    for m in backend.managed:
        backend.unhook(m)
    _unguard_pipeline(backend)
    backend.pipeline.disable()
    backend.enabled = False


def close_model_offload(pipe):
    """Ends mlo's hold on the pipeline: the weights go back to torch-owned
    CPU tensors (with every write made to them), the hooks go, and libmlo's
    pipeline and platform are freed at once.  The pipeline then runs as
    plain torch; enable_model_offload may be called again.  Idempotent."""
    backend = getattr(pipe, "_mlo_offload", None)
    if backend is not None:
        backend.close()


# -- from_pretrained: a pipeline whose weights torch never reads -----------------

_WEIGHT_NAMES = {"diffusers": "diffusion_pytorch_model", "transformers": "model"}


def _read_range(path, offset, out):
    """out's bytes from path at offset (a CPU tensor, filled in place)."""
    n = out.numel() * out.element_size()
    if not n:
        return out
    view = memoryview(out.view(-1).view(torch.uint8).numpy())
    with open(path, "rb") as f:
        f.seek(offset)
        got = f.readinto(view)
    if got != n:
        raise OSError("%s: %d bytes at %d, but the file ends after %d" % (path, n, offset, got))
    return out


def _safetensors_header(path):
    """{name: (dtype code, shape, absolute offset, nbytes)} of a
    .safetensors file: an 8-byte little-endian header length, the JSON
    header, then the data, which the offsets count from."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError("%s: not a safetensors file (shorter than its header length)" % path)
        n = struct.unpack("<Q", head)[0]
        size = os.fstat(f.fileno()).st_size
        if n > min(size - 8, 256 << 20):
            raise ValueError("%s: not a safetensors file (header of %d bytes)" % (path, n))
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            raise ValueError("%s: not a safetensors file (%s)" % (path, e)) from None
    out = {}
    for name, v in header.items():
        if name == "__metadata__":
            continue
        begin, end = v["data_offsets"]
        if not 0 <= begin <= end or 8 + n + end > size:
            raise ValueError("%s: tensor %r lies outside the file" % (path, name))
        out[name] = (v["dtype"], tuple(v["shape"]), 8 + n + begin, end - begin)
    return out


def _weight_files(folder, library, variant):
    """The safetensors files of a model folder (an index's shards, or one
    file), with the variant's when there are any: [paths]; [] with none."""
    base = _WEIGHT_NAMES[library]
    names = []
    if variant:
        names += [("%s.safetensors.index.%s.json" % (base, variant), True),
                  ("%s.%s.safetensors" % (base, variant), False)]
    names += [("%s.safetensors.index.json" % base, True), ("%s.safetensors" % base, False)]
    for i, (name, is_index) in enumerate(names):
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            continue
        if variant and i >= 2:
            warnings.warn("mlo: %s has no %s weights; its %s are read" % (folder, variant, name),
                          stacklevel=4)
        if not is_index:
            return [path]
        with open(path) as f:
            weight_map = json.load(f)["weight_map"]
        return [os.path.join(folder, shard) for shard in sorted(set(weight_map.values()))]
    return []


def _target_dtype(library, cls, name, file_dtype, torch_dtype):
    """The dtype diffusers / transformers give a tensor loaded from a file
    of file_dtype: the file's without torch_dtype; else torch_dtype for a
    floating one, float32 in the class's _keep_in_fp32_modules (diffusers:
    always; transformers: for float16, and its _strict list for bfloat16)."""
    if torch_dtype is None or torch_dtype == "auto" or not file_dtype.is_floating_point:
        return file_dtype
    parts = name.split(".")
    keep = []
    if library == "diffusers":
        keep = list(getattr(cls, "_keep_in_fp32_modules", None) or [])
    else:
        if torch_dtype == torch.float16:
            keep += list(getattr(cls, "_keep_in_fp32_modules", None) or [])
        if torch_dtype in (torch.float16, torch.bfloat16):
            keep += list(getattr(cls, "_keep_in_fp32_modules_strict", None) or [])
    return torch.float32 if any(k in parts for k in keep) else torch_dtype


class _Scratch:
    """A file holding the tensors no checkpoint file holds as the module
    wants them (a conversion, a buffer computed at init): written once,
    declared from like the checkpoint's, removed with the offload."""

    def __init__(self, folder):
        self.folder = folder
        self.path = None
        self.f = None
        self.bytes = 0

    def add(self, t):
        if self.f is None:
            fd, self.path = tempfile.mkstemp(prefix="mlo-materialized-", suffix=".bin",
                                             dir=self.folder)
            self.f = os.fdopen(fd, "wb")
        at = (self.f.tell() + 255) // 256 * 256
        self.f.seek(at)
        data = t.detach().contiguous().cpu()
        if data.numel():
            self.f.write(memoryview(data.view(-1).view(torch.uint8).numpy()))
        self.bytes += data.numel() * data.element_size()
        return self.path, at

    def close(self):
        if self.f is not None:
            self.f.close()

    def remove(self):
        self.close()
        if self.path is not None:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass


def _empty_module(library, cls, folder):
    """The model built from its config with its parameters on the meta
    device (accelerate's init_empty_weights; buffers computed at init are
    real)."""
    try:
        from accelerate import init_empty_weights
    except ImportError:
        raise ImportError("mlo.torch.from_pretrained builds the models empty with accelerate's "
                          "init_empty_weights: pip install accelerate") from None
    if library == "diffusers":
        config = cls.load_config(folder)
        with init_empty_weights():
            module = cls.from_config(config)
    else:
        config = cls.config_class.from_pretrained(folder)
        with init_empty_weights():
            module = cls._from_config(config)
        if hasattr(module, "tie_weights"):
            module.tie_weights()
    return module.eval()


def _declare_from_files(module, library, files, torch_dtype, scratch, what, bar=_NoBar()):
    """Every parameter and buffer of module as a meta tensor of the dtype
    diffusers would give it, and module._mlo_files {name: (path, offset)}
    for each of its names: its range in the checkpoint files, or in the
    scratch file where the file's bytes are not what the module holds (a
    conversion) or no file holds it (a buffer computed at init).  A
    parameter in no file is refused, as diffusers refuses it.  Returns
    (converted names, computed names)."""
    ranges = {}
    for path in files:
        ranges.update({k: (path,) + v for k, v in _safetensors_header(path).items()})
    prefix = getattr(module, "base_model_prefix", "") or ""
    names, places = {}, {}  # id(tensor) -> its names; each name -> (owner, attr, is_param)
    for is_param, named in ((True, module.named_parameters(remove_duplicate=False)),
                            (False, module.named_buffers(remove_duplicate=False))):
        for qname, t in named:
            if t is None:
                continue
            names.setdefault(id(t), (t, is_param, []))[2].append(qname)
            places[qname] = _resolve(module, qname) + (is_param,)
    out, converted, computed, missing = {}, [], [], []
    for t, is_param, qnames in names.values():
        found = None
        for q in qnames:
            for key in (q, prefix + "." + q if prefix else q,
                        q[len(prefix) + 1:] if prefix and q.startswith(prefix + ".") else q):
                if key in ranges:
                    found = (key, ranges[key])
                    break
            if found:
                break
        if found is None:
            if t.is_meta:
                missing.append(qnames[0])
                continue
            source, target = scratch.add(t), t.dtype  # computed at init (a rope table)
            computed.append(qnames[0])
        else:
            key, (path, code, shape, offset, nbytes) = found
            file_dtype = _TORCH_DTYPES.get(code)
            if file_dtype is None:
                raise ValueError("%s: %s holds %s as %s, which mlo does not move" %
                                 (what, path, key, code))
            if tuple(shape) != tuple(t.shape):
                raise ValueError("%s: %s is %s in %s, but the model built from its config has "
                                 "%s" % (what, key, list(shape), path, list(t.shape)))
            target = _target_dtype(library, type(module), qnames[0], file_dtype, torch_dtype)
            if target == file_dtype:
                source = (path, offset)
            else:  # materialized once, converted, into the scratch file
                raw = _read_range(path, offset, torch.empty(shape, dtype=file_dtype))
                source = scratch.add(raw.to(target))
                del raw
                converted.append(qnames[0])
                bar.update(nbytes)
        meta = torch.empty(t.shape, dtype=target, device="meta")
        for q in qnames:
            out[q] = source
            owner, attr, p = places[q]
            if p:
                getattr(owner, attr).data = meta
            else:
                owner._buffers[attr] = meta
    if missing:
        raise ValueError("%s: %d tensor(s) are in no weight file (%s): %s" %
                         (what, len(missing), ", ".join(os.path.basename(f) for f in files),
                          ", ".join(missing[:8]) + (", ..." if len(missing) > 8 else "")))
    module._mlo_files = out
    return converted, computed


def from_pretrained(pipeline_class, path, *, device=None, host_memory=None, policy="strict",
                    budget=0, reserve=0, scratch_dir=None, **kwargs):
    """pipeline_class.from_pretrained(path, **kwargs), offloaded by mlo,
    with no weight ever read into a torch tensor: each model with
    safetensors weights is built from its config on the meta device, each
    of its parameters and buffers is declared from its range in the files
    (a diffusers folder, sharded or not, `variant=`), and offload is
    enabled (enable_model_offload's device, policy, budget, reserve,
    host_memory).  With host_memory ("24G", bytes) the components that do
    not fit stay in their files and each load reads them (docs/disk.md);
    without it every slab is read into host memory once, at enable.

    `dtype=` (or its older name `torch_dtype=`) gives the dtypes diffusers
    would; a tensor whose file holds another dtype (a conversion), or that
    no file holds (a buffer computed at init), is materialized once into a
    scratch file in
    scratch_dir (the system's temporary folder by default; removed with the
    offload), with a warning naming how many and how large.  Models without
    safetensors weights, and the other components (tokenizers,
    schedulers), are loaded by diffusers.  The other keywords pass through
    to diffusers.  Returns the pipeline (its backend: pipe._mlo_offload)."""
    if not os.path.isdir(path):
        raise ValueError("mlo.torch.from_pretrained reads a local diffusers folder; %r is not "
                         "one (download it first: huggingface_hub.snapshot_download)" % (path,))
    if host_memory is not None:
        parse_size(host_memory, "host_memory")  # refused before anything is built
    index_path = os.path.join(path, "model_index.json")
    if not os.path.isfile(index_path):
        raise ValueError("%s has no model_index.json: not a diffusers pipeline folder" % path)
    with open(index_path) as f:
        index = json.load(f)
    variant = kwargs.get("variant")
    if "dtype" in kwargs and "torch_dtype" in kwargs:
        raise ValueError("from_pretrained: give dtype= or torch_dtype= (its older name), not both")
    # dtype= is diffusers' name now; torch_dtype= (deprecated there) still works
    torch_dtype = kwargs.get("dtype", kwargs.get("torch_dtype"))
    if isinstance(torch_dtype, dict):
        raise ValueError("from_pretrained: a dtype per component is not supported by mlo yet;"
                         " give one dtype")
    scratch = _Scratch(scratch_dir)
    built, notes = {}, []
    # the pipeline does not exist yet: diffusers' own switch alone turns it off
    bar = _LazyBar(None, "mlo: converting weights to %s" % str(torch_dtype).replace(
        "torch.", ""))
    try:
        for name, spec in index.items():
            if name.startswith("_") or name in kwargs or not isinstance(spec, list) or \
                    len(spec) != 2 or spec[0] not in _WEIGHT_NAMES:
                continue
            library, class_name = spec
            cls = getattr(importlib.import_module(library), class_name, None)
            if not isinstance(cls, type) or not issubclass(cls, torch.nn.Module):
                continue
            folder = os.path.join(path, name)
            files = _weight_files(folder, library, variant)
            if not files:
                notes.append("%s has no safetensors weights: diffusers loads it into memory"
                             % name)
                continue
            module = _empty_module(library, cls, folder)
            converted, computed = _declare_from_files(module, library, files, torch_dtype,
                                                      scratch, name, bar)
            if converted:
                notes.append("%s: %d tensor(s) converted from their files' dtype (%s, ...)"
                             % (name, len(converted), converted[0]))
            if computed:
                notes.append("%s: %d buffer(s) computed at init, in no file (%s, ...)"
                             % (name, len(computed), computed[0]))
            built[name] = module
        scratch.close()
        bar.close()
        if scratch.bytes:
            notes.append("%.1f MiB materialized once into %s" % (scratch.bytes / 2**20,
                                                                 scratch.path))
        if notes:
            warnings.warn("mlo: from_pretrained: " + "; ".join(notes), stacklevel=2)
        pipe = pipeline_class.from_pretrained(path, **built, **kwargs)
        backend = enable_model_offload(pipe, device=device, policy=policy, budget=budget,
                                       reserve=reserve, host_memory=host_memory)
        unmanaged = [n for n, mod in built.items() if all(m.module is not mod
                                                          for m in backend.managed)]
        for n in unmanaged:  # mlo does not move it (role "other"): torch holds its weights
            _load_from_files(built[n])
        if unmanaged:
            warnings.warn("mlo: from_pretrained: %s not offloaded (no DiT, encoder or VAE "
                          "role): read into torch memory" % ", ".join(unmanaged), stacklevel=2)
    except BaseException:
        bar.close()
        scratch.remove()
        raise
    if scratch.path is not None:
        # the libmlo pipeline reads it as long as it lives (a view of its
        # memory keeps it past close_model_offload)
        weakref.finalize(backend.pipeline, scratch.remove)
    return pipe


def _loaded_from(module):
    """The folder a loaded model was read from (diffusers' and
    transformers' config._name_or_path), or None."""
    config = getattr(module, "config", None)
    folder = getattr(config, "_name_or_path", None)
    if folder is None and isinstance(config, dict):
        folder = config.get("_name_or_path")
    return folder if isinstance(folder, str) and os.path.isdir(folder) else None


_COMPARE_CHUNK = 16 << 20  # bytes of a file compared with a tensor at once


def _file_holds(path, offset, data):
    """Whether the file has data's bytes (a contiguous CPU tensor) at offset."""
    want = np.frombuffer(memoryview(data.view(-1).view(torch.uint8).numpy()), dtype=np.uint8)
    buf = np.empty(min(len(want), _COMPARE_CHUNK), dtype=np.uint8)
    with open(path, "rb", buffering=0) as f:
        f.seek(offset)
        for at in range(0, len(want), _COMPARE_CHUNK):
            n = min(_COMPARE_CHUNK, len(want) - at)
            if f.readinto(memoryview(buf)[:n]) != n or \
                    not np.array_equal(buf[:n], want[at:at + n]):
                return False
    return True


def _find_loaded_files(backend, found, scratch, pipe=None):
    """For the disk tier over a pipeline already loaded into torch memory
    (enable_model_offload's host_memory): each tensor of each module, found
    in the safetensors files its model was loaded from (its name, dtype,
    shape and every byte the same), else written once into the scratch
    file, in backend.loaded_files, so that every component may be declared
    from files and the disk tier may leave any of them there.  Returns the
    names written to the scratch file and their bytes."""
    spilled, spilled_bytes, seen = [], 0, set()
    total = sum(t.numel() * t.element_size() for _, module, _ in found
                for named in (module.parameters(), module.buffers())
                for t in named if t is not None and not t.is_meta)
    bar = _progress_bar(pipe, "mlo: finding the weights in their files", total)
    try:
        for name, module, _ in found:
            got, names, nbytes = _find_module_files(name, module, scratch, seen, bar)
            backend.loaded_files[id(module)] = got
            spilled += names
            spilled_bytes += nbytes
    finally:
        bar.close()
    return spilled, spilled_bytes


def _find_module_files(name, module, scratch, seen, bar):
    """_find_loaded_files for one module: {name: (path, offset)}, the names
    written to the scratch file, their bytes."""
    ranges = {}
    folder = _loaded_from(module)
    if folder is not None:
        for f in sorted(os.listdir(folder)):
            if f.endswith(".safetensors"):
                path = os.path.join(folder, f)
                for k, v in _safetensors_header(path).items():
                    ranges.setdefault(k, []).append((path,) + v)
    prefix = getattr(module, "base_model_prefix", "") or ""
    out, spilled, spilled_bytes = {}, [], 0
    for named in (module.named_parameters(), module.named_buffers()):
        for qname, t in named:
            if t is None or t.is_meta or not t.numel() or _is_wrapper(t) or \
                    t.data_ptr() in seen:
                # no bytes, another component's (a reference: C6), or a tensor
                # subclass, whose inner tensors no file holds as they are
                continue
            seen.add(t.data_ptr())
            data = t.detach().contiguous()
            nbytes = data.numel() * data.element_size()
            keys = (qname, prefix + "." + qname if prefix else qname,
                    qname[len(prefix) + 1:] if prefix and qname.startswith(prefix + ".")
                    else qname)
            for path, code, shape, offset, _ in (c for k in dict.fromkeys(keys)
                                                 for c in ranges.get(k, ())):
                if _TORCH_DTYPES.get(code) == data.dtype and \
                        tuple(shape) == tuple(data.shape) and _file_holds(path, offset, data):
                    out[qname] = (path, offset)
                    break
            else:
                out[qname] = scratch.add(data)
                spilled.append("%s.%s" % (name, qname))
                spilled_bytes += nbytes
            bar.update(nbytes)
    return out, spilled, spilled_bytes


def _give_back_freed_memory():
    """What torch freed goes back to the OS: glibc keeps freed chunks of its
    heap (torch's CPU allocations below its mmap threshold) until trimmed."""
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (AttributeError, OSError):
        pass  # not glibc: its allocator gives back what it gives back


def _load_from_files(module):
    """Every meta tensor of module read from its range into torch memory."""
    files = module._mlo_files
    for is_param, named in ((True, module.named_parameters()), (False, module.named_buffers())):
        for qname, t in named:
            if t is not None and t.is_meta:
                own = _read_range(*files[qname], torch.empty(t.shape, dtype=t.dtype))
                owner, attr = _resolve(module, qname)
                _set_tensor(owner, attr, is_param, own)
