"""test_torch_devices.py — mlo.torch over several devices (issue 45): one
libmlo pipeline given two host stand-ins, each with its own capacity and
budget, on a real tiny diffusers Wan2.2 pipeline (tiny.py).

On the host platform both "devices" are CPU memory, so the hooks' moves of
a forward's tensors are no-ops here; what is tested is that libmlo really
places the components on two platforms (mlo_component_device, each
device's peak), that pins are honoured and bad ones refused, that the
latents stay bit-identical, and (on the meta device) that the hooks' move
reaches every tensor of the nested structures forwards take and return.
The CUDA paths (device=["cuda:0", "cuda:1"]) need two GPUs: not run here.

    MLO_LIBRARY=build/libmlo.so .cache/torch-venv/bin/python python/tests/run.py test_torch_devices
"""
import collections
import dataclasses
import os
import sys
import unittest
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mlo  # noqa: E402
import mlo.torch  # noqa: E402
import tiny  # noqa: E402
from mlo.torch._hooks import _send  # noqa: E402

# Experts of about 5.1 MiB each and a text encoder of about 9.2 MiB: on a
# 12 MiB device the two experts fit (with the VAE), not with the encoder.
SIZES = dict(ffn_dim=20000, enc_ff=50000)
CAP = 12 << 20
DEV = "host:capacity=12M"
TWO = [DEV, DEV]


def build():
    return tiny.wan(**SIZES)


def latents(pipe):
    with torch.no_grad():
        return pipe(tiny.PROMPT, num_inference_steps=4, height=16, width=16, num_frames=5,
                    max_sequence_length=8, guidance_scale=3.0, guidance_scale_2=2.0,
                    generator=torch.Generator().manual_seed(0), output_type="latent",
                    return_dict=False)[0]


REF = None


def reference():
    global REF
    if REF is None:
        REF = latents(build())
    return REF


class TwoHostDevices(unittest.TestCase):
    def setUp(self):
        warnings.simplefilter("ignore")

    def offload(self, **kw):
        pipe = build()
        kw.setdefault("device", TWO)
        b = mlo.torch.enable_model_offload(pipe, **kw)
        self.addCleanup(mlo.torch.close_model_offload, pipe)
        return pipe, b

    def sizes(self, b):
        return {m.name: m.comp.bytes for m in b.managed}

    def test_experts_and_encoder_placed_apart_identical(self):
        size = build_sizes()
        # the premise: both experts fit one device, not with the encoder
        experts = size["transformer"] + size["transformer_2"]
        self.assertLessEqual(experts + size["vae"], CAP)
        self.assertGreater(experts + size["text_encoder"], CAP)
        for policy in ("budget", "strict"):
            with self.subTest(policy=policy):
                pipe, b = self.offload(policy=policy)
                self.assertEqual(b.pipeline.device_count, 2)
                out = latents(pipe)
                self.assertTrue(torch.equal(reference(), out), "latents differ (%s)" % policy)
                comp = {m.name: m.comp.device for m in b.managed}
                self.assertEqual({m.name: m.device for m in b.managed}, comp)
                self.assertNotEqual(comp["text_encoder"], comp["transformer"], comp)
                self.assertEqual(comp["transformer"], comp["transformer_2"], comp)
                p = b.device_placement()
                self.assertEqual(p["components"], comp)
                on = {d["index"]: set(d["components"]) for d in p["devices"]}
                self.assertEqual(on[comp["text_encoder"]] & {"transformer", "transformer_2"},
                                 set())
                # each device held its own components, within its own room
                enc_dev, dit_dev = p["devices"][comp["text_encoder"]], \
                    p["devices"][comp["transformer"]]
                self.assertGreaterEqual(enc_dev["peak_device_bytes"], size["text_encoder"])
                self.assertLess(enc_dev["peak_device_bytes"], size["text_encoder"] +
                                size["transformer"])
                self.assertGreaterEqual(dit_dev["peak_device_bytes"], size["transformer"])
                self.assertLess(dit_dev["peak_device_bytes"], size["transformer"] +
                                size["text_encoder"])
                for d in p["devices"]:
                    self.assertLessEqual(d["peak_device_bytes"], CAP)
                    self.assertEqual(d["room_bytes"], CAP)
                # the placement model's measure, per request: the budget
                # policy keeps both experts and the encoder, so at most half
                # of one device's (none); strict still switches the experts
                self.assertGreater(p["one_device_bytes"], 0)
                if policy == "budget":
                    self.assertLessEqual(2 * p["moved_bytes"], p["one_device_bytes"])
                else:
                    self.assertEqual(p["moved_bytes"], experts)
                    self.assertLess(p["moved_bytes"], p["one_device_bytes"])
                # ... and what a warm generation really copies: the same bytes
                b.pipeline.reset_stats()
                self.assertTrue(torch.equal(reference(), latents(pipe)))
                self.assertEqual(b.pipeline.stats()["h2d_bytes"], p["moved_bytes"])
                budgets = [d["budget_bytes"] for d in b.device_placement()["devices"]]
                self.assertEqual(budgets, [CAP, CAP] if policy == "budget" else [0, 0])
                mlo.torch.close_model_offload(pipe)

    def test_one_device_of_the_same_size_moves_more(self):
        pipe, one = self.offload(device=DEV, policy="budget")
        latents(pipe)
        one.pipeline.reset_stats()
        self.assertTrue(torch.equal(reference(), latents(pipe)))
        one_moved = one.pipeline.stats()["h2d_bytes"]
        self.assertGreater(one_moved, 0, "one 12 MiB device should switch the encoder out")
        self.assertEqual(one.pipeline.device_count, 1)
        self.assertEqual(one.device_placement()["moved_bytes"], 0)  # no placement on one
        pipe, two = self.offload(policy="budget")
        latents(pipe)
        two.pipeline.reset_stats()
        self.assertTrue(torch.equal(reference(), latents(pipe)))
        self.assertLessEqual(2 * two.pipeline.stats()["h2d_bytes"], one_moved)

    def test_enable_again_with_the_same_list_is_a_no_op(self):
        pipe, b = self.offload(policy="budget", place={"text_encoder": 1})
        self.assertIs(mlo.torch.enable_model_offload(pipe, device=tuple(TWO), policy="budget",
                                                     place={"text_encoder": 1}), b)
        with self.assertRaises(mlo.MloOwnedError):
            mlo.torch.enable_model_offload(pipe, device=TWO, policy="budget")
        mlo.torch.disable_model_offload(pipe)
        self.assertIs(mlo.torch.enable_model_offload(pipe, device=TWO, policy="budget",
                                                     place={"text_encoder": 1}), b)
        self.assertEqual(b.device_placement()["components"]["text_encoder"], 1)
        self.assertTrue(torch.equal(reference(), latents(pipe)))

    def test_pins_are_honoured(self):
        for place, want in (({"text_encoder": 0}, {"text_encoder": 0, "transformer": 1}),
                            ({"text_encoder": 1}, {"text_encoder": 1, "transformer": 0}),
                            ({"transformer": "host:capacity=13M"}, {"transformer": 1}),
                            # the experts split: each device switches on its own
                            ({"transformer": 0, "transformer_2": 1},
                             {"transformer": 0, "transformer_2": 1})):
            with self.subTest(place=place):
                device = [DEV, "host:capacity=13M"]
                pipe, b = self.offload(device=device, policy="budget", place=place)
                self.assertTrue(torch.equal(reference(), latents(pipe)), place)
                got = b.device_placement()
                for name, dev in want.items():
                    self.assertEqual(got["components"][name], dev, (place, got["components"]))
                self.assertEqual(set(got["pinned"]), set(place))
                for name in place:
                    self.assertEqual(got["pinned"][name], want[name])
                self.assertEqual([d["device"] for d in got["devices"]], device)
                self.assertEqual(got["devices"][1]["room_bytes"], 13 << 20)
                mlo.torch.close_model_offload(pipe)

    def test_bad_pins_are_refused(self):
        ref_pipe = build()
        for place, err, text in (
                ({"text_encoder": 2}, mlo.MloInvalidError, "device 2 is not one of the "
                                                           "pipeline's 2"),
                ({"text_encoder": -1}, mlo.MloInvalidError, "not a device index"),
                ({"text_encoder": 1.0}, mlo.MloInvalidError, "neither a device index"),
                ({"nope": 0}, mlo.MloNotFoundError, "no component 'nope'.*text_encoder"),
                ({"vae": "cuda:1"}, mlo.MloInvalidError, "'cuda:1' is none of device="),
                ({"vae": DEV}, mlo.MloInvalidError,
                 r"names devices \[0, 1\] of device=.*; pin by index")):
            with self.subTest(place=place):
                pipe = build()
                ptrs = {n: p.data_ptr() for n, p in pipe.text_encoder.named_parameters()}
                with self.assertRaisesRegex(err, text):
                    mlo.torch.enable_model_offload(pipe, device=TWO, place=place)
                # left as it was (C15), and runs as plain torch
                self.assertFalse(hasattr(pipe, "_mlo_offload"))
                self.assertFalse(pipe.text_encoder._forward_pre_hooks)
                self.assertEqual(ptrs, {n: p.data_ptr()
                                        for n, p in pipe.text_encoder.named_parameters()})
        self.assertTrue(torch.equal(reference(), latents(ref_pipe)))

    def test_a_pin_that_cannot_fit_names_the_sizes(self):
        pipe = build()
        with self.assertRaisesRegex(mlo.MloDeviceOutOfMemoryError,
                                    "'text_encoder' .* cannot run on device 1, where it is "
                                    "pinned"):
            mlo.torch.enable_model_offload(pipe, device=[DEV, "host:capacity=4M"],
                                           place={"text_encoder": 1})
        self.assertFalse(hasattr(pipe, "_mlo_offload"))
        self.assertTrue(torch.equal(reference(), latents(pipe)))

    def test_device_lists_checked(self):
        for device, text in ((["host", "cuda:0"], "mixes cuda and host"),
                             ([], "empty list"),
                             ([DEV, None], "each device of a list is named"),
                             ([DEV] * 17, "at most 16")):
            with self.subTest(device=device):
                with self.assertRaisesRegex(ValueError, text):
                    mlo.torch.enable_model_offload(build(), device=device)
        with self.assertRaisesRegex(ValueError, "not a {component name: device} dict"):
            mlo.torch.enable_model_offload(build(), device=TWO, place=3)


@dataclasses.dataclass
class _Out:
    sample: torch.Tensor
    note: str = "kept"


class MovesTests(unittest.TestCase):
    """The hooks' move (_send), to the meta device: what the forward of a
    component on another GPU is given and gives back."""

    def test_every_tensor_of_nested_structures_moves(self):
        from diffusers.models.modeling_outputs import Transformer2DModelOutput
        from transformers.modeling_outputs import BaseModelOutput
        Pair = collections.namedtuple("Pair", "a b")
        t = torch.ones(2)
        args = (t, [t, (t, 3)], {"x": t, "n": None, "deep": {"y": [t]}}, Pair(t, "s"), "text")
        out = _send(args, "meta")
        self.assertIsInstance(out, tuple)
        self.assertTrue(out[0].is_meta and out[1][0].is_meta and out[1][1][0].is_meta)
        self.assertEqual(out[1][1][1], 3)
        self.assertTrue(out[2]["x"].is_meta and out[2]["deep"]["y"][0].is_meta)
        self.assertIsNone(out[2]["n"])
        self.assertIsInstance(out[3], Pair)
        self.assertTrue(out[3].a.is_meta)
        self.assertEqual(out[3].b, "s")
        self.assertEqual(out[4], "text")
        self.assertFalse(t.is_meta)  # the caller's own are left where they were
        # diffusers' and transformers' outputs, and a dataclass
        d = _send(Transformer2DModelOutput(sample=t), "meta")
        self.assertIsInstance(d, Transformer2DModelOutput)
        self.assertTrue(d.sample.is_meta and d[0].is_meta and d["sample"].is_meta)
        h = _send(BaseModelOutput(last_hidden_state=t), "meta")
        self.assertIsInstance(h, BaseModelOutput)
        self.assertTrue(h.last_hidden_state.is_meta and h[0].is_meta)
        o = _send(_Out(t), "meta")
        self.assertTrue(o.sample.is_meta)
        self.assertEqual(o.note, "kept")

    def test_nothing_to_move_is_not_copied(self):
        t = torch.ones(2)
        args = (t, [t], {"x": t})
        self.assertIs(_send(args, "cpu"), args)
        self.assertIs(_send(args[2], "cpu"), args[2])
        self.assertIs(_send(t, "cpu"), t)


def build_sizes():
    pipe = build()
    b = mlo.torch.enable_model_offload(pipe, device="host")
    try:
        return {m.name: m.comp.bytes for m in b.managed}
    finally:
        mlo.torch.close_model_offload(pipe)


if __name__ == "__main__":
    unittest.main()
