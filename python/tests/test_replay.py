"""test_replay.py — the Python binding over libmlo, without torch (CI).

1. The binding itself: a pipeline of components built from ctypes buffers,
   materialized, offloaded under the strict rule and the budget policy,
   acquired and released; the bytes on the device are the bytes given, an
   error is an MloError naming the problem, nothing moves back (d2h 0).
2. The recorded diffusers runs (recorded.json, written by record.py from
   real Wan2.2 and Flux pipelines through mlo.torch, where torch is
   installed): the same components, declared through the binding, and the
   same sequence of acquires and releases their hooks made, give libmlo's
   same counters — loads, evictions and bytes per component, the device
   peak — and pass the residency audit at every acquire.  CI cannot run
   torch (several GB); this holds the binding and the library to what the
   adapter did with it.
"""
import ctypes
import json
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

import mlo  # noqa: E402

ELEM = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
        "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


class BindingTests(unittest.TestCase):
    def setUp(self):
        self.plat = mlo.Platform("host:capacity=8M")

    def tearDown(self):
        self.plat.close()

    def build(self):
        pipe = mlo.Pipeline(self.plat)
        bufs, tensors = [], {}
        for name, role, n in (("text_encoder", "encoder", 1000), ("transformer", "dit", 3000),
                              ("transformer_2", "dit", 3000), ("vae", "vae", 500)):
            comp = pipe.add_component(name, role)
            buf = (ctypes.c_float * n)(*[float(i % 97) + len(name) for i in range(n)])
            bufs.append(buf)
            tensors[name] = (comp, comp.add_tensor("w", "F32", [n], ctypes.addressof(buf)), buf)
        return pipe, tensors, bufs

    def test_strict_round_trip(self):
        pipe, t, bufs = self.build()
        pipe.enable()
        self.assertTrue(pipe.enabled)
        comps = {c.name: c for c in pipe.components}
        self.assertTrue(comps["text_encoder"].resident)  # C2: encoders and VAEs after enable
        with comps["transformer"]:
            self.assertFalse(comps["text_encoder"].resident)  # C3
            comp, handle, buf = t["transformer"]
            dev = mlo.Component.device_ptr(handle)
            self.assertEqual(ctypes.string_at(dev, ctypes.sizeof(buf)), bytes(buf))
            pipe.audit()
        with comps["transformer_2"]:
            self.assertFalse(comps["transformer"].resident)  # C12: one DiT at a time
        with comps["text_encoder"]:
            self.assertFalse(comps["transformer_2"].resident)  # C4
        self.assertTrue(comps["vae"].resident)  # C5
        st = pipe.stats()
        self.assertEqual(st["d2h_bytes"], 0)
        self.assertEqual(st["host_slab_bytes"], sum(c.bytes for c in pipe.components))
        before = pipe.stats()
        pipe.disable()
        self.assertEqual(before["h2d_bytes"], pipe.stats()["h2d_bytes"])  # C14
        pipe.free()

    def test_budget_keeps_what_fits(self):
        pipe, t, bufs = self.build()
        pipe.enable(policy="budget", budget=1 << 20)
        comps = {c.name: c for c in pipe.components}
        for name in ("transformer", "transformer_2", "text_encoder", "vae"):
            with comps[name]:
                pass
        pipe.reset_stats()  # everything fits in the budget: nothing moves again
        for name in ("text_encoder", "transformer", "transformer_2", "vae"):
            with comps[name]:
                pass
        self.assertEqual(pipe.stats()["h2d_bytes"], 0)
        pipe.free()

    def test_errors_name_the_problem(self):
        with self.assertRaises(mlo.MloError) as e:
            mlo.Platform("host:capacity=lots")
        self.assertIn("capacity", str(e.exception))
        self.assertEqual(e.exception.name, "MLO_EINVAL")
        pipe = mlo.Pipeline(self.plat)
        pipe.add_component("transformer", "dit")
        with self.assertRaises(mlo.MloError) as e:
            pipe.add_component("transformer", "dit")
        self.assertEqual(e.exception.name, "MLO_EEXIST")
        big = pipe.add_component("huge", "encoder")
        big.add_tensor("w", "U8", [64 << 20])  # zero-filled, larger than the device
        with self.assertRaises(mlo.MloError) as e:
            pipe.enable()
        self.assertEqual(e.exception.name, "MLO_ENOMEM_DEVICE")
        self.assertFalse(pipe.enabled)  # C15
        pipe.free()


    def test_framework_cache_is_asked_back(self):
        # another pipeline on the device stands in for torch's caching
        # allocator: its resident encoder is the cache, evicted on request
        plat = mlo.Platform("host:capacity=150K")
        keep = []

        def pipeline(enc_floats, dit_floats):
            pipe = mlo.Pipeline(plat)
            comps = {}
            for name, role, n in (("text_encoder", "encoder", enc_floats),
                                  ("transformer", "dit", dit_floats)):
                buf = (ctypes.c_float * n)()
                keep.append(buf)
                comps[name] = pipe.add_component(name, role)
                comps[name].add_tensor("w", "F32", [n], ctypes.addressof(buf))
            pipe.enable()  # the encoder resident (C2)
            return pipe, comps

        torch_like, cache = pipeline(30000, 1)
        torch_like.disable()  # hooks off, the encoder stays: evict() is allowed
        pipe, comps = pipeline(1000, 30000)
        with self.assertRaises(mlo.MloError) as e:
            comps["transformer"].acquire()
        self.assertEqual(e.exception.name, "MLO_ENOMEM_DEVICE")
        free = plat.memory()["free_bytes"]
        calls = []
        plat.set_framework_cache(
            reclaim=lambda: (calls.append(1), cache["text_encoder"].evict()),
            cached_bytes=lambda: cache["text_encoder"].bytes if cache["text_encoder"].resident
            else 0)
        self.assertEqual(plat.memory()["free_bytes"], free + cache["text_encoder"].bytes)
        with comps["transformer"]:
            pass
        self.assertEqual(calls, [1])
        self.assertFalse(cache["text_encoder"].resident)
        plat.set_framework_cache()
        plat.close()


class MisuseTests(unittest.TestCase):
    """The binding never lets Python reach freed C state (a freed pipeline's
    objects raise MloError MLO_ESTATE; a platform closes its pipelines
    first), never frees under a call in progress (MLO_EBUSY), and never lets
    ctypes wrap or cut a value (ValueError).  Each of these crashed the
    interpreter or converted silently before (issue 27.7)."""

    def setUp(self):
        self.plat = mlo.Platform("host:capacity=8M")
        self.pipe = mlo.Pipeline(self.plat)
        self.enc = self.pipe.add_component("text_encoder", "encoder")
        self.enc.add_tensor("w", "F32", [256])
        self.dit = self.pipe.add_component("transformer", "dit")
        self.dit.add_tensor("w", "F32", [256])
        self.dit2 = self.pipe.add_component("transformer_2", "dit")
        self.dit2.add_tensor("w", "F32", [256])

    def tearDown(self):
        self.plat.close()

    def assertState(self, fn):
        with self.assertRaises(mlo.MloError) as e:
            fn()
        self.assertEqual(e.exception.name, "MLO_ESTATE")

    def test_freed_pipeline_raises(self):
        self.pipe.enable()
        self.dit.acquire()
        self.pipe.free()  # the acquire goes with it, as mlo_pipeline_free says
        self.assertState(lambda: self.enc.resident)
        self.assertState(self.dit.release)
        self.assertState(self.pipe.enable)
        self.assertState(lambda: self.pipe.enabled)
        self.assertState(lambda: self.dit.add_tensor("x", "F32", [1]))
        self.pipe.free()  # idempotent

    def test_closed_platform_frees_its_pipelines_first(self):
        self.plat.close()
        self.assertState(self.pipe.enable)
        self.assertState(lambda: self.plat.name)
        self.assertState(lambda: mlo.Pipeline(self.plat))
        self.plat.close()  # idempotent

    def test_free_refuses_under_a_call_in_progress(self):
        import threading
        self.pipe.enable()
        self.dit.acquire()  # the other DiT must wait for it (C12)
        done = []
        t = threading.Thread(target=lambda: (self.dit2.acquire(), done.append(1),
                                             self.dit2.release()))
        t.start()
        for _ in range(200):  # until the other thread is inside its acquire
            if self.pipe._inflight:
                break
            threading.Event().wait(0.01)
        self.assertEqual(self.pipe._inflight, 1)
        with self.assertRaises(mlo.MloError) as e:
            self.pipe.free()
        self.assertEqual(e.exception.name, "MLO_EBUSY")
        self.dit.release()
        t.join(10)
        self.assertEqual(done, [1])
        self.pipe.free()
        self.assertState(self.dit.acquire)

    def test_values_are_checked_not_wrapped(self):
        for fn in (lambda: self.pipe.add_component("a\0b", "dit"),
                   lambda: self.pipe.add_component("x", "nonsense"),
                   lambda: self.dit.add_tensor("n\0ul", "F32", [1]),
                   lambda: self.dit.add_tensor("big", "F32", [2 ** 64 + 5]),
                   lambda: self.dit.add_tensor("neg", "F32", [-1]),
                   lambda: self.dit.add_tensor("dt", "F33", [1]),
                   lambda: self.dit.add_tensor("dims", "F32", [1] * 9),
                   lambda: self.pipe.enable(policy="nonsense"),
                   lambda: self.pipe.enable(policy="budget", budget=2 ** 64 + 10),
                   lambda: self.pipe.enable(policy="budget", budget=-1),
                   lambda: self.pipe.set_schedule([(self.dit, 2 ** 32 + 1)])):
            with self.assertRaises(ValueError):
                fn()
        self.assertFalse(self.pipe.enabled)  # nothing ran as strict by accident
        self.assertEqual([c.name for c in self.pipe.components],
                         ["text_encoder", "transformer", "transformer_2"])
        self.pipe.enable(policy="BUDGET", budget=1 << 20)  # case-insensitive, as the C API
        self.assertEqual(self.pipe.stats()["budget_bytes"], 1 << 20)

    def test_library_from_a_folder(self):
        import subprocess
        lib = os.environ.get("MLO_LIBRARY")
        if not lib or os.path.isdir(lib):
            self.skipTest("MLO_LIBRARY is not a file here")
        env = dict(os.environ, MLO_LIBRARY=os.path.dirname(lib))
        out = subprocess.run([sys.executable, "-c", "import mlo; print(mlo.version())"],
                             capture_output=True, text=True, env=env,
                             cwd=os.path.join(HERE, ".."))
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.strip(), mlo.version())


class ReplayTests(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(os.path.join(HERE, "recorded.json")) as f:
            cls.rec = json.load(f)

    def replay(self, name):
        rec = self.rec["pipelines"][name]
        self.assertTrue(rec["identical"])
        plat = mlo.Platform("host:capacity=64M")
        pipe = mlo.Pipeline(plat)
        comps = {}
        for c in rec["components"]:
            comp = pipe.add_component(c["name"], c["role"])
            for tname, dtype, shape in c["tensors"]:
                comp.add_tensor(tname, dtype, shape)  # zero-filled: counters, not values
            comps[c["name"]] = comp
            self.assertEqual(comp.bytes, c["bytes"], c["name"])
        pipe.enable()
        pipe.reset_stats()
        held = []
        for op, cname in rec["events"]:
            comp = comps[cname]
            if op == "acquire":
                comp.acquire()
                pipe.audit()
                held.append(cname)
            else:
                comp.release()
                held.remove(cname)
        self.assertFalse(held)
        for c in rec["components"]:
            st = comps[c["name"]].stats()
            for key in ("loads", "evictions", "h2d_bytes", "d2h_bytes"):
                self.assertEqual(st[key], c[key], "%s: %s" % (c["name"], key))
        ps = pipe.stats()
        self.assertEqual(ps["peak_device_bytes"], rec["peak_device_bytes"])
        self.assertEqual(ps["d2h_bytes"], 0)
        pipe.free()
        plat.close()

    def test_wan(self):
        self.replay("wan")

    def test_flux(self):
        self.replay("flux")

    def test_recorded_runs_are_contract_shaped(self):
        """What the hooks did is what the contract says: Wan's experts each
        run, the VAE is never evicted, nothing is written back."""
        wan = {c["name"]: c for c in self.rec["pipelines"]["wan"]["components"]}
        self.assertEqual(wan["vae"]["evictions"], 0)
        self.assertGreaterEqual(wan["transformer"]["loads"], 1)
        self.assertGreaterEqual(wan["transformer_2"]["loads"], 1)
        self.assertEqual(sum(c["d2h_bytes"] for c in wan.values()), 0)


if __name__ == "__main__":
    unittest.main()
