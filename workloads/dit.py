#!/usr/bin/python3
"""workloads/dit.py - a class-conditional Diffusion Transformer (DiT) on the CPU, random
weights, in a short denoising loop: a transformer denoiser to run allocators under and to
record traces from (a UNet's allocations are convolutions at several resolutions; a DiT's
are the same few token-by-width shapes, block after block, and attention scores of
heads x tokens x tokens).

Written here from the published architecture (Peebles & Xie 2023, "Scalable Diffusion
Models with Transformers"), no downloads:
  patchify: a p x p stride-p convolution of the 4-channel latent to `hidden` channels,
  flattened to (L/p)^2 tokens, plus a fixed 2-D sine-cosine position embedding;
  conditioning c = timestep embedding (sinusoidal(256) -> Linear -> SiLU -> Linear) + class
  embedding (1000 classes and one "null" class for classifier-free guidance);
  N blocks with adaLN-Zero: SiLU(c) -> Linear gives 6 x hidden: shift, scale and gate for the
  attention and for the MLP; x += gate * Attention(LayerNorm(x) * (1 + scale) + shift), the
  same for the MLP (GELU tanh, ratio 4); LayerNorms without affine parameters;
  final layer: adaLN (shift, scale) -> Linear to p*p*8 -> unpatchify to 8 channels (noise
  and the learned variance).
DiT-XL/2 has 675,129,632 parameters (with its 256-token position embedding, as published).
The weights are random (default initialisation), not adaLN-Zero's zeros: a zero gate would
make every block the identity and the output independent of the blocks.

Attention is softmax(Q K^T / sqrt(d)) V with baddbmm, softmax, then bmm, heads folded into
the batch: what diffusers' AttnProcessor does on torch 1.x, which has no
F.scaled_dot_product_attention. Each attention allocates three buffers of batch x heads x
tokens x tokens floats (the baddbmm input, the scores, the probabilities). diffusers passes
an uninitialised input with beta 0; here it is zeroed and beta is 1, the same allocations,
because torch 1.x's CPU baddbmm with beta 0 multiplies its own uninitialised result by 0,
which keeps any NaN the allocator's recycled memory held (on glibc as on sdalloc).

Invariants: weights come from torch.manual_seed(--seed) only, fp32, and everything runs
under torch.inference_mode(), so two runs with the same options and thread count give the
same output bytes (the JSON's sha256). --batch is the number of images; with guidance
(--cfg-scale > 1, the default) the model runs on 2 x batch: conditional, then null class.

    /usr/bin/python3 workloads/dit.py [--config DiT-XL/2] [--latent L] [--batch B]
        [--steps N] [--cfg-scale S] [--threads T] [--warmup W] [--small] [--seed K]
        [--json FILE]
"""

import argparse
import hashlib
import json
import math
import sys
import time
from dataclasses import dataclass

import torch
from torch import nn

from sd_unet import ddim_timesteps, positive, timed_ddim, which_blas


# ---------------------------------------------------------------------------- configuration
@dataclass(frozen=True)
class DiTConfig:
    depth: int
    hidden: int
    heads: int
    patch: int
    latent_channels: int = 4
    out_channels: int = 8  # noise and learned variance
    classes: int = 1000
    frequency_dim: int = 256  # sinusoidal timestep features
    mlp_ratio: int = 4


# The paper's table 1: depth, hidden width and heads of S, B, L and XL, at patch 2, 4 and 8.
_SIZES = {"S": (12, 384, 6), "B": (12, 768, 12), "L": (24, 1024, 16), "XL": (28, 1152, 16)}
CONFIGS = {f"DiT-{size}/{patch}": DiTConfig(depth, hidden, heads, patch)
           for size, (depth, hidden, heads) in _SIZES.items() for patch in (2, 4, 8)}
# A tiny DiT of the same shape for tests: well under a second.
SMALL = DiTConfig(depth=2, hidden=64, heads=4, patch=2, classes=10)


# ---------------------------------------------------------------------------- building blocks
def timestep_embedding(timesteps, dim, max_period=10000.0):
    """Sinusoidal features of the timesteps, cos then sin, [batch, dim] (dim even)."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32) / half)
    angles = timesteps.float()[:, None] * freqs[None, :]
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)


def sincos_position_embedding(dim, grid):
    """Fixed 2-D sine-cosine embedding of a grid x grid of patches, [grid*grid, dim]: the
    first half of the width encodes the row, the second half the column."""
    quarter = dim // 4
    omega = 1.0 / 10000.0 ** (torch.arange(quarter, dtype=torch.float64) / quarter)
    coords = torch.arange(grid, dtype=torch.float64)
    rows = coords.repeat_interleave(grid)[:, None] * omega[None, :]
    cols = coords.repeat(grid)[:, None] * omega[None, :]
    parts = [torch.sin(rows), torch.cos(rows), torch.sin(cols), torch.cos(cols)]
    return torch.cat(parts, dim=1).float()


def attention(q, k, v, heads):
    """softmax(q k^T / sqrt(d)) v per head; q [b, n, dim], k and v [b, m, dim] -> [b, n, dim].
    baddbmm over a zeroed input, softmax, bmm: diffusers' AttnProcessor's allocations (its
    beta-0 form reads uninitialised memory on torch 1.x's CPU: the module docstring)."""
    b, n, dim = q.shape
    d = dim // heads

    def heads_to_batch(t):
        return t.reshape(b, -1, heads, d).permute(0, 2, 1, 3).reshape(b * heads, -1, d)

    q, k, v = heads_to_batch(q), heads_to_batch(k), heads_to_batch(v)
    buffer = torch.zeros(b * heads, n, k.shape[1], dtype=q.dtype, device=q.device)
    scores = torch.baddbmm(buffer, q, k.transpose(1, 2), beta=1.0, alpha=d ** -0.5)
    del buffer
    probs = scores.softmax(dim=-1)
    del scores
    out = torch.bmm(probs, v)
    return out.reshape(b, heads, n, d).permute(0, 2, 1, 3).reshape(b, n, dim)


def modulate(x, shift, scale):
    """adaLN: x * (1 + scale) + shift, one (shift, scale) per sample, [b, 1, dim] each."""
    return x * (1 + scale) + shift


class SelfAttention(nn.Module):
    """DiT's attention: one fused qkv projection, heads, an output projection."""

    def __init__(self, dim, heads, device=None):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, device=device)
        self.proj = nn.Linear(dim, dim, device=device)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return self.proj(attention(q, k, v, self.heads))


class Mlp(nn.Module):
    """Linear -> GELU (tanh approximation) -> Linear."""

    def __init__(self, dim, hidden, out=None, device=None):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden, device=device)
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = nn.Linear(hidden, out or dim, device=device)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class TimestepEmbedder(nn.Module):
    def __init__(self, hidden, frequency_dim, device=None):
        super().__init__()
        self.frequency_dim = frequency_dim
        self.linear_1 = nn.Linear(frequency_dim, hidden, device=device)
        self.linear_2 = nn.Linear(hidden, hidden, device=device)

    def forward(self, timesteps):
        features = timestep_embedding(timesteps, self.frequency_dim).to(self.linear_1.weight)
        return self.linear_2(nn.functional.silu(self.linear_1(features)))


class PatchEmbed(nn.Module):
    """A p x p stride-p convolution of the latent, flattened to tokens, plus the fixed
    position embedding of the grid (a frozen parameter, as published)."""

    def __init__(self, cfg, latent, device=None):
        super().__init__()
        self.proj = nn.Conv2d(cfg.latent_channels, cfg.hidden, cfg.patch, stride=cfg.patch,
                              device=device)
        grid = latent // cfg.patch
        self.pos_embed = nn.Parameter(torch.zeros(1, grid * grid, cfg.hidden, device=device),
                                      requires_grad=False)
        if self.pos_embed.device.type != "meta":
            with torch.no_grad():
                self.pos_embed.copy_(sincos_position_embedding(cfg.hidden, grid)[None])

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2) + self.pos_embed


def unpatchify(x, channels, patch, grid):
    """[b, grid*grid, patch*patch*channels] -> [b, channels, grid*patch, grid*patch]."""
    b = x.shape[0]
    x = x.reshape(b, grid, grid, patch, patch, channels)
    return torch.einsum("nhwpqc->nchpwq", x).reshape(b, channels, grid * patch, grid * patch)


class FinalLayer(nn.Module):
    """LayerNorm with adaLN (shift, scale from the conditioning) -> Linear to patch pixels."""

    def __init__(self, cfg, device=None):
        super().__init__()
        self.norm = nn.LayerNorm(cfg.hidden, elementwise_affine=False, eps=1e-6,
                                 device=device)
        self.linear = nn.Linear(cfg.hidden, cfg.patch * cfg.patch * cfg.out_channels,
                                device=device)
        self.ada_ln = nn.Linear(cfg.hidden, 2 * cfg.hidden, device=device)

    def forward(self, x, c):
        shift, scale = self.ada_ln(nn.functional.silu(c))[:, None].chunk(2, dim=-1)
        return self.linear(modulate(self.norm(x), shift, scale))


# ---------------------------------------------------------------------------- the DiT
class DiTBlock(nn.Module):
    """Self-attention and MLP, each under adaLN-Zero modulation from the conditioning."""

    def __init__(self, cfg, device=None):
        super().__init__()
        dim = cfg.hidden
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6, device=device)
        self.attn = SelfAttention(dim, cfg.heads, device)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6, device=device)
        self.mlp = Mlp(dim, dim * cfg.mlp_ratio, device=device)
        self.ada_ln = nn.Linear(dim, 6 * dim, device=device)

    def forward(self, x, c):
        (shift_msa, scale_msa, gate_msa,
         shift_mlp, scale_mlp, gate_mlp) = self.ada_ln(nn.functional.silu(c))[:, None].chunk(6, -1)
        x = x + gate_msa * self.attn(modulate(self.norm1(x), shift_msa, scale_msa))
        return x + gate_mlp * self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp))


class DiT(nn.Module):
    """DiT for a latent of side `latent` (the position embedding's grid)."""

    def __init__(self, cfg, latent, device=None):
        super().__init__()
        if latent % cfg.patch:
            raise ValueError(f"latent side {latent} is not a multiple of the patch {cfg.patch}")
        self.cfg = cfg
        self.grid = latent // cfg.patch
        self.x_embedder = PatchEmbed(cfg, latent, device)
        self.t_embedder = TimestepEmbedder(cfg.hidden, cfg.frequency_dim, device)
        # One more row than classes: the null class of classifier-free guidance.
        self.y_embedder = nn.Embedding(cfg.classes + 1, cfg.hidden, device=device)
        self.blocks = nn.ModuleList([DiTBlock(cfg, device) for _ in range(cfg.depth)])
        self.final_layer = FinalLayer(cfg, device)

    @property
    def null_class(self):
        return self.cfg.classes

    def forward(self, x, timesteps, labels):
        tokens = self.x_embedder(x)
        c = self.t_embedder(timesteps) + self.y_embedder(labels)
        for block in self.blocks:
            tokens = block(tokens, c)
        out = self.final_layer(tokens, c)
        return unpatchify(out, self.cfg.out_channels, self.cfg.patch, self.grid)


def parameter_count(cfg, latent=32):
    """Parameters of the DiT for `latent` (32 = 256 px, as published), counted on the meta
    device: no weights are allocated."""
    return sum(p.numel() for p in DiT(cfg, latent, device="meta").parameters())


# ---------------------------------------------------------------------------- denoising loop
def alphas_cumprod(train_steps=1000):
    """DiT's (ADM's) linear schedule: betas from 1e-4 to 0.02."""
    betas = torch.linspace(1e-4, 0.02, train_steps, dtype=torch.float64)
    return torch.cumprod(1.0 - betas, dim=0)


def denoise(model, args, cond, uncond, tag, describe, extra=None):
    """The shared loop of dit.py and pixart.py: a DDIM loop (eta 0) over --steps timesteps
    on (batch, 4, latent, latent) latents from --seed + 1, the noise estimate taken from the
    model's first 4 output channels. With guidance the model runs on the latents twice,
    conditioned on `cond` then on `uncond` (the null class or caption), and the estimate is
    uncond + scale * (cond - uncond). Prints each step, writes --json (with `extra`'s keys);
    answers the exit code."""
    cfg, latent = model.cfg, args.latent
    guided = args.cfg_scale > 1.0
    model_cond = torch.cat([cond, uncond]) if guided else cond
    generator = torch.Generator().manual_seed(args.seed + 1)
    latents = torch.randn(args.batch, cfg.latent_channels, latent, latent, generator=generator)
    alphas = alphas_cumprod()
    timesteps = ddim_timesteps(args.steps)
    blas = which_blas()
    parameters = sum(p.numel() for p in model.parameters())
    tokens = (latent // cfg.patch) ** 2
    print(f"{tag}: {describe}, {parameters:,} parameters, batch {args.batch}"
          f"{' (x2 guided)' if guided else ''}, {latent}x{latent} latents = {tokens} tokens, "
          f"{args.threads} threads, built in {args.build_seconds:.1f} s; "
          f"BLAS: {blas['blas_info']} {' '.join(blas['mapped']) or '(none mapped)'}", flush=True)

    def predict_noise(x, t):
        model_in = torch.cat([x, x]) if guided else x
        steps = torch.full((model_in.shape[0],), t, dtype=torch.long)
        eps = model(model_in, steps, model_cond)[:, :cfg.latent_channels]
        if guided:
            conditional, unconditional = eps.chunk(2)
            eps = unconditional + args.cfg_scale * (conditional - unconditional)
        return eps

    latents, step_seconds, warmup_seconds = timed_ddim(predict_noise, latents, timesteps,
                                                       alphas, args.warmup, tag)
    result = latents.contiguous()
    digest = hashlib.sha256(result.numpy().tobytes()).hexdigest()
    report = {
        "config": args.config_name, "parameters": parameters,
        "batch": args.batch, "model_batch": args.batch * (2 if guided else 1),
        "latent": latent, "tokens": tokens, "threads": args.threads, "steps": args.steps,
        "guidance": args.cfg_scale if guided else None,
        "build_seconds": args.build_seconds, "warmup_seconds": warmup_seconds,
        "step_seconds": step_seconds,
        "output_shape": list(result.shape),
        "checksum": float(result.double().abs().sum()),
        "sha256": digest,
        "finite": bool(torch.isfinite(result).all()),
        "blas": blas, "torch": torch.__version__,
        **(extra or {}),
    }
    print(f"{tag}: output {tuple(result.shape)} checksum {report['checksum']:.6f} "
          f"sha256 {digest[:16]}", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(report, out, indent=1)
    return 0 if report["finite"] else 1


def common_options(parser, default_cfg_scale):
    """The options dit.py and pixart.py share (those of workloads/sd_unet.py, but --batch
    counts images)."""
    parser.add_argument("--latent", type=positive, default=0,
                        help="latent side (32 = 256 px, 64 = 512 px; default 32, 8 with --small)")
    parser.add_argument("--batch", type=positive, default=1,
                        help="images; guidance runs the model on twice as many (default 1)")
    parser.add_argument("--steps", type=positive, default=4, help="denoising steps (default 4)")
    parser.add_argument("--cfg-scale", type=float, default=default_cfg_scale,
                        help=f"guidance scale; 1 or less runs without guidance "
                             f"(default {default_cfg_scale})")
    parser.add_argument("--threads", type=positive, default=2, help="torch threads (default 2)")
    parser.add_argument("--warmup", type=int, default=0, help="untimed forwards first")
    parser.add_argument("--small", action="store_true", help="a tiny model of the same shape")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write per-step times and the output checksum here")


def check_common(parser, args, patch):
    """Rejects what common_options cannot (exit 2) and fills the default latent."""
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    if not args.latent:
        args.latent = 8 if args.small else 32
    if args.latent % patch:
        parser.error(f"--latent must be a multiple of the patch size {patch}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="DiT-XL/2", choices=sorted(CONFIGS),
                        help="the paper's model (default DiT-XL/2); --small overrides it")
    common_options(parser, default_cfg_scale=4.0)
    args = parser.parse_args(argv)
    cfg = SMALL if args.small else CONFIGS[args.config]
    check_common(parser, args, cfg.patch)
    args.config_name = "small" if args.small else args.config

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    build_start = time.perf_counter()
    model = DiT(cfg, args.latent).eval()
    args.build_seconds = time.perf_counter() - build_start
    labels = torch.randint(0, cfg.classes, (args.batch,),
                           generator=torch.Generator().manual_seed(args.seed + 2))
    null = torch.full_like(labels, model.null_class)
    return denoise(model, args, labels, null, "dit", f"{args.config_name} class-conditional")


if __name__ == "__main__":
    sys.exit(main())
