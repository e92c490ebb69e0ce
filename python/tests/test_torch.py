"""test_torch.py — mlo.torch on real diffusers pipelines (tiny, random
weights, built in memory: tiny.py), CPU, host platform.

Needs torch, diffusers, transformers and peft: `make test` installs them
(scripts/torch-venv.sh) and ctest runs this as python_torch.  By hand:
    MLO_LIBRARY=build/libmlo.so .cache/torch-venv/bin/python python/tests/run.py test_torch
"""
import ctypes
import gc
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
    """Every managed tensor's data is libmlo's (a slab or a device block),
    or, for one the disk tier keeps in its files and has not loaded, none
    (the meta device)."""
    for m in backend.managed:
        for e in m.entries:
            t = e.current()
            where = (mlo.Component.host_data(e.handle), mlo.Component.device_ptr(e.handle))
            if t.is_meta and not any(where):
                continue
            if e.nbytes and (t.is_meta or t.data_ptr() not in where):
                return "%s.%s" % (m.name, e.attr)
    return None


class Watch:
    """Checks at every hook (each acquire) what the contract allows: the
    audit passes, a DiT runs with no encoder and no other DiT resident, an
    encoder with no DiT resident; and at each acquire and release, every
    tensor is bound where libmlo has its bytes."""

    def __init__(self, test, backend, strict=True):
        self.test, self.backend, self.calls, self.strict = test, backend, [], strict
        self.orig, self.orig_release = backend.acquire, backend.release
        backend.acquire = self.acquire
        backend.release = self.release

    def bound_where_libmlo_has_the_bytes(self):
        for o in self.backend.managed:
            self.test.assertEqual(o.bound, "device" if o.comp.resident else "host", o.name)
        self.test.assertIsNone(in_mlo_memory(self.backend))

    def release(self, m):
        """A release may evict (the budget policy prefetches there): what it
        evicted is bound to its slab at once, not at the next acquire, so no
        module points at a freed device block in between (issue 25.8)."""
        self.orig_release(m)
        self.bound_where_libmlo_has_the_bytes()

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
        self.bound_where_libmlo_has_the_bytes()


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


class Block(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.a, self.b = torch.nn.Linear(width, width), torch.nn.Linear(width, width)

    def forward(self, x):
        return x + self.b(torch.tanh(self.a(x)))


class Stacked(torch.nn.Module):
    """A DiT whose blocks are named as no layout libmlo reads (`stack.3`),
    so only its modules say where its blocks are."""

    def __init__(self, width=256, depth=6):
        super().__init__()
        self.embed = torch.nn.Linear(width, width)
        self.stack = torch.nn.ModuleList(Block(width) for _ in range(depth))
        self.proj_out = torch.nn.Linear(width, width)

    def forward(self, x):
        x = self.embed(x)
        for block in self.stack:
            x = block(x)
        return self.proj_out(x)


class StackedPipeline(mlo.torch.SupportsComponentDiscovery):
    _dit_modules = ("dit",)
    _encoder_modules = ("enc",)

    def __init__(self):
        torch.manual_seed(3)
        self.enc = Enc().eval()
        self.dit = Stacked().eval()


class Declared(mlo.torch.SupportsComponentDiscovery):
    _dit_modules = ("dit",)
    _encoder_modules = ("enc", "empty")
    _vae_modules = ()

    def __init__(self):
        self.enc = Enc().eval()
        self.dit = Dit(self.enc).eval()
        self.empty = Empty()


class SpecGrammarTests(unittest.TestCase):
    """The platform spec as libmlo reads and composes it (issue 40: the
    binding split specs by hand), and mlo.torch's CUDA device specs made
    with it: torch's current stream added, the user's options kept."""

    def test_the_library_grammar(self):
        self.assertEqual(mlo.platform_spec_parts("cuda:1:pinned=0"), ("cuda", 1))
        self.assertEqual(mlo.platform_spec_parts("host:capacity=1G"), ("host", None))
        self.assertEqual(mlo.platform_spec_parts("fault:kind=copy,nth=1,inner=cuda:2"),
                         ("cuda", 2))
        self.assertEqual(mlo.platform_spec_get("cuda:0:pinned=0,stream=94", "stream"), "94")
        self.assertIsNone(mlo.platform_spec_get("cuda:0:pinned=0", "stream"))
        self.assertEqual(mlo.platform_spec_compose("cuda:pinned=0", 1, "stream", 94),
                         "cuda:1:pinned=0,stream=94")
        self.assertEqual(mlo.platform_spec_compose("host:capacity=1G", None, "capacity", "2G"),
                         "host:capacity=2G")
        for bad in ("gpu:0", ""):
            with self.assertRaises(ValueError):
                mlo.platform_spec_parts(bad)
        with self.assertRaises(ValueError):
            mlo.platform_spec_compose("host", 1)  # the host takes no index

    def test_cuda_specs_get_the_current_stream(self):
        from unittest import mock
        from mlo.torch import _settings
        stream = mock.Mock(cuda_stream=94)
        with mock.patch("torch.cuda.current_device", return_value=1), \
                mock.patch("torch.cuda.current_stream", return_value=stream) as current:
            self.assertEqual(_settings._platform_spec("cuda"), "cuda:1:stream=94")
            self.assertEqual(_settings._platform_spec("cuda:pinned=0,capacity=4G"),
                             "cuda:1:pinned=0,capacity=4G,stream=94")
            self.assertEqual(_settings._platform_spec("cuda:2:chunk=8M"),
                             "cuda:2:chunk=8M,stream=94")
            current.assert_called_with(2)
            self.assertEqual(_settings._platform_spec(torch.device("cuda", 3)), "cuda:3:stream=94")
            # a stream given is the caller's: kept as it is
            self.assertEqual(_settings._platform_spec("cuda:0:stream=5"), "cuda:0:stream=5")
            with self.assertRaisesRegex(ValueError, "expected cuda, cuda:N"):
                _settings._platform_spec("cuda:x")


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

    def test_blocks_from_the_modules(self):
        """Blocks no name reveals are declared from the module's ModuleList
        (mlo_tensor_set_block): the DiT streams its blocks under a budget
        smaller than it, each block's module hooked, output identical."""
        pipe = StackedPipeline()
        x = torch.randn(4, 256, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            ref = pipe.dit(x)
        block = sum(p.numel() * 4 for p in pipe.dit.stack[0].parameters())
        b = mlo.torch.enable_model_offload(pipe, device=DEVICE, policy="budget",
                                           budget=block * 4)  # the DiT has 6 and two more
        m = next(m for m in b.managed if m.name == "dit")
        self.assertEqual(m.comp.block_count, 6)
        self.assertEqual(sorted(m.blocks), list(range(6)))
        self.assertEqual([m.blocks[i][0] for i in range(6)], list(pipe.dit.stack))
        self.assertTrue(m.streams)
        by_block = {}
        for e in m.entries:
            by_block.setdefault(mlo.Component.tensor_block(e.handle), []).append(e.qname)
        self.assertEqual(sorted(by_block[mlo.BLOCK_EPILOGUE]), ["proj_out.bias",
                                                                "proj_out.weight"])
        self.assertEqual(sorted(by_block[2]), ["stack.2.a.bias", "stack.2.a.weight",
                                               "stack.2.b.bias", "stack.2.b.weight"])
        for _ in range(2):
            with torch.no_grad():
                self.assertTrue(torch.equal(pipe.dit(x), ref))
        self.assertGreater(b.pipeline.stats()["block_loads"], 0)
        mlo.torch.close_model_offload(pipe)

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

    def test_a_failed_acquire_is_not_released(self):
        # torch runs the module's release hook (always_call) after its
        # acquire hook raised; the release must not drop a hold this thread
        # never took: with another thread holding the component, libmlo
        # would drop that thread's (evictable under its forward, and its
        # own release refused), and with none it refuses, which torch
        # silences with a warning.  The acquire's error reaches the caller
        # unchanged.
        import threading
        p = Declared()
        b = mlo.torch.enable_model_offload(p, device=DEVICE)
        dit = next(m for m in b.managed if m.name == "dit")
        inside, done, out = threading.Event(), threading.Event(), {}

        def hold():
            try:
                with b.acquired(dit):
                    inside.set()
                    done.wait(60)
            except Exception as e:  # noqa: BLE001 (reported below)
                out["error"] = e

        injected = mlo.MloError(-2, "injected: the acquire fails")

        def failing():
            raise injected

        for other in (True, False):
            a = threading.Thread(target=hold) if other else None
            if a:
                a.start()
                self.assertTrue(inside.wait(60))
            dit.comp.acquire = failing
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    with self.assertRaises(mlo.MloError) as cm:
                        p.dit(torch.zeros(1, 4))
            finally:
                del dit.comp.acquire
                done.set()
                if a:
                    a.join()
            self.assertIs(cm.exception, injected)
            self.assertFalse([w for w in caught if "always_call" in str(w.message)],
                             [str(w.message) for w in caught])
            self.assertNotIn("error", out)  # the other thread's hold was its own to release
            self.assertFalse(b._held_here())
            b.pipeline.audit()
        with torch.no_grad():
            p.dit(torch.zeros(1, 4))  # acquires and releases as before
        mlo.torch.disable_model_offload(p)


def rss_bytes():
    """Resident memory as the kernel counts it, after the collector and
    glibc have handed back what is free (malloc_trim): what is held, not
    what the allocator caches."""
    gc.collect()
    ctypes.CDLL(None).malloc_trim(0)
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def component_bytes(pipe):
    """Each component's bytes in mlo, {name: bytes}; the pipeline is left as
    it was (offloaded for the count, then closed)."""
    b = mlo.torch.enable_model_offload(pipe, device=DEVICE)
    sizes = {m.name: m.comp.bytes for m in b.managed}
    mlo.torch.close_model_offload(pipe)
    return sizes


def one_expert_budget(build):
    """A budget that holds the VAE, the encoder and one expert, not both."""
    sizes = component_bytes(build())
    return sizes["vae"] + sizes["text_encoder"] + sizes["transformer"]


def add_lora(pipe, seed=5, names=("transformer", "transformer_2")):
    """A LoRA on both experts with non-zero weights (peft's own layers,
    added after enable as a user loads one)."""
    from peft import LoraConfig
    torch.manual_seed(seed)
    for name in names:
        getattr(pipe, name).add_adapter(
            LoraConfig(r=2, lora_alpha=2, target_modules=["to_q", "to_v", "ffn.net.0.proj"],
                       init_lora_weights=False), adapter_name="style")


def cast_layerwise(pipe):
    """diffusers' layerwise casting on both experts: float8 storage, float32
    compute; the pipeline, for chaining."""
    for name in ("transformer", "transformer_2"):
        getattr(pipe, name).enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn,
                                                     compute_dtype=torch.float32)
    return pipe


class WritesTests(unittest.TestCase):
    """Writes into the weights while offloaded reach libmlo's memory (27.1)."""

    def setUp(self):
        warnings.simplefilter("ignore")

    def lora_runs(self, offload, safe):
        pipe = tiny.wan()
        if offload:
            b = mlo.torch.enable_model_offload(pipe, device=DEVICE)
        add_lora(pipe)
        outs = [np.asarray(tiny.run_wan(pipe))]
        pipe.fuse_lora(components=["transformer", "transformer_2"], safe_fusing=safe)
        outs += [np.asarray(tiny.run_wan(pipe)) for _ in range(2)]
        return outs, (b if offload else None)

    def test_fused_lora_is_kept(self):
        for safe in (False, True):  # in place (.data +=), and .data replaced
            ref, _ = self.lora_runs(False, safe)
            got, b = self.lora_runs(True, safe)
            for i, (r, g) in enumerate(zip(ref, got)):
                self.assertTrue(np.array_equal(r, g), "safe_fusing=%s: generation %d differs "
                                "from plain diffusers by %g" % (safe, i,
                                                                float(np.abs(r - g).max())))
            self.assertGreater(sum(m.written_back for m in b.managed), 0)
            self.assertIsNone(in_mlo_memory(b))
            b.pipeline.audit()

    def test_in_place_writes_resident_and_evicted(self):
        def edit(pipe):
            with torch.no_grad():
                pipe.transformer.proj_out.weight.data.mul_(1.5)  # .data: no version bump
                pipe.transformer_2.load_state_dict(
                    {k: v * 0.5 for k, v in pipe.transformer_2.state_dict().items()})
        ref_pipe = tiny.wan()
        tiny.run_wan(ref_pipe)
        edit(ref_pipe)
        ref = np.asarray(tiny.run_wan(ref_pipe))
        pipe = tiny.wan()
        b = mlo.torch.enable_model_offload(pipe, device=DEVICE)
        tiny.run_wan(pipe)  # transformer_2 is resident now, transformer evicted
        edit(pipe)
        for _ in range(2):
            self.assertTrue(np.array_equal(ref, np.asarray(tiny.run_wan(pipe))))
        self.assertGreater(sum(m.written_back for m in b.managed), 0)

    def test_no_write_no_write_back(self):
        # copies in flight (a slow, jittered link; the budget policy's
        # prefetch) are never read as writes: nothing is written back
        pipe = tiny.wan()
        ref = np.asarray(tiny.run_wan(tiny.wan()))
        b = mlo.torch.enable_model_offload(pipe, device="host:capacity=64M,bw=30M,jitter=1",
                                           policy="budget", budget=one_expert_budget(tiny.wan))
        for _ in range(3):
            self.assertTrue(np.array_equal(ref, np.asarray(tiny.run_wan(pipe))))
        self.assertGreater(b.pipeline.stats()["prefetches"], 0)
        self.assertEqual({m.name: m.written_back for m in b.managed},
                         {m.name: 0 for m in b.managed})

    def test_write_while_disabled_is_kept(self):
        def edit(pipe):
            w = pipe.text_encoder.encoder.block[0].layer[1].DenseReluDense.wo.weight
            w.data = w.data * 3  # replaced
            with torch.no_grad():
                pipe.transformer_2.proj_out.weight.data.mul_(0.5)  # in place
        ref_pipe = tiny.wan()
        tiny.run_wan(ref_pipe)
        edit(ref_pipe)
        ref = np.asarray(tiny.run_wan(ref_pipe))
        for policy, budget in (("strict", 0), ("budget", one_expert_budget(tiny.wan))):
            pipe = tiny.wan()
            mlo.torch.enable_model_offload(pipe, device=DEVICE, policy=policy, budget=budget)
            tiny.run_wan(pipe)
            mlo.torch.disable_model_offload(pipe)
            edit(pipe)
            mlo.torch.enable_model_offload(pipe, device=DEVICE, policy=policy, budget=budget)
            for _ in range(2):
                self.assertTrue(np.array_equal(ref, np.asarray(tiny.run_wan(pipe))), policy)

    def test_write_into_a_prefetched_component(self):
        # Loaded ahead and not run yet when written, then evicted before its
        # forward: its load has landed, so the check reads and keeps it.
        for how in ("in place", "replaced"):
            pipe = tiny.wan(num_layers=8, ffn_dim=4096)  # experts of 4.4 MB
            sizes = component_bytes(pipe)
            budget = sizes["transformer"] + sizes["vae"] + sizes["text_encoder"] // 2
            b = mlo.torch.enable_model_offload(pipe, device=DEVICE, policy="budget",
                                               budget=budget)
            tiny.run_wan(pipe)
            tiny.run_wan(pipe)
            m = {m.name: m for m in b.managed}
            self.assertTrue(m["text_encoder"].comp.resident)  # prefetched for the next prompt
            w = next(pipe.text_encoder.parameters())
            with torch.no_grad():
                if how == "in place":
                    w.data.add_(0.5)
                else:
                    w.data = w.data + 0.5
            expect = w.detach().clone()
            with b.acquired(m["transformer"]):  # needs the encoder's room first
                pass
            self.assertFalse(m["text_encoder"].comp.resident, how)
            self.assertTrue(torch.equal(next(pipe.text_encoder.parameters()).detach(), expect),
                            how)
            self.assertGreater(m["text_encoder"].written_back, 0, how)

    def test_another_dtype_is_refused(self):
        pipe = tiny.wan()
        mlo.torch.enable_model_offload(pipe, device=DEVICE)
        w = pipe.transformer.proj_out.weight
        w.data = w.data.to(torch.float64)
        with self.assertRaisesRegex(mlo.MloError, "proj_out.weight was replaced by a "
                                    "torch.float64"):
            tiny.run_wan(pipe)

    def test_pipe_to_is_guarded(self):
        ref = np.asarray(tiny.run_wan(tiny.wan()))
        pipe = tiny.wan()
        mlo.torch.enable_model_offload(pipe, device=DEVICE)
        with self.assertRaisesRegex(RuntimeError, r"to\(torch.bfloat16\) while mlo offloads"):
            pipe.to(torch.bfloat16)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            self.assertIs(pipe.to("cpu"), pipe)
        self.assertTrue(any("ignored: mlo places the weights" in str(x.message) for x in w))
        self.assertTrue(np.array_equal(ref, np.asarray(tiny.run_wan(pipe))))
        mlo.torch.disable_model_offload(pipe)
        self.assertNotIn("to", pipe.__dict__)  # the guard goes with the offload
        self.assertIs(pipe.to(torch.float32), pipe)

    def test_device_names_as_torch_users_pass_them(self):
        ref = np.asarray(tiny.run_wan(tiny.wan()))
        for device in ("cpu", torch.device("cpu"), None):
            pipe = tiny.wan()
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                b = mlo.torch.enable_model_offload(pipe, device=device)
            self.assertEqual(b.platform.name, "host", device)
            if device is None and not torch.cuda.is_available():
                self.assertTrue(any("torch sees no GPU" in str(x.message) for x in w))
            self.assertTrue(np.array_equal(ref, np.asarray(tiny.run_wan(pipe))), device)
        for bad in (torch.device("meta"), 3, "cuda:x"):
            with self.assertRaises((ValueError, mlo.MloError), msg=repr(bad)):
                mlo.torch.enable_model_offload(tiny.wan(), device=bad)

    def test_a_switched_cuda_stream_or_a_capture_is_refused(self):
        # The logic only (no GPU here): a backend enabled on stream 0x1234
        # asked to run while torch's current stream is another.
        pipe = tiny.wan()
        b = mlo.torch.enable_model_offload(pipe, device=DEVICE)
        b.cuda_streams[0] = (0, 0x1234)

        class Stream:
            def __init__(self, handle):
                self.cuda_stream = handle

        real = torch.cuda.current_stream, torch.cuda.is_current_stream_capturing
        try:
            torch.cuda.is_current_stream_capturing = lambda: False  # noqa: E731
            torch.cuda.current_stream = lambda index=None: Stream(0)  # noqa: E731
            with self.assertRaisesRegex(mlo.MloError, "is 0x0, but offload was enabled on "
                                        "stream 0x1234"):
                tiny.run_wan(pipe)
            torch.cuda.current_stream = lambda index=None: Stream(0x1234)  # noqa: E731
            tiny.run_wan(pipe)
            torch.cuda.is_current_stream_capturing = lambda: True  # noqa: E731
            with self.assertRaisesRegex(mlo.MloError, "CUDA graph capture"):
                tiny.run_wan(pipe)
        finally:
            torch.cuda.current_stream, torch.cuda.is_current_stream_capturing = real

    def test_other_offload_hooks_are_refused(self):
        pipe = tiny.wan()
        pipe.transformer.enable_group_offload(onload_device=torch.device("cpu"),
                                              offload_device=torch.device("cpu"),
                                              offload_type="block_level", num_blocks_per_group=1)
        with self.assertRaisesRegex(ValueError, "transformer: diffusers' hooks .*group_offload"):
            mlo.torch.enable_model_offload(pipe, device=DEVICE)
        self.assertFalse(hasattr(pipe, "_mlo_offload"))
        # layerwise casting beside group offload: the offload is still named
        pipe = cast_layerwise(tiny.wan())
        pipe.transformer_2.enable_group_offload(onload_device=torch.device("cpu"),
                                                offload_device=torch.device("cpu"),
                                                offload_type="block_level", num_blocks_per_group=1)
        with self.assertRaisesRegex(ValueError, "transformer_2: diffusers' hooks .*group_off"):
            mlo.torch.enable_model_offload(pipe, device=DEVICE)
        pipe = tiny.wan()
        mlo.torch.enable_model_offload(pipe, device=DEVICE)
        for method in ("enable_model_cpu_offload", "enable_sequential_cpu_offload"):
            with self.assertRaisesRegex(RuntimeError, "disable_model_offload"):
                getattr(pipe, method)()


class LearnedScheduleTests(unittest.TestCase):
    def setUp(self):
        warnings.simplefilter("ignore")

    def test_budget_policy_prefetches_from_the_second_generation(self):
        pipe = tiny.wan()
        ref = np.asarray(tiny.run_wan(tiny.wan()))
        budget = one_expert_budget(tiny.wan)
        b = mlo.torch.enable_model_offload(pipe, device=DEVICE, policy="budget", budget=budget)
        self.assertTrue(np.array_equal(ref, np.asarray(tiny.run_wan(pipe))))
        self.assertEqual(b.pipeline.stats()["prefetches"], 0)  # nothing learned yet
        self.assertTrue(np.array_equal(ref, np.asarray(tiny.run_wan(pipe))))
        runs = [(c.name, n) for c, n in b.pipeline.schedule()]
        # CFG: two encoder calls (prompt, negative), two per step on each expert
        self.assertEqual([name for name, _ in runs],
                         ["text_encoder", "transformer", "transformer_2", "vae"])
        self.assertEqual(runs[0][1], 2)
        self.assertEqual(runs[1][1] + runs[2][1], 2 * 4)
        b.pipeline.reset_stats()
        self.assertTrue(np.array_equal(ref, np.asarray(tiny.run_wan(pipe))))
        self.assertGreater(b.pipeline.stats()["prefetches"], 0)
        self.assertLessEqual(b.pipeline.stats()["peak_device_bytes"], budget)


class LifetimeTests(unittest.TestCase):
    """Weights held once, and nothing left when a pipeline goes (27.2)."""

    def setUp(self):
        warnings.simplefilter("ignore")

    def cycle(self, close):
        pipe = tiny.wan(ffn_dim=200000)
        mlo.torch.enable_model_offload(pipe, device="host:capacity=512M")
        tiny.run_wan(pipe, steps=2)
        if close:
            mlo.torch.close_model_offload(pipe)
        del pipe
        gc.collect()

    def test_rss_flat_over_cycles(self):
        for close in (False, True):
            self.cycle(close)  # warm: torch's and diffusers' own one-time allocations
            first = rss_bytes()
            for _ in range(5):
                self.cycle(close)
            self.assertLess(rss_bytes(), first * 1.05 + (8 << 20),
                            "close=%s: RSS grew from %d MiB to %d MiB over 5 cycles"
                            % (close, first >> 20, rss_bytes() >> 20))

    def test_weights_held_once(self):
        base = rss_bytes()
        pipe = tiny.wan(ffn_dim=200000)
        weights = sum(t.numel() * t.element_size() for name in ("transformer", "transformer_2",
                                                                 "text_encoder", "vae")
                      for t in getattr(pipe, name).state_dict().values())
        self.assertGreater(weights, 100 << 20)
        b = mlo.torch.enable_model_offload(pipe, device="host:capacity=512M")
        held = rss_bytes() - base
        self.assertLessEqual(held, weights * 1.05 + (16 << 20),
                             "%d MiB resident for %d MiB of weights" % (held >> 20, weights >> 20))
        slabs = b.pipeline.stats()["host_slab_bytes"]  # the weights, 256-byte aligned
        self.assertTrue(weights <= slabs < weights * 1.01, (slabs, weights))
        del b
        mlo.torch.close_model_offload(pipe)

    def test_close_gives_the_weights_back(self):
        ref = np.asarray(tiny.run_wan(tiny.wan()))
        pipe = tiny.wan()
        b = mlo.torch.enable_model_offload(pipe, device=DEVICE)
        tiny.run_wan(pipe)
        sd = pipe.transformer.state_dict()  # views of libmlo's memory, taken before
        mlo.torch.close_model_offload(pipe)
        mlo.torch.close_model_offload(pipe)  # idempotent
        self.assertTrue(b.closed)
        self.assertFalse(hasattr(pipe, "_mlo_offload"))
        for k, v in sd.items():  # still valid: they keep their memory
            self.assertTrue(torch.equal(v, pipe.transformer.state_dict()[k]), k)
        del sd
        self.assertTrue(np.array_equal(ref, np.asarray(tiny.run_wan(pipe))))
        with mlo.torch.enable_model_offload(pipe, device=DEVICE) as b:  # and again, scoped
            self.assertTrue(np.array_equal(ref, np.asarray(tiny.run_wan(pipe))))
        self.assertFalse(hasattr(pipe, "_mlo_offload"))
        self.assertTrue(b.closed)
        self.assertTrue(np.array_equal(ref, np.asarray(tiny.run_wan(pipe))))
        # the backend's own close() ends the offload as completely
        b = mlo.torch.enable_model_offload(pipe, device=DEVICE)
        b.close()
        self.assertFalse(hasattr(pipe, "_mlo_offload"))
        self.assertNotIn("to", pipe.__dict__)
        self.assertTrue(np.array_equal(ref, np.asarray(tiny.run_wan(pipe))))
        mlo.torch.enable_model_offload(pipe, device=DEVICE)
        self.assertTrue(np.array_equal(ref, np.asarray(tiny.run_wan(pipe))))

    def test_modules_outlive_the_pipeline(self):
        pipe = tiny.wan()
        mlo.torch.enable_model_offload(pipe, device=DEVICE)
        tiny.run_wan(pipe)
        dit = pipe.transformer
        w = dit.proj_out.weight.detach().clone()
        del pipe
        gc.collect()
        # the module's views keep libmlo's memory: reading them is safe
        self.assertTrue(torch.equal(dit.proj_out.weight.detach(), w))


def watch_landed(b, m, seen):
    """A hook inside each block of m (after mlo's: begun) that records in
    seen[(name, block)] whether the block's device bytes are its slab's."""
    def inside(i):
        def check(mod, args):
            _, entries = m.blocks[i]
            same = all(torch.equal(b._entry_view(e, "device"), b._entry_view(e, "host"))
                       for e in entries if e.nbytes)
            seen.setdefault((m.name, i), []).append(same)
        return check
    for i, (module, _) in m.blocks.items():
        module.register_forward_pre_hook(inside(i))


def failed_begin_is_not_ended(test, pipe, b, ref):
    """A block whose begin raises is not ended: torch runs the block's
    always_call end hook after its pre-hook raised, and mlo.torch used to
    call mlo_block_end there for a block this thread never began (which
    libmlo refuses with MLO_ESTATE, a refusal torch silences with a
    warning).  The begin's own error reaches the caller, unchanged and with
    no warning; the blocks begun before it are ended; the next generation
    is bit-identical (issue 44)."""
    m = next(m for m in b.managed if m.name == "transformer")
    block = sorted(m.blocks)[1]  # one begun after another, in the same forward
    calls = []
    injected = mlo.MloError(-2, "injected: block %d's begin fails" % block)
    begin, end = m.comp.block_begin, m.comp.block_end

    def failing_begin(i):
        if i == block and ("failed", block) not in calls:
            calls.append(("failed", block))
            raise injected
        begin(i)
        calls.append(("begun", i))

    def counted_end(i):
        calls.append(("end", i))
        end(i)

    m.comp.block_begin, m.comp.block_end = failing_begin, counted_end
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with test.assertRaises(mlo.MloError) as cm:
                tiny.run_wan(pipe)
    finally:
        del m.comp.block_begin, m.comp.block_end
    test.assertIs(cm.exception, injected)
    failed = calls.index(("failed", block))
    test.assertNotIn(("end", block), calls[failed:])  # the failed begin is never ended
    begun = [i for op, i in calls[:failed] if op == "begun"]
    ended = [i for op, i in calls[:failed] if op == "end"]
    test.assertEqual(sorted(ended), sorted(begun))  # what began before it did end
    test.assertIn(sorted(m.blocks)[0], ended)
    test.assertFalse([w for w in caught if "always_call" in str(w.message)],
                     [str(w.message) for w in caught])
    test.assertFalse(b._begun_here())  # this thread holds no block begun
    b.pipeline.audit()
    test.assertTrue(np.array_equal(ref, np.asarray(tiny.run_wan(pipe))))
    b.pipeline.audit()


def aborted_forward_leaves_weights(test, pipe, b, ref):
    """An exception in a DiT's forward (here a pre-hook on its block 1,
    once: the block is begun, its end hook ends it, the forward unwinds
    with blocks 0 and 1 run) leaves its weights as they were: the write
    check at its release (check_writes is on) reads only bytes that have
    landed, so it writes nothing back, and the next two generations are
    bit-identical.  A streamed DiT defers its later kept blocks' copies to
    the refills its forward never reached; the check read their uncopied
    device bytes as a write and copied them over the slab, and every later
    generation differed."""
    m = next(m for m in b.managed if m.name == "transformer")
    test.assertTrue(b.check_writes)

    class Stop(Exception):
        pass

    raised = []

    def once(mod, args):
        if not raised:
            raised.append(True)
            raise Stop

    hook = pipe.transformer.blocks[1].register_forward_pre_hook(once)
    try:
        test.assertRaises(Stop, tiny.run_wan, pipe)
    finally:
        hook.remove()
    test.assertEqual(raised, [True])
    test.assertFalse(b._begun_here())
    b.pipeline.audit()
    test.assertTrue(m.comp.resident)  # what its forward did not reach: still loading, or
    b.pipeline.synchronize()  # not issued; the synchronize issues and waits for them all
    test.assertTrue(m.comp.load_done)
    for i in range(2):
        test.assertTrue(np.array_equal(ref, np.asarray(tiny.run_wan(pipe))), "generation %d" % i)
        test.assertEqual({o.name: o.written_back for o in b.managed},
                         {o.name: 0 for o in b.managed})
        b.pipeline.audit()


class ProgressiveTests(unittest.TestCase):
    """A component whose blocks each have a module of their own loads block
    by block (docs/streaming.md, "Progressive loads"): its blocks' hooks
    order each block's compute after that block's copy.  Over a slow,
    jittered link, frames stay bit-identical, every block computes from its
    landed bytes, and the same bytes move as with whole loads."""

    def setUp(self):
        warnings.simplefilter("ignore")

    def run_with(self, progressive):
        build = lambda: tiny.wan(num_layers=6, ffn_dim=2048)  # noqa: E731
        ref = np.asarray(tiny.run_wan(build()))
        pipe = build()
        b = mlo.torch.enable_model_offload(pipe, device="host:capacity=64M,bw=30M,jitter=1",
                                           progressive=progressive)
        seen = {}
        for m in b.managed:
            if m.role in ("dit", "encoder"):  # (the VAE's blocks share no module each)
                self.assertEqual(m.may_progress, progressive, m.name)
                self.assertFalse(m.progressive)  # earned by a forward that runs every block
                self.assertFalse(m.streams)
                if progressive:
                    self.assertEqual(len(m.blocks), m.comp.block_count, m.name)
                    watch_landed(b, m, seen)
        for _ in range(3):
            self.assertTrue(np.array_equal(ref, np.asarray(tiny.run_wan(pipe))))
            b.pipeline.audit()
        for m in b.managed:
            if m.role in ("dit", "encoder"):
                self.assertEqual(m.progressive, progressive, m.name)
                self.assertEqual(m.comp.stream_info()["progressive"], int(progressive))
        st = b.pipeline.stats()
        mlo.torch.disable_model_offload(pipe)
        return st, seen

    def test_block_called_outside_its_forward(self):
        # a block module run on its own, outside its component's forward (a
        # direct call): as without progressive loads, it runs, unordered
        pipe = tiny.wan(num_layers=2)
        b = mlo.torch.enable_model_offload(pipe, device=DEVICE)
        tiny.run_wan(pipe)
        m = next(m for m in b.managed if m.name == "text_encoder")
        self.assertTrue(m.may_progress)
        block = m.blocks[0][0]
        hidden = torch.zeros(1, 3, pipe.text_encoder.config.d_model)
        with torch.no_grad():
            block(hidden)
        self.assertRaises(mlo.MloError, mlo.torch.enable_model_offload, pipe, device=DEVICE,
                          progressive=False)  # other settings: refused, not reused (C16)
        mlo.torch.disable_model_offload(pipe)

    def test_block_called_while_another_thread_runs_the_forward(self):
        # Thread A's forward pauses inside block 0 of a progressive residency
        # whose later blocks are still copying over a slow link; this thread
        # calls block 5 directly: it runs (not its forward: no error) and
        # reads landed bytes (mlo.torch waits for the load).
        import threading
        pipe = tiny.wan(num_layers=6, ffn_dim=20000)
        b = mlo.torch.enable_model_offload(pipe, device="host:capacity=256M,bw=5M,jitter=1")
        tiny.run_wan(pipe, steps=2)  # earns progressive
        m = next(m for m in b.managed if m.name == "transformer")
        self.assertTrue(m.progressive)
        inside, done, seen = threading.Event(), threading.Event(), {}

        def pause(mod, args):
            if threading.current_thread() is not threading.main_thread() and not inside.is_set():
                inside.set()
                done.wait(60)

        class Stop(Exception):
            pass

        def check(mod, args):
            if threading.current_thread() is threading.main_thread():
                seen["landed"] = all(
                    torch.equal(b._entry_view(e, "device"), b._entry_view(e, "host"))
                    for e in m.blocks[5][1] if e.nbytes)
                raise Stop
        hooks = [pipe.transformer.blocks[0].register_forward_pre_hook(pause),
                 pipe.transformer.blocks[5].register_forward_pre_hook(check)]
        a = threading.Thread(target=lambda: tiny.run_wan(pipe, steps=2))
        a.start()
        try:
            self.assertTrue(inside.wait(120))
            self.assertRaises(Stop, pipe.transformer.blocks[5], torch.zeros(1))
        finally:
            done.set()
            a.join()
            for h in hooks:
                h.remove()
        self.assertTrue(seen["landed"])
        mlo.torch.close_model_offload(pipe)

    def progressive_case(self, check):
        """A two-block Wan offloaded, run once so that its transformer
        earns progressive loads (its blocks' hooks begin and end them), then
        check(self, pipe, backend, plain diffusers' latents)."""
        build = lambda: tiny.wan(num_layers=2)  # noqa: E731
        ref = np.asarray(tiny.run_wan(build()))
        pipe = build()
        b = mlo.torch.enable_model_offload(pipe, device=DEVICE)
        tiny.run_wan(pipe)
        self.assertTrue(next(m for m in b.managed if m.name == "transformer").progressive)
        check(self, pipe, b, ref)
        mlo.torch.close_model_offload(pipe)

    def test_a_failed_begin_is_not_ended(self):
        self.progressive_case(failed_begin_is_not_ended)

    def test_an_aborted_forward_leaves_the_weights(self):
        # a progressive load issues every block's copy at its acquire, none
        # deferred: what its forward did not reach lands all the same
        self.progressive_case(aborted_forward_leaves_weights)

    def test_blocks_wait_for_their_own_copies(self):
        prog, seen = self.run_with(True)
        whole, _ = self.run_with(False)
        # every block of both experts and of the encoder ran (the encoder's
        # one block is encoder.block.0, not the ModuleList inside it)
        self.assertEqual(len(seen), 12 + 1)
        self.assertTrue(all(all(v) and len(v) >= 3 for v in seen.values()),
                        "a block computed before its bytes landed: %s" % seen)
        self.assertEqual(prog["h2d_bytes"], whole["h2d_bytes"])
        self.assertGreater(prog["copy_calls"], whole["copy_calls"])  # a copy per block


class JoinedTests(unittest.TestCase):
    """The budget policy with prefetch, on a budget holding one expert: the
    expert switch is joined (docs/streaming.md, "The joined switch"): in
    the first expert's last call, the second's copies go into the blocks it
    has run, over a slow, jittered link."""

    def setUp(self):
        warnings.simplefilter("ignore")

    def build(self):
        return tiny.wan(num_layers=6, ffn_dim=2048)

    def test_expert_switch_joined_identical(self):
        ref = np.asarray(tiny.run_wan(self.build()))
        pipe = self.build()
        budget = one_expert_budget(self.build)
        b = mlo.torch.enable_model_offload(pipe, device="host:capacity=64M,bw=30M,jitter=1",
                                           policy="budget", budget=budget)
        seen = {}
        for m in b.managed:
            if m.role == "dit":
                watch_landed(b, m, seen)
        for _ in range(3):  # learned from the first, progressive from its forwards
            self.assertTrue(np.array_equal(ref, np.asarray(tiny.run_wan(pipe))))
            b.pipeline.audit()
        joined = {m.name: m.comp.stats()["joined_loads"] for m in b.managed}
        self.assertGreaterEqual(joined["transformer_2"], 1, joined)
        self.assertTrue(all(all(v) for v in seen.values()),
                        "a block computed before its bytes landed: %s" % seen)
        self.assertLessEqual(b.pipeline.stats()["peak_device_bytes"], budget)
        mlo.torch.close_model_offload(pipe)

    def test_block_called_while_its_memory_goes(self):
        # Thread A's generation pauses in the first expert's last call, its
        # first blocks ended and their memory going to the second expert;
        # this thread calls block 0 directly: refused, not computed from the
        # second expert's bytes.
        import threading
        ref = np.asarray(tiny.run_wan(self.build()))
        pipe = self.build()
        b = mlo.torch.enable_model_offload(pipe, device="host:capacity=64M,bw=30M",
                                           policy="budget", budget=one_expert_budget(self.build))
        for _ in range(2):  # the schedule learned, progressive earned
            tiny.run_wan(pipe)
        calls = dict((c.name, n) for c, n in b.pipeline.schedule())["transformer"]
        inside, done, count, out = threading.Event(), threading.Event(), [0], {}

        def pause(mod, args):
            if threading.current_thread() is threading.main_thread():
                return
            count[0] += 1
            if count[0] == calls:  # the expert's last call, blocks 0-4 ended
                inside.set()
                done.wait(60)

        hook = pipe.transformer.blocks[5].register_forward_pre_hook(pause)
        a = threading.Thread(target=lambda: out.setdefault("frames", tiny.run_wan(pipe)))
        a.start()
        try:
            self.assertTrue(inside.wait(120))
            with self.assertRaises(mlo.MloError) as cm:
                pipe.transformer.blocks[0](torch.zeros(1))
            self.assertIn("joined switch", str(cm.exception))
        finally:
            done.set()
            a.join()
            hook.remove()
        self.assertTrue(np.array_equal(ref, np.asarray(out["frames"])))
        second = next(m for m in b.managed if m.name == "transformer_2")
        self.assertGreaterEqual(second.comp.stats()["joined_loads"], 1)
        mlo.torch.close_model_offload(pipe)


class StreamTests(unittest.TestCase):
    """A DiT larger than its budget streams its blocks through device slots
    (docs/streaming.md), each block module hooked to say where the forward
    is: frames bit-identical, each streamed block computed from its slot."""

    def setUp(self):
        warnings.simplefilter("ignore")

    def streamed(self):
        build = lambda: tiny.wan(num_layers=8, ffn_dim=4096)  # noqa: E731
        ref = np.asarray(tiny.run_wan(build()))
        pipe = build()
        sizes = component_bytes(pipe)
        budget = sizes["vae"] + sizes["text_encoder"] + sizes["transformer"] * 6 // 10
        b = mlo.torch.enable_model_offload(pipe, device=DEVICE, policy="budget", budget=budget)
        return ref, pipe, b, budget

    def test_streamed_dit_identical_and_from_its_slots(self):
        ref, pipe, b, budget = self.streamed()
        seen = {}

        def inside(m, i):  # a hook on a module inside block i: the block is begun
            def check(mod, args):
                _, entries = m.blocks[i]
                ptrs = [(e.current().data_ptr(), mlo.Component.device_ptr(e.handle))
                        for e in entries if e.nbytes]
                seen.setdefault((m.name, i), []).append(all(p == d and d for p, d in ptrs))
            return check

        for m in b.managed:
            if m.role == "dit":
                self.assertTrue(m.streams, m.name)
                info = m.comp.stream_info()
                self.assertGreater(info["streamed_blocks"], 0)
                self.assertEqual(len(m.blocks), info["blocks"])
                for i, (module, _) in m.blocks.items():
                    module.attn1.register_forward_pre_hook(inside(m, i))
        for _ in range(3):
            self.assertTrue(np.array_equal(ref, np.asarray(tiny.run_wan(pipe))))
            self.assertIsNone(in_mlo_memory(b))  # between forwards: slabs or resident blocks
            b.pipeline.audit()
        st = b.pipeline.stats()
        self.assertGreater(st["block_loads"], 0)
        self.assertLessEqual(st["peak_device_bytes"], budget)
        self.assertEqual(st["d2h_bytes"], 0)
        self.assertEqual(len(seen), 16)  # every block of both experts ran
        self.assertTrue(all(all(v) for v in seen.values()),
                        "a block computed from memory other than its device copy: %s" % seen)

    def test_compiled_transformers_stream(self):
        """Both experts compiled (torch.compile, its eager backend: dynamo's
        tracing without code generation) and streamed: the hooks run
        outside the graph (torch.compiler.disable), the frames are the
        same, and dynamo never traces into mlo (traced, each tensor swap
        recompiled the graph until dynamo gave up)."""
        ref, pipe, b, budget = self.streamed()
        inside = []
        for name in ("acquire", "_block_begin", "_bind_entry"):
            def record(*a, __fn=getattr(b, name), **k):
                inside.append(torch.compiler.is_compiling())
                return __fn(*a, **k)
            setattr(b, name, record)
        for name in ("transformer", "transformer_2"):
            getattr(pipe, name).compile(backend="eager")
        for _ in range(2):
            self.assertTrue(np.array_equal(ref, np.asarray(tiny.run_wan(pipe))))
            b.pipeline.audit()
        self.assertTrue(inside)
        self.assertFalse(any(inside), "a hook was traced by dynamo")
        self.assertGreater(b.pipeline.stats()["block_loads"], 0)

    def test_a_failed_begin_is_not_ended(self):
        ref, pipe, b, _ = self.streamed()  # check_writes on
        self.assertTrue(next(m for m in b.managed if m.name == "transformer").streams)
        failed_begin_is_not_ended(self, pipe, b, ref)
        self.assertEqual(sum(m.written_back for m in b.managed), 0)
        mlo.torch.close_model_offload(pipe)

    def test_an_aborted_forward_leaves_the_weights(self):
        ref, pipe, b, _ = self.streamed()
        self.assertTrue(next(m for m in b.managed if m.name == "transformer").streams)
        aborted_forward_leaves_weights(self, pipe, b, ref)
        mlo.torch.close_model_offload(pipe)

    def test_the_vae_joins_a_tight_budget(self):
        # A budget that leaves less beside the streamed expert's footprint
        # than the VAE: the last expert's switch to the VAE joins, its
        # copies going into the expert's ended kept blocks
        # (docs/streaming.md, "The prompt's cycle"); frames bit-identical.
        build = lambda: tiny.wan(num_layers=8, ffn_dim=4096)  # noqa: E731
        ref = np.asarray(tiny.run_wan(build()))
        probe = build()  # the streamed expert's footprint at 60% of it
        sizes = component_bytes(probe)
        b = mlo.torch.enable_model_offload(probe, device=DEVICE, policy="budget",
                                           budget=sizes["transformer"] * 6 // 10)
        dit = next(m for m in b.managed if m.name == "transformer_2")
        footprint = dit.comp.stream_info()["device_bytes"]
        mlo.torch.close_model_offload(probe)
        pipe = build()
        budget = footprint + sizes["vae"] // 3  # the VAE does not fit beside it
        b = mlo.torch.enable_model_offload(pipe, device=DEVICE, policy="budget", budget=budget)
        for _ in range(3):
            self.assertTrue(np.array_equal(ref, np.asarray(tiny.run_wan(pipe))))
            b.pipeline.audit()
        vae = next(m for m in b.managed if m.name == "vae")
        self.assertEqual(vae.comp.stats()["joined_loads"], 2)  # from the second generation
        self.assertLessEqual(b.pipeline.stats()["peak_device_bytes"], budget)

    def test_one_dit_written_between_generations(self):
        # One DiT (Wan2.1's shape): it stays resident between generations,
        # its slots filled ahead with blocks copied before the write.
        from diffusers import WanPipeline

        def build():
            p = tiny.wan(num_layers=8, ffn_dim=4096)
            return WanPipeline(tokenizer=p.tokenizer, text_encoder=p.text_encoder, vae=p.vae,
                               transformer=p.transformer, scheduler=p.scheduler)

        def run(pipe):
            with torch.no_grad():
                return np.asarray(pipe(tiny.PROMPT, num_inference_steps=4, height=16, width=16,
                                       num_frames=5, max_sequence_length=8, guidance_scale=3.0,
                                       generator=torch.Generator().manual_seed(0),
                                       output_type="np").frames)

        def write(pipe):  # a streamed block (0 and 1 stay resident)
            with torch.no_grad():
                pipe.transformer.blocks[2].ffn.net[0].proj.weight.data.add_(0.5)

        def fuse(pipe):
            add_lora(pipe, names=("transformer",))
            pipe.fuse_lora(components=["transformer"])

        for edit, paused in ((fuse, False), (write, True)):
            ref_pipe = build()
            edit(ref_pipe)
            ref = run(ref_pipe)
            pipe = build()
            sizes = component_bytes(pipe)
            budget = sizes["vae"] + sizes["text_encoder"] + sizes["transformer"] * 6 // 10
            b = mlo.torch.enable_model_offload(pipe, device=DEVICE, policy="budget",
                                               budget=budget)
            self.assertTrue(next(m for m in b.managed if m.role == "dit").streams)
            run(pipe)  # learning: at its end the DiT's first blocks are copied ahead
            if paused:  # a direct write: between disable and enable
                mlo.torch.disable_model_offload(pipe)
            edit(pipe)  # fuse_lora pauses the offload itself
            if paused:
                mlo.torch.enable_model_offload(pipe, device=DEVICE, policy="budget",
                                               budget=budget)
            for i in range(2):
                self.assertTrue(np.array_equal(ref, run(pipe)), "%s: generation %d"
                                % (edit.__name__, i))

    def test_lora_fused_while_streaming(self):
        ref_pipe = tiny.wan(num_layers=8, ffn_dim=4096)
        add_lora(ref_pipe)
        ref_pipe.fuse_lora(components=["transformer", "transformer_2"])
        ref = np.asarray(tiny.run_wan(ref_pipe))
        _, pipe, b, _ = self.streamed()
        tiny.run_wan(pipe)
        add_lora(pipe)
        pipe.fuse_lora(components=["transformer", "transformer_2"])
        for _ in range(2):
            self.assertTrue(np.array_equal(ref, np.asarray(tiny.run_wan(pipe))))


if __name__ == "__main__":
    unittest.main()
