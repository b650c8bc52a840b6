"""scripts/gpu_offload.py - the offload measurement of scripts/gpu-check.sh (stage `offload`),
run as `scripts/gpu_workload.py offload` (its doc has the options).

The workload is gpu_workload.py's: workloads/sd_unet.py's SD 1.5 UNet, fp16 on CUDA, batch
2, at 64x64 and 96x96 latents, random weights made on the device from torch.manual_seed(0).
Measured in the same run, before anything is offloaded:
  - T per latent: the step with every weight on the GPU (median of the timed steps; a step
    ends with the compute stream's synchronize, as a pipeline reading the latents would);
  - BW: pinned host->device bandwidth (copies of 256 MiB from page-locked memory).
Then the model moves to host memory (model.to("cpu")) and sdalloc.torch.offload(model,
budget, device="cuda") streams it at each budget of OFFLOAD_BUDGETS (fractions of the
weights' bytes), the first latent's plan recorded at the first step, the next latent's
after off.replan(). Each row shows, beside its step time, T, X / BW (X: the bytes its plan
copies per step), the floor max(T, X / BW), the ideal floor max(T, (weights - budget) /
BW), the plan's own prediction, copy calls per step, device memory (cudaMemGetInfo, above
what was used before the model) and host RAM (RSS growth since the weights came to host
memory). Where diffusers is installed, its group offloading (use_stream=True, one block a
group) runs the same UNet as one more row per latent ("diffusers not installed" otherwise).

A row has problems (and fails the check) when its device region passes its budget, a timed
step left the plan, or its output differs from all-on-GPU's at that latent. The bars
(issue 47), judged on a GPU only and failing the verdict only under --strict: every offload
row's step <= FLOOR_BAR x its floor; at 96x96 and 50 %, <= REF_BAR x all-on-GPU.

--cpu-smoke: the small UNet on the CPU, offloaded to the simulated device computing on the
host (device="cpu"), one latent; BW is the CPU's memcpy; the same table, not judged.
"""

import json
import os
import statistics
import sys
import time

# pylint: disable-next=import-error
from gpu_workload import BATCH, CPU_LATENTS, GPU_LATENTS, ROOT, fingerprint, mib, outputs_match

OFFLOAD_BUDGETS = (0.5, 0.25)  # fractions of the weights' bytes
FLOOR_BAR = 1.10  # every offload row: step time <= this x max(T, X / BW)
REF_BAR = 1.15  # at REF_BAR_LATENT and 50 %: step time <= this x all-on-GPU
REF_BAR_LATENT = 96
BANDWIDTH_BYTES = 256 << 20


def _rss():
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure_bandwidth(torch, cuda):
    """Bytes per second host->device from page-locked memory (CUDA events, median of 5), or
    the CPU's memcpy under --cpu-smoke."""
    if not cuda:
        src = torch.ones(BANDWIDTH_BYTES // 4, dtype=torch.uint8)
        dst = torch.empty_like(src)
        times = []
        for _ in range(5):
            start = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - start)
        return src.numel() / statistics.median(times)
    src = torch.empty(BANDWIDTH_BYTES, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(BANDWIDTH_BYTES, dtype=torch.uint8, device="cuda")
    stream = torch.cuda.Stream()
    times = []
    with torch.cuda.stream(stream):
        dst.copy_(src, non_blocking=True)  # warm-up
        for _ in range(5):
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record(stream)
            dst.copy_(src, non_blocking=True)
            end.record(stream)
            end.synchronize()
            times.append(begin.elapsed_time(end) / 1e3)
    return BANDWIDTH_BYTES / statistics.median(times)


class Runner:
    """The UNet's steps at one latent: inputs, the step's end (the compute stream), timing."""

    def __init__(self, torch, model, cfg, sd_unet, device, dtype, latent):
        self.torch, self.model, self.cuda = torch, model, device == "cuda"
        self.context, self.timesteps = sd_unet.conditioning(cfg, BATCH, device, dtype)
        shape = (BATCH, cfg.latent_channels, latent, latent)
        self.x = torch.randn(shape, device=device, dtype=dtype,
                             generator=torch.Generator(device=device).manual_seed(3))
        self.latent, self.shape = latent, list(shape)

    def step(self):
        start = time.perf_counter()
        out = self.model(self.x, self.timesteps, self.context)
        if self.cuda:
            self.torch.cuda.current_stream().synchronize()
        return time.perf_counter() - start, out

    def device_used(self, baseline):
        if not self.cuda:
            return None
        free, total = self.torch.cuda.mem_get_info()
        return total - free - baseline

    def measure(self, args, baseline, stats=None):
        """Warm-up (the first offloaded step is the recorded one), then timed steps."""
        with self.torch.inference_mode():
            for _ in range(args.warmup):
                self.step()
            before = stats() if stats else None
            times, used, out = [], 0, None
            for _ in range(args.iterations):
                seconds, out = self.step()
                times.append(seconds)
                used = max(used, self.device_used(baseline) or 0)
            after = stats() if stats else None
        row = {"latent": self.latent, "shape": self.shape, "iterations": len(times),
               "median_s": statistics.median(times), "min_s": min(times),
               "max_s": max(times), "device_used_bytes": used if self.cuda else None,
               "output_fingerprint": fingerprint(out), "problems": []}
        if stats:
            row["stats"] = after
            row["copies_per_step"] = (after["copies"] - before["copies"]) / len(times)
            row["divergent_in_timed_steps"] = after["divergent_steps"] - before["divergent_steps"]
        return row


def _floors(row, ref_s, bandwidth, weight_bytes):
    """T, X / BW, the floor, the ideal floor and the ratios of one offloaded row."""
    stats = row["stats"]
    budget = row["budget_bytes"]
    row["ref_s"] = ref_s
    row["copy_s"] = stats["streamed_bytes"] / bandwidth
    row["floor_s"] = max(ref_s, row["copy_s"])
    row["ideal_s"] = max(ref_s, max(0, weight_bytes - budget) / bandwidth)
    row["predicted_s"] = stats["predicted_step_seconds"]
    if stats["region_bytes"] > budget:
        row["problems"].append(f"device region {stats['region_bytes']} B over the budget "
                               f"{budget} B")
    if row["divergent_in_timed_steps"]:
        row["problems"].append(f"{row['divergent_in_timed_steps']} timed steps left the plan")


def _diffusers_rows(torch, model, runners, args, baseline, weight_bytes):
    """diffusers' group offloading of the same UNet, one block a group, use_stream=True."""
    try:
        from diffusers.hooks import apply_group_offloading  # pylint: disable=import-outside-toplevel
    except ImportError as error:
        return [{"setting": "diffusers group offload", "skipped": f"not installed ({error})"}]
    rows = []
    rss_before = _rss()
    try:
        apply_group_offloading(model, onload_device=torch.device("cuda"),
                               offload_device=torch.device("cpu"), offload_type="block_level",
                               num_blocks_per_group=1, use_stream=True)
        for runner in runners:
            row = runner.measure(args, baseline)
            row.update(setting="diffusers group offload", budget_bytes=None,
                       host_ram_bytes=_rss() - rss_before + weight_bytes)
            rows.append(row)
    except Exception as error:  # pylint: disable=broad-except
        rows.append({"setting": "diffusers group offload",
                     "skipped": f"{type(error).__name__}: {error}"})
    return rows


def offload(args):
    """All weights on the device against sdalloc.torch.offload at OFFLOAD_BUDGETS (doc)."""
    import torch  # pylint: disable=import-outside-toplevel
    import sdalloc.torch as shim  # pylint: disable=import-outside-toplevel
    sys.path.insert(0, os.path.join(ROOT, "workloads"))
    import sd_unet  # pylint: disable=import-outside-toplevel,import-error

    if args.cpu_smoke:
        device, dtype, latents, cfg = "cpu", torch.float32, CPU_LATENTS[:1], sd_unet.SMALL
    else:
        if not torch.cuda.is_available():
            raise SystemExit("gpu_workload: torch.cuda.is_available() is False")
        device, dtype, latents, cfg = "cuda", torch.float16, GPU_LATENTS, sd_unet.FULL
        torch.cuda.init()
    cuda = device == "cuda"
    baseline = 0
    if cuda:
        free, total = torch.cuda.mem_get_info()
        baseline = total - free
    rss_start = _rss()
    model = sd_unet.make_unet(cfg, device, dtype)  # the run's weights, made in place
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    runners = [Runner(torch, model, cfg, sd_unet, device, dtype, latent) for latent in latents]
    bandwidth = measure_bandwidth(torch, cuda)
    result = {"cpu_smoke": args.cpu_smoke, "torch": torch.__version__,
              "dtype": str(dtype).replace("torch.", ""), "weight_bytes": weight_bytes,
              "parameters": sum(p.numel() for p in model.parameters()),
              "bandwidth_bytes_per_second": bandwidth, "latents": list(latents),
              "settings": [], "problems": []}
    references = {}
    for runner in runners:
        row = runner.measure(args, baseline)
        row.update(setting="all on GPU" if cuda else "all on CPU", budget_bytes=None)
        references[runner.latent] = row
        result["settings"].append(row)
    if cuda:
        rss_start = _rss()
        model.to("cpu")  # the weights now live in host memory, 1x
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    for fraction in OFFLOAD_BUDGETS:
        budget = int(fraction * weight_bytes)
        off = shim.offload(model, budget=budget, device=device)
        try:
            for index, runner in enumerate(runners):
                if index:
                    off.replan()  # another shape: recorded and planned again
                row = runner.measure(args, baseline, off.stats)
                row.update(setting=f"offload {fraction * 100:g} %", budget_fraction=fraction,
                           budget_bytes=budget, plan=off.describe(),
                           host_ram_bytes=_rss() - rss_start)
                _floors(row, references[runner.latent]["median_s"], bandwidth, weight_bytes)
                if outputs_match(row, references[runner.latent]) is False:
                    row["problems"].append("output differs from all-on-GPU's")
                result["settings"].append(row)
        finally:
            off.remove()
    if cuda:  # at the first latent only: the stage's time is counted
        result["settings"] += _diffusers_rows(torch, model, runners[:1], args, baseline,
                                              weight_bytes)
    with open(args.out, "w", encoding="utf-8") as out_file:
        json.dump(result, out_file, indent=1)
    print(format_offload(result), flush=True)


OFFLOAD_COLUMNS = (("setting", 24), ("latent", 6), ("budget MiB", 10), ("ms/step", 8),
                   ("x ref", 6), ("T ms", 7), ("X/BW ms", 8), ("floor ms", 8), ("x floor", 7),
                   ("ideal ms", 8), ("plan ms", 7), ("copies", 6), ("device MiB", 10),
                   ("host MiB", 9))


def _ms(seconds):
    return "-" if seconds is None else f"{seconds * 1e3:.2f}"


def _cells(s, references):
    ref = references.get(s.get("latent"))
    x_ref = "-" if ref is None else f"{s['median_s'] / ref:.3f}"
    floor = s.get("floor_s")
    copies = s.get("copies_per_step")
    return [s["setting"], str(s.get("latent", "-")), mib(s.get("budget_bytes")),
            _ms(s["median_s"]), x_ref, _ms(s.get("ref_s", ref)), _ms(s.get("copy_s")),
            _ms(floor), "-" if floor is None else f"{s['median_s'] / floor:.3f}",
            _ms(s.get("ideal_s")), _ms(s.get("predicted_s")),
            "-" if copies is None else f"{copies:.0f}", mib(s.get("device_used_bytes")),
            mib(s.get("host_ram_bytes"))]


def offload_bars(result):
    """[(ok, line)]: each offload row's step against FLOOR_BAR x its floor, and the
    REF_BAR_LATENT x 50 % row against REF_BAR x all-on-GPU."""
    settings = [s for s in result.get("settings") or [] if "median_s" in s]
    references = {s["latent"]: s["median_s"] for s in settings if s.get("budget_bytes") is None
                  and s["setting"].startswith("all on")}
    bars = []
    for s in settings:
        if s.get("floor_s"):
            ratio = s["median_s"] / s["floor_s"]
            bars.append((ratio <= FLOOR_BAR, f"{s['setting']} at {s['latent']}x{s['latent']}: "
                                             f"{ratio:.3f} x max(T, X/BW) (<= {FLOOR_BAR})"))
        if s.get("budget_fraction") == 0.5 and s.get("latent") == REF_BAR_LATENT and \
                references.get(REF_BAR_LATENT):
            ratio = s["median_s"] / references[REF_BAR_LATENT]
            bars.append((ratio <= REF_BAR, f"{s['setting']} at {REF_BAR_LATENT}x"
                                           f"{REF_BAR_LATENT}: {ratio:.3f} x all-on-GPU "
                                           f"(<= {REF_BAR})"))
    return bars


def offload_bar(result):
    """(ok, line) for every bar at once (gpu_workload.py's table), or None: nothing to judge."""
    bars = offload_bars(result)
    if not bars:
        return None
    missed = [line for ok, line in bars if not ok]
    worst = max((float(line.split(": ")[1].split(" x ")[0]), line) for _, line in bars)[1]
    line = (f"offload: {len(bars) - len(missed)} of {len(bars)} bars met" +
            (f"; missed: {'; '.join(missed)}" if missed else f"; worst {worst}"))
    return (not missed, line)


def format_offload(result):
    """The offload table (every figure beside its floor), then the bars' lines."""
    if result.get("error"):
        return f"offload: FAILED: {result['error'].splitlines()[0]}"
    settings = result.get("settings") or []
    where = "CPU, simulated device (smoke)" if result.get("cpu_smoke") else "GPU"
    model = "small UNet" if result.get("cpu_smoke") else "SD 1.5 UNet"
    bandwidth = result.get("bandwidth_bytes_per_second")
    lines = [f"offload: {model} {result.get('dtype')}, batch {BATCH}, weights "
             f"{mib(result.get('weight_bytes'))} MiB, on the {where}; BW "
             f"{'-' if bandwidth is None else f'{bandwidth / 1e9:.1f}'} GB/s pinned "
             "host->device; floor = max(T, X/BW), ideal = max(T, (weights - budget)/BW)"]
    header = [OFFLOAD_COLUMNS[0][0].ljust(OFFLOAD_COLUMNS[0][1])] + [
        name.rjust(width) for name, width in OFFLOAD_COLUMNS[1:]]
    lines.append("  ".join(header + ["status"]))
    references = {s["latent"]: s["median_s"] for s in settings if s.get("budget_bytes") is None
                  and s.get("setting", "").startswith("all on") and "median_s" in s}
    for s in settings:
        if "median_s" not in s:
            lines.append(f"{s.get('setting', '?').ljust(OFFLOAD_COLUMNS[0][1])}  "
                         f"{s.get('skipped') or s.get('error') or 'no figures'}")
            continue
        cells = _cells(s, references)
        cells = [cells[0].ljust(OFFLOAD_COLUMNS[0][1])] + [
            c.rjust(w) for c, (_, w) in zip(cells[1:], OFFLOAD_COLUMNS[1:])]
        status = "FAILED: " + "; ".join(s["problems"]) if s.get("problems") else "ok"
        lines.append("  ".join(cells + [status]).rstrip())
    smoke = result.get("cpu_smoke")
    for ok, line in offload_bars(result):
        word = "INFO" if smoke else "PASS" if ok else "FAIL"
        lines.append(f"{word}  offload: {line}" + (" (judged on a GPU only)" if smoke else ""))
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
    return [f"{s['setting']} at {s.get('latent')}: {p}" for s in result.get("settings", [])
            for p in s.get("problems", [])] + list(result.get("problems", []))
