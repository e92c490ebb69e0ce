#!/usr/bin/env python3
"""Writes the real-library fixtures of tests/format/real/ (issue: real
checkpoints as the tools that write them lay them out).

Every file here is written by the libraries users get their checkpoints
from, never by mlo: diffusers' and transformers' own save_pretrained (tiny
random-weight Wan2.2, Wan2.1 and Flux pipelines; sharded, fp16 variants,
a hub-style folder with both), PyPI's safetensors for ComfyUI /
stable-diffusion.cpp single files under their real names, and PyPI's gguf
for GGUF files.  Alongside, expect.json records what diffusers itself says
about each pipeline: the expert schedule (which transformer each step runs,
from the pipeline's own scheduler and boundary rule), so the C tests compare
mlo against diffusers, not against themselves.

torch + diffusers + transformers are several GB, too big for CI, so the
output is checked in (about 1.5 MB) and this script is how it was made:

    python3 -m venv /tmp/fx && /tmp/fx/bin/pip install torch diffusers \
        transformers safetensors gguf numpy
    /tmp/fx/bin/python tests/format/real/generate.py

It is deterministic (fixed seeds) and rewrites the whole folder.
"""
import json
import os
import shutil
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
STEP_COUNTS = [1, 2, 4, 8, 10, 20, 30, 40, 50]


def tiny_wan_transformer(torch, seed):
    from diffusers import WanTransformer3DModel
    torch.manual_seed(seed)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=4,
        out_channels=4, text_dim=16, freq_dim=16, ffn_dim=32, num_layers=2,
        rope_max_seq_len=32).eval()


def tiny_wan_vae(torch):
    from diffusers import AutoencoderKLWan
    torch.manual_seed(3)
    return AutoencoderKLWan(base_dim=4, z_dim=4, dim_mult=[1, 1], num_res_blocks=1,
                            temperal_downsample=[False], latents_mean=[0.0] * 4,
                            latents_std=[1.0] * 4).eval()


def tiny_umt5(torch):
    from transformers import UMT5Config, UMT5EncoderModel
    torch.manual_seed(4)
    cfg = UMT5Config(vocab_size=64, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2,
                     relative_attention_num_buckets=8)
    return UMT5EncoderModel(cfg).eval()


def wan_scheduler(shift):
    from diffusers import UniPCMultistepScheduler
    return UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                   num_train_timesteps=1000, flow_shift=shift)


def expert_schedule(pipe):
    """For each step count, the number of steps diffusers' WanPipeline runs
    on `transformer` (the high-noise expert): its rule, t >= boundary_ratio *
    num_train_timesteps, over the timesteps its own scheduler makes."""
    out = {}
    ratio = pipe.config.boundary_ratio
    for n in STEP_COUNTS:
        pipe.scheduler.set_timesteps(n)
        ts = [float(t) for t in pipe.scheduler.timesteps]
        if ratio is None:
            first = n
        else:
            b = ratio * pipe.scheduler.config.num_train_timesteps
            first = sum(1 for t in ts if t >= b)
        out[str(n)] = {"first": first, "timesteps": ts}
    return out


def save_pipe(pipe, name, **kw):
    path = os.path.join(HERE, name)
    pipe.save_pretrained(path, **kw)
    return path


def save_config_only(pipe, name):
    """model_index.json and the scheduler as diffusers writes them, without
    the weights (the schedule depends on nothing else; keeps the fixtures
    small)."""
    path = save_pipe(pipe, name)
    for entry in os.listdir(path):
        if entry != "scheduler" and os.path.isdir(os.path.join(path, entry)):
            shutil.rmtree(os.path.join(path, entry))
    return path


def main():
    import torch
    from diffusers import (AutoencoderKL, FlowMatchEulerDiscreteScheduler,
                           FluxTransformer2DModel, FluxPipeline, WanPipeline)
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel
    import diffusers
    import transformers

    for entry in os.listdir(HERE):
        p = os.path.join(HERE, entry)
        if os.path.isdir(p):
            shutil.rmtree(p)
    expect = {"versions": {"torch": torch.__version__, "diffusers": diffusers.__version__,
                           "transformers": transformers.__version__}}

    # Wan2.2: two experts, boundary 0.875, the UniPC scheduler with flow
    # sigmas a Wan2.2 directory ships (shift 3 here, 12 below).
    hi, lo = tiny_wan_transformer(torch, 1), tiny_wan_transformer(torch, 2)
    vae, te = tiny_wan_vae(torch), tiny_umt5(torch)
    wan22 = WanPipeline(tokenizer=None, text_encoder=te, vae=vae, scheduler=wan_scheduler(3.0),
                        transformer=hi, transformer_2=lo, boundary_ratio=0.875)
    save_pipe(wan22, "wan22")                                   # unsharded, fp32
    save_pipe(wan22, "wan22-sharded", max_shard_size="40KB")   # weight maps
    save_pipe(wan22, "wan22-hub")                               # plain files, fp16 below
    expect["wan22"] = {"schedule": expert_schedule(wan22)}
    wan22.scheduler = wan_scheduler(12.0)
    save_config_only(wan22, "wan22-shift12")
    expect["wan22-shift12"] = {"schedule": expert_schedule(wan22)}
    wan22.scheduler = FlowMatchEulerDiscreteScheduler(shift=5.0)
    save_config_only(wan22, "wan22-flowmatch")
    expect["wan22-flowmatch"] = {"schedule": expert_schedule(wan22)}
    wan22.scheduler = wan_scheduler(3.0)

    # fp16 variants (the same weights, rounded: .to() casts in place, so
    # this comes after every fp32 save): sharded alone, and into the hub
    # folder beside its default files.
    wan22_16 = wan22.to(torch.float16)
    save_pipe(wan22_16, "wan22-fp16-sharded", variant="fp16", max_shard_size="40KB")
    save_pipe(wan22_16, "wan22-hub", variant="fp16")
    expect["wan22-hub"] = {"schedule": expert_schedule(wan22_16)}

    # UniPC without flow sigmas (the DDPM-style spacings): diffusers'
    # integer timesteps, for test_schedule.c to write configs from.
    from diffusers import UniPCMultistepScheduler
    discrete = []
    for spacing in ("linspace", "leading", "trailing"):
        for offset in (0, 1):
            for n in (1, 4, 7, 10, 30):
                sch = UniPCMultistepScheduler(timestep_spacing=spacing, steps_offset=offset)
                sch.set_timesteps(n)
                discrete.append({"spacing": spacing, "steps_offset": offset, "steps": n,
                                 "timesteps": [int(t) for t in sch.timesteps]})
    expect["unipc_discrete"] = discrete

    # Wan2.1: one transformer, no boundary.
    wan21 = WanPipeline(tokenizer=None, text_encoder=tiny_umt5(torch), vae=tiny_wan_vae(torch),
                        scheduler=wan_scheduler(3.0), transformer=tiny_wan_transformer(torch, 5))
    save_pipe(wan21, "wan21")
    expect["wan21"] = {"schedule": expert_schedule(wan21)}

    # Flux: CLIP + T5 encoders, a FlowMatch scheduler, an AutoencoderKL.
    torch.manual_seed(6)
    clip = CLIPTextModel(CLIPTextConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                                        num_hidden_layers=1, num_attention_heads=2,
                                        max_position_embeddings=16, projection_dim=16)).eval()
    t5 = T5EncoderModel(T5Config(vocab_size=64, d_model=16, d_kv=8, d_ff=32, num_layers=1,
                                 num_heads=2, relative_attention_num_buckets=8)).eval()
    flux_tr = FluxTransformer2DModel(patch_size=1, in_channels=8, num_layers=1,
                                     num_single_layers=1, attention_head_dim=8,
                                     num_attention_heads=2, joint_attention_dim=16,
                                     pooled_projection_dim=16, axes_dims_rope=(2, 2, 4)).eval()
    flux_vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=2,
                             block_out_channels=(8,), down_block_types=("DownEncoderBlock2D",),
                             up_block_types=("UpDecoderBlock2D",), layers_per_block=1,
                             norm_num_groups=4).eval()
    flux = FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), vae=flux_vae,
                        text_encoder=clip, tokenizer=None, text_encoder_2=t5, tokenizer_2=None,
                        transformer=flux_tr)
    save_pipe(flux, "flux")

    # ComfyUI / stable-diffusion.cpp single files under their real names,
    # written by PyPI's safetensors from the same modules' state dicts.
    from safetensors.torch import save_file
    single = os.path.join(HERE, "single")
    os.makedirs(single)
    files = {
        "wan2.2_t2v_high_noise_14B_fp16.safetensors": hi.half(),
        "wan2.2_t2v_low_noise_14B_fp16.safetensors": lo.half(),
        "umt5_xxl_fp8_e4m3fn_scaled.safetensors": te,
        "wan2.1_vae.safetensors": vae,
        "flux1-dev.safetensors": flux_tr,
        "t5xxl_fp16.safetensors": t5.half(),
        "clip_l.safetensors": clip,
        "ae.safetensors": flux_vae,
    }
    for fname, mod in files.items():
        sd = {k: v.contiguous() for k, v in mod.state_dict().items()}
        if fname.startswith("umt5"):  # the fp8 checkpoint users download
            sd = {k: (v.to(torch.float8_e4m3fn) if v.ndim == 2 else v) for k, v in sd.items()}
        # tied weights (T5's shared/embed_tokens) are stored once, as users' files do
        seen, out = {}, {}
        for k, v in sd.items():
            key = (v.data_ptr(), v.shape, v.dtype)
            if key in seen:
                continue
            seen[key] = k
            out[k] = v.clone()
        save_file(out, os.path.join(single, fname), metadata={"format": "pt"})

    # GGUF files as ComfyUI-GGUF / stable-diffusion.cpp users have them,
    # written by PyPI's gguf: quantized blocks (Q8_0, Q4_0, Q4_K, Q6_K) next
    # to F16/F32 tensors, and one with a non-default alignment.
    import gguf
    rng = np.random.default_rng(7)

    def gguf_file(name, arch, alignment, tensors):
        w = gguf.GGUFWriter(os.path.join(single, name), arch)
        if alignment:
            w.add_custom_alignment(alignment)
        w.add_string("general.name", name.split(".")[0])
        w.add_array("test.shape_list", [1, 2, 3])
        for tname, qtype, shape in tensors:
            if qtype in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
                arr = rng.standard_normal(shape).astype(
                    np.float32 if qtype == gguf.GGMLQuantizationType.F32 else np.float16)
                w.add_tensor(tname, arr)
            else:  # the quantized bytes of this shape: opaque to mlo as to ComfyUI's loader
                bs, ts = gguf.GGML_QUANT_SIZES[qtype]
                row = shape[-1] // bs * ts
                raw = rng.integers(0, 256, size=(*shape[:-1], row), dtype=np.uint8)
                w.add_tensor(tname, raw, raw_dtype=qtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    Q = gguf.GGMLQuantizationType
    gguf_file("wan2.2_t2v_high_noise_14B_Q4_K_M.gguf", "wan", None, [
        ("blocks.0.self_attn.q.weight", Q.Q4_K, (16, 256)),
        ("blocks.0.self_attn.k.weight", Q.Q6_K, (16, 256)),
        ("blocks.0.ffn.0.weight", Q.Q8_0, (32, 64)),
        ("blocks.0.ffn.2.weight", Q.Q4_0, (8, 96)),
        ("blocks.0.norm3.weight", Q.F32, (16,)),
        ("patch_embedding.weight", Q.F16, (16, 4, 1, 2)),
    ])
    gguf_file("umt5-xxl-encoder-Q8_0.gguf", "t5encoder", 64, [
        ("enc.blk.0.attn_q.weight", Q.Q8_0, (16, 32)),
        ("enc.blk.0.attn_norm.weight", Q.F32, (16,)),
        ("token_embd.weight", Q.F16, (64, 16)),
    ])
    expect["gguf_sizes"] = {t.name: list(v) for t, v in gguf.GGML_QUANT_SIZES.items()}

    # What the reference readers see in every file written above: per
    # component folder (or single file), the tensor count, the tensors'
    # bytes and their dtypes, from safetensors' safe_open and gguf's
    # GGUFReader, never from mlo.
    from safetensors import safe_open
    def st_view(paths):
        n, nbytes, dtypes = 0, 0, {}
        for path in paths:
            with safe_open(path, "pt") as f:
                for k in f.keys():
                    t = f.get_slice(k)
                    d = t.get_dtype()  # the file's own dtype string ("F32")
                    shape = t.get_shape()
                    numel = 1
                    for x in shape:
                        numel *= x
                    width = {"F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "I64": 8}[d]
                    n += 1
                    nbytes += numel * width
                    dtypes[d] = dtypes.get(d, 0) + 1
        return {"tensors": n, "tensor_bytes": nbytes, "dtypes": dtypes}

    def folder_files(folder, variant):
        names = sorted(os.listdir(folder))
        st = [x for x in names if x.endswith(".safetensors")]
        if variant:
            st = [x for x in st if f".{variant}." in x or f".{variant}-" in x]
        else:
            st = [x for x in st if x.count(".") == 1 or "-of-" in x and ".fp16" not in x]
        return [os.path.join(folder, x) for x in st]

    views = {}
    for d in ("wan22", "wan22-sharded", "wan22-fp16-sharded", "wan21", "flux", "wan22-hub"):
        for variant in ((None, "fp16") if d == "wan22-hub" else (None,)):
            key = d + (f"@{variant}" if variant else "")
            comps = {}
            root = os.path.join(HERE, d)
            for c in sorted(os.listdir(root)):
                folder = os.path.join(root, c)
                if not os.path.isdir(folder) or c == "scheduler":
                    continue
                v = variant or ("fp16" if d == "wan22-fp16-sharded" else None)
                comps[c] = st_view(folder_files(folder, v))
            views[key] = comps
    for fname in sorted(os.listdir(single)):
        path = os.path.join(single, fname)
        if fname.endswith(".safetensors"):
            views["single/" + fname] = st_view([path])
        else:
            r = gguf.GGUFReader(path)
            dtypes = {}
            for t in r.tensors:
                dtypes[t.tensor_type.name] = dtypes.get(t.tensor_type.name, 0) + 1
            views["single/" + fname] = {
                "tensors": len(r.tensors),
                "tensor_bytes": int(sum(int(t.n_bytes) for t in r.tensors)),
                "dtypes": dtypes,
                "architecture": str(bytes(r.fields["general.architecture"].parts[-1]), "utf-8"),
            }
    expect["views"] = views

    with open(os.path.join(HERE, "expect.json"), "w") as f:
        json.dump(expect, f, indent=1, sort_keys=True)
        f.write("\n")
    total = 0
    for root, _, names in os.walk(HERE):
        total += sum(os.path.getsize(os.path.join(root, n)) for n in names)
    print(f"fixtures: {total / 1024:.0f} KiB", file=sys.stderr)


if __name__ == "__main__":
    main()
