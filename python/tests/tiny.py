"""tiny.py — tiny random-weight diffusers pipelines, built from configs in
memory (no download): a Wan2.2 pipeline with two transformers split at the
0.875 boundary, and a Flux pipeline with two text encoders (CLIP and T5).
Shared by the tests, the recorder and the benchmark.  Needs torch,
diffusers and transformers (and tokenizers, which transformers brings).
"""
import torch
from diffusers import (AutoencoderKL, AutoencoderKLWan, FlowMatchEulerDiscreteScheduler,
                       FluxPipeline, FluxTransformer2DModel, UniPCMultistepScheduler,
                       WanPipeline, WanTransformer3DModel)
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (CLIPTextConfig, CLIPTextModel, PreTrainedTokenizerFast, T5Config,
                          T5EncoderModel, UMT5Config, UMT5EncoderModel)

WORDS = "a cat on the red mat in warm sun light over green hills".split()
PROMPT = "a cat on the red mat"


def tokenizer(max_length):
    vocab = {"[PAD]": 0, "[UNK]": 1, "</s>": 2}
    for w in WORDS:
        vocab.setdefault(w, len(vocab))
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="[PAD]", unk_token="[UNK]",
                                   eos_token="</s>", model_max_length=max_length)


def wan(seed=0, ffn_dim=32, num_layers=2, enc_ff=32):
    """ffn_dim sizes the DiTs: 32 is a few KiB each, 200000 about 51 MB;
    num_layers is their blocks; enc_ff sizes the text encoder's
    feed-forward (32: a few KiB; 50000: about 9.6 MB)."""
    torch.manual_seed(seed)

    def dit(s):
        torch.manual_seed(s)
        return WanTransformer3DModel(
            patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=4,
            out_channels=4, text_dim=16, freq_dim=16, ffn_dim=ffn_dim, num_layers=num_layers,
            rope_max_seq_len=32).eval()

    torch.manual_seed(seed + 3)
    vae = AutoencoderKLWan(base_dim=4, z_dim=4, dim_mult=[1, 1], num_res_blocks=1,
                           temperal_downsample=[False], latents_mean=[0.0] * 4,
                           latents_std=[1.0] * 4).eval()
    torch.manual_seed(seed + 4)
    enc = UMT5EncoderModel(UMT5Config(vocab_size=64, d_model=16, d_kv=8, d_ff=enc_ff, num_layers=1,
                                      num_heads=2, relative_attention_num_buckets=8)).eval()
    sched = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                    num_train_timesteps=1000, flow_shift=12.0)
    return WanPipeline(tokenizer=tokenizer(8), text_encoder=enc, vae=vae, transformer=dit(seed + 1),
                       transformer_2=dit(seed + 2), scheduler=sched, boundary_ratio=0.875)


def run_wan(pipe, steps=4):
    with torch.no_grad():
        return pipe(PROMPT, num_inference_steps=steps, height=16, width=16, num_frames=5,
                    max_sequence_length=8, guidance_scale=3.0, guidance_scale_2=2.0,
                    generator=torch.Generator().manual_seed(0), output_type="np").frames


def flux(seed=0):
    torch.manual_seed(seed + 6)
    clip = CLIPTextModel(CLIPTextConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                                        num_hidden_layers=1, num_attention_heads=2,
                                        max_position_embeddings=16, projection_dim=16)).eval()
    t5 = T5EncoderModel(T5Config(vocab_size=64, d_model=16, d_kv=8, d_ff=32, num_layers=1,
                                 num_heads=2, relative_attention_num_buckets=8)).eval()
    torch.manual_seed(seed + 7)
    tr = FluxTransformer2DModel(patch_size=1, in_channels=8, num_layers=1, num_single_layers=1,
                                attention_head_dim=8, num_attention_heads=2,
                                joint_attention_dim=16, pooled_projection_dim=16,
                                axes_dims_rope=(2, 2, 4)).eval()
    torch.manual_seed(seed + 8)
    vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=2,
                        block_out_channels=(8,), down_block_types=("DownEncoderBlock2D",),
                        up_block_types=("UpDecoderBlock2D",), layers_per_block=1,
                        norm_num_groups=4, scaling_factor=0.36, shift_factor=0.11).eval()
    return FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), vae=vae,
                        text_encoder=clip, tokenizer=tokenizer(16), text_encoder_2=t5,
                        tokenizer_2=tokenizer(8), transformer=tr)


def run_flux(pipe, steps=3):
    with torch.no_grad():
        return pipe(PROMPT, num_inference_steps=steps, height=16, width=16,
                    max_sequence_length=8, guidance_scale=3.5,
                    generator=torch.Generator().manual_seed(0), output_type="np").images


PIPELINES = {"wan": (wan, run_wan), "flux": (flux, run_flux)}
