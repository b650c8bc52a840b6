#!/usr/bin/python3
"""workloads/pixart.py - a text-conditioned Diffusion Transformer in the layout of PixArt-alpha
on the CPU, random weights, in a short denoising loop: the DiT of workloads/dit.py with a
cross-attention to the caption's tokens in every block, which is what users run as a
text-to-image transformer.

Written here from the published architecture (Chen et al. 2023, "PixArt-alpha: Fast
Training of Diffusion Transformer for Photorealistic Text-to-Image Synthesis"), no
downloads, on dit.py's pieces (patchify, timestep embedder, attention, MLP, the loop):
  caption: T tokens of width 4096 (a T5-XXL encoder's output; random here, the encoder is
  not run) -> caption embedder Linear 4096 -> hidden, GELU tanh, Linear hidden -> hidden;
  adaLN-single: the timestep embedding t -> SiLU -> Linear to 6 x hidden, computed once and
  shared by every block, each of which adds its own learned (6, hidden) table to it;
  a block: x += gate * SelfAttention(LayerNorm(x) * (1 + scale) + shift); x +=
  CrossAttention(x, caption) (queries from x, keys and values from the caption, no norm, no
  gate); x += gate * MLP(modulated LayerNorm(x)) (GELU tanh, ratio 4);
  final layer: LayerNorm modulated by its own (2, hidden) table plus t, Linear to p*p*8,
  unpatchify to 8 channels (noise and learned variance).
PixArt-XL/2 is DiT-XL/2's trunk (28 blocks, 1152 wide, 16 heads, patch 2). The resolution
and aspect-ratio micro-conditions of the 1024 px model are left out (the 512 px model has
none); the caption is never masked (every token counts).

Guidance runs the model on 2 x batch: the captions, then the learned null caption (the
embedding PixArt trains in place of dropped captions) repeated for each image. Invariants
as dit.py's: weights from torch.manual_seed(--seed) only, fp32, inference mode; the same
options and thread count give the same output bytes.

    /usr/bin/python3 workloads/pixart.py [--config PixArt-XL/2] [--latent L] [--batch B]
        [--text-tokens T] [--steps N] [--cfg-scale S] [--threads T] [--warmup W] [--small]
        [--seed K] [--json FILE]
"""

import argparse
import sys
import time
from dataclasses import dataclass

import torch
from torch import nn

import dit
from dit import DiTConfig


@dataclass(frozen=True)
class PixArtConfig(DiTConfig):
    caption_dim: int = 4096  # T5-XXL's width
    caption_tokens: int = 120  # the length PixArt-alpha pads its captions to


CONFIGS = {"PixArt-XL/2": PixArtConfig(depth=28, hidden=1152, heads=16, patch=2)}
# A tiny model of the same shape for tests: well under a second.
SMALL = PixArtConfig(depth=2, hidden=64, heads=4, patch=2, caption_dim=32, caption_tokens=8)


class CrossAttention(nn.Module):
    """Queries from the image tokens, keys and values (one fused projection) from the caption."""

    def __init__(self, dim, context_dim, heads, device=None):
        super().__init__()
        self.heads = heads
        self.q_linear = nn.Linear(dim, dim, device=device)
        self.kv_linear = nn.Linear(context_dim, 2 * dim, device=device)
        self.proj = nn.Linear(dim, dim, device=device)

    def forward(self, x, context):
        k, v = self.kv_linear(context).chunk(2, dim=-1)
        return self.proj(dit.attention(self.q_linear(x), k, v, self.heads))


class PixArtBlock(nn.Module):
    """Self-attention and MLP under adaLN-single modulation, a cross-attention between."""

    def __init__(self, cfg, device=None):
        super().__init__()
        dim = cfg.hidden
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6, device=device)
        self.attn = dit.SelfAttention(dim, cfg.heads, device)
        self.cross_attn = CrossAttention(dim, dim, cfg.heads, device)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6, device=device)
        self.mlp = dit.Mlp(dim, dim * cfg.mlp_ratio, device=device)
        self.scale_shift_table = nn.Parameter(torch.randn(6, dim, device=device) / dim ** 0.5)

    def forward(self, x, caption, t6):
        b = x.shape[0]
        (shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp,
         gate_mlp) = (self.scale_shift_table[None] + t6.reshape(b, 6, -1)).chunk(6, dim=1)
        x = x + gate_msa * self.attn(dit.modulate(self.norm1(x), shift_msa, scale_msa))
        x = x + self.cross_attn(x, caption)
        return x + gate_mlp * self.mlp(dit.modulate(self.norm2(x), shift_mlp, scale_mlp))


class PixArtFinalLayer(nn.Module):
    def __init__(self, cfg, device=None):
        super().__init__()
        self.norm = nn.LayerNorm(cfg.hidden, elementwise_affine=False, eps=1e-6,
                                 device=device)
        self.linear = nn.Linear(cfg.hidden, cfg.patch * cfg.patch * cfg.out_channels,
                                device=device)
        self.scale_shift_table = nn.Parameter(
            torch.randn(2, cfg.hidden, device=device) / cfg.hidden ** 0.5)

    def forward(self, x, t):
        shift, scale = (self.scale_shift_table[None] + t[:, None]).chunk(2, dim=1)
        return self.linear(dit.modulate(self.norm(x), shift, scale))


class PixArt(nn.Module):
    """PixArt-alpha for a latent of side `latent`; forward(x, timesteps, caption) with caption
    [batch, tokens, caption_dim]."""

    def __init__(self, cfg, latent, device=None):
        super().__init__()
        if latent % cfg.patch:
            raise ValueError(f"latent side {latent} is not a multiple of the patch {cfg.patch}")
        self.cfg = cfg
        self.grid = latent // cfg.patch
        dim = cfg.hidden
        self.x_embedder = dit.PatchEmbed(cfg, latent, device)
        self.t_embedder = dit.TimestepEmbedder(dim, cfg.frequency_dim, device)
        self.t_block = nn.Linear(dim, 6 * dim, device=device)  # adaLN-single, after a SiLU
        self.y_embedder = dit.Mlp(cfg.caption_dim, dim, dim, device=device)
        # The null caption of classifier-free guidance, learned in place of dropped captions.
        self.y_embedding = nn.Parameter(
            torch.randn(cfg.caption_tokens, cfg.caption_dim, device=device)
            / cfg.caption_dim ** 0.5)
        self.blocks = nn.ModuleList([PixArtBlock(cfg, device) for _ in range(cfg.depth)])
        self.final_layer = PixArtFinalLayer(cfg, device)

    def null_caption(self, batch, tokens):
        """The learned null caption for `batch` images, cut or repeated to `tokens` tokens."""
        rows = torch.arange(tokens) % self.cfg.caption_tokens
        return self.y_embedding.detach()[rows][None].expand(batch, -1, -1).contiguous()

    def forward(self, x, timesteps, caption):
        tokens = self.x_embedder(x)
        t = self.t_embedder(timesteps)
        t6 = self.t_block(nn.functional.silu(t))
        context = self.y_embedder(caption)
        for block in self.blocks:
            tokens = block(tokens, context, t6)
        out = self.final_layer(tokens, t)
        return dit.unpatchify(out, self.cfg.out_channels, self.cfg.patch, self.grid)


def parameter_count(cfg, latent=64):
    """Parameters of the model for `latent` (64 = 512 px), counted on the meta device."""
    return sum(p.numel() for p in PixArt(cfg, latent, device="meta").parameters())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="PixArt-XL/2", choices=sorted(CONFIGS),
                        help="the model (default PixArt-XL/2); --small overrides it")
    parser.add_argument("--text-tokens", type=dit.positive, default=0,
                        help="caption tokens (default 120, 8 with --small)")
    dit.common_options(parser, default_cfg_scale=4.5)
    args = parser.parse_args(argv)
    cfg = SMALL if args.small else CONFIGS[args.config]
    dit.check_common(parser, args, cfg.patch)
    args.config_name = "small" if args.small else args.config
    text_tokens = args.text_tokens or cfg.caption_tokens

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    build_start = time.perf_counter()
    model = PixArt(cfg, args.latent).eval()
    args.build_seconds = time.perf_counter() - build_start
    caption = torch.randn(args.batch, text_tokens, cfg.caption_dim,
                          generator=torch.Generator().manual_seed(args.seed + 2))
    null = model.null_caption(args.batch, text_tokens)
    return dit.denoise(model, args, caption, null, "pixart",
                       f"{args.config_name} text-conditioned, {text_tokens} caption tokens",
                       extra={"text_tokens": text_tokens})


if __name__ == "__main__":
    sys.exit(main())
