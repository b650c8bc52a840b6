#!/usr/bin/python3
"""workloads/sd_pipeline.py - a whole Stable Diffusion 1.5 text-to-image pipeline, random
weights: the text encoder, the UNet's denoising loop under classifier-free guidance, then the
VAE decode of the latents to an image, as one call; and a "server" that makes such calls at
mixed image sizes in one process. What a diffusers user runs, to measure allocators on
(scripts/gpu_pipeline.py on a GPU, the drop-in and recorded traces on the CPU).

Written here from the published configurations, no downloads:
  text encoder: CLIP ViT-L/14's text transformer (SD 1.5's): token and position embeddings
  (49,408 x 768, 77 x 768), 12 pre-LayerNorm blocks of causal self-attention (12 heads) and
  an MLP of 3072 with quick-GELU, a final LayerNorm; its last hidden state is the context.
  123,060,480 parameters. The prompt is token ids from the seed (no tokenizer): begin, 12
  ids, end, padding with the end token; the unconditional prompt is begin, end, padding.
  UNet: workloads/sd_unet.py's SD 1.5 UNet (859,520,964 parameters); DDIM (eta 0) on SD
  1.5's scaled-linear schedule; each step runs the UNet on the unconditional and the
  conditional half at once (batch 2) and mixes them with the guidance scale.
  VAE: workloads/vae_decoder.py's SD 1.5 decoder (49,490,199 parameters) on latents /
  0.18215, then diffusers' post-processing (image / 2 + 0.5, clamped to [0, 1]).
An image of side S px has latents of side S / 8; any multiple of 8 px works (the UNet's
upsamplers take the size of their skip tensor, as diffusers' do). Attention is
F.scaled_dot_product_attention where torch has it (>= 2.0, as diffusers' AttnProcessor2_0),
else the scores written out (torch 1.13 here).

Invariants: every weight comes from a fixed seed per model (make_pipeline's `seed`), every
noise tensor from a generator seeded per call, everything runs under torch.inference_mode():
the same configuration, device, dtype and thread count give the same image bytes, whatever
allocator serves the memory.

    /usr/bin/python3 workloads/sd_pipeline.py [--small] [--sizes 512,768,...] [--steps N]
        [--guidance G] [--threads T] [--seed K] [--mark-steps] [--json FILE]

--sizes is the server's sequence of image sides in pixels (default 128,192,160,256,128 on
the CPU; 64,96,80,128,64 with --small). --mark-steps wraps each UNet step in sdalloc.step()
for the malloc drop-in's mode:planned (LD_PRELOAD=libsdalloc_preload.so). Each call prints
its size, time and the sha256 of its image; --json writes them with the latents' checksums.
"""

import argparse
import contextlib
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

import sd_unet
import vae_decoder


# ---------------------------------------------------------------------------- configuration
@dataclass(frozen=True)
class TextConfig:
    vocab: int = 49408
    hidden: int = 768
    layers: int = 12
    heads: int = 12
    intermediate: int = 3072
    tokens: int = 77
    begin_token: int = 49406
    end_token: int = 49407
    prompt_tokens: int = 12  # ids between begin and end


@dataclass(frozen=True)
class PipelineConfig:
    name: str
    text: TextConfig
    unet: sd_unet.UNetConfig
    vae_widths: tuple


CLIP_L = TextConfig()
FULL = PipelineConfig("sd15", CLIP_L, sd_unet.FULL, (512, 512, 256, 128))
# Tiny models of the same shape for tests (the text width is the small UNet's context width).
SMALL = PipelineConfig("small", TextConfig(vocab=1000, hidden=32, layers=2, heads=2,
                                           intermediate=64, begin_token=998, end_token=999),
                       sd_unet.SMALL, (64, 64, 32, 32))
VAE_SCALE = 0.18215  # SD 1.5's latent scaling factor
LATENT_FACTOR = 8  # image pixels per latent pixel


def has_fused_attention():
    return hasattr(F, "scaled_dot_product_attention")


# ---------------------------------------------------------------------------- text encoder
class TextAttention(nn.Module):
    def __init__(self, cfg, device):
        super().__init__()
        self.heads = cfg.heads
        self.q_proj = nn.Linear(cfg.hidden, cfg.hidden, device=device)
        self.k_proj = nn.Linear(cfg.hidden, cfg.hidden, device=device)
        self.v_proj = nn.Linear(cfg.hidden, cfg.hidden, device=device)
        self.out_proj = nn.Linear(cfg.hidden, cfg.hidden, device=device)

    def forward(self, x, fused):
        b, n, dim = x.shape
        d = dim // self.heads

        def split(t):
            return t.reshape(b, n, self.heads, d).transpose(1, 2)

        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
        if fused:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = q @ k.transpose(-1, -2) * (d ** -0.5)
            mask = torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1)
            out = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v
        return self.out_proj(out.transpose(1, 2).reshape(b, n, dim))


class TextLayer(nn.Module):
    def __init__(self, cfg, device):
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(cfg.hidden, device=device)
        self.self_attn = TextAttention(cfg, device)
        self.layer_norm2 = nn.LayerNorm(cfg.hidden, device=device)
        self.fc1 = nn.Linear(cfg.hidden, cfg.intermediate, device=device)
        self.fc2 = nn.Linear(cfg.intermediate, cfg.hidden, device=device)

    def forward(self, x, fused):
        x = x + self.self_attn(self.layer_norm1(x), fused)
        h = self.fc1(self.layer_norm2(x))
        return x + self.fc2(h * torch.sigmoid(1.702 * h))  # quick-GELU


class TextEncoder(nn.Module):
    """CLIP's text transformer: token ids [batch, tokens] -> last hidden state."""

    fused = False

    def __init__(self, cfg, device=None):
        super().__init__()
        self.token_embedding = nn.Embedding(cfg.vocab, cfg.hidden, device=device)
        self.position_embedding = nn.Embedding(cfg.tokens, cfg.hidden, device=device)
        self.layers = nn.ModuleList([TextLayer(cfg, device) for _ in range(cfg.layers)])
        self.final_layer_norm = nn.LayerNorm(cfg.hidden, device=device)

    def forward(self, ids):
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.token_embedding(ids) + self.position_embedding(positions)[None]
        for layer in self.layers:
            x = layer(x, self.fused)
        return self.final_layer_norm(x)


def prompt_ids(cfg, seed, device):
    """[2, tokens]: the unconditional prompt (begin, end, padding) and a prompt of
    cfg.prompt_tokens ids drawn from `seed`, in that order (diffusers' order under guidance)."""
    generator = torch.Generator().manual_seed(seed)
    words = torch.randint(0, cfg.begin_token, (cfg.prompt_tokens,), generator=generator)
    ids = torch.full((2, cfg.tokens), cfg.end_token, dtype=torch.long)
    ids[:, 0] = cfg.begin_token
    ids[1, 1:1 + cfg.prompt_tokens] = words
    return ids.to(device)


# ---------------------------------------------------------------------------- the pipeline
def _built(factory, device, dtype, seed):
    """factory(device) made directly in `dtype` on `device` from `seed`, in eval mode."""
    torch.manual_seed(seed)
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        return factory(device).eval()
    finally:
        torch.set_default_dtype(default_dtype)


class Pipeline:
    """The three models on one device; calling it makes one image (see the module doc).

    fused: F.scaled_dot_product_attention in every attention (default: where torch has it).
    step_scope: step_scope(i) answers a context manager entered around UNet step i (for
    sdalloc.torch.step() or the drop-in's sdalloc.step()); default none."""

    def __init__(self, cfg, device, dtype, seed=0, fused=None, step_scope=None):
        self.cfg, self.device, self.dtype = cfg, device, dtype
        self.fused = has_fused_attention() if fused is None else fused
        self.step_scope = step_scope or (lambda i: contextlib.nullcontext())
        self.text = _built(lambda d: TextEncoder(cfg.text, d), device, dtype, seed)
        self.unet = _built(lambda d: sd_unet.UNet(cfg.unet, d), device, dtype, seed + 1)
        # vae_decoder's modules take no device: made on the CPU, then moved (49 M parameters).
        torch.manual_seed(seed + 2)
        self.vae = vae_decoder.Decoder(cfg.vae_widths).eval().to(device=device, dtype=dtype)
        self.text.fused = self.fused
        for module in list(self.unet.modules()) + list(self.vae.modules()):
            if isinstance(module, (sd_unet.Attention, vae_decoder.AttentionBlock)):
                module.fused = self.fused
        self.alphas = sd_unet.alphas_cumprod()

    def parameters(self):
        return sum(p.numel() for m in (self.text, self.unet, self.vae) for p in m.parameters())

    def __call__(self, size, steps, guidance=7.5, seed=0):
        """One image of side `size` px (a multiple of 8): answers (image [1, 3, size, size]
        in [0, 1], final latents [1, 4, size/8, size/8])."""
        if size % LATENT_FACTOR or size < LATENT_FACTOR:
            raise ValueError(f"image size {size} px is not a positive multiple of "
                             f"{LATENT_FACTOR}")
        latent = size // LATENT_FACTOR
        with torch.inference_mode():
            context = self.text(prompt_ids(self.cfg.text, seed, self.device))
            generator = torch.Generator(device=self.device).manual_seed(seed + 1)
            latents = torch.randn(1, self.cfg.unet.latent_channels, latent, latent,
                                  generator=generator, device=self.device, dtype=self.dtype)
            timesteps = sd_unet.ddim_timesteps(steps)
            for i, t in enumerate(timesteps):
                with self.step_scope(i):
                    t_batch = torch.full((2,), t, dtype=torch.long, device=self.device)
                    uncond, cond = self.unet(torch.cat([latents, latents]), t_batch,
                                             context).chunk(2)
                    eps = uncond + guidance * (cond - uncond)
                    t_prev = timesteps[i + 1] if i + 1 < len(timesteps) else -1
                    latents = sd_unet.ddim_step(latents, eps, t, t_prev, self.alphas)
                    del uncond, cond, eps
            sample = self.vae(latents / VAE_SCALE)
            image = (sample / 2 + 0.5).clamp(0, 1)
        return image, latents


def make_pipeline(small, device, dtype, seed=0, fused=None, step_scope=None):
    return Pipeline(SMALL if small else FULL, device, dtype, seed, fused, step_scope)


def default_sizes(small):
    """The server's sequence on the CPU: the GPU's 512, 768, 640, 1024, 512 px scaled by 1/4
    (1/8 with --small), so a test runs in seconds."""
    return (64, 96, 80, 128, 64) if small else (128, 192, 160, 256, 128)


def parse_sizes(text):
    sizes = [int(part) for part in text.split(",") if part.strip()]
    if not sizes or any(s < LATENT_FACTOR or s % LATENT_FACTOR for s in sizes):
        raise argparse.ArgumentTypeError(f"sizes must be positive multiples of "
                                         f"{LATENT_FACTOR} px, not {text!r}")
    return sizes


def digest(tensor):
    return hashlib.sha256(tensor.detach().contiguous().cpu().numpy().tobytes()).hexdigest()


def drop_in_step_scope():
    """sdalloc.step() of the preloaded drop-in (python/sdalloc on the path); SystemExit when
    it is not preloaded, so --mark-steps never silently marks nothing."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), "python"))
    import sdalloc  # pylint: disable=import-outside-toplevel
    if not sdalloc.preloaded():
        raise SystemExit("sd_pipeline: --mark-steps needs LD_PRELOAD=libsdalloc_preload.so")
    return lambda i: sdalloc.step()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", action="store_true", help="tiny models of the same shape")
    parser.add_argument("--sizes", type=parse_sizes, help="image sides in px, in order")
    parser.add_argument("--steps", type=sd_unet.positive, default=3,
                        help="denoising steps per image (default 3)")
    parser.add_argument("--guidance", type=float, default=7.5, help="guidance scale")
    parser.add_argument("--threads", type=sd_unet.positive, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mark-steps", action="store_true",
                        help="each UNet step in sdalloc.step() (the drop-in's mode:planned)")
    parser.add_argument("--json", help="write each call's size, time and checksums here")
    args = parser.parse_args(argv)
    sizes = args.sizes or list(default_sizes(args.small))
    torch.set_num_threads(args.threads)
    scope = drop_in_step_scope() if args.mark_steps else None
    start = time.perf_counter()
    pipe = make_pipeline(args.small, "cpu", torch.float32, args.seed, step_scope=scope)
    print(f"sd_pipeline: {pipe.cfg.name}, {pipe.parameters():,} parameters, built in "
          f"{time.perf_counter() - start:.1f} s; {args.steps} steps per image, guidance "
          f"{args.guidance}, {args.threads} threads, attention "
          f"{'fused' if pipe.fused else 'written out'}", flush=True)
    calls = []
    for n, size in enumerate(sizes):
        start = time.perf_counter()
        image, latents = pipe(size, args.steps, args.guidance, seed=args.seed + n)
        seconds = time.perf_counter() - start
        calls.append({"size": size, "seconds": seconds, "image_sha256": digest(image),
                      "latents_sha256": digest(latents),
                      "image_mean": float(image.double().mean()),
                      "latents_abs_mean": float(latents.double().abs().mean()),
                      "finite": bool(torch.isfinite(latents).all())})
        print(f"sd_pipeline: call {n + 1}/{len(sizes)} {size}x{size} px {seconds:.3f} s "
              f"image sha256 {calls[-1]['image_sha256'][:16]} mean "
              f"{calls[-1]['image_mean']:.6f}", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump({"config": pipe.cfg.name, "parameters": pipe.parameters(),
                       "steps": args.steps, "guidance": args.guidance,
                       "threads": args.threads, "torch": torch.__version__,
                       "calls": calls}, out, indent=1)
    return 0 if all(c["finite"] for c in calls) else 1


if __name__ == "__main__":
    sys.exit(main())
