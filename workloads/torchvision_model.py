#!/usr/bin/python3
"""workloads/torchvision_model.py - one of torchvision's image classifiers on the CPU, random
weights: small models whose pools stay far below a diffusion model's (tens of MiB, a few
activations of 1-10 MiB each), to record traces of that regime from and to run allocators
under.

The model code is torchvision's own (Debian's python3-torchvision 0.14); nothing is
downloaded (weights=None: random initialisation from torch.manual_seed(--seed)).

Invariants: fp32, everything runs under torch.inference_mode(); the same options and thread
count give the same output bytes, whose checksum is printed after each pass. `--batch 1,8`
cycles through the batch sizes pass by pass: a program whose shapes change, as a server's
do with the requests it batches.

    /usr/bin/python3 workloads/torchvision_model.py --model NAME [--batch B[,B...]] [--size S]
        [--passes N] [--threads T] [--seed K]
"""

import argparse
import hashlib
import time

import torch
import torchvision

MODELS = ("resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_large", "efficientnet_b0",
          "densenet121", "squeezenet1_1", "shufflenet_v2_x1_0", "vgg11", "regnet_y_400mf")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, choices=MODELS)
    ap.add_argument("--batch", default="1", help="batch size, or sizes to cycle through: 1,8")
    ap.add_argument("--size", type=int, default=224, help="input side in pixels")
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    try:
        batches = [int(b) for b in args.batch.split(",")]
    except ValueError:
        ap.error(f"--batch must be a number or numbers separated by commas, not {args.batch!r}")
    if min(batches) < 1 or args.size < 32 or args.passes < 1 or args.threads < 1:
        ap.error("--batch, --passes and --threads must be >= 1 and --size >= 32")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = getattr(torchvision.models, args.model)(weights=None).eval()
    params = sum(p.numel() for p in model.parameters())
    inputs = [torch.randn(b, 3, args.size, args.size) for b in batches]
    print(f"{args.model}: {params:,} parameters, inputs {[tuple(x.shape) for x in inputs]}, "
          f"{args.threads} threads", flush=True)
    with torch.inference_mode():
        for i in range(args.passes):
            x = inputs[i % len(inputs)]
            t0 = time.perf_counter()
            y = model(x)
            dt = time.perf_counter() - t0
            digest = hashlib.sha256(y.numpy().tobytes()).hexdigest()[:16]
            print(f"pass {i + 1}/{args.passes} (batch {x.shape[0]}): {dt * 1000:.1f} ms, "
                  f"output {digest}", flush=True)


if __name__ == "__main__":
    main()
