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
        with self.assertRaises(mlo.MloStateError) as e:
            fn()
        self.assertEqual(e.exception.name, "MLO_ESTATE")

    def test_statuses_are_exception_classes(self):
        """Each libmlo status raises its own MloError subclass: a caller
        catches what it can act on by class, and MloError catches all."""
        with self.assertRaises(mlo.MloExistsError) as e:
            self.pipe.add_component("transformer", "dit")  # the name is taken
        self.assertEqual((e.exception.code, e.exception.name), (-10, "MLO_EEXIST"))
        self.assertIsInstance(e.exception, mlo.MloError)
        self.pipe.enable()
        with self.assertRaises(mlo.MloStateError):
            self.dit.add_tensor("x", "F32", [1])  # materialized: no more tensors
        import pickle
        seen = set()
        for name in mlo.__all__:
            cls = getattr(mlo, name)
            if isinstance(cls, type) and issubclass(cls, mlo.MloError) and cls is not mlo.MloError:
                err = mlo.MloError(cls.code_value, "x")  # the code picks the class
                self.assertIs(type(err), cls)
                self.assertEqual(err.name, mlo.lib().mlo_err_name(cls.code_value).decode())
                self.assertIs(type(cls("y")), cls)  # a class knows its code
                again = pickle.loads(pickle.dumps(err))
                self.assertEqual((type(again), again.code, str(again)), (cls, err.code, str(err)))
                seen.add(cls.code_value)
        self.assertEqual(seen, set(range(-15, 0)))  # every status mlo.h has
        self.assertIs(type(mlo.MloError(-99, "z")), mlo.MloError)  # one it does not know
        with self.assertRaises(TypeError):
            mlo.MloError("a message and no code")

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
        idle = mlo.Pipeline(self.plat)  # the close refuses all or nothing: it stays too
        with self.assertRaises(mlo.MloError) as e:
            self.plat.close()
        self.assertEqual(e.exception.name, "MLO_EBUSY")
        self.assertFalse(idle.enabled)
        self.assertTrue(self.plat.name)
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


    def test_counters_are_the_librarys(self):
        """The binding's ComponentStats is libmlo's own list of counters
        (mlo_component_stats_fields), names and offsets; a binding whose
        list differs refuses the library, naming both lists."""
        from mlo import _lib
        lib = _lib.load()
        _lib._check_stats(lib, "libmlo")  # the real one: the same list
        table = ctypes.POINTER(_lib.StatsField)()
        n = lib.mlo_component_stats_fields(ctypes.byref(table))
        self.assertEqual([table[i].name.decode() for i in range(n)],
                         [name for name, _ in _lib.ComponentStats._fields_])
        self.assertEqual(table[7].seconds, b"stall_s")  # wait_ns, reported in seconds

        class Short(ctypes.Structure):
            _fields_ = _lib.ComponentStats._fields_[:-1]
        saved, _lib.ComponentStats = _lib.ComponentStats, Short
        try:
            with self.assertRaisesRegex(OSError, r"differ from this binding's"):
                _lib._check_stats(lib, "libmlo")
        finally:
            _lib.ComponentStats = saved


# Run in a child process: a handle that reaches freed C memory may segfault,
# which must fail one test, not kill the runner.  It prints one JSON line per
# call, before and after, so a crash names the call that crashed.
_LIFETIME_CHILD = r"""
import ctypes, gc, json, sys
sys.path.insert(0, sys.argv[2])
import mlo

scenario = sys.argv[1]
plat = mlo.Platform("host:capacity=8M")
pipe = mlo.Pipeline(plat)
enc = pipe.add_component("text_encoder", "encoder")
buf = (ctypes.c_float * 64)(*range(64))
t = enc.add_tensor("w", "F32", [64], ctypes.addressof(buf))
pipe.add_component("transformer", "dit").add_tensor("w", "F32", [64])
pipe.enable()  # the encoder resident (C2): t has a device address
pipe.synchronize()  # and its bytes have landed (the load is asynchronous)


def address(t):  # the raw value a caller may have kept
    return t.handle.value if hasattr(t, "handle") else t.value


def call(what, fn):
    print(json.dumps({"calling": what}), flush=True)
    try:
        v = fn()
        if isinstance(v, ctypes.c_void_p):
            v = v.value
        out = {"what": what, "value": v if isinstance(v, (int, str, type(None))) else repr(v)}
    except mlo.MloError as e:
        out = {"what": what, "raised": "MloError", "name": e.name, "message": str(e)}
    except Exception as e:
        out = {"what": what, "raised": type(e).__name__, "message": str(e)}
    print(json.dumps(out), flush=True)


C = mlo.Component
tensor_calls = [
    ("Component.host_data", lambda t: C.host_data(t)),
    ("Component.device_ptr", lambda t: C.device_ptr(t)),
    ("Component.device_status", lambda t: C.device_status(t)),
    ("Component.nbytes", lambda t: C.nbytes(t)),
    ("Component.tensor_block", lambda t: C.tensor_block(t)),
    ("comp.device_ptr", lambda t: enc.device_ptr(t)),
]
handle_calls = [
    ("Tensor.host_data", lambda t: t.host_data()),
    ("Tensor.device_ptr", lambda t: t.device_ptr()),
    ("Tensor.device_status", lambda t: t.device_status()),
    ("Tensor.nbytes", lambda t: t.nbytes),
    ("Tensor.block", lambda t: t.block),
    ("Tensor.handle", lambda t: t.handle),
    ("ctypes argument", lambda t: mlo.lib().mlo_tensor_nbytes(t)),  # its _as_parameter_
]
component_calls = [
    ("add_tensor", lambda c: c.add_tensor("x", "F32", [1])),
    ("block_count", lambda c: c.block_count), ("stream_info", lambda c: c.stream_info()),
    ("set_progressive", lambda c: c.set_progressive(True)),
    ("block_begin", lambda c: c.block_begin(0)), ("block_end", lambda c: c.block_end(0)),
    ("bytes", lambda c: c.bytes), ("resident", lambda c: c.resident),
    ("load_done", lambda c: c.load_done), ("evict", lambda c: c.evict()),
    ("acquire", lambda c: c.acquire()), ("release", lambda c: c.release()),
    ("stats", lambda c: c.stats()), ("handle", lambda c: c.handle),
]
pipeline_calls = [
    ("add_component", lambda p: p.add_component("vae", "vae")),
    ("materialize", lambda p: p.materialize()), ("enable", lambda p: p.enable()),
    ("disable", lambda p: p.disable()), ("enabled", lambda p: p.enabled),
    ("set_schedule", lambda p: p.set_schedule([(enc, 1)])),
    ("learn_schedule", lambda p: p.learn_schedule()), ("schedule", lambda p: p.schedule()),
    ("audit", lambda p: p.audit()), ("synchronize", lambda p: p.synchronize()),
    ("stats", lambda p: p.stats()), ("reset_stats", lambda p: p.reset_stats()),
    ("handle", lambda p: p.handle),
]
platform_calls = [
    ("name", lambda p: p.name), ("description", lambda p: p.description),
    ("caps", lambda p: p.caps()), ("memory", lambda p: p.memory()),
    ("synchronize", lambda p: p.synchronize()),
    ("set_framework_cache", lambda p: p.set_framework_cache(cached_bytes=lambda: 0)),
    ("handle", lambda p: p.handle), ("Pipeline", lambda p: mlo.Pipeline(p)),
]


def run_all(t, raw):
    for what, fn in tensor_calls:
        call(what, lambda: fn(t))
        call(what + "(raw)", lambda: fn(raw))
        call(what + "(address)", lambda: fn(raw.value))
    for what, fn in handle_calls:
        call(what, lambda: fn(t))
    for what, fn in component_calls:
        call("Component." + what, lambda: fn(enc))
    for what, fn in pipeline_calls:
        call("Pipeline." + what, lambda: fn(pipe))


if scenario == "free":
    raw = ctypes.c_void_p(address(t))
    pipe.free()
    run_all(t, raw)
elif scenario == "close":
    raw = ctypes.c_void_p(address(t))
    plat.close()  # frees the pipeline on it first
    run_all(t, raw)
    for what, fn in platform_calls:
        call("Platform." + what, lambda: fn(plat))
    call("Pipeline.free", pipe.free)  # freed already: a no-op
    call("Platform.close", plat.close)  # idempotent
elif scenario == "collected":
    # a handle object keeps its owner alive: nothing it reaches is freed
    before = [(what, fn(t)) for what, fn in tensor_calls[:5]]
    data = ctypes.string_at(C.device_ptr(t), 256)
    del pipe, plat, enc
    gc.collect()
    for what, fn in tensor_calls[:5]:
        call(what, lambda: fn(t))
    call("device bytes", lambda: ctypes.string_at(C.device_ptr(t), 256) == data)
    print(json.dumps({"before": before}), flush=True)
    # a raw value outlives what it pointed at: refused, never dereferenced
    raw = ctypes.c_void_p(address(t))
    del t
    gc.collect()
    for what, fn in tensor_calls[:5]:
        call(what + "(raw)", lambda: fn(raw))
        call(what + "(address)", lambda: fn(raw.value))
"""


class HandleLifetimeTests(unittest.TestCase):
    """Every handle the binding gives out (tensors, components, pipelines,
    platforms) raises MloError (MLO_ESTATE, naming "pipeline freed" or
    "platform closed") once its owner is freed or closed, and a raw tensor
    value whose pipeline was collected raises ValueError, instead of
    reaching freed C memory.  Tensor handles were raw c_void_p values and
    the Component.host_data/device_ptr/... staticmethods read freed memory
    after Pipeline.free(), Platform.close() or collection (issue 44)."""

    def child(self, scenario):
        import subprocess
        try:
            out = subprocess.run([sys.executable, "-c", _LIFETIME_CHILD, scenario,
                                  os.path.join(HERE, "..")], capture_output=True, timeout=30)
            rc, stdout, stderr = out.returncode, out.stdout, out.stderr
        except subprocess.TimeoutExpired as e:  # a call spinning on freed memory
            rc, stdout, stderr = "hung", e.stdout or b"", e.stderr or b""
        lines = [json.loads(line) for line in stdout.decode().splitlines()]
        calls = [line for line in lines if "what" in line]
        if rc != 0:
            last = lines[-1].get("calling") if lines else None
            self.fail("%s: the child died (status %s) in %s\n%s" %
                      (scenario, rc, last, stderr.decode(errors="replace")[-2000:]))
        self.assertTrue(calls, out.stderr)
        return calls, lines

    def assertRefused(self, calls, *words, kind="MloError"):
        for c in calls:
            with self.subTest(c["what"]):
                # a Tensor given to a C function: ctypes wraps what it raised
                self.assertEqual(c.get("raised"), "ArgumentError" if c["what"] == "ctypes argument"
                                 else kind, c)
                if kind == "MloError":
                    self.assertIn("MLO_ESTATE", c["message"], c)
                for w in words:
                    self.assertIn(w, c["message"], c)

    def test_after_pipeline_free(self):
        calls, _ = self.child("free")
        self.assertEqual(len(calls), 6 * 3 + 7 + 14 + 13)
        self.assertRefused(calls, "pipeline freed")

    def test_after_platform_close(self):
        calls, _ = self.child("close")
        handles = calls[:-10]
        self.assertEqual(len(handles), 6 * 3 + 7 + 14 + 13)
        self.assertRefused(handles, "pipeline freed", "platform closed")
        self.assertRefused(calls[-10:-2], "platform closed")
        self.assertEqual(calls[-2:], [{"what": "Pipeline.free", "value": None},
                                      {"what": "Platform.close", "value": None}])

    def test_after_collection(self):
        calls, lines = self.child("collected")
        kept, raw = calls[:6], calls[6:]
        before = dict(next(line["before"] for line in lines if "before" in line))
        for c in kept[:5]:  # the Tensor kept its pipeline: the same live values
            self.assertEqual(c.get("value"), before[c["what"]], c)
        self.assertEqual(kept[5], {"what": "device bytes", "value": True})
        self.assertEqual(len(raw), 10)
        self.assertRefused(raw, "no live tensor", kind="ValueError")


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
