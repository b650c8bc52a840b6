#!/usr/bin/python3
"""bench/transfer/sd_unet_units.py - writes the SD 1.5 UNet's offload units (sd_unet_units.csv
beside it), the input of sdalloc_offload_bench and of the offload tests on the simulated
device.

The units are those sdalloc.torch.offload makes (python/sdalloc/_offload_units.py, default
unit size) of workloads/sd_unet.py's full UNet, built on torch's meta device; one row per
unit in the order of a forward: name, bytes of its fp16 image, FLOPs of one forward at batch
2 and 64x64 latents, kernels (leaf module calls), keep_resident (below 1 MiB), uses.

    /usr/bin/python3 bench/transfer/sd_unet_units.py [--out FILE] [--unit-mib N]
"""

import argparse
import csv
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "workloads"))

FIELDS = ("name", "bytes", "flops", "kernels", "keep_resident", "uses")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join(HERE, "sd_unet_units.csv"))
    parser.add_argument("--unit-mib", type=int, default=32)
    args = parser.parse_args(argv)
    import sd_unet  # pylint: disable=import-outside-toplevel,import-error
    from sdalloc import _offload_units  # pylint: disable=import-outside-toplevel
    rows = _offload_units.unet_unit_table(sd_unet, unit_bytes=args.unit_mib << 20)
    with open(args.out, "w", encoding="utf-8", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=FIELDS, lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: int(v) if isinstance(v, bool) else v for k, v in row.items()})
    total = sum(r["bytes"] for r in rows)
    flops = sum(r["flops"] for r in rows)
    big = [r for r in rows if r["name"].startswith(("down.2", "down.3", "mid", "up.0", "up.1"))]
    print(f"{len(rows)} units, {total / 2**20:.1f} MiB, {flops / 1e9:.1f} GFLOP; 1280-channel "
          f"blocks {sum(r['bytes'] for r in big) / total:.3f} of the bytes, "
          f"{sum(r['flops'] for r in big) / flops:.3f} of the FLOPs; largest unit "
          f"{max(r['bytes'] for r in rows) / 2**20:.1f} MiB -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
