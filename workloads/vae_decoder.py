#!/usr/bin/python3
"""workloads/vae_decoder.py - Stable Diffusion 1.5's VAE decoder on the CPU, random weights:
a decoder-shaped program whose allocations differ from the UNet's (few, large activations at
the image's resolution), to record traces from and to run allocators under.

Written here from the published architecture (the layout of diffusers' AutoencoderKL decoder
for SD 1.5), no downloads: post_quant_conv 4->4, conv_in 4->512; mid block ResNet(512) -
single-head self-attention over the latent pixels - ResNet(512); four up blocks of widths
512/512/256/128, 3 ResNet blocks each, nearest 2x upsampling + conv after all but the last;
GroupNorm(32) -> SiLU -> conv_out 128->3. A latent of side L gives an image of side 8L.

Invariants: weights come from torch.manual_seed(--seed) only, fp32, everything runs under
torch.inference_mode(); the output's checksum is printed so two runs can be compared.

    /usr/bin/python3 workloads/vae_decoder.py [--batch B] [--latent L] [--passes N] [--threads T]
"""

import argparse
import time

import torch
from torch import nn
from torch.nn import functional as F


class ResnetBlock(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.norm1 = nn.GroupNorm(32, cin, eps=1e-6)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.norm2 = nn.GroupNorm(32, cout, eps=1e-6)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.shortcut = nn.Conv2d(cin, cout, 1) if cin != cout else None

    def forward(self, x):
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        return (x if self.shortcut is None else self.shortcut(x)) + h


class AttentionBlock(nn.Module):
    """One head over every pixel of the latent, as the SD VAE's mid block."""

    # True: F.scaled_dot_product_attention (torch >= 2.0, diffusers' AttnProcessor2_0) instead
    # of the scores written out; workloads/sd_pipeline.py sets it where torch has it.
    fused = False

    def __init__(self, dim):
        super().__init__()
        self.norm = nn.GroupNorm(32, dim, eps=1e-6)
        self.to_q, self.to_k, self.to_v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.to_out = nn.Linear(dim, dim)

    def forward(self, x):
        b, c, h, w = x.shape
        t = self.norm(x).reshape(b, c, h * w).transpose(1, 2)
        q, k, v = self.to_q(t), self.to_k(t), self.to_v(t)
        if self.fused:
            attended = F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None])[:, 0]
            return x + self.to_out(attended).transpose(1, 2).reshape(b, c, h, w)
        weights = torch.softmax(q @ k.transpose(1, 2) * (c ** -0.5), dim=-1)
        out = self.to_out(weights @ v).transpose(1, 2).reshape(b, c, h, w)
        return x + out


class Decoder(nn.Module):
    def __init__(self, widths=(512, 512, 256, 128)):
        super().__init__()
        self.post_quant_conv = nn.Conv2d(4, 4, 1)
        self.conv_in = nn.Conv2d(4, widths[0], 3, padding=1)
        self.mid = nn.ModuleList([ResnetBlock(widths[0], widths[0]), AttentionBlock(widths[0]),
                                  ResnetBlock(widths[0], widths[0])])
        self.up = nn.ModuleList()
        cin = widths[0]
        for i, cout in enumerate(widths):
            blocks = nn.ModuleList([ResnetBlock(cin if j == 0 else cout, cout) for j in range(3)])
            upsample = nn.Conv2d(cout, cout, 3, padding=1) if i + 1 < len(widths) else None
            self.up.append(nn.ModuleDict({"blocks": blocks, "upsample": upsample}
                                         if upsample is not None else {"blocks": blocks}))
            cin = cout
        self.norm_out = nn.GroupNorm(32, widths[-1], eps=1e-6)
        self.conv_out = nn.Conv2d(widths[-1], 3, 3, padding=1)

    def forward(self, z):
        x = self.conv_in(self.post_quant_conv(z))
        for layer in self.mid:
            x = layer(x)
        for level in self.up:
            for block in level["blocks"]:
                x = block(x)
            if "upsample" in level:
                x = level["upsample"](F.interpolate(x, scale_factor=2.0, mode="nearest"))
        return self.conv_out(F.silu(self.norm_out(x)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--latent", type=int, default=16, help="latent side (image side = 8x)")
    parser.add_argument("--passes", type=int, default=2, help="decodes of the same latent")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if min(args.batch, args.latent, args.passes, args.threads) < 1:
        parser.error("--batch, --latent, --passes and --threads must be at least 1")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    decoder = Decoder().eval()
    z = torch.randn(args.batch, 4, args.latent, args.latent,
                    generator=torch.Generator().manual_seed(args.seed + 1))
    with torch.inference_mode():
        for i in range(args.passes):
            start = time.perf_counter()
            image = decoder(z / 0.18215)
            print(f"vae_decoder: pass {i + 1}/{args.passes} {tuple(image.shape)} "
                  f"{time.perf_counter() - start:.3f} s checksum {float(image.double().abs().sum()):.6f}",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
