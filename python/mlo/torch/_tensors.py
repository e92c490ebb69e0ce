"""mlo.torch's tensors: torch views over libmlo's memory (a slab, a device
block), the entry that says where each module tensor lives, tensor
subclasses taken apart into their inner tensors and built again, and the
one place a module's tensor is swapped (_set_tensor)."""
import ctypes
import warnings

import numpy as np
import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
           torch.float64: "F64", torch.int64: "I64", torch.int32: "I32", torch.int16: "I16",
           torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}
for _name, _code in (("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2")):
    if hasattr(torch, _name):
        _DTYPES[getattr(torch, _name)] = _code
_TORCH_DTYPES = {code: dtype for dtype, code in _DTYPES.items()}


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
                 "qname", "source", "places", "composite", "path", "managed")

    def __init__(self, owner, attr, is_param, handle, nbytes, like, name, source=None):
        self.owner, self.attr, self.is_param = owner, attr, is_param
        self.handle, self.nbytes, self.like, self.name = handle, nbytes, like, name
        self.qname = name.split(".", 1)[1]
        self.ptr = None
        self.source = source  # (path, offset) where it was declared from a file
        self.places = ()  # the other (owner, attr) holding the same tensor (tied)
        self.composite = None  # the _Composite it is an inner tensor of
        self.path = ()  # its place in that composite's __tensor_flatten__ tree
        self.managed = None  # its component's _Managed (_backend.py): where its device is

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


def _stored_bytes(t):
    """The bytes t holds: a tensor subclass's inner tensors', not the
    dequantized size it stands for."""
    if _is_wrapper(t):
        return sum(x.numel() * x.element_size() for _, x in _flatten(t)[1])
    return t.numel() * t.element_size()


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
