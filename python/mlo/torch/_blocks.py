"""Blocks: where a component's forward is.  A component that streams (the
budget policy keeps only some of its blocks resident) or loads block by
block has a module per block whose hooks (_hooks.BlockHooks) say when its
block begins and ends (mlo_block_begin / mlo_block_end); this mixin of
Offload finds those modules, plans the pieces a fingerprint sums, and
makes the calls."""
import os

import torch

from .. import (BLOCK_EPILOGUE, Component, MloError, MloStateError, MloUnsupportedError,
                _ESTATE)


def _block_lists(module):
    """The ModuleLists of module that hold its repeated blocks, outermost
    first, in registration order (Flux's transformer_blocks, then its
    single_transformer_blocks): two or more modules of one class."""
    found = []

    def walk(mod):
        for child in mod.children():
            if isinstance(child, torch.nn.ModuleList) and len(child) >= 2 and \
                    len({type(c) for c in child}) == 1:
                found.append(child)
            else:
                walk(child)

    walk(module)
    return found


class BlockPlan:
    def declare_blocks(self, m):
        """A DiT's or encoder's blocks declared from its modules
        (mlo_tensor_set_block) where libmlo's names find none (blocks
        named `stack.3` rather than one of the layouts it reads): block i
        is the i-th child of its ModuleLists, in the order they run; the
        rest stays the prologue, or the epilogue where a name says so
        (proj_out).  Before materialize; a component whose names libmlo
        reads is left to them."""
        if m.role not in ("dit", "encoder") or m.comp.block_count:
            return
        block_of, n = {}, 0
        for blocks in _block_lists(m.module):
            for child in blocks:
                for sub in child.modules():
                    block_of.setdefault(id(sub), n)
                n += 1
        if not n:
            return
        named = [e.handle.block for e in m.entries]  # before any is declared: then none is
        for e, was in zip(m.entries, named):
            b = block_of.get(id(e.owner), BLOCK_EPILOGUE if was == BLOCK_EPILOGUE else None)
            if b is not None:
                e.handle.set_block(b)

    def plan_blocks(self, m):
        """Where m streams (the budget policy keeps only some of its blocks
        resident: docs/streaming.md), each block's module: the module its
        tensors' names share (`blocks.3` for blocks.3.attn1...), which
        _hooks.BlockHooks hooks to say where the forward is (a resident
        block's begin and end cost libmlo nothing).  Then the pieces a fingerprint sums: the
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
