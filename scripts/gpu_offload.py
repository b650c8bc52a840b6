"""scripts/gpu_offload.py - the offload measurement of scripts/gpu-check.sh (stage `offload`),
run as `scripts/gpu_workload.py offload` (its doc has the options).

The workload is gpu_workload.py's: workloads/sd_unet.py's SD 1.5 UNet, fp16 on CUDA, batch
2, 64x64 latents, random weights made on the device from torch.manual_seed(0). The first
setting is all weights on the GPU; then the model moves to host memory (model.to("cpu"), 1x
the weights in RAM) and sdalloc.torch.offload(model, budget, prefetch=2, device="cuda")
streams them at each budget of OFFLOAD_BUDGETS (fractions of the weights' bytes). The time
of a setting is the median of its timed steps, torch.cuda.synchronize() after each; its
output is fingerprinted and compared with the first setting's. A setting has problems (and
fails the check) when its peak resident bytes pass the budget, a step diverged from the
plan, or its output differs; the bar (step time at 50 % budget <= OFFLOAD_BAR x all on the
GPU) is a bar like the others: it fails the verdict only under --strict.
"""

import json
import os
import statistics
import sys
import time

# pylint: disable-next=import-error
from gpu_workload import BATCH, CPU_LATENTS, GPU_LATENTS, ROOT, fingerprint, mib, outputs_match

OFFLOAD_BUDGETS = (0.5, 0.25)  # fractions of the weights' bytes
OFFLOAD_BAR = 1.15  # step time at 50 % budget <= this x all-on-GPU
OFFLOAD_SETTLE_S = 3.0  # warm-up time after offload(): the background registration


def offload(args):
    """All weights on the device against sdalloc.torch.offload at OFFLOAD_BUDGETS (doc)."""
    import torch  # pylint: disable=import-outside-toplevel
    import sdalloc.torch as shim  # pylint: disable=import-outside-toplevel
    sys.path.insert(0, os.path.join(ROOT, "workloads"))
    import sd_unet  # pylint: disable=import-outside-toplevel,import-error

    if args.cpu_smoke:
        device, dtype, latent, cfg = "cpu", torch.float32, CPU_LATENTS[0], sd_unet.SMALL
    else:
        if not torch.cuda.is_available():
            raise SystemExit("gpu_workload: torch.cuda.is_available() is False")
        device, dtype, latent, cfg = "cuda", torch.float16, GPU_LATENTS[0], sd_unet.FULL
        torch.cuda.init()
    cuda = device == "cuda"
    model = sd_unet.make_unet(cfg, device, dtype)  # the run's weights, made in place
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    context, timesteps = sd_unet.conditioning(cfg, BATCH, device, dtype)
    shape = (BATCH, cfg.latent_channels, latent, latent)
    x = torch.randn(shape, device=device, dtype=dtype,
                    generator=torch.Generator(device=device).manual_seed(3))
    result = {"cpu_smoke": args.cpu_smoke, "torch": torch.__version__, "shape": list(shape),
              "dtype": str(dtype).replace("torch.", ""), "weight_bytes": weight_bytes,
              "parameters": sum(p.numel() for p in model.parameters()),
              "settings": [], "problems": []}

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def device_used():
        if not cuda:
            return None
        free, total = torch.cuda.mem_get_info()
        return total - free

    def measure(name, budget, settle_s, stats=None):
        """Warm-up, then timed steps; one setting's figures (`stats`: the offloader's)."""
        started = time.perf_counter()
        warmups = 0
        with torch.inference_mode():
            while warmups < args.warmup or time.perf_counter() - started < settle_s:
                model(x, timesteps, context)
                sync()
                warmups += 1
            times, used, out = [], 0, None
            before = stats() if stats else None
            for _ in range(args.iterations):
                start = time.perf_counter()
                out = model(x, timesteps, context)
                sync()
                times.append(time.perf_counter() - start)
                used = max(used, device_used() or 0)
        figures = {} if stats is None else {"stats": stats(), "loads_per_step": (
            stats()["loads"] - before["loads"]) / len(times)}
        return {**figures, "setting": name, "budget_bytes": budget, "warmup_steps": warmups,
                "iterations": len(times), "median_s": statistics.median(times),
                "min_s": min(times), "max_s": max(times),
                "device_used_bytes": used if cuda else None, "output_fingerprint":
                fingerprint(out), "problems": []}

    reference = measure("all on GPU" if cuda else "all on CPU", None, 0.0)
    result["settings"].append(reference)
    if cuda:
        model.to("cpu")  # the weights now live in host memory, 1x
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    target = "cuda" if cuda else "cpu"
    for fraction in OFFLOAD_BUDGETS:
        budget = int(fraction * weight_bytes)
        off = shim.offload(model, budget=budget, prefetch=2, device=target)
        try:
            row = measure(f"offload {fraction * 100:g} %", budget,
                          0.0 if args.cpu_smoke else OFFLOAD_SETTLE_S, off.stats)
            row["budget_fraction"] = fraction
        finally:
            off.remove()
        if row["stats"]["peak_resident_bytes"] > budget:
            row["problems"].append(f"peak resident {row['stats']['peak_resident_bytes']} B "
                                   f"over the budget {budget} B")
        if row["stats"]["divergent_steps"] != 0:
            row["problems"].append(f"{row['stats']['divergent_steps']} divergent steps")
        if outputs_match(row, reference) is False:
            row["problems"].append("output differs from all-on-GPU's")
        result["settings"].append(row)
    with open(args.out, "w", encoding="utf-8") as out_file:
        json.dump(result, out_file, indent=1)
    print(format_offload(result), flush=True)


OFFLOAD_WIDTHS = (14, 11, 10, 8, 11, 11)
OFFLOAD_HEADER = ("setting", "budget MiB", "ms/step", "x ref", "loads/step", "device MiB",
                  "status")


def offload_bar(result):
    """(ok, line) for the 50 % bar, or None when there is nothing to judge."""
    settings = result.get("settings") or []
    half = next((s for s in settings if s.get("budget_fraction") == 0.5), None)
    if not settings or half is None:
        return None
    ratio = half["median_s"] / settings[0]["median_s"]
    where = "all-on-CPU" if result.get("cpu_smoke") else "all-on-GPU"
    return (ratio <= OFFLOAD_BAR, f"offload: step time at 50 % budget {ratio:.3f} x {where} "
                                  f"(bar: <= {OFFLOAD_BAR})")


def format_offload(result):
    """The offload table: a row per setting, then the bar's PASS/FAIL line."""
    if result.get("error"):
        return f"offload: FAILED: {result['error'].splitlines()[0]}"
    settings = result.get("settings") or []
    where = "CPU, host backend (smoke)" if result.get("cpu_smoke") else "GPU"
    model = "small UNet" if result.get("cpu_smoke") else "SD 1.5 UNet"
    lines = [f"offload: {model} {result.get('dtype')}, {tuple(result.get('shape', ()))}, "
             f"weights {mib(result.get('weight_bytes'))} MiB, on the {where}"]
    header = [str(OFFLOAD_HEADER[0]).ljust(OFFLOAD_WIDTHS[0])] + [
        str(c).rjust(w) for c, w in zip(OFFLOAD_HEADER[1:6], OFFLOAD_WIDTHS[1:])]
    lines.append("  ".join(header + [OFFLOAD_HEADER[6]]))
    reference = settings[0]["median_s"] if settings else None
    for s in settings:
        loads = s.get("loads_per_step")
        cells = [s["setting"].ljust(OFFLOAD_WIDTHS[0]), mib(s.get("budget_bytes")),
                 f"{s['median_s'] * 1e3:.2f}", f"{s['median_s'] / reference:.3f}",
                 "-" if loads is None else f"{loads:.1f}", mib(s.get("device_used_bytes"))]
        cells = [cells[0]] + [c.rjust(w) for c, w in zip(cells[1:], OFFLOAD_WIDTHS[1:])]
        status = "FAILED: " + "; ".join(s["problems"]) if s.get("problems") else "ok"
        lines.append("  ".join(cells + [status]).rstrip())
    bar = offload_bar(result)
    if bar is not None:
        ok, line = bar
        word = ("INFO" if result.get("cpu_smoke") else "PASS" if ok else "FAIL")
        lines.append(f"{word}  {line}" + (" (judged on a GPU only)"
                                          if result.get("cpu_smoke") else ""))
    return "\n".join(lines)


def load_offload(path):
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as error:
        return {"error": f"no result: {error}"}


def offload_problems(result):
    """The offload result's problems (an error, or a setting's), for the verdict."""
    if result is None:
        return []
    if result.get("error"):
        return [result["error"].splitlines()[0]]
    return [f"{s['setting']}: {p}" for s in result.get("settings", []) for p in
            s.get("problems", [])] + list(result.get("problems", []))
