"""test_torch.py — mlo.torch on real diffusers pipelines (tiny, random
weights, built in memory: tiny.py), CPU, host platform.

Needs torch, diffusers and transformers: several GB, so CI does not install
them (docs/python.md); there test_replay.py checks the binding against what
record.py wrote from these same runs.  Run here with
    MLO_LIBRARY=build/libmlo.so python3 python/tests/run.py test_torch
"""
import os
import sys
import unittest
import warnings

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mlo  # noqa: E402
import mlo.torch  # noqa: E402
import tiny  # noqa: E402

DEVICE = "host:capacity=64M"


def strict_need(backend):
    """The specification's peak: the VAEs with every encoder (after enable),
    or with the largest DiT."""
    b = {m.name: m.comp.bytes for m in backend.managed}
    vae = sum(b[m.name] for m in backend.managed if m.role == "vae")
    enc = sum(b[m.name] for m in backend.managed if m.role == "encoder")
    dit = max([b[m.name] for m in backend.managed if m.role == "dit"] or [0])
    return vae + max(enc, dit)


def in_mlo_memory(backend):
    """Every managed tensor's data is libmlo's (a slab or a device block)."""
    for m in backend.managed:
        for e in m.entries:
            t = getattr(e.owner, e.attr) if e.is_param else e.owner._buffers[e.attr]
            if e.nbytes and t.data_ptr() not in (mlo.Component.host_data(e.handle),
                                                 mlo.Component.device_ptr(e.handle)):
                return "%s.%s" % (m.name, e.attr)
    return None


class Watch:
    """Checks at every hook (each acquire) what the contract allows: the
    audit passes, a DiT runs with no encoder and no other DiT resident, an
    encoder with no DiT resident, and every tensor is bound where libmlo
    has its bytes."""

    def __init__(self, test, backend, strict=True):
        self.test, self.backend, self.calls, self.strict = test, backend, [], strict
        self.orig = backend.acquire
        backend.acquire = self.acquire

    def acquire(self, m):
        self.orig(m)
        b = self.backend
        self.calls.append(m.name)
        b.pipeline.audit()
        resident = {o.name for o in b.managed if o.comp.resident}
        if not self.strict:  # the budget policy keeps what fits: the audit said so
            pass
        elif m.role == "dit":
            bad = [o.name for o in b.managed if o is not m and o.role in ("dit", "encoder")
                   and o.name in resident]
            self.test.assertFalse(bad, "%s runs with %s resident" % (m.name, bad))
        if self.strict and m.role == "encoder":
            bad = [o.name for o in b.managed if o.role == "dit" and o.name in resident]
            self.test.assertFalse(bad, "%s runs with %s resident" % (m.name, bad))
        for o in b.managed:
            self.test.assertEqual(o.bound, "device" if o.comp.resident else "host", o.name)
        self.test.assertIsNone(in_mlo_memory(b))


class PipelineTests(unittest.TestCase):
    def setUp(self):
        warnings.simplefilter("ignore")

    def offloaded(self, name, **kw):
        build, run = tiny.PIPELINES[name]
        ref = np.asarray(run(build()))
        pipe = build()
        backend = mlo.torch.enable_model_offload(pipe, device=DEVICE, **kw)
        watch = Watch(self, backend, strict=kw.get("policy", "strict") == "strict")
        out = np.asarray(run(pipe))
        return ref, out, pipe, backend, watch, run

    def test_wan_identical_and_contract(self):
        ref, out, pipe, b, watch, _ = self.offloaded("wan")
        self.assertTrue(np.array_equal(ref, out), "offloaded frames differ")
        st = {m.name: m.comp.stats() for m in b.managed}
        # both experts ran, each evicted when the other or the encoder needed room
        self.assertIn("transformer", watch.calls)
        self.assertIn("transformer_2", watch.calls)
        self.assertFalse(next(m for m in b.managed if m.name == "transformer").comp.resident,
                         "the inactive DiT is still resident")
        self.assertEqual((st["vae"]["loads"], st["vae"]["evictions"]), (1, 0))
        ps = b.pipeline.stats()
        self.assertEqual(ps["d2h_bytes"], 0)
        self.assertLessEqual(ps["peak_device_bytes"], strict_need(b))
        self.assertEqual(ps["host_slab_bytes"], sum(m.comp.bytes for m in b.managed))

    def test_flux_two_encoders(self):
        ref, out, pipe, b, watch, _ = self.offloaded("flux")
        self.assertTrue(np.array_equal(ref, out), "offloaded image differs")
        self.assertIn("text_encoder", watch.calls)
        self.assertIn("text_encoder_2", watch.calls)
        roles = {m.name: m.role for m in b.managed}
        self.assertEqual(roles, {"vae": "vae", "text_encoder": "encoder",
                                 "text_encoder_2": "encoder", "transformer": "dit"})
        self.assertEqual(b.pipeline.stats()["d2h_bytes"], 0)

    def test_budget_policy_keeps_what_fits(self):
        ref, out, pipe, b, watch, run = self.offloaded("wan", policy="budget",
                                                       budget=8 << 20)
        self.assertTrue(np.array_equal(ref, out))
        b.pipeline.reset_stats()
        again = np.asarray(run(pipe))
        self.assertTrue(np.array_equal(ref, again))
        self.assertEqual(b.pipeline.stats()["h2d_bytes"], 0, "a pipeline that fits moved again")

    def test_disable_moves_nothing_and_is_idempotent(self):
        ref, out, pipe, b, watch, run = self.offloaded("wan")
        before = b.pipeline.stats()
        mlo.torch.disable_model_offload(pipe)
        mlo.torch.disable_model_offload(pipe)
        after = b.pipeline.stats()
        for k in ("h2d_bytes", "d2h_bytes", "loads", "evictions", "platform_calls"):
            self.assertEqual(before[k], after[k], k)
        for m in b.managed:
            self.assertFalse(m.module._forward_pre_hooks, m.name)
            self.assertNotIn("decode", m.module.__dict__)
        self.assertIs(mlo.torch.enable_model_offload(pipe, device=DEVICE), b)
        self.assertIs(mlo.torch.enable_model_offload(pipe, device=DEVICE), b)
        with self.assertRaises(mlo.MloError):
            mlo.torch.enable_model_offload(pipe, device=DEVICE, policy="budget")
        self.assertTrue(np.array_equal(ref, np.asarray(run(pipe))))

    def test_failing_enable_leaves_modules_as_they_were(self):
        build, run = tiny.PIPELINES["wan"]
        pipe = build()
        ref = np.asarray(run(pipe))
        ptrs = {n: p.data_ptr() for n, p in pipe.transformer.named_parameters()}
        with self.assertRaises(mlo.MloError):
            mlo.torch.enable_model_offload(pipe, device="host:capacity=4K")  # nothing fits
        self.assertEqual(ptrs, {n: p.data_ptr() for n, p in pipe.transformer.named_parameters()})
        self.assertFalse(pipe.transformer._forward_pre_hooks)
        self.assertFalse(hasattr(pipe, "_mlo_offload"))
        self.assertTrue(np.array_equal(ref, np.asarray(run(pipe))))


class Dit(torch.nn.Module):
    def __init__(self, shared_encoder=None):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        self.out = torch.nn.Linear(4, 4, bias=False)
        self.out.weight = self.proj.weight  # tied: one tensor, two names
        self.register_buffer("scale", torch.full((4,), 0.5))
        self.encoder_ref = shared_encoder  # a module of another component (C6)

    def forward(self, x):
        return self.out(self.proj(x)) * self.scale


class Enc(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.emb(x)


class Empty(torch.nn.Module):
    def forward(self, x):
        return x


class Declared(mlo.torch.SupportsComponentDiscovery):
    _dit_modules = ("dit",)
    _encoder_modules = ("enc", "empty")
    _vae_modules = ()

    def __init__(self):
        self.enc = Enc().eval()
        self.dit = Dit(self.enc).eval()
        self.empty = Empty()


class ModuleTests(unittest.TestCase):
    def test_tied_references_parameterless_and_declared(self):
        p = Declared()
        x = torch.randn(2, 4)
        with torch.no_grad():
            ref = p.dit(p.empty(p.enc(x)))
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            b = mlo.torch.enable_model_offload(p, device=DEVICE)
        self.assertFalse([x for x in w if "guessed" in str(x.message)], "declared, yet guessed")
        dit = next(m for m in b.managed if m.name == "dit")
        names = sorted(e.attr for e in dit.entries)
        # proj.weight (== out.weight), proj.bias, scale; nothing of the encoder
        self.assertEqual(names, ["bias", "scale", "weight"])
        self.assertIs(p.dit.out.weight, p.dit.proj.weight)
        with torch.no_grad():
            out = p.dit(p.empty(p.enc(x)))
        self.assertTrue(torch.equal(ref, out))
        empty = next(m for m in b.managed if m.name == "empty")
        self.assertEqual(empty.comp.stats()["platform_calls"], 0, "an empty component moved")
        self.assertEqual(p.dit.out.weight.data_ptr(), p.dit.proj.weight.data_ptr())
        mlo.torch.disable_model_offload(p)

    def test_delegate_is_called(self):
        calls = []

        class Pipe(mlo.torch.OffloadDelegate):
            def __init__(self):
                self.enc, self.dit = Enc().eval(), Dit().eval()

            def mlo_enable_offload(self, backend):
                calls.append("enable")
                for name, role in (("enc", "encoder"), ("dit", "dit")):
                    backend.add_module(name, getattr(self, name), role)
                backend.start()
                for m in backend.managed:
                    backend.hook(m)

            def mlo_disable_offload(self, backend):
                calls.append("disable")
                for m in backend.managed:
                    backend.unhook(m)

        p = Pipe()
        x = torch.randn(2, 4)
        with torch.no_grad():
            ref = p.dit(p.enc(x))
        b = mlo.torch.enable_model_offload(p, device=DEVICE)
        with torch.no_grad():
            self.assertTrue(torch.equal(ref, p.dit(p.enc(x))))
        mlo.torch.disable_model_offload(p)
        self.assertEqual(calls, ["enable", "disable"])
        self.assertEqual(b.pipeline.stats()["d2h_bytes"], 0)

    def test_acquire_context_manager(self):
        p = Declared()
        b = mlo.torch.enable_model_offload(p, device=DEVICE)
        enc = next(m for m in b.managed if m.name == "enc")
        dit = next(m for m in b.managed if m.name == "dit")
        with b.acquired(dit):
            self.assertTrue(dit.comp.resident)
            self.assertFalse(enc.comp.resident)  # the DiT's acquire evicted the encoder
            self.assertEqual(enc.bound, "host")
        mlo.torch.disable_model_offload(p)


if __name__ == "__main__":
    unittest.main()
