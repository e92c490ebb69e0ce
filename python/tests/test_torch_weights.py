"""test_torch_weights.py — mlo.torch where the weights come from, and what
they are: from_pretrained (a folder's files, sharded, a variant, dtype=,
every tier at once), enable_model_offload(host_memory=) on a pipeline
already loaded, quantized and cast weights (diffusers' layerwise casting,
torchao's int8, diffusers' GGUF), and the progress shown meanwhile.  CPU,
host platform, real diffusers pipelines (tiny.py); the helpers are
test_torch's.

ctest runs it as python_torch_weights where python_torch runs.  By hand:
    MLO_LIBRARY=build/libmlo.so .cache/torch-venv/bin/python python/tests/run.py test_torch_weights
"""
import gc
import importlib.util
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
from test_torch import (DEVICE, cast_layerwise, component_bytes, in_mlo_memory,  # noqa: E402
                        rss_bytes)


class FromPretrainedTests(unittest.TestCase):
    """mlo.torch.from_pretrained on a Wan2.2 folder written by
    save_pretrained (two 151 MiB experts): no weight read into torch, half
    the weights on disk (host_memory), the latents plain diffusers gives."""

    def setUp(self):
        import tempfile
        self.tmp = tempfile.TemporaryDirectory(prefix="mlo-fp-")
        self.addCleanup(self.tmp.cleanup)
        self.dir = os.path.join(self.tmp.name, "wan")
        tiny.wan(ffn_dim=100000, num_layers=12).save_pretrained(self.dir)
        self.weights = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(self.dir)
                           for f in fs if f.endswith(".safetensors"))

    def probe(self, *args):
        import json
        import subprocess
        out = os.path.join(self.tmp.name, "%s.pt" % args[0])
        run = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__),
                                                           "rss_probe.py"), args[0], self.dir,
                              out] + list(args[1:]), capture_output=True, text=True, timeout=300)
        self.assertEqual(run.returncode, 0, run.stderr[-3000:])
        return json.loads(run.stdout.strip().splitlines()[-1]), torch.load(out)

    def test_half_the_weights_on_disk(self):
        budget = self.weights // 2
        plain, ref = self.probe("diffusers")
        got, latents = self.probe("mlo", "host:capacity=200M", str(budget))
        # CPU GEMMs over K=100000 round differently with the weights at other
        # addresses (plain diffusers' own weights copied elsewhere do too):
        # the weights are the files' bytes (test_weights_are_the_files)
        self.assertTrue(torch.allclose(latents, ref, rtol=0, atol=1e-5),
                        (latents - ref).abs().max())
        self.assertGreater(got["disk_bytes"], self.weights // 3)  # one expert stays on disk
        self.assertLessEqual(got["host_slab_bytes"], budget)
        # loading: the slabs that fit and the staging ring, never the weights;
        # the whole run: besides those, the stand-in device, whose memory is
        # this process's (its arena's resident pages, counted from smaps)
        loaded = got["loaded_peak"] - got["before"] - got["staging"]
        self.assertLessEqual(loaded, budget + self.weights // 10, got)
        self.assertGreater(got["device_rss"], 0, got)
        run = got["peak"] - got["before"] - got["staging"] - got["device_rss"]
        self.assertLessEqual(run, budget + self.weights // 10, got)
        self.assertGreaterEqual(plain["peak"] - plain["before"], self.weights * 9 // 10, plain)
        print("\nweights %d MiB, host budget %d MiB: plain diffusers peak RSS +%d MiB; "
              "mlo.torch.from_pretrained +%d MiB after loading, +%d MiB after the run, of "
              "which the stand-in device's arena %d MiB (its peak use %d MiB) and the staging "
              "ring %d MiB: +%d MiB besides them" % tuple(
                  x >> 20 for x in (self.weights, budget, plain["peak"] - plain["before"],
                                    got["loaded_peak"] - got["before"],
                                    got["peak"] - got["before"], got["device_rss"],
                                    got["device_peak"], got["staging"], run)), file=sys.stderr)

    def test_enable_frees_what_goes_to_disk(self):
        """A pipeline loaded and run by plain diffusers, then offloaded with
        host_memory: the expert sent to disk leaves host memory."""
        budget = self.weights // 2 + (8 << 20)  # one expert's slab fits, not two
        plain, ref = self.probe("diffusers")
        got, latents = self.probe("enable", "host:capacity=200M", str(budget))
        self.assertTrue(torch.allclose(latents, ref, rtol=0, atol=1e-5),
                        (latents - ref).abs().max())
        self.assertGreater(got["disk_bytes"], self.weights // 3, got)  # one expert
        self.assertGreater(got["host_slab_bytes"], self.weights // 3, got)  # the other
        self.assertGreater(got["disk_read_bytes"], self.weights // 3, got)  # read at its load
        # the kept expert's slab replaces torch's copy; the other's goes
        grew = got["after"] - got["before"] - got["staging"] - got["device_rss"]
        self.assertLessEqual(grew, -got["disk_bytes"] + self.weights // 20, got)
        print("\nenable_model_offload(host_memory=%d MiB) on a loaded %d MiB pipeline: RSS %+d "
              "MiB (%d MiB sent to disk; stand-in device %d MiB, staging %d MiB)" % tuple(
                  x >> 20 for x in (budget, self.weights, got["after"] - got["before"],
                                    got["disk_bytes"], got["device_rss"], got["staging"])),
              file=sys.stderr)

    def test_weights_are_the_files(self):
        from diffusers import WanPipeline
        plain = WanPipeline.from_pretrained(self.dir)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pipe = mlo.torch.from_pretrained(WanPipeline, self.dir, device="host:capacity=200M",
                                             host_memory=self.weights // 2)
        b = pipe._mlo_offload
        on_disk = [m.name for m in b.managed if any(
            e.nbytes and not mlo.Component.host_data(e.handle) for e in m.entries)]
        self.assertTrue(on_disk)
        for m in b.managed:  # every tensor declared from its file range
            self.assertTrue(all(e.source is not None for e in m.entries), m.name)
        mlo.torch.close_model_offload(pipe)  # on disk: read back from the files
        for name in ("transformer", "transformer_2", "vae", "text_encoder"):
            a, c = getattr(plain, name).state_dict(), getattr(pipe, name).state_dict()
            self.assertEqual(sorted(a), sorted(c))
            for k in a:
                self.assertTrue(torch.equal(a[k], c[k]), "%s.%s" % (name, k))


class FromPretrainedSmallTests(unittest.TestCase):
    def test_identical_latents_and_errors(self):
        import tempfile
        from diffusers import WanPipeline
        with tempfile.TemporaryDirectory(prefix="mlo-fp-") as d:
            tiny.wan().save_pretrained(d)
            ref = tiny.run_wan(WanPipeline.from_pretrained(d))
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                pipe = mlo.torch.from_pretrained(WanPipeline, d, device=DEVICE, host_memory="30K")
            self.assertTrue(any("computed at init" in str(x.message) for x in w))
            np.testing.assert_array_equal(tiny.run_wan(pipe), ref)
            self.assertGreater(pipe._mlo_offload.pipeline.stats()["disk_read_bytes"], 0)
            mlo.torch.close_model_offload(pipe)
            np.testing.assert_array_equal(tiny.run_wan(pipe), ref)
            with self.assertRaises(ValueError):
                mlo.torch.from_pretrained(WanPipeline, os.path.join(d, "nope"))
            with self.assertRaises(ValueError):
                mlo.torch.from_pretrained(WanPipeline, d, host_memory="lots")


def from_pretrained_quietly(*args, **kwargs):
    """mlo.torch.from_pretrained, and the text of the warnings it gave."""
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        pipe = mlo.torch.from_pretrained(*args, **kwargs)
    return pipe, " ".join(str(x.message) for x in w)


def sources(pipe, name):
    """{tensor name: the file it was declared from} of a component."""
    m = next(m for m in pipe._mlo_offload.managed if m.name == name)
    return {e.qname: e.source[0] for e in m.entries}


class EnableHostMemoryTests(unittest.TestCase):
    def test_built_in_memory_goes_to_disk_through_a_scratch_file(self):
        """Weights in no file (a pipeline built in memory) are written once
        to a scratch file the disk tier reads, with a warning; a failing
        enable removes it and leaves the modules on their own tensors."""
        import tempfile
        with tempfile.TemporaryDirectory(prefix="mlo-scratch-") as d:
            pipe = tiny.wan()
            ref = tiny.run_wan(pipe)
            mine = {k: v for k, v in pipe.transformer.state_dict().items()}
            with self.assertRaises(mlo.MloError):  # no room for the VAE on the device
                mlo.torch.enable_model_offload(pipe, device="host:capacity=1K",
                                               host_memory="30K", scratch_dir=d)
            self.assertEqual(os.listdir(d), [])
            for k, v in pipe.transformer.state_dict().items():
                self.assertEqual(v.data_ptr(), mine[k].data_ptr(), k)
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                b = mlo.torch.enable_model_offload(pipe, device=DEVICE, host_memory="30K",
                                                   scratch_dir=d)
            said = " ".join(str(x.message) for x in w)
            self.assertIn("written once to %s" % d, said)
            self.assertEqual(len(os.listdir(d)), 1)
            on_disk = [m for m in b.managed if not mlo.Component.host_data(m.entries[0].handle)]
            self.assertTrue(on_disk)
            for m in on_disk:  # bound to no memory between its loads
                if not m.comp.resident:
                    self.assertTrue(all(e.current().is_meta for e in m.entries if e.nbytes),
                                    m.name)
            np.testing.assert_array_equal(tiny.run_wan(pipe), ref)
            self.assertGreater(b.pipeline.stats()["disk_read_bytes"], 0)
            mlo.torch.close_model_offload(pipe)
            del b, m, on_disk  # what reaches the libmlo pipeline
            gc.collect()
            self.assertEqual(os.listdir(d), [])  # removed with the offload
            np.testing.assert_array_equal(tiny.run_wan(pipe), ref)


class LoadedFilesTests(unittest.TestCase):
    def test_mapped_pages_or_compared_bytes(self):
        """A pipeline plain diffusers loaded (its parameters point into the
        safetensors files it mapped) and run: each tensor is its file's
        bytes without reading the file where its pages were never written;
        one written in place is compared, found changed, and its own bytes
        are what the disk tier reads."""
        import tempfile
        from unittest import mock
        from diffusers import WanPipeline
        with tempfile.TemporaryDirectory(prefix="mlo-mapped-") as d:
            tiny.wan(ffn_dim=4096).save_pretrained(os.path.join(d, "wan"))
            pipe = WanPipeline.from_pretrained(os.path.join(d, "wan"))
            before = tiny.run_wan(pipe)  # its pages read, none written
            changed = pipe.transformer.blocks[0].ffn.net[0].proj.weight
            with torch.no_grad():
                changed[0] += 50  # a page of the mapping copied on write
            ref = tiny.run_wan(pipe)
            self.assertFalse(np.allclose(ref, before, rtol=0, atol=1e-3))
            with open(os.path.join(d, "wan", "transformer", "junk.safetensors"), "wb") as f:
                f.write(b"not safetensors")  # passed over: a search, not a load
            compared = []
            holds = mlo.torch._files._file_holds

            def counting(path, offset, data):
                compared.append(data.data_ptr())
                return holds(path, offset, data)

            with mock.patch.object(mlo.torch._files, "_file_holds", counting), \
                    warnings.catch_warnings():
                warnings.simplefilter("ignore")
                b = mlo.torch.enable_model_offload(pipe, device=DEVICE, host_memory="30K",
                                                   scratch_dir=d)
            src = {e.name: e.source[0] for m in b.managed for e in m.entries}
            name = "transformer.blocks.0.ffn.net.0.proj.weight"
            self.assertTrue(src[name].startswith(os.path.join(d, "mlo-")), src[name])
            other = "transformer_2.blocks.0.ffn.net.0.proj.weight"  # 256 KiB, never written
            self.assertTrue(src[other].endswith("diffusion_pytorch_model.safetensors"))
            self.assertIn(changed.data_ptr(), compared)
            self.assertLess(len(compared), len(src) // 4, "most were read as mapped")
            for _ in range(2):
                # the weights at other addresses round the GEMMs otherwise
                # (FromPretrainedTests): close, and far from the unwritten
                np.testing.assert_allclose(tiny.run_wan(pipe), ref, rtol=0, atol=1e-5)
            self.assertGreater(b.pipeline.stats()["disk_read_bytes"], 0)
            mlo.torch.close_model_offload(pipe)
            del b


class LayerwiseCastingTests(unittest.TestCase):
    """diffusers' layerwise casting is a cast, not an offload: mlo moves the
    float8 storage, and each layer computes from a float32 copy of it."""

    def test_identical_and_bound_to_mlo_memory(self):
        ref = tiny.run_wan(cast_layerwise(tiny.wan()))
        pipe = cast_layerwise(tiny.wan())
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            b = mlo.torch.enable_model_offload(pipe, device=DEVICE)
            entries = {e.name: e for m in b.managed for e in m.entries}
            self.assertEqual(entries["transformer.blocks.0.ffn.net.0.proj.weight"].like.dtype,
                             torch.float8_e4m3fn)
            for _ in range(2):  # the second after both experts were evicted and loaded
                np.testing.assert_array_equal(tiny.run_wan(pipe), ref)
                self.assertIsNone(in_mlo_memory(b))  # no layer left on torch's cast copy
        self.assertFalse([str(x.message) for x in w if "replaced" in str(x.message) or
                          "written" in str(x.message)])
        self.assertEqual(sum(m.written_back for m in b.managed), 0)
        self.assertGreater(b.pipeline.stats()["loads"], 2)
        hook = pipe.transformer.blocks[0].ffn.net[0].proj._diffusers_hook.get_hook(
            "layerwise_casting")
        mlo.torch.disable_model_offload(pipe)  # diffusers' own cast back after disable
        self.assertEqual(hook.fn_ref.post_forward, hook.post_forward)
        np.testing.assert_array_equal(tiny.run_wan(pipe), ref)

    def test_host_memory_holds_the_float8_bytes_once(self):
        check_bytes_held_once(self, cast_layerwise)  # float8: a quarter of float32


def check_bytes_held_once(case, make):
    """A tiny Wan with wide feed-forwards, made by `make` into a quarter of
    its float32 bytes, enabled on the host stand-in: host memory grows by
    about what the modules store (their bytes once, in mlo's slabs, with no
    dequantized or float32 copy kept), and the slabs hold them."""
    base = rss_bytes()
    pipe = make(tiny.wan(ffn_dim=200000))
    stored = stored_bytes(pipe)
    case.assertLess(stored, 40 << 20)
    b = mlo.torch.enable_model_offload(pipe, device="host:capacity=512M")
    held = rss_bytes() - base
    case.assertLessEqual(held, stored * 1.05 + (16 << 20),
                         "%d MiB resident for %d MiB of weights" % (held >> 20, stored >> 20))
    slabs = b.pipeline.stats()["host_slab_bytes"]
    case.assertTrue(stored <= slabs < stored * 1.01, (slabs, stored))
    del b
    mlo.torch.close_model_offload(pipe)


def quantize_int8(pipe):
    """torchao's weight-only int8 on both experts' linear layers; the
    pipeline, for chaining."""
    from torchao.quantization import Int8WeightOnlyConfig, quantize_
    for name in ("transformer", "transformer_2"):
        quantize_(getattr(pipe, name), Int8WeightOnlyConfig())
    return pipe


def stored_bytes(pipe, names=("transformer", "transformer_2", "text_encoder", "vae")):
    """The bytes the modules hold: a tensor subclass's inner tensors'."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    def size(t):
        if is_traceable_wrapper_subclass(t):
            return sum(size(getattr(t, n)) for n in t.__tensor_flatten__()[0])
        return t.numel() * t.element_size()
    return sum(size(t) for name in names for t in getattr(pipe, name).state_dict().values())


@unittest.skipUnless(importlib.util.find_spec("torchao"), "torchao is not installed "
                     "(python/tests/torch-requirements.txt has it)")
class TorchaoInt8Tests(unittest.TestCase):
    """A tensor subclass (torchao's Int8Tensor) moves as its inner tensors'
    bytes: int8 data and scales, never a dequantized copy."""

    def test_identical_and_held_as_int8(self):
        ref = tiny.run_wan(quantize_int8(tiny.wan()))
        pipe = quantize_int8(tiny.wan())
        cls = type(pipe.transformer.blocks[0].ffn.net[0].proj.weight)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            b = mlo.torch.enable_model_offload(pipe, device=DEVICE)
            int8 = [e for m in b.managed for e in m.entries if e.like.dtype == torch.int8]
            self.assertTrue(int8)
            for _ in range(2):
                np.testing.assert_array_equal(tiny.run_wan(pipe), ref)
                weight = pipe.transformer.blocks[0].ffn.net[0].proj.weight
                self.assertIs(type(weight), cls)
                self.assertIsNone(in_mlo_memory(b))  # its int8 data and scale are mlo's
        self.assertFalse([str(x.message) for x in w if "mlo" in str(x.message)])
        self.assertEqual(sum(m.written_back for m in b.managed), 0)
        mlo.torch.close_model_offload(pipe)  # torch's own Int8Tensors again
        weight = pipe.transformer.blocks[0].ffn.net[0].proj.weight
        self.assertIs(type(weight), cls)
        self.assertTrue(all(e.nbytes == 0 or e.current().data_ptr() not in (
            mlo.Component.host_data(e.handle), mlo.Component.device_ptr(e.handle))
            for e in int8[:4]))
        np.testing.assert_array_equal(tiny.run_wan(pipe), ref)

    def test_on_disk(self):
        """host_memory: the inner tensors written once to a scratch file
        (no checkpoint holds them as they are), read at each load, the
        subclass bound to the meta device between loads."""
        import tempfile
        ref = tiny.run_wan(quantize_int8(tiny.wan()))
        with tempfile.TemporaryDirectory(prefix="mlo-int8-") as d:
            pipe = quantize_int8(tiny.wan())
            cls = type(pipe.transformer.blocks[0].ffn.net[0].proj.weight)
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                b = mlo.torch.enable_model_offload(pipe, device=DEVICE, host_memory="30K",
                                                   scratch_dir=d)
                for _ in range(2):
                    np.testing.assert_array_equal(tiny.run_wan(pipe), ref)
                    self.assertIsNone(in_mlo_memory(b))
            self.assertTrue(any("written once to %s" % d in str(x.message) for x in w))
            inner = [e for m in b.managed for e in m.entries if e.composite is not None]
            self.assertTrue(inner and all(e.source and e.source[0].startswith(d)
                                          for e in inner))
            on_disk = [m.name for m in b.managed if m.role == "dit" and
                       not mlo.Component.host_data(m.entries[0].handle)]
            self.assertTrue(on_disk)
            self.assertGreater(b.pipeline.stats()["disk_read_bytes"], 0)
            mlo.torch.close_model_offload(pipe)
            self.assertIs(type(pipe.transformer.blocks[0].ffn.net[0].proj.weight), cls)
            np.testing.assert_array_equal(tiny.run_wan(pipe), ref)
            del b

    def test_a_failed_enable_leaves_the_subclass(self):
        pipe = quantize_int8(tiny.wan())
        weight = pipe.transformer.blocks[0].ffn.net[0].proj.weight
        with self.assertRaises(mlo.MloError):
            mlo.torch.enable_model_offload(pipe, device="host:capacity=1K")
        self.assertIs(pipe.transformer.blocks[0].ffn.net[0].proj.weight, weight)

    def test_host_memory_holds_the_int8_bytes_once(self):
        check_bytes_held_once(self, quantize_int8)  # int8: a quarter of float32


def gguf_wan(folder, ffn_dim=256):
    """tiny.wan() with both experts read by diffusers from GGUF files
    (from_single_file, GGUFQuantizationConfig) written into folder: every
    weight whose rows split into 32-value blocks (the FFN's output layers)
    quantized to Q8_0, the rest float32; names as the original Wan
    checkpoints have them, which diffusers' converter maps (it swaps norm2
    and norm3)."""
    import gguf
    from diffusers import GGUFQuantizationConfig, WanTransformer3DModel
    pipe = tiny.wan(ffn_dim=ffn_dim)
    swap = {"norm2": "norm3", "norm3": "norm2"}
    for name in ("transformer", "transformer_2"):
        config, path = os.path.join(folder, name), os.path.join(folder, name + ".gguf")
        getattr(pipe, name).save_config(config)
        writer = gguf.GGUFWriter(path, "wan")
        for key, t in getattr(pipe, name).state_dict().items():
            values = t.float().numpy()
            key = ".".join(swap.get(p, p) for p in key.split("."))
            if values.ndim == 2 and values.shape[1] % 32 == 0:
                writer.add_tensor(key, gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q8_0),
                                  raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            else:
                writer.add_tensor(key, values)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        setattr(pipe, name, WanTransformer3DModel.from_single_file(
            path, config=config,
            quantization_config=GGUFQuantizationConfig(compute_dtype=torch.float32)).eval())
    return pipe


@unittest.skipUnless(importlib.util.find_spec("gguf"), "gguf is not installed "
                     "(python/tests/torch-requirements.txt has it)")
class GGUFTests(unittest.TestCase):
    """diffusers' GGUF weights (GGUFParameter: a Parameter subclass over the
    packed Q8_0 bytes) move as those bytes and stay GGUFParameters, in host
    memory and on disk (host_memory)."""

    def test_identical_in_host_memory_and_on_disk(self):
        import tempfile
        with tempfile.TemporaryDirectory(prefix="mlo-gguf-") as d:
            ref = tiny.run_wan(gguf_wan(d))
            for host_memory in (None, "30K"):
                with self.subTest(host_memory=host_memory):
                    pipe = gguf_wan(d)
                    layer = pipe.transformer.blocks[0].ffn.net[2]
                    self.assertEqual(type(layer.weight).__name__, "GGUFParameter")
                    self.assertEqual(layer.weight.dtype, torch.uint8)
                    cls, quant = type(layer.weight), layer.weight.quant_type
                    with warnings.catch_warnings(record=True) as w:
                        warnings.simplefilter("always")
                        b = mlo.torch.enable_model_offload(pipe, device=DEVICE,
                                                           host_memory=host_memory,
                                                           scratch_dir=d)
                        for _ in range(2):
                            np.testing.assert_array_equal(tiny.run_wan(pipe), ref)
                            self.assertIs(type(layer.weight), cls)
                            self.assertEqual(layer.weight.quant_type, quant)
                            self.assertIsNone(in_mlo_memory(b))
                    said = [str(x.message) for x in w if "mlo" in str(x.message)]
                    self.assertFalse([x for x in said if "replaced" in x or "written back" in x])
                    if host_memory:
                        self.assertGreater(b.pipeline.stats()["disk_read_bytes"], 0)
                    mlo.torch.close_model_offload(pipe)
                    self.assertIs(type(layer.weight), cls)
                    np.testing.assert_array_equal(tiny.run_wan(pipe), ref)

    def test_host_memory_holds_the_packed_bytes_once(self):
        import tempfile
        with tempfile.TemporaryDirectory(prefix="mlo-gguf-") as d:
            base = rss_bytes()
            pipe = gguf_wan(d, ffn_dim=100000)
            stored = stored_bytes(pipe)
            packed = sum(p.numel() for p in pipe.transformer.parameters()
                         if type(p).__name__ == "GGUFParameter")
            self.assertGreater(packed, 1 << 20)
            b = mlo.torch.enable_model_offload(pipe, device="host:capacity=512M")
            held = rss_bytes() - base
            self.assertLessEqual(held, stored * 1.05 + (16 << 20),
                                 "%d MiB resident for %d MiB of weights" % (held >> 20,
                                                                            stored >> 20))
            slabs = b.pipeline.stats()["host_slab_bytes"]
            self.assertTrue(stored <= slabs < stored * 1.01, (slabs, stored))
            del b
            mlo.torch.close_model_offload(pipe)


class ProgressTests(unittest.TestCase):
    """Long work at enable shows diffusers' kind of progress bar, off with
    the pipeline's own switch or diffusers' global one, and one log line
    says where each component lives and why."""

    def enable(self, d, configure=lambda pipe: None):
        import contextlib
        import io
        from diffusers import WanPipeline
        pipe = WanPipeline.from_pretrained(d)
        configure(pipe)
        err = io.StringIO()
        with warnings.catch_warnings(), contextlib.redirect_stderr(err), \
                self.assertLogs("mlo.torch", "INFO") as logs:
            warnings.simplefilter("ignore")
            mlo.torch.enable_model_offload(pipe, device=DEVICE, host_memory="700K")
        mlo.torch.close_model_offload(pipe)
        return err.getvalue(), " ".join(logs.output)

    def test_bars_and_the_placement_line(self):
        import tempfile
        from diffusers.utils import logging as dlogging
        with tempfile.TemporaryDirectory(prefix="mlo-progress-") as d:
            tiny.wan(ffn_dim=2000).save_pretrained(d)  # 557 KiB each expert
            shown, said = self.enable(d)
            self.assertIn("mlo: finding the weights in their files", shown)
            self.assertIn("mlo: reading weights into host slabs", shown)
            self.assertIn("100%", shown)
            # the expert used most per prompt keeps its slab, the other is
            # read from its files at each load; the VAE is on the device
            for name, where in (("transformer", "host slab"), ("transformer_2", "disk"),
                                ("vae", "device"), ("text_encoder", "device")):
                self.assertRegex(said, r"(: |; )%s \([a-z]+, [0-9.]+ [KM]iB\): %s, [^;]*[a-z]"
                                 % (name, where))
            self.assertIn("host_memory 700.0 KiB", said)
            shown, _ = self.enable(d, lambda pipe: pipe.set_progress_bar_config(disable=True))
            self.assertNotIn("mlo:", shown)
            dlogging.disable_progress_bar()
            try:
                shown, _ = self.enable(d)
            finally:
                dlogging.enable_progress_bar()
            self.assertNotIn("mlo:", shown)


    def test_bar_for_each_load_from_disk_during_a_generation(self):
        """The expert the host plan leaves on disk is read at each of its
        loads; with the reads paced (MLO_DISK_BW) a bar shows each one's
        bytes, drawn by a thread polling libmlo while the forward waits, to
        100%; none with the pipeline's bars off, and the latents are the
        same either way."""
        import contextlib
        import io
        import tempfile
        from diffusers import WanPipeline
        with tempfile.TemporaryDirectory(prefix="mlo-progress-") as d:
            tiny.wan(ffn_dim=2000).save_pretrained(d)  # 557 KiB each expert
            old = os.environ.get("MLO_DISK_BW")
            os.environ["MLO_DISK_BW"] = "2000000"  # an expert's read: about 0.3 s
            try:
                shown, latents = [], []
                for bars in (True, False):
                    pipe = WanPipeline.from_pretrained(d)
                    if not bars:
                        pipe.set_progress_bar_config(disable=True)
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        mlo.torch.enable_model_offload(pipe, device=DEVICE, host_memory="700K",
                                                       policy="strict")
                    err = io.StringIO()
                    with contextlib.redirect_stderr(err):
                        latents.append(tiny.run_wan(pipe, steps=4))  # both experts
                    mlo.torch.close_model_offload(pipe)
                    shown.append(err.getvalue())
            finally:
                if old is None:
                    os.environ.pop("MLO_DISK_BW", None)
                else:
                    os.environ["MLO_DISK_BW"] = old
            self.assertRegex(shown[0], r"mlo: loading transformer(_2)? from disk: +100%")
            self.assertNotIn("from disk", shown[1])
            self.assertTrue(np.array_equal(latents[0], latents[1]))


class FromPretrainedTiersTests(unittest.TestCase):
    """from_pretrained with every tier at once: each expert larger than the
    device budget (it streams), parts of it on disk (host_memory), the
    budget policy prefetching by the schedule it learns."""

    def test_streamed_from_disk_with_a_learned_schedule(self):
        import tempfile
        from diffusers import WanPipeline
        with tempfile.TemporaryDirectory(prefix="mlo-tiers-") as d:
            tiny.wan(num_layers=8, ffn_dim=4096).save_pretrained(d)
            ref = tiny.run_wan(WanPipeline.from_pretrained(d))
            sizes = component_bytes(WanPipeline.from_pretrained(d))
            budget = sizes["vae"] + sizes["text_encoder"] + sizes["transformer"] * 6 // 10
            # the blocks both experts stream (40% each) and more, not all of both
            host = sizes["transformer"] * 17 // 10
            pipe, _ = from_pretrained_quietly(WanPipeline, d, device=DEVICE, policy="budget",
                                              budget=budget, host_memory=host)
            b = pipe._mlo_offload
            for m in b.managed:
                if m.role == "dit":
                    self.assertTrue(m.streams, m.name)
            st = b.pipeline.stats()
            self.assertGreater(st["disk_bytes"], 0)
            self.assertLessEqual(st["host_slab_bytes"], host)
            prefetches = []
            for _ in range(3):
                before = b.pipeline.stats()["prefetches"]
                np.testing.assert_array_equal(tiny.run_wan(pipe), ref)
                prefetches.append(b.pipeline.stats()["prefetches"] - before)
                b.pipeline.audit()
            st = b.pipeline.stats()
            self.assertGreater(st["disk_read_bytes"], 0)
            self.assertGreater(st["block_loads"], 0)
            self.assertLessEqual(st["peak_device_bytes"], budget)
            self.assertGreater(prefetches[-1], 0, prefetches)  # by the learned schedule
            mlo.torch.close_model_offload(pipe)


class FromPretrainedFormsTests(unittest.TestCase):
    """The folders diffusers writes: a variant beside the default weights,
    sharded (an index and its shards), and dtype= with the files in that
    dtype (nothing converted) or in another (converted once, said so)."""

    def setUp(self):
        import tempfile
        self.tmp = tempfile.TemporaryDirectory(prefix="mlo-forms-")
        self.addCleanup(self.tmp.cleanup)
        self.dir = self.tmp.name

    def test_variant_sharded(self):
        from diffusers import WanPipeline
        tiny.wan(seed=0).save_pretrained(self.dir)
        tiny.wan(seed=1).save_pretrained(self.dir, variant="v1", max_shard_size="20KB")
        shards = [f for f in os.listdir(os.path.join(self.dir, "transformer"))
                  if f.startswith("diffusion_pytorch_model.v1-")]
        self.assertGreater(len(shards), 1)  # the index's case, not one file
        default = tiny.run_wan(WanPipeline.from_pretrained(self.dir))
        ref = tiny.run_wan(WanPipeline.from_pretrained(self.dir, variant="v1"))
        self.assertFalse(np.array_equal(default, ref))
        pipe, said = from_pretrained_quietly(WanPipeline, self.dir, variant="v1", device=DEVICE,
                                             host_memory="30K")
        np.testing.assert_array_equal(tiny.run_wan(pipe), ref)
        self.assertGreater(pipe._mlo_offload.pipeline.stats()["disk_read_bytes"], 0)
        used = set(sources(pipe, "transformer").values())
        # every shard, each from the index: none of the default file's
        self.assertEqual(sorted(os.path.basename(f) for f in used
                                if f.startswith(self.dir)), sorted(shards))
        self.assertIn("model.v1.safetensors", {os.path.basename(f) for f in sources(
            pipe, "text_encoder").values()})
        self.assertNotIn("converted", said)
        mlo.torch.close_model_offload(pipe)
        np.testing.assert_array_equal(tiny.run_wan(pipe), ref)

    def test_dtype_converted_once_or_not_at_all(self):
        from diffusers import WanPipeline
        tiny.wan().save_pretrained(self.dir)  # float32
        plain = WanPipeline.from_pretrained(self.dir, dtype=torch.bfloat16)
        plain.save_pretrained(self.dir, variant="bf16")  # as diffusers holds it in bfloat16
        ref = tiny.run_wan(plain)
        want = {k: v.dtype for k, v in plain.transformer.state_dict().items()}
        self.assertIn(torch.float32, set(want.values()))  # _keep_in_fp32_modules
        self.assertIn(torch.bfloat16, set(want.values()))
        for kwargs in ({"variant": "bf16", "torch_dtype": torch.bfloat16},  # the files' dtype
                       {"dtype": torch.bfloat16}):  # converted
            with self.subTest(**{k: str(v) for k, v in kwargs.items()}):
                pipe, said = from_pretrained_quietly(WanPipeline, self.dir, device=DEVICE,
                                                     **kwargs)
                src = sources(pipe, "transformer")
                scratch = {f for f in src.values() if not f.startswith(self.dir)}
                self.assertLessEqual(len(scratch), 1)
                in_scratch = [k for k, f in src.items() if f in scratch]
                params = dict(pipe.transformer.named_parameters())
                if "variant" in kwargs:
                    self.assertNotIn("converted", said)
                    self.assertFalse([k for k in in_scratch if k in params])  # buffers only
                else:
                    # every floating parameter not kept in float32 read once,
                    # converted, into the scratch file, and said so
                    moved = sorted(k for k in params if want[k] == torch.bfloat16)
                    self.assertEqual(sorted(k for k in in_scratch if k in params), moved)
                    self.assertIn("transformer: %d tensor(s) converted" % len(moved), said)
                    self.assertIn("materialized once", said)
                    self.assertTrue(all(os.path.isfile(f) for f in scratch))
                got = {k: v.dtype for k, v in pipe.transformer.state_dict().items()}
                self.assertEqual(got, want)
                np.testing.assert_array_equal(tiny.run_wan(pipe), ref)
                mlo.torch.close_model_offload(pipe)
                del pipe
                gc.collect()
                self.assertFalse([f for f in scratch if os.path.exists(f)])  # removed with it
        with self.assertRaises(ValueError):
            mlo.torch.from_pretrained(WanPipeline, self.dir, dtype=torch.bfloat16,
                                      torch_dtype=torch.bfloat16)


if __name__ == "__main__":
    unittest.main()
