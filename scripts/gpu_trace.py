#!/usr/bin/env python3
"""scripts/gpu_trace.py - records the GPU workload's allocation trace as `op,id,size` CSV.

  gpu_trace.py --out FILE.csv [--latents 64,96] [--iterations N] [--warmup W]

Runs gpu_workload.py's model (workloads/sd_unet.py's SD 1.5 UNet, random weights, fp16,
batch 2) on CUDA under PyTorch's own caching allocator with its memory history on
(torch.cuda.memory._record_memory_history), dumps the snapshot and converts it with
tools/torch_snapshot_to_trace.py into the event trace `sdalloc replay` reads
(docs/formats.md), printing that tool's summary. The weights are made before
recording starts, so the trace holds the inference only: per latent size W warm-up
iterations (cuDNN's and cuBLAS's plan trials allocate there), then N iterations, shapes in
the order given (a shape change, as a pipeline makes when a user changes the resolution).

A GPU trace shows what the CPU traces cannot: fp16 sizes and what cuDNN/cuBLAS ask for as
workspace. Replayed here (no GPU needed), it tunes the pool on the shape it serves there.
"""

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH = 2


def record(args):
    import torch  # pylint: disable=import-outside-toplevel
    sys.path.insert(0, os.path.join(ROOT, "workloads"))
    import sd_unet  # pylint: disable=import-outside-toplevel,import-error

    if not torch.cuda.is_available():
        raise SystemExit("gpu_trace: torch.cuda.is_available() is False")
    cfg = sd_unet.FULL
    model = sd_unet.make_unet(cfg, "cuda", torch.float16)
    context, timesteps = sd_unet.conditioning(cfg, BATCH, "cuda", torch.float16)
    torch.cuda.synchronize()

    history = torch.cuda.memory._record_memory_history  # pylint: disable=protected-access
    history(enabled="all", context=None, stacks="python", max_entries=1_000_000)
    with torch.inference_mode():
        for lat in args.latents:
            shape = (BATCH, cfg.latent_channels, lat, lat)
            for i in range(args.warmup + args.iterations):
                x = torch.randn(shape, device="cuda", dtype=torch.float16,
                                generator=torch.Generator(device="cuda").manual_seed(i))
                out = x - 0.1 * model(x, timesteps, context)
                del x, out
                torch.cuda.synchronize()
            print(f"gpu_trace: {lat}x{lat}: {args.warmup} warm-up + {args.iterations} "
                  "iterations recorded", flush=True)
    torch.cuda.memory._dump_snapshot(args.snapshot)  # pylint: disable=protected-access
    history(enabled=None)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--latents", default="64,96",
                        help="comma-separated latent sizes, in order (default 64,96)")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args(argv)
    try:
        args.latents = [int(v) for v in args.latents.split(",")]
    except ValueError:
        parser.error(f"--latents must be comma-separated integers, got '{args.latents}'")
    if args.iterations < 1 or args.warmup < 0 or any(v < 8 or v % 8 for v in args.latents):
        parser.error("--iterations >= 1, --warmup >= 0, latents multiples of 8 from 8")
    args.snapshot = args.out + ".snapshot.pickle"
    record(args)
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import torch_snapshot_to_trace  # pylint: disable=import-outside-toplevel,import-error
    try:
        return torch_snapshot_to_trace.main([args.snapshot, "-o", args.out])
    finally:
        os.remove(args.snapshot)


if __name__ == "__main__":
    sys.exit(main())
