#!/usr/bin/env python3
"""The activation model of `mlo plan` against real diffusers transformers
and VAEs (issue 43, item 1).

`test_activation.py MLO_BINARY` builds small WanTransformer3DModel,
FluxTransformer2DModel and QwenImageTransformer2DModel configurations, a
small UMT5 encoder (held to an upper count: below) and two VAEs (Wan's at its real
widths, a 2-D AutoencoderKL at Flux's) with random weights, saves each as
a component folder (the DiTs in bf16, as from_pretrained(torch_dtype=
bfloat16) loads them, the modules diffusers keeps in float32 kept so; the
VAEs in float32, as diffusers runs Wan's), runs one forward (a decode) on
CPU at two resolutions, and measures the forward's peak of allocated bytes with torch's own counters: the profiler's allocation
events (profile_memory=True), which the CPU allocator reports with every
allocation and free made inside the profiled window; the weights and
inputs, allocated before it, are not counted.  `mlo plan FOLDER --json
--kernels cpu` at the same job must give the component's activations
within 15% of that.  The formula lives only in mlo
(tools/mlo/plan_activation.c): the test reads what mlo prints.

Needs torch and diffusers (MLO_TORCH_PYTHON, as python_torch); exits 77
(ctest: skipped) without them.
"""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

MLO = None
TOLERANCE = 0.15


def have_torch():
    return all(importlib.util.find_spec(m) is not None for m in ("torch", "diffusers"))


def peak_allocated(forward):
    """The largest number of bytes allocated at once, counted from the
    allocations and frees torch's CPU allocator reports to the profiler
    while forward() runs."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        forward()
    allocation = torch._C._profiler._EventType.Allocation
    events = []

    def walk(event):
        if event.tag == allocation:
            events.append((event.start_time_ns, event.extra_fields.alloc_size))
        for child in event.children:
            walk(child)

    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root)
    events.sort()
    live = peak = 0
    for _, size in events:
        live += size
        peak = max(peak, live)
    return peak


def save_bf16(model_class, model, folder):
    """Saves model as from_pretrained(torch_dtype=bfloat16) would load it,
    and returns it so loaded."""
    import torch

    os.makedirs(os.path.dirname(folder), exist_ok=True)
    raw = tempfile.mkdtemp(dir=os.path.dirname(folder))
    model.save_pretrained(raw)
    loaded = model_class.from_pretrained(raw, torch_dtype=torch.bfloat16).eval()
    loaded.save_pretrained(folder)
    shutil.rmtree(raw)
    return loaded


def planned(folder, family, height, width, frames, text_tokens):
    args = [MLO, "plan", folder, "--job", family, "--kernels", "cpu", "--json",
            "--height", str(height), "--width", str(width), "--frames", str(frames),
            "--text-tokens", str(text_tokens), "--device-memory", "80G", "--offload", "none"]
    p = subprocess.run(args, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise AssertionError(f"{' '.join(args)} -> {p.returncode}: {p.stderr}")
    res = json.loads(p.stdout)
    (dit,) = [c for c in res["components"] if c["role"] == "dit"]
    return dit, res


class Measured(unittest.TestCase):
    """A temporary folder and the comparison; the tests are the subclasses'."""

    @classmethod
    def setUpClass(cls):
        import torch

        torch.manual_seed(0)
        torch.set_num_threads(1)  # one thread: no per-thread buffers of another machine's count
        cls.tmp = tempfile.mkdtemp(prefix="mlo-activation-")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def check(self, name, measured, dit, res):
        """dit: the component's row of mlo plan's JSON."""
        modelled = dit["activation_bytes"]
        with self.subTest(name):
            self.assertGreater(measured, 0)
            err = modelled / measured - 1
            print(f"{name}: measured {measured} B, modelled {modelled:.0f} B "
                  f"({err:+.1%}, peak at the {dit['activation_phase']})")
            self.assertLess(abs(err), TOLERANCE, f"{name}: modelled {modelled:.0f} B against "
                            f"{measured} B measured ({err:+.1%})")
            # the reserve is built on what was modelled: never less than it
            self.assertGreaterEqual(res["memory"]["model_reserve_bytes"], modelled)


class ActivationTests(Measured):
    """The DiTs: Wan's and Flux's transformer blocks."""

    def test_wan_transformer(self):
        import torch
        from diffusers import WanTransformer3DModel

        # Wan2.2 A14B's proportions at a small width: 128-wide heads, an FFN
        # 2.7x the hidden width, its patching and its VAE's latent.
        folder = os.path.join(self.tmp, "wan", "transformer")
        model = save_bf16(WanTransformer3DModel, WanTransformer3DModel(
            num_attention_heads=2, attention_head_dim=128, in_channels=16, out_channels=16,
            text_dim=64, freq_dim=32, ffn_dim=704, num_layers=2, rope_max_seq_len=1024),
            folder)
        text_tokens, frames = 512, 81
        text = torch.randn(1, text_tokens, 64, dtype=torch.bfloat16)
        tokens = []
        for height, width in ((96, 160), (192, 320)):
            latent = torch.randn(1, 16, (frames - 1) // 4 + 1, height // 8, width // 8,
                                 dtype=torch.bfloat16)
            measured = peak_allocated(
                lambda: model(latent, torch.tensor([500]), text, return_dict=False))
            dit, res = planned(folder, "wan2.2-t2v", height, width, frames,
                               text_tokens)
            tokens.append(dit["activation_tokens"])
            self.check(f"wan {width}x{height}x{frames}", measured, dit, res)
        self.assertEqual(tokens, [21 * 6 * 10, 21 * 12 * 20])  # latent frames x patches

    def test_flux_transformer(self):
        import torch
        from diffusers import FluxTransformer2DModel

        folder = os.path.join(self.tmp, "flux", "transformer")
        model = save_bf16(FluxTransformer2DModel, FluxTransformer2DModel(
            patch_size=1, in_channels=64, num_layers=1, num_single_layers=2,
            attention_head_dim=128, num_attention_heads=2, joint_attention_dim=64,
            pooled_projection_dim=32, guidance_embeds=True, axes_dims_rope=(16, 56, 56)),
            folder)
        text_tokens = 128
        text = torch.randn(1, text_tokens, 64, dtype=torch.bfloat16)
        pooled = torch.randn(1, 32, dtype=torch.bfloat16)
        for size in (256, 512):
            h = w = size // 16
            latent = torch.randn(1, h * w, 64, dtype=torch.bfloat16)
            img_ids = torch.zeros(h * w, 3)
            img_ids[:, 1] = torch.arange(h).repeat_interleave(w)
            img_ids[:, 2] = torch.arange(w).repeat(h)
            txt_ids = torch.zeros(text_tokens, 3)
            measured = peak_allocated(lambda: model(
                latent, text, pooled, torch.tensor([0.5]), img_ids, txt_ids, torch.tensor([3.5]),
                return_dict=False))
            dit, res = planned(folder, "flux", size, size, 1, text_tokens)
            self.assertEqual(dit["activation_tokens"], h * w)
            self.check(f"flux {size}x{size}", measured, dit, res)


class QwenActivationTests(Measured):
    """Qwen-Image's double-stream transformer (two blocks, 128-wide heads)."""

    def test_qwen_image_transformer(self):
        import torch
        from diffusers import QwenImageTransformer2DModel

        folder = os.path.join(self.tmp, "qwen", "transformer")
        model = save_bf16(QwenImageTransformer2DModel, QwenImageTransformer2DModel(
            patch_size=2, in_channels=64, out_channels=16, num_layers=2, attention_head_dim=128,
            num_attention_heads=2, joint_attention_dim=64, axes_dims_rope=(16, 56, 56)), folder)
        text_tokens = 128
        text = torch.randn(1, text_tokens, 64, dtype=torch.bfloat16)
        mask = torch.ones(1, text_tokens, dtype=torch.long)
        for size in (256, 512):
            h = w = size // 16
            latent = torch.randn(1, h * w, 64, dtype=torch.bfloat16)
            measured = peak_allocated(lambda: model(latent, text, mask, torch.tensor([0.5]),
                                                    img_shapes=[(1, h, w)], return_dict=False))
            dit, res = planned(folder, "qwen-image", size, size, 1, text_tokens)
            self.assertEqual(dit["activation_tokens"], h * w)
            self.check(f"qwen-image {size}x{size}", measured, dit, res)


class VaeActivationTests(Measured):
    """The VAE's decode, counted from its decoder's levels: Wan2.2's causal
    video VAE at its real widths (diffusers' default AutoencoderKLWan
    config), and a 2-D AutoencoderKL at Flux's widths, both float32 as
    diffusers runs Wan's VAE, at two resolutions each."""

    def vae_row(self, folder, family, height, width, frames):
        p = subprocess.run([MLO, "plan", folder, "--job", family, "--kernels", "cpu", "--json",
                            "--height", str(height), "--width", str(width), "--frames",
                            str(frames), "--device-memory", "80G", "--offload", "none"],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        res = json.loads(p.stdout)
        (vae,) = [c for c in res["components"] if c["role"] == "vae"]
        return vae, res

    def test_wan_vae(self):
        import torch
        from diffusers import AutoencoderKLWan

        folder = os.path.join(self.tmp, "wan-vae", "vae")
        vae = AutoencoderKLWan().eval()
        vae.save_pretrained(folder)
        frames = 9
        for size in (64, 96):
            latent = torch.randn(1, 16, (frames - 1) // 4 + 1, size // 8, size // 8)
            measured = peak_allocated(lambda: vae.decode(latent, return_dict=False))
            row, res = self.vae_row(folder, "wan2.2-t2v", size, size, frames)
            self.check(f"wan vae {size}x{size}x{frames}", measured, row, res)

    def test_image_vae(self):
        import torch
        from diffusers import AutoencoderKL

        folder = os.path.join(self.tmp, "kl-vae", "vae")
        vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=16,
                            down_block_types=["DownEncoderBlock2D"] * 4,
                            up_block_types=["UpDecoderBlock2D"] * 4,
                            block_out_channels=[128, 256, 512, 512], layers_per_block=2).eval()
        vae.save_pretrained(folder)
        for size in (128, 192):
            latent = torch.randn(1, 16, size // 8, size // 8)
            measured = peak_allocated(lambda: vae.decode(latent, return_dict=False))
            row, res = self.vae_row(folder, "flux", size, size, 1)
            self.check(f"2-D vae {size}x{size}", measured, row, res)


class EncoderActivationTests(Measured):
    """A text encoder's count is an upper one (its scores' float32 copies
    depend on transformers' attention code): never below the measured peak,
    and within 35% of it, for a small UMT5 encoder (Wan's family)."""

    def test_umt5_encoder(self):
        import torch
        if importlib.util.find_spec("transformers") is None:
            self.skipTest("transformers not installed")
        from transformers import UMT5Config, UMT5EncoderModel

        folder = os.path.join(self.tmp, "umt5", "text_encoder")
        config = UMT5Config(vocab_size=1000, d_model=256, d_kv=64, d_ff=640, num_layers=2,
                            num_heads=4, relative_attention_num_buckets=32,
                            feed_forward_proj="gated-gelu")
        model = UMT5EncoderModel(config).to(torch.bfloat16).eval()
        model.save_pretrained(folder)
        for tokens in (128, 512):
            ids = torch.randint(0, 1000, (1, tokens))
            mask = torch.ones(1, tokens, dtype=torch.long)
            measured = peak_allocated(lambda: model(input_ids=ids, attention_mask=mask))
            p = subprocess.run([MLO, "plan", folder, "--job", "wan2.2-t2v", "--kernels", "cpu",
                                "--json", "--text-tokens", str(tokens), "--device-memory", "80G",
                                "--offload", "none"], capture_output=True, text=True, timeout=120)
            self.assertEqual(p.returncode, 0, p.stderr)
            (row,) = json.loads(p.stdout)["components"]
            modelled = row["activation_bytes"]
            print(f"umt5 at {tokens} tokens: measured {measured} B, modelled {modelled:.0f} B "
                  f"({modelled / measured - 1:+.1%})")
            self.assertGreaterEqual(modelled, measured)
            self.assertLess(modelled, measured * 1.35)


def main():
    global MLO
    if len(sys.argv) != 2:
        print("usage: test_activation.py MLO_BINARY", file=sys.stderr)
        return 2
    MLO = os.path.abspath(sys.argv[1])
    if not have_torch():
        print(f"skipped: torch or diffusers not installed for {sys.executable}")
        return 77
    suite = unittest.TestSuite(unittest.defaultTestLoader.loadTestsFromTestCase(cls)
                               for cls in (ActivationTests, QwenActivationTests,
                                           VaeActivationTests, EncoderActivationTests))
    return 0 if unittest.TextTestRunner(verbosity=2).run(suite).wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
