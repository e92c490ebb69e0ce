"""Writes into the weights while they are offloaded (defect 27.1): a
fingerprint of each slab, compared with the device bytes before anything
may be evicted, and replaced tensors copied into mlo's memory.  A mixin of
Offload (_backend.py), which it reads and binds through."""
import warnings

import torch

from .. import Component, MloInvalidError
from ._tensors import _SUM_CHUNK, _cuda_view, _host_word_sum


class WriteCheck:
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
                sums.append(self._cuda_word_sum(at, n, dtype, entries[0].managed) if cuda else
                            _host_word_sum(at, n, dtype))
        return tuple(sums)

    def _cuda_word_sum(self, at, n, dtype, m):
        """_host_word_sum of device memory: summed on the device in chunks
        (torch widens a chunk to int64 before it sums), read back once."""
        like = torch.empty((n,), dtype=dtype, device="meta")
        v = _cuda_view(at, like, n * like.element_size(), self.pipeline, self.torch_device_of(m))
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
        if m.bound == "device" and self.cuda_streams[m.device] is not None:
            # written outside m's hold: libmlo orders m's eviction after the
            # compute of its last hold only (issue 25.7), so the copies must
            # have landed before the acquire that may evict it
            torch.cuda.current_stream(self.cuda_streams[m.device][0]).synchronize()
        self._bind(m, m.bound, fresh=False)
        self._take_reference(m)
        m.written_back += len(replaced)
        warnings.warn("mlo: %d tensor(s) of '%s' were replaced (%s…); their values are now in "
                      "mlo's memory" % (len(replaced), m.name, replaced[0][0].name), stacklevel=4)

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
