#!/usr/bin/python3
"""tests/onnxruntime/export_models.py - the ONNX models the ONNX Runtime tests and benchmark
run, exported here with Debian's torch (torch.onnx.export), random weights, no downloads.

Models (each MODEL.onnx plus MODEL.json: input names, shapes and dtypes, and the torch
output's sha256, so a reader knows what to feed it):
  small_unet   workloads/sd_unet.py's SMALL UNet (the SD-UNet shape, three levels), latent
               16x16, batch 2: well under a second to export; the tests' model
  resnet18     torchvision's ResNet-18 at 64x64, batch 1: the tests' convolution model
  resnet50     torchvision's ResNet-50 at 224x224, batch 1: the benchmark's
  sd_unet_mid  the SD 1.5 UNet's first three levels at full width (320/640/1280, one ResNet
               block each, cross-attention on 77x768 text in the first two), latent 32x32,
               batch 2: the benchmark's SD-shaped model (the whole UNet is 3.4 GB of fp32
               weights and a run of it takes minutes on two cores)

Invariant: weights come from torch.manual_seed(0) only, so an export is the same bytes each
time for the same torch. A model already present is not exported again.

    /usr/bin/python3 tests/onnxruntime/export_models.py --out DIR [MODEL ...]
"""

import argparse
import dataclasses
import json
import pathlib
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "workloads"))
import sd_unet  # noqa: E402  (the repository's SD-UNet-shaped model)


def unet_model(cfg, latent, batch):
    model = sd_unet.UNet(cfg).eval()
    inputs = {
        "sample": torch.randn(batch, cfg.latent_channels, latent, latent),
        "timesteps": torch.full((batch,), 500.0),
        "context": torch.randn(batch, cfg.context_tokens, cfg.context_dim),
    }
    return model, inputs


def resnet_model(name, size):
    import torchvision  # Debian's python3-torchvision

    model = getattr(torchvision.models, name)(weights=None).eval()
    return model, {"input": torch.randn(1, 3, size, size)}


MID = dataclasses.replace(sd_unet.FULL, block_channels=(320, 640, 1280),
                          attention=(True, True, False), layers_per_block=1)
MODELS = {
    "small_unet": lambda: unet_model(sd_unet.SMALL, 16, 2),
    "resnet18": lambda: resnet_model("resnet18", 64),
    "resnet50": lambda: resnet_model("resnet50", 224),
    "sd_unet_mid": lambda: unet_model(MID, 32, 2),
}


def export(name, out):
    onnx_path, meta_path = out / f"{name}.onnx", out / f"{name}.json"
    if onnx_path.exists() and meta_path.exists():
        return
    torch.manual_seed(0)
    model, inputs = MODELS[name]()
    with torch.no_grad():
        tmp = onnx_path.with_suffix(".onnx.partial")
        torch.onnx.export(model, tuple(inputs.values()), str(tmp), input_names=list(inputs),
                          output_names=["output"], opset_version=14)
        tmp.rename(onnx_path)  # whole or not at all
    meta = {"inputs": [{"name": k, "shape": list(v.shape), "dtype": "float32"}
                       for k, v in inputs.items()]}
    # The inputs' bytes go next to the model, so every program feeds the same values.
    for k, v in inputs.items():
        (out / f"{name}.{k}.bin").write_bytes(v.contiguous().numpy().tobytes())
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=pathlib.Path)
    parser.add_argument("models", nargs="*", default=["small_unet", "resnet18"],
                        choices=sorted(MODELS))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    for name in args.models:
        export(name, args.out)
        print(f"export_models: {args.out / name}.onnx")


if __name__ == "__main__":
    main()
