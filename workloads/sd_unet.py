#!/usr/bin/python3
"""workloads/sd_unet.py - Stable Diffusion 1.5's UNet on the CPU, random weights, in a short
denoising loop: a real inference program to run allocators under (`sdalloc run`).

Written here from the published architecture (Rombach et al. 2022; the layout of diffusers'
UNet2DConditionModel for SD 1.5), no downloads:
  conv_in 4->320; time embedding: sinusoidal(320) -> Linear 1280 -> SiLU -> Linear 1280;
  down blocks of widths 320/640/1280/1280, 2 ResNet blocks each, a cross-attention
  transformer after each ResNet in the first three, a stride-2 conv after all but the last;
  mid block ResNet-Transformer-ResNet at 1280; up blocks of 3 ResNet blocks, each taking one
  skip tensor by concatenation (a transformer after each in the last three), nearest 2x
  upsampling + conv after all but the last; GroupNorm(32) -> SiLU -> conv_out 320->4.
  A transformer block: GroupNorm(32), 1x1 conv in, LayerNorm + self-attention, LayerNorm +
  cross-attention on the 77x768 text context, LayerNorm + GEGLU feed-forward (4x), 1x1 conv
  out, residual; 8 heads. The full configuration has 859,520,964 parameters.

Invariants: weights come from torch.manual_seed(--seed) only, fp32, and everything runs
under torch.inference_mode(), so two runs with the same options and thread count give the
same output bytes (the JSON's sha256). --batch is the UNet's batch: an even batch is
batch/2 images under classifier-free guidance (unconditional and conditional halves; the
default 2 is one 512x512 image), an odd one is that many images without guidance.

    /usr/bin/python3 workloads/sd_unet.py [--steps N] [--batch B] [--latent L] [--threads T]
                                          [--warmup W] [--small] [--seed S] [--json FILE]
"""

import argparse
import hashlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


# ---------------------------------------------------------------------------- configuration
@dataclass(frozen=True)
class UNetConfig:
    block_channels: tuple = (320, 640, 1280, 1280)
    attention: tuple = (True, True, True, False)  # a transformer after each ResNet block
    layers_per_block: int = 2  # ResNet blocks per down level (up levels have one more)
    heads: int = 8
    context_dim: int = 768
    context_tokens: int = 77
    groups: int = 32
    latent_channels: int = 4


FULL = UNetConfig()
# A tiny UNet of the same shape (three levels, one block each) for tests: well under a second.
SMALL = UNetConfig(block_channels=(32, 64, 64), attention=(True, True, False),
                   layers_per_block=1, heads=2, context_dim=32, context_tokens=77, groups=8)


# ---------------------------------------------------------------------------- building blocks
def timestep_embedding(timesteps, dim):
    """Sinusoidal embedding (cos first, as SD 1.5's flip_sin_to_cos), [batch, dim]."""
    half = dim // 2
    exponent = -math.log(10000.0) * torch.arange(half, dtype=torch.float32,
                                                 device=timesteps.device) / half
    angles = timesteps.float()[:, None] * torch.exp(exponent)[None, :]
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)


class ResnetBlock(nn.Module):
    def __init__(self, cin, cout, temb_dim, groups, device):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, cin, eps=1e-5, device=device)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1, device=device)
        self.time_emb_proj = nn.Linear(temb_dim, cout, device=device)
        self.norm2 = nn.GroupNorm(groups, cout, eps=1e-5, device=device)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, device=device)
        self.shortcut = nn.Conv2d(cin, cout, 1, device=device) if cin != cout else None

    def forward(self, x, temb):
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.time_emb_proj(F.silu(temb))[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return (x if self.shortcut is None else self.shortcut(x)) + h


class Attention(nn.Module):
    # False: softmax(Q K^T / sqrt(d)) V written out (the scores are a tensor), as diffusers'
    # AttnProcessor on torch 1.x; True: F.scaled_dot_product_attention (torch >= 2.0), as its
    # AttnProcessor2_0. workloads/sd_pipeline.py sets it where torch has the function.
    fused = False

    def __init__(self, dim, context_dim, heads, device):
        super().__init__()
        self.heads = heads
        self.to_q = nn.Linear(dim, dim, bias=False, device=device)
        self.to_k = nn.Linear(context_dim, dim, bias=False, device=device)
        self.to_v = nn.Linear(context_dim, dim, bias=False, device=device)
        self.to_out = nn.Linear(dim, dim, device=device)

    def forward(self, x, context):
        b, n, dim = x.shape
        d = dim // self.heads

        def split(t):
            return t.reshape(b, -1, self.heads, d).transpose(1, 2)  # [b, heads, tokens, d]

        q, k, v = split(self.to_q(x)), split(self.to_k(context)), split(self.to_v(context))
        if self.fused:
            out = F.scaled_dot_product_attention(q, k, v)
            return self.to_out(out.transpose(1, 2).reshape(b, n, dim))
        weights = torch.softmax(q @ k.transpose(-1, -2) * (d ** -0.5), dim=-1)
        return self.to_out((weights @ v).transpose(1, 2).reshape(b, n, dim))


class GEGLU(nn.Module):
    def __init__(self, dim, device):
        super().__init__()
        self.proj = nn.Linear(dim, dim * 8, device=device)  # value and gate, 4*dim each
        self.out = nn.Linear(dim * 4, dim, device=device)

    def forward(self, x):
        value, gate = self.proj(x).chunk(2, dim=-1)
        return self.out(value * F.gelu(gate))


class TransformerBlock(nn.Module):
    """Transformer2DModel with one BasicTransformerBlock, as in SD 1.5 (1x1 conv in/out)."""

    def __init__(self, channels, cfg, device):
        super().__init__()
        self.norm = nn.GroupNorm(cfg.groups, channels, eps=1e-6, device=device)
        self.proj_in = nn.Conv2d(channels, channels, 1, device=device)
        self.norm1 = nn.LayerNorm(channels, device=device)
        self.attn1 = Attention(channels, channels, cfg.heads, device)
        self.norm2 = nn.LayerNorm(channels, device=device)
        self.attn2 = Attention(channels, cfg.context_dim, cfg.heads, device)
        self.norm3 = nn.LayerNorm(channels, device=device)
        self.ff = GEGLU(channels, device)
        self.proj_out = nn.Conv2d(channels, channels, 1, device=device)

    def forward(self, x, context):
        b, c, hgt, wid = x.shape
        h = self.proj_in(self.norm(x)).permute(0, 2, 3, 1).reshape(b, hgt * wid, c)
        n1 = self.norm1(h)
        h = h + self.attn1(n1, n1)
        h = h + self.attn2(self.norm2(h), context)
        h = h + self.ff(self.norm3(h))
        h = h.reshape(b, hgt, wid, c).permute(0, 3, 1, 2)
        return x + self.proj_out(h)


class Downsample(nn.Module):
    def __init__(self, channels, device):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2, padding=1, device=device)

    def forward(self, x):
        return self.conv(x)


class Upsample(nn.Module):
    def __init__(self, channels, device):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1, device=device)

    def forward(self, x, size=None):
        """size: the skip tensor's height and width, for a latent side that is not a multiple
        of 2^(levels-1) (a stride-2 conv rounds up; doubling would overshoot), as diffusers'
        forward_upsample_size; None doubles."""
        if size is None:
            return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))
        return self.conv(F.interpolate(x, size=tuple(size), mode="nearest"))


# ---------------------------------------------------------------------------- the UNet
class UNet(nn.Module):
    def __init__(self, cfg, device=None):
        super().__init__()
        chans, levels = cfg.block_channels, len(cfg.block_channels)
        temb = chans[0] * 4
        self.cfg = cfg
        self.conv_in = nn.Conv2d(cfg.latent_channels, chans[0], 3, padding=1, device=device)
        self.time_1 = nn.Linear(chans[0], temb, device=device)
        self.time_2 = nn.Linear(temb, temb, device=device)

        # Down path: each level's ResNet (+ transformer) outputs and its downsampler's output
        # are skip tensors; skip_channels records their widths in order.
        self.down = nn.ModuleList()
        skip_channels = [chans[0]]
        cin = chans[0]
        for level, cout in enumerate(chans):
            layers = nn.ModuleList()
            for _ in range(cfg.layers_per_block):
                layers.append(self._stage(cin, cout, temb, cfg.attention[level], device))
                cin = cout
                skip_channels.append(cout)
            if level < levels - 1:
                layers.append(Downsample(cout, device))
                skip_channels.append(cout)
            self.down.append(layers)

        self.mid_res1 = ResnetBlock(cin, cin, temb, cfg.groups, device)
        self.mid_attn = TransformerBlock(cin, cfg, device)
        self.mid_res2 = ResnetBlock(cin, cin, temb, cfg.groups, device)

        # Up path: one more block per level than the down path, each concatenating one skip.
        self.up = nn.ModuleList()
        up_attention = tuple(reversed(cfg.attention))
        for level, cout in enumerate(reversed(chans)):
            layers = nn.ModuleList()
            for _ in range(cfg.layers_per_block + 1):
                skip = skip_channels.pop()
                layers.append(self._stage(cin + skip, cout, temb, up_attention[level], device))
                cin = cout
            if level < levels - 1:
                layers.append(Upsample(cout, device))
            self.up.append(layers)

        self.norm_out = nn.GroupNorm(cfg.groups, chans[0], eps=1e-5, device=device)
        self.conv_out = nn.Conv2d(chans[0], cfg.latent_channels, 3, padding=1, device=device)

    def _stage(self, cin, cout, temb, attention, device):
        stage = nn.ModuleList([ResnetBlock(cin, cout, temb, self.cfg.groups, device)])
        if attention:
            stage.append(TransformerBlock(cout, self.cfg, device))
        return stage

    @staticmethod
    def _run_stage(stage, x, temb, context):
        x = stage[0](x, temb)
        return stage[1](x, context) if len(stage) > 1 else x

    def forward(self, sample, timesteps, context):
        # The embedding is computed in fp32 and cast to the weights' dtype (fp16 on a GPU:
        # scripts/gpu_workload.py); on the CPU's fp32 both casts are no-ops.
        temb = self.time_2(F.silu(self.time_1(
            timestep_embedding(timesteps, self.cfg.block_channels[0]).to(sample.dtype))))
        x = self.conv_in(sample)
        skips = [x]
        for layers in self.down:
            for layer in layers:
                if isinstance(layer, Downsample):
                    x = layer(x)
                else:
                    x = self._run_stage(layer, x, temb, context)
                skips.append(x)
        x = self.mid_res2(self.mid_attn(self.mid_res1(x, temb), context), temb)
        for layers in self.up:
            for layer in layers:
                if isinstance(layer, Upsample):
                    size = skips[-1].shape[-2:]
                    x = layer(x, None if size[0] == 2 * x.shape[-2] and
                              size[1] == 2 * x.shape[-1] else size)
                else:
                    x = self._run_stage(layer, torch.cat([x, skips.pop()], dim=1), temb, context)
        return self.conv_out(F.silu(self.norm_out(x)))


def make_unet(cfg, device, dtype, seed=0):
    """The UNet in eval mode, random weights from `seed`, made directly in `dtype` on
    `device` (no float32 copy to convert or to cache): what the GPU scripts run."""
    torch.manual_seed(seed)
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        return UNet(cfg, device=device).eval()
    finally:
        torch.set_default_dtype(default_dtype)


def conditioning(cfg, batch, device, dtype, seed=1):
    """Random text embeddings for `batch` (from `seed`) and timestep 500 for each: the GPU
    scripts' inputs beside the latents."""
    generator = torch.Generator(device=device).manual_seed(seed)
    context = torch.randn(batch, cfg.context_tokens, cfg.context_dim, device=device,
                          dtype=dtype, generator=generator)
    return context, torch.full((batch,), 500, dtype=torch.long, device=device)


def parameter_count(cfg):
    """Parameters of the UNet, counted on the meta device: no weights are allocated."""
    return sum(p.numel() for p in UNet(cfg, device="meta").parameters())


# ---------------------------------------------------------------------------- denoising loop
def ddim_timesteps(steps, train_steps=1000):
    stride = train_steps // steps
    return [train_steps - 1 - i * stride for i in range(steps)]


def alphas_cumprod(train_steps=1000):
    """SD 1.5's "scaled linear" schedule: betas from 0.00085 to 0.012, linear in sqrt."""
    betas = torch.linspace(0.00085 ** 0.5, 0.012 ** 0.5, train_steps, dtype=torch.float64) ** 2
    return torch.cumprod(1.0 - betas, dim=0)


def ddim_step(latents, eps, t, t_prev, alphas):
    """Deterministic DDIM (eta 0): predict x0 from the noise estimate, step to t_prev."""
    a_t = float(alphas[t])
    a_prev = float(alphas[t_prev]) if t_prev >= 0 else 1.0
    x0 = (latents - (1.0 - a_t) ** 0.5 * eps) / a_t ** 0.5
    return a_prev ** 0.5 * x0 + (1.0 - a_prev) ** 0.5 * eps


def timed_ddim(predict_noise, latents, timesteps, alphas, warmup, tag):
    """The timed denoising loop of the workloads: `warmup` forwards at the first timestep
    (outputs dropped), then one DDIM step per timestep, each printed as `tag: step ...`.
    Returns the last latents, the step times and the warm-up times, in seconds."""
    step_seconds, warmup_seconds = [], []
    with torch.inference_mode():
        for _ in range(warmup):
            start = time.perf_counter()
            predict_noise(latents, timesteps[0])
            warmup_seconds.append(time.perf_counter() - start)
            print(f"{tag}: warm-up forward {warmup_seconds[-1]:.3f} s", flush=True)
        for i, t in enumerate(timesteps):
            start = time.perf_counter()
            eps = predict_noise(latents, t)
            t_prev = timesteps[i + 1] if i + 1 < len(timesteps) else -1
            latents = ddim_step(latents, eps, t, t_prev, alphas)
            step_seconds.append(time.perf_counter() - start)
            print(f"{tag}: step {i + 1}/{len(timesteps)} t={t} {step_seconds[-1]:.3f} s",
                  flush=True)
    return latents, step_seconds, warmup_seconds


def which_blas():
    """What torch multiplies through: the build's BLAS_INFO and the BLAS libraries mapped."""
    torch.ones(64, 64) @ torch.ones(64, 64)  # make sure the BLAS is loaded
    config = torch.__config__.show()
    info = next((part.split("=", 1)[1] for part in config.replace(",", " ").split()
                 if part.startswith("BLAS_INFO=")), "unknown")
    mapped = set()
    with open("/proc/self/maps", encoding="utf-8") as maps:
        for line in maps:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            name = os.path.basename(path)
            if name.startswith(("libblas", "libopenblas", "libmkl", "libblis", "libcblas")):
                mapped.add(path)
    return {"blas_info": info, "mapped": sorted(mapped)}


def run(args):
    cfg = SMALL if args.small else FULL
    latent = args.latent if args.latent else (16 if args.small else 64)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    build_start = time.perf_counter()
    unet = UNet(cfg).eval()
    build_seconds = time.perf_counter() - build_start
    guided = args.batch % 2 == 0
    images = args.batch // 2 if guided else args.batch
    generator = torch.Generator().manual_seed(args.seed + 1)
    latents = torch.randn(images, cfg.latent_channels, latent, latent, generator=generator)
    context = torch.randn(args.batch, cfg.context_tokens, cfg.context_dim, generator=generator)
    alphas = alphas_cumprod()
    timesteps = ddim_timesteps(args.steps)
    blas = which_blas()
    print(f"sd_unet: {'small' if args.small else 'SD 1.5'} UNet, "
          f"{sum(p.numel() for p in unet.parameters()):,} parameters, batch {args.batch}, "
          f"{latent}x{latent} latents, {args.threads} threads, built in {build_seconds:.1f} s; "
          f"BLAS: {blas['blas_info']} {' '.join(blas['mapped']) or '(none mapped)'}", flush=True)

    def predict_noise(x, t):
        model_in = torch.cat([x, x]) if guided else x
        eps = unet(model_in, torch.full((args.batch,), t, dtype=torch.long), context)
        if guided:
            uncond, cond = eps.chunk(2)
            eps = uncond + args.guidance * (cond - uncond)
        return eps

    latents, step_seconds, warmup_seconds = timed_ddim(predict_noise, latents, timesteps,
                                                       alphas, args.warmup, "sd_unet")
    result = latents.contiguous()
    digest = hashlib.sha256(result.numpy().tobytes()).hexdigest()
    report = {
        "config": "small" if args.small else "sd15",
        "parameters": sum(p.numel() for p in unet.parameters()),
        "batch": args.batch, "latent": latent, "threads": args.threads, "steps": args.steps,
        "guidance": args.guidance if guided else None,
        "build_seconds": build_seconds, "warmup_seconds": warmup_seconds,
        "step_seconds": step_seconds,
        "output_shape": list(result.shape),
        "checksum": float(result.double().abs().sum()),
        "sha256": digest,
        "finite": bool(torch.isfinite(result).all()),
        "blas": blas, "torch": torch.__version__,
    }
    print(f"sd_unet: output {tuple(result.shape)} checksum {report['checksum']:.6f} "
          f"sha256 {digest[:16]}", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(report, out, indent=1)
    return 0 if report["finite"] else 1


def positive(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=positive, default=4, help="denoising steps (default 4)")
    parser.add_argument("--batch", type=positive, default=2,
                        help="UNet batch; even = batch/2 images with guidance (default 2)")
    parser.add_argument("--latent", type=positive, default=0,
                        help="latent side (64 = 512x512 images; default 64, 16 with --small)")
    parser.add_argument("--threads", type=positive, default=2, help="torch threads (default 2)")
    parser.add_argument("--warmup", type=int, default=0, help="untimed forwards first")
    parser.add_argument("--small", action="store_true", help="a tiny UNet of the same shape")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--guidance", type=float, default=7.5, help="guidance scale")
    parser.add_argument("--json", help="write per-step times and the output checksum here")
    args = parser.parse_args(argv)
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    cfg = SMALL if args.small else FULL
    factor = 2 ** (len(cfg.block_channels) - 1)  # one halving per downsampler
    if args.latent % factor:
        parser.error(f"--latent must be a multiple of {factor} (the UNet halves it "
                     f"{len(cfg.block_channels) - 1} times)")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
