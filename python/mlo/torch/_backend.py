"""Offload: one libmlo pipeline over a pipeline's modules.  It declares
each module's tensors, binds them where libmlo holds their bytes, acquires
and releases around each forward, says where a forward is in its blocks,
and runs the life cycle (start, enable, close).  The hooks that call it are
_hooks.py's; the write check is _writes.py's, the blocks' calls
_blocks.py's."""
import contextlib
import gc
import logging
import threading

import torch

from .. import (Component, MloInvalidError, MloNotFoundError, MloStateError, Pipeline,
               Platform)
from .. import platform_spec_get, platform_spec_parts
from ._blocks import BlockPlan
from ._files import _read_range
from ._guards import _unguard_pipeline
from ._hooks import BlockHooks, CastHooks, ComponentHooks
from ._progress import _DiskLoadBar, _bar_config, _format_size, _log, _materialize_progress
from ._settings import _device_list, _platform_specs
from ._tensors import (_DTYPES, _Composite, _Entry, _cuda_view, _flatten, _is_wrapper,
                       _resolve, _set_tensor, _view)
from ._writes import WriteCheck


class _Managed:
    """One component: its module, its tensors' entries, where they are bound,
    and what its forward has shown of its blocks."""

    def __init__(self, name, module, role, comp):
        self.name, self.module, self.role, self.comp = name, module, role, comp
        self.entries = []
        self.bound = None  # "host", "device", or None (torch's own memory)
        self.bound_ptr = None
        self.reference = None  # the fingerprint of its slab (check_writes_now)
        self.acquired_since_load = False  # its device copy waited for by an acquire
        self.written_back = 0  # tensors written back to the slab (defect 27.1)
        self.hooks = []  # the hook objects on its modules (_hooks.py)
        self.streams = False  # its blocks pass through device slots (block streaming)
        self.progressive = False  # it loads block by block, its blocks' hooks saying where
        self.may_progress = False  # each block has a module to hook: progressive once seen
        self.seen = set()  # blocks begun since its acquire (progressive is earned by these)
        self.blocks = {}  # block index -> (its module, its entries)
        self.pieces = []  # its entries by contiguous piece: what a fingerprint sums
        self.device = 0  # the pipeline device libmlo placed it on (each enable says)


class Offload(WriteCheck, BlockPlan):
    """The backend behind enable_model_offload: one libmlo pipeline over a
    pipeline's modules.  Kept on the pipeline as ``pipe._mlo_offload``; its
    memory holds the modules' weights as long as the pipeline lives.
    settings: an OffloadSettings (what enable was asked for)."""

    def __init__(self, settings):
        self.settings = settings
        self.specs = _platform_specs(settings.device)
        # one libmlo platform per device; the first is where the caller's
        # tensors are (the pipeline's execution device)
        self.platforms = [Platform(spec) for spec in self.specs]
        self.platform = self.platforms[0]
        # per device: the CUDA stream compute is ordered on (C8), torch's
        # current one there at enable ((index, handle), None off CUDA), and
        # the torch device its block's views are on
        self.cuda_streams, self.torch_devices = [], []
        for spec, platform in zip(self.specs, self.platforms):
            stream, torch_device = None, "cpu"
            given = platform_spec_get(spec, "stream") if spec.startswith("cuda") else None
            if given is not None:
                stream = (platform_spec_parts(spec)[1] or 0, int(given, 0))
            if platform.name == "cuda":
                # torch's caching allocator holds freed blocks as reserved: mlo
                # counts them free and asks for them before an allocation fails
                index = stream[0] if stream else torch.cuda.current_device()
                torch_device = "cuda:%d" % index  # views on the block's own device
                platform.set_framework_cache(
                    reclaim=torch.cuda.empty_cache,
                    cached_bytes=lambda i=index: torch.cuda.memory_reserved(i) -
                    torch.cuda.memory_allocated(i))
            self.cuda_streams.append(stream)
            self.torch_devices.append(torch_device)
        # several torch devices: the hooks move a forward's tensors to its
        # component's device and its outputs back to the first
        self.moves = len(self.platforms) > 1
        self.caps = self.platform.caps()
        self.device_type = "cuda" if self.platform.name == "cuda" else "cpu"
        self.pipeline = Pipeline(self.platforms)
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
            e.places, e.managed = others, m
            m.entries.append(e)
            if t.numel():
                self.owner_of[key] = m
        self.declare_blocks(m)
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
        loaded_files = self.loaded_files.get(id(module), {})
        for path, x in leaves:
            dtype = _DTYPES.get(x.dtype)
            if dtype is None or x.device.type != "cpu":
                raise ValueError("%s.%s: its %s (a %s, inside a %s) is %s on %s, which mlo "
                                 "does not move" % (name, qname, ".".join(path),
                                                    type(x).__name__, type(t).__name__,
                                                    x.dtype, x.device))
            data = x.detach().contiguous()
            inner = "%s.%s" % (qname, ".".join(path))
            source = loaded_files.get(inner)  # written to a file: the disk tier may leave it
            if source is not None:
                handle = m.comp.add_tensor(inner, dtype, list(data.shape), buffer=not is_param,
                                           file=source[0], file_offset=source[1])
            else:
                handle = m.comp.add_tensor(inner, dtype, list(data.shape),
                                           data.data_ptr() if data.numel() else None,
                                           buffer=not is_param)
            e = _Entry(owner, attr, is_param, handle, Component.nbytes(handle),
                       torch.empty(data.shape, dtype=data.dtype, device="meta"),
                       "%s.%s" % (name, inner), source)
            e.places, e.composite, e.path, e.managed = others, composite, path, m
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
            return _cuda_view(ptr, e.like, e.nbytes, self.pipeline, self.torch_device_of(e.managed))
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

    def torch_device_of(self, m):
        """The torch device m's forward runs on and its block's views are on."""
        return self.torch_devices[m.device]

    # -- entry points -------------------------------------------------------
    def _check_stream(self, m):
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
        index, handle = self.cuda_streams[m.device]
        now = torch.cuda.current_stream(index).cuda_stream
        if now != handle:
            raise MloStateError("torch's current stream on cuda:%d is 0x%x, but offload was "
                                "enabled on stream 0x%x: loads are ordered against that one only; "
                                "run the pipeline on the stream it was enabled on, or enable "
                                "inside the same `with torch.cuda.stream(...)`" %
                                (index, now, handle))

    def acquire(self, m):
        if self.cuda_streams[m.device] is not None:
            self._check_stream(m)
        if self.check_writes:
            # an acquire may evict others (a switch; the budget policy's
            # prefetch); m itself only when it is not resident
            self.check_writes_now(skip=m if m.bound == "device" else None)
        with self._disk_bar(m):
            m.comp.acquire()
        held = self._held_here()  # first: a binding below that raises still releases it
        held[m.name] = held.get(m.name, 0) + 1
        self.sync_bindings()
        m.acquired_since_load = True  # the compute stream waits for its load (C8)

    def _disk_bar(self, m):
        """A progress bar for m's load from disk, where the disk tier keeps
        components in their files (host_memory) and m is loading or not
        resident: the acquire will wait for the reads."""
        if not self.settings.host_budget or (m.comp.resident and
                                             not m.comp.disk_progress()[1]):
            return contextlib.nullcontext()
        pipe = self.pipe_ref() if self.pipe_ref is not None else None
        return _DiskLoadBar(m.comp, _bar_config(pipe), "mlo: loading %s from disk" % m.name)

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

    @property
    def check_writes(self):
        return self.settings.check_writes

    @property
    def progressive(self):
        return self.settings.progressive

    def hook(self, m):
        """m's hook objects installed (_hooks.py): its forward's acquire and
        release, its blocks' begin and end, the rebinding after diffusers'
        layerwise casts."""
        for h in (ComponentHooks(self, m), BlockHooks(self, m), CastHooks(self, m)):
            m.hooks.append(h)
            h.install()

    def unhook(self, m):
        for h in reversed(m.hooks):
            h.remove()
        m.hooks = []

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
        budget = self.settings.policy == "budget"
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

    # -- life cycle -----------------------------------------------------------
    def start(self):
        """Materializes (the one copy into the slabs), rebinds every module
        to its slab, enables offload, binds what enable made resident.
        With a host budget, enable materializes: only the slabs that stay in
        host memory are filled (docs/disk.md)."""
        pipe = self.pipe_ref() if self.pipe_ref is not None else None
        end_progress = _materialize_progress(self.pipeline, _bar_config(pipe),
                                             "mlo: reading weights into host slabs")
        self.pin()
        try:
            if not self.settings.host_budget:
                self.pipeline.materialize()
                for m in self.managed:
                    self._bind(m, "host")
            self.enable()
        finally:
            end_progress()
        self._originals = []  # torch's own copies go: the slabs hold the weights now
        self.log_placement()

    def pin(self):
        """settings.place: each named component pinned to its device
        (mlo_component_set_device), before enable places the others.  A
        device is an index into device=, or one of its entries as given
        ("cuda:1", "host:capacity=1G", a torch.device).  MloNotFoundError
        for a name that is no component, MloInvalidError for a device that
        is not one of the pipeline's."""
        given = list(_device_list(self.settings.device))
        by_name = {m.name: m for m in self.managed}
        for name, dev in self.settings.place:
            m = by_name.get(name)
            if m is None:
                raise MloNotFoundError("place: no component %r (the components: %s)" %
                                       (name, ", ".join(sorted(by_name)) or "none"))
            index = dev
            if isinstance(dev, str):
                hits = [i for i, g in enumerate(given)
                        if dev == (str(g) if isinstance(g, torch.device) else g) or
                        dev == self.torch_devices[i] != "cpu"]
                if len(hits) != 1:
                    raise MloInvalidError(
                        "place: %s=%r %s of device=%r%s" % (
                            name, dev, "names devices %s" % hits if hits else "is none",
                            given, "; pin by index (0 .. %d)" % (len(given) - 1)))
                index = hits[0]
            elif isinstance(dev, bool) or not isinstance(dev, int):
                raise MloInvalidError("place: %s=%r is neither a device index nor a device "
                                      "of device=%r" % (name, dev, given))
            m.comp.set_device(index)

    def device_placement(self):
        """Which component libmlo placed on which device, and what it moves:
        {"devices": [{"index", "device" (as given), "platform" (libmlo's
        spec), "torch_device", "components" [names], "room_bytes",
        "device_bytes", "peak_device_bytes", "budget_bytes"}, ...],
        "components": {name: device index}, "pinned": {name: device index},
        "moved_bytes": per request as libmlo's placement model counts them,
        "one_device_bytes": the same with every component on device 0
        (both 0 with one device)}.  Peaks are since the last
        pipeline.reset_stats()."""
        given = list(_device_list(self.settings.device))
        where = {m.name: m.comp.device for m in self.managed}
        placed = self.pipeline.placement()
        devices = []
        for i, spec in enumerate(self.specs):
            st = self.pipeline.device_stats(i)
            devices.append({"index": i, "device": given[i], "platform": spec,
                            "torch_device": self.torch_devices[i],
                            "components": [n for n, d in where.items() if d == i],
                            "room_bytes": placed["room_bytes"][i] if
                            i < len(placed["room_bytes"]) else 0, **st})
        pinned = {name: where.get(name) for name, _ in self.settings.place}
        return {"devices": devices, "components": where, "pinned": pinned,
                "moved_bytes": placed["moved_bytes"],
                "one_device_bytes": placed["one_device_bytes"]}

    def placement(self):
        """Where each component lives now and why: [(name, role, bytes,
        where, why)], where is "device" ("device N" on a pipeline of several),
        "host slab" or "disk" (its slab left in its files by host_memory).
        device_placement() says which device each one is on."""
        policy, host_budget = self.settings.policy, self.settings.host_budget
        size = _format_size(host_budget)
        out = []
        for m in self.managed:
            on_disk = any(e.nbytes and not Component.host_data(e.handle) for e in m.entries)
            if m.comp.resident:
                where = "device" if len(self.platforms) == 1 else "device %d" % m.device
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
            _log.info("mlo: on %s: %s", " + ".join(self.specs), "; ".join(
                "%s (%s, %s): %s, %s" % (name, role, _format_size(nbytes), where, why)
                for name, role, nbytes, where, why in self.placement()))

    def enable(self):
        """libmlo's offload on with the settings (at start, and again after a
        disable); each component's blocks planned, its slab's fingerprint
        taken, every module bound where libmlo has its bytes."""
        s = self.settings
        for m in self.managed:  # before enable's loads: they go block by block already
            # A forward must be seen to begin every block before loads go block
            # by block (release): hooks on a module torch never calls would
            # let compute read blocks still copying.
            m.may_progress = self.progressive and self._hookable_blocks(m) is not None
            m.progressive = m.progressive and m.may_progress
            m.comp.set_progressive(m.progressive)
        self.pipeline.enable(policy=s.policy, budget=s.budget, reserve=s.reserve,
                             prefetch=s.prefetch, host_budget=s.host_budget)
        self.enabled = True
        for m in self.managed:  # where enable placed it (several devices)
            m.device = m.comp.device
        if s.policy == "budget":  # nothing declares the calls: learn them (docs/planner.md)
            self.pipeline.learn_schedule(True)
        for m in self.managed:
            self.plan_blocks(m)
        self.sync_bindings()

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
                from ._api import disable_model_offload  # _api imports this module
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
