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
import os
import threading
import warnings
import weakref

import torch

from . import Component, MloError, Pipeline, Platform, _ESTATE, lib, role_from_class, role_guess

__all__ = ["enable_model_offload", "disable_model_offload", "close_model_offload",
           "SupportsComponentDiscovery", "OffloadDelegate", "Offload"]

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


class _Entry:
    """One tensor of a component: where it sits in the module tree, its
    dtype and shape (`like`, on the meta device: no bytes of torch's are
    kept), and the address it was last bound to."""
    __slots__ = ("owner", "attr", "is_param", "handle", "nbytes", "like", "name", "ptr",
                 "qname")

    def __init__(self, owner, attr, is_param, handle, nbytes, like, name):
        self.owner, self.attr, self.is_param = owner, attr, is_param
        self.handle, self.nbytes, self.like, self.name = handle, nbytes, like, name
        self.qname = name.split(".", 1)[1]
        self.ptr = None

    def current(self):
        """The tensor the module has in this place now."""
        return getattr(self.owner, self.attr) if self.is_param else \
            self.owner._buffers.get(self.attr)


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
        self.streams = False  # its blocks pass through device slots (block streaming)
        self.progressive = False  # it loads block by block, its blocks' hooks saying where
        self.may_progress = False  # each block has a module to hook: progressive once seen
        self.seen = set()  # blocks begun since its acquire (progressive is earned by these)
        self.blocks = {}  # block index -> (its module, its entries)
        self.pieces = []  # its entries by contiguous piece: what a fingerprint sums


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
                 progressive=True):
        self.settings = (device, policy, budget, reserve, prefetch)
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
                                    torch.empty(data.shape, dtype=data.dtype, device="meta"),
                                    "%s.%s" % (name, qname)))
            if t.numel():
                self.owner_of[key] = m
        self.managed.append(m)
        return m

    # -- binding ----------------------------------------------------------
    def _entry_view(self, e, where):
        """e's bytes in the slab ("host") or the device block ("device").  A
        streamed block's tensors have a device copy only between its
        block_begin and block_end: outside, "device" is their slab."""
        ptr = Component.host_data(e.handle) if where == "host" else \
            Component.device_ptr(e.handle)
        if where == "device" and not ptr and e.nbytes:
            where, ptr = "host", Component.host_data(e.handle)
        if where == "device" and self.caps["device_pointers"] and not self.caps[
                "host_addressable"]:
            return _cuda_view(ptr, e.like, e.nbytes, self.pipeline, self.torch_device)
        return _view(ptr, e.like, e.nbytes, self.pipeline)

    def _bind_entry(self, e, where):
        view = self._entry_view(e, where)
        if e.is_param:
            getattr(e.owner, e.attr).data = view
        else:
            e.owner._buffers[e.attr] = view
        e.ptr = view.data_ptr() if view.numel() else None

    def _bind(self, m, where, fresh=True):
        for e in m.entries:
            self._bind_entry(e, where)
        m.bound = where
        m.bound_ptr = self._first_device_ptr(m) if where == "device" else None
        if fresh:  # a new load (or none): unchecked until its forward has waited for it
            m.acquired_since_load = False

    # -- writes into the weights (defect 27.1) -----------------------------
    def _span_sum(self, entries, where):
        """The 64-bit sum of the 32-bit words from the first of these
        entries to the end of the last, in the slab ("host") or on the
        device: one reduction, read back.  None where one of them has no
        device copy (a streamed block outside its forward)."""
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
                like = torch.empty((n,), dtype=dtype, device="meta")
                v = _cuda_view(at, like, n * like.element_size(), self.pipeline,
                               self.torch_device) if cuda else \
                    _view(at, like, n * like.element_size(), self.pipeline)
                sums.append(int(torch.sum(v, dtype=torch.int64)))
        return tuple(sums)

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
            if m is skip or m.bound != "device" or m.reference is None:
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
            if any(d is not None and d != r for d, r in zip(now, m.reference)):
                with torch.no_grad():
                    loaded = [e for e in m.entries if e.nbytes and Component.device_ptr(e.handle)]
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
            if cur is None or not e.nbytes or cur.data_ptr() == e.ptr:
                continue
            if cur.dtype != e.like.dtype or tuple(cur.shape) != tuple(e.like.shape):
                raise MloError(-1, "%s was replaced by a %s %s tensor while offloaded (it is %s "
                               "%s): mlo cannot keep it; call disable_model_offload and enable "
                               "again (diffusers' VAE upcast, force_upcast, does this: run the "
                               "VAE in float32 or set vae.config.force_upcast = False)"
                               % (e.name, cur.dtype, tuple(cur.shape), e.like.dtype,
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
            raise MloError(-5, "mlo offload cannot run under CUDA graph capture: the graph "
                           "would replay without its loads and evictions; capture with the "
                           "offload disabled, or do not capture (torch.compile's "
                           "mode='reduce-overhead' captures)")
        index, handle = self.cuda_stream
        now = torch.cuda.current_stream(index).cuda_stream
        if now != handle:
            raise MloError(-5, "torch's current stream on cuda:%d is 0x%x, but offload was enabled "
                           "on stream 0x%x: loads are ordered against that one only; run the "
                           "pipeline on the stream it was enabled on, or enable inside the same "
                           "`with torch.cuda.stream(...)`" % (index, now, handle))

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
        if self.device_type != "cpu" and not hasattr(m.module, "_hf_hook"):
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
        self.enable()
        self._originals = []  # torch's own copies go: the slabs hold the weights now

    def enable(self):
        """libmlo's offload on with the settings (at start, and again after a
        disable); each component's blocks planned, its slab's fingerprint
        taken, every module bound where libmlo has its bytes."""
        device, policy, budget, reserve, prefetch = self.settings
        for m in self.managed:  # before enable's loads: they go block by block already
            # A forward must be seen to begin every block before loads go block
            # by block (release): hooks on a module torch never calls would
            # let compute read blocks still copying.
            m.may_progress = self.progressive and self._hookable_blocks(m) is not None
            m.progressive = m.progressive and m.may_progress
            m.comp.set_progressive(m.progressive)
        self.pipeline.enable(policy=policy, budget=budget, reserve=reserve, prefetch=prefetch)
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
                        raise MloError(-8, "'%s' streams, but the tensors of its block %d (%s, "
                                       "...) share no module to hook; give it a budget that "
                                       "holds it whole" % (m.name, b, entries[0].qname))
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
                raise MloError(_ESTATE, "%s: block %d was called outside its forward while that "
                               "forward gave its memory to the next component (a joined switch); "
                               "call it after the forward ends" % (m.name, b))
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
            for e in m.entries:
                cur = e.current()
                own = torch.empty(e.like.shape, dtype=e.like.dtype, device="cpu")
                if e.nbytes and cur is not None:
                    own.copy_(cur)
                if e.is_param:
                    getattr(e.owner, e.attr).data = own
                else:
                    e.owner._buffers[e.attr] = own
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
            if hooks:
                found.append("%s: diffusers' hooks %s (enable_group_offload or layerwise "
                             "casting; the model's disable_group_offload() removes group "
                             "offload)" % (name, ", ".join(sorted(hooks))))
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
                         prefetch=True, check_writes=True, progressive=True):
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
    Idempotent with the same arguments (C11); different ones raise MloError
    (EOWNED, C16).  On failure the modules are left as they were (C15).
    Returns the backend (pipe._mlo_offload)."""
    current = getattr(pipe, "_mlo_offload", None)
    args = (device, policy, budget, reserve, prefetch)
    if current is not None and current.closed:
        current = None
    if current is not None:
        if current.settings != args or (current.check_writes, current.progressive) != (
                check_writes, progressive):
            raise MloError(-13, "offload is already enabled with other settings")
        if not current.enabled:
            _reenable(pipe, current)
        return current
    backend = Offload(device, policy, budget, reserve, prefetch, check_writes, progressive)
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
            for name, module, role in found:
                backend.add_module(name, module, role)
            if not any(m.role == "dit" for m in backend.managed):
                raise ValueError("no DiT found (declare the components: SupportsComponentDiscovery)")
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
        raise
    pipe._mlo_offload = backend
    backend.pipe_ref = weakref.ref(pipe)
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
