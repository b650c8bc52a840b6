#!/usr/bin/env python3
"""scripts/gpu_workload.py - a Stable Diffusion-scale UNet under one allocator, and the table.

Used by scripts/gpu-check.sh; each allocator configuration runs in a fresh process, since a
process cannot change its CUDA allocator after the first allocation.

  gpu_workload.py run --config NAME --out FILE.json [--iterations N] [--cpu-smoke]
      Runs the workload under configuration NAME and writes its figures as JSON:
        native       PyTorch's caching allocator (no allocator settings)
        expandable   PyTorch's, with expandable_segments:True
        async        PyTorch's backend:cudaMallocAsync
        sdalloc-vmm  sdalloc's default: sdalloc.torch.install() with no mode (mode:auto,
                     which is vmm on CUDA's virtual memory: 2 MiB pages mapped with
                     cuMemCreate/cuMemMap into reserved ranges, moved where they are needed)
        sdalloc-pool sdalloc via sdalloc.torch.install(mode="pool")
        sdalloc-async sdalloc via sdalloc.torch.install(mode="async")
        sdalloc-planned sdalloc via sdalloc.torch.install(mode="planned"), each timed
                     iteration one sdalloc.torch.step(); its step figures go into the JSON
      PyTorch's settings go into both PYTORCH_CUDA_ALLOC_CONF and PYTORCH_ALLOC_CONF before
      torch is imported, and the run records whether they are in effect
      (torch.cuda.get_allocator_backend(), expandable segments in the snapshot): a setting
      that is not in effect is a problem, and a run with problems is a FAILED row.
      --cpu-smoke runs the small UNet on the CPU (no allocator swap, memory figures null);
      sdalloc-planned then steps a backend:host planned pool of the shim that torch's CPU
      tensors never reach (only the step calls and the figures' path are checked).
  gpu_workload.py offload --out FILE.json [--iterations N] [--warmup W] [--cpu-smoke]
      The UNet's step time (64x64 and 96x96, batch 2, fp16) with all weights on the GPU,
      the pinned bandwidth, then the weights in host memory offloaded through
      sdalloc.torch.offload(device="cuda") at budgets of 50 % and 25 % of the weights'
      bytes; each a table row beside its floor max(T, X/BW), and the bars (every step <=
      1.10 x its floor; 96x96 at 50 % <= 1.15 x all-on-GPU) as PASS/FAIL. Warm-up: W steps
      per setting and latent (the first offloaded one is recorded and planned). Each
      setting's output is compared with all-on-GPU's. --cpu-smoke: the small UNet on the
      CPU against the simulated device (the code path only; not judged). The code is in
      scripts/gpu_offload.py.
  gpu_workload.py row FILE.json          one table row, printed as a run finishes
  gpu_workload.py table FILE.json... [--json OUT] [--stages TSV] [--offload FILE]
                        [--pipeline FILE]... [--strict]
      The table, the verdict lines of the bars (sdalloc's peak reserved below native's, no
      higher than expandable's, at <= 1.05 x expandable's time per shape (1.02 for the
      default, sdalloc-vmm), and no cudaMalloc or cudaFree in the second half of each
      shape's timed iterations), the outputs compared with native's, and the gpu-check
      stages (TSV lines: name, status, seconds, detail), the offload table and its bar
      (--offload: `offload`'s JSON), and the pipeline's table and bars (--pipeline:
      scripts/gpu_pipeline.py's results, scripts/gpu_pipeline_table.py). --json writes
      everything to OUT. Exit 1 when a stage or run failed or a run (or offload setting,
      or pipeline run) has problems, or an output differs; --strict also when a bar is
      missed.

The workload: workloads/sd_unet.py's Stable Diffusion 1.5 UNet (random weights), fp16 on
CUDA, batch 2 (one image under classifier-free guidance), 64x64 and 96x96 latents, under
torch.inference_mode. Per shape: warm-up iterations outside any step (cuDNN/cuBLAS plan
trials allocate once there), then >= 20 timed iterations; the time of a shape is the median
of its iterations, with torch.cuda.synchronize() around each. Device memory from
cudaMemGetInfo (torch.cuda.mem_get_info, above what was used before the model) is sampled
after every iteration beside the allocator's own figure: it counts what a cudaMemPool keeps.
The output of the first timed iteration of the first shape is fingerprinted (after its
step, so that every step allocates alike), so the table can compare every allocator's output
with native's. Per shape the run also counts the allocator's cudaMalloc + cudaFree calls
over the timed iterations (memory_stats' num_device_alloc + num_device_free; a steady state
makes none) and, for sdalloc-planned, which timed steps left their plan.
"""

import argparse
import contextlib
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CONFIGS = {
    "native": {"torch_conf": None, "sdalloc": None},
    "expandable": {"torch_conf": "expandable_segments:True", "sdalloc": None},
    "async": {"torch_conf": "backend:cudaMallocAsync", "sdalloc": None},
    "sdalloc-vmm": {"torch_conf": None, "sdalloc": {}},  # the default: install(), no mode
    "sdalloc-pool": {"torch_conf": None, "sdalloc": {"mode": "pool"}},
    "sdalloc-async": {"torch_conf": None, "sdalloc": {"mode": "async"}},
    "sdalloc-planned": {"torch_conf": None, "sdalloc": {"mode": "planned"}, "steps": True},
}
STEP_FIGURES = ("planned_allocations", "kept_allocations", "fallback_allocations",
                "recorded_allocations", "recorded_steps", "planned_steps", "divergent_steps",
                "replans", "arena_failures", "arena_bytes", "plans")
GPU_LATENTS = (64, 96)
CPU_LATENTS = (8, 16)
BATCH = 2
MiB = 1 << 20
OUTPUT_TOLERANCE = 2e-3  # relative, on the fingerprint's sums (fp16 kernels may differ)
TIME_BAR = 1.05  # an sdalloc configuration's time per shape <= this x expandable's
DEFAULT_TIME_BAR = 1.02  # the same for sdalloc's default (sdalloc-vmm): issue 48's bar


# --------------------------------------------------------------------------- run

def set_torch_conf(conf):
    """Before torch is imported: PyTorch reads its allocator settings once (newer versions
    read PYTORCH_ALLOC_CONF, older ones PYTORCH_CUDA_ALLOC_CONF: both are set)."""
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        if conf:
            os.environ[name] = conf
        else:
            os.environ.pop(name, None)


def allocator_in_effect(torch, spec):
    """What torch reports about its allocator, and the problems if a setting is not in
    effect."""
    found, problems = {}, []
    getter = getattr(torch.cuda, "get_allocator_backend", None)
    found["allocator_backend"] = getter() if getter else None
    conf = spec["torch_conf"] or ""
    if "cudaMallocAsync" in conf and found["allocator_backend"] != "cudaMallocAsync":
        problems.append(f"backend:cudaMallocAsync not in effect (backend "
                        f"{found['allocator_backend']!r})")
    if "expandable_segments" in conf:
        segments = torch.cuda.memory._snapshot()["segments"]  # pylint: disable=protected-access
        found["expandable_in_effect"] = any(s.get("is_expandable") for s in segments)
        if not found["expandable_in_effect"]:
            problems.append("expandable_segments not in effect (no expandable segment in "
                            "torch.cuda.memory._snapshot())")
    return found, problems


def fingerprint(tensor):
    flat = tensor.detach().float().flatten()
    return {"sum": float(flat.sum()), "abs_sum": float(flat.abs().sum()),
            "first": [float(v) for v in flat[:4]]}


def run(args):
    spec = CONFIGS[args.config]
    set_torch_conf(None if args.cpu_smoke else spec["torch_conf"])
    import torch  # pylint: disable=import-outside-toplevel
    sys.path.insert(0, os.path.join(ROOT, "workloads"))
    import sd_unet  # pylint: disable=import-outside-toplevel,import-error

    result = {"config": args.config, "torch": torch.__version__, "cpu_smoke": args.cpu_smoke,
              "allocator_conf": spec["torch_conf"], "sdalloc": spec["sdalloc"], "problems": []}
    shim = None
    if spec["sdalloc"] is not None and not args.cpu_smoke:
        import sdalloc.torch as shim  # pylint: disable=import-outside-toplevel
        shim.install(**spec["sdalloc"])
        result["sdalloc_conf"] = shim.config_text()
        result["sdalloc_hooks"] = shim.hooks()
    step_device = None
    if spec.get("steps"):
        import sdalloc.torch as step_shim  # pylint: disable=import-outside-toplevel
        if args.cpu_smoke:
            step_shim.configure(backend="host", **spec["sdalloc"])
            step_device = 0
            result["sdalloc_conf"] = step_shim.config_text()

        def timed_scope():
            return step_shim.step(device=step_device)
    else:
        timed_scope = contextlib.nullcontext

    if args.cpu_smoke:
        device, dtype, latents, cfg = "cpu", torch.float32, CPU_LATENTS, sd_unet.SMALL
    else:
        if not torch.cuda.is_available():
            raise SystemExit("gpu_workload: torch.cuda.is_available() is False")
        device, dtype, latents, cfg = "cuda", torch.float16, GPU_LATENTS, sd_unet.FULL
        torch.cuda.init()
    cuda = device == "cuda"
    used_before = None
    if cuda:
        free, total = torch.cuda.mem_get_info()
        used_before = total - free
    model = sd_unet.make_unet(cfg, device, dtype)  # fp16 directly: no fp32 copy to cache
    result["parameters"] = sum(p.numel() for p in model.parameters())
    if cuda:
        found, problems = allocator_in_effect(torch, spec)
        result.update(found)
        result["problems"] += problems
        if shim is not None and found["allocator_backend"] == "native":
            result["problems"].append("sdalloc installed, but torch reports the native "
                                      "allocator")
        torch.cuda.reset_peak_memory_stats()  # the peaks of inference, weights included
    context, timesteps = sd_unet.conditioning(cfg, BATCH, device, dtype)
    shapes = [(BATCH, cfg.latent_channels, lat, lat) for lat in latents]
    result["shapes"] = [list(s) for s in shapes]
    device_peak = [0]

    def sync_and_sample():
        if cuda:
            torch.cuda.synchronize()
            free_now, total_now = torch.cuda.mem_get_info()
            device_peak[0] = max(device_peak[0], total_now - free_now - used_before)

    def iteration(shape, seed):
        x = torch.randn(shape, device=device, dtype=dtype,
                        generator=torch.Generator(device=device).manual_seed(seed))
        return x - 0.1 * model(x, timesteps, context)

    def vmm_unmaps():
        """Pages the shim's mode:vmm pool has unmapped (0 for other configurations)."""
        if shim is None:
            return 0
        from sdalloc import _native  # pylint: disable=import-outside-toplevel
        return int(_native.shim().c.sdalloc_torch_vmm_unmaps(torch.cuda.current_device()))

    def device_calls():
        """cudaMalloc + cudaFree calls of the allocator so far (torch's num_device_alloc /
        num_device_free, which the shim answers too): a steady state should make none."""
        if not cuda:
            return 0
        stats = torch.cuda.memory_stats()
        return int(stats.get("num_device_alloc", 0)) + int(stats.get("num_device_free", 0))

    def divergent_steps():
        if not spec.get("steps"):
            return 0
        return step_shim.step_stats(device=step_device)["divergent_steps"]

    per_shape = []
    divergent_at = []  # (shape index, timed iteration) of each step that left its plan
    with torch.inference_mode():
        for n, shape in enumerate(shapes):
            for _ in range(args.warmup):  # outside any step: plan trials allocate here
                warm = iteration(shape, 2)
                del warm
            sync_and_sample()
            unmaps_before = vmm_unmaps()
            calls_before = device_calls()
            calls_at = []  # device calls so far, after each timed iteration
            times = []
            for i in range(args.iterations):
                diverged_before = divergent_steps()
                start = time.perf_counter()
                with timed_scope():
                    out = iteration(shape, 3)
                    sync_and_sample()
                    times.append(time.perf_counter() - start)
                # Outside the step: the fingerprint allocates, and only in the first step, so
                # inside it would make the recorded step differ from every later one. `out`
                # outlives every step alike (a kept slot of the plan).
                if n == 0 and i == 0:
                    result["output_fingerprint"] = fingerprint(out)
                del out
                if divergent_steps() != diverged_before:
                    divergent_at.append([n, i])
                calls_at.append(device_calls())
            per_shape.append({"shape": list(shape), "iterations": len(times),
                              "median_s": statistics.median(times), "min_s": min(times),
                              "max_s": max(times),
                              # each one waits for its stream; steady state should need none
                              "vmm_unmaps": vmm_unmaps() - unmaps_before,
                              "device_calls": device_calls() - calls_before,
                              # the second half of the timed iterations: a consolidation
                              # in the first ones is the policy at work, any call here
                              # is a pool that has not settled
                              "steady_iterations": len(times) // 2,
                              "steady_device_calls":
                                  calls_at[-1] - calls_at[len(times) - 1 - len(times) // 2]})
    result["divergent_at"] = divergent_at
    result["per_shape"] = per_shape
    result["time_per_iteration_s"] = max(s["median_s"] for s in per_shape)

    if spec.get("steps"):
        figures = step_shim.step_stats(device=step_device)
        result["step_stats"] = {name: figures[name] for name in STEP_FIGURES}
        if figures["divergent_steps"] != 0:
            where = ", ".join(f"{shapes[n][-1]}x{shapes[n][-1]} #{i}" for n, i in divergent_at)
            result["problems"].append(f"{figures['divergent_steps']} divergent steps (want 0; "
                                      f"at {where})")
        if not args.cpu_smoke and figures["planned_allocations"] == 0:
            result["problems"].append("no planned allocations")

    result["peak_reserved_bytes"] = None
    result["peak_allocated_bytes"] = None
    result["device_peak_bytes"] = device_peak[0] if cuda else None
    if cuda:
        stats = torch.cuda.memory_stats()  # the shim's figures after install()
        result["peak_reserved_bytes"] = stats.get("reserved_bytes.all.peak")
        result["peak_allocated_bytes"] = stats.get("allocated_bytes.all.peak")
        if shim is not None:  # the pool mode:auto resolved to (sdalloc_pool_mode)
            result["sdalloc_mode"] = shim.pool(torch.cuda.current_device()).mode
    with open(args.out, "w", encoding="utf-8") as out_file:
        json.dump(result, out_file, indent=1)
    shapes_text = ", ".join(f"{s['shape'][-1]}x{s['shape'][-1]} {s['median_s'] * 1e3:.1f} ms "
                            f"({s['device_calls']} device allocs+frees)" for s in per_shape)
    print(f"gpu_workload: {args.config}: {args.iterations} iterations per shape, median "
          f"{shapes_text}", flush=True)


# --------------------------------------------------------------------------- table

def load_results(paths):
    results = []
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                results.append(json.load(f))
        except (OSError, ValueError) as error:
            name = os.path.splitext(os.path.basename(path))[0]
            results.append({"config": name, "error": f"no result: {error}"})
    return results


def mib(value):
    return "-" if value is None else f"{value / MiB:.1f}"


def step_note(result):
    steps = result.get("step_stats")
    if not steps:
        return ""
    return (f"; steps: {steps['planned_allocations']} planned, {steps['kept_allocations']} "
            f"kept, {steps['fallback_allocations']} fallback allocations; "
            f"{steps['divergent_steps']}/{steps['planned_steps']} planned steps divergent, "
            f"{steps['recorded_steps']} recorded, {steps['replans']} replans, "
            f"{steps['plans']} plans")


# Fixed widths, so rows printed one by one as runs finish line up under the header.
WIDTHS = (16, 12, 12, 12, 10, 10)
HEADER = ("config", "reserved MiB", "alloc'd MiB", "device MiB", "ms shape1", "ms shape2",
          "status")


def status_of(result):
    if result.get("error"):
        return "FAILED: " + result["error"].splitlines()[0]
    if result.get("problems"):
        return "FAILED: " + "; ".join(result["problems"])
    unmaps = sum(s.get("vmm_unmaps", 0) for s in result.get("per_shape", []))
    return "ok" + step_note(result) + (f"; {unmaps} pages unmapped in timed iterations"
                                       if unmaps else "")


def format_row(cells):
    parts = [str(cells[0]).ljust(WIDTHS[0])]
    parts += [str(c).rjust(w) for c, w in zip(cells[1:6], WIDTHS[1:])]
    return "  ".join(parts + [str(cells[6])]).rstrip()


def row_of(result):
    if result.get("error"):
        return format_row((result["config"], "-", "-", "-", "-", "-", status_of(result)))
    times = [f"{s['median_s'] * 1e3:.2f}" for s in result.get("per_shape", [])]
    times += ["-"] * (2 - len(times))
    return format_row((result["config"], mib(result.get("peak_reserved_bytes")),
                       mib(result.get("peak_allocated_bytes")),
                       mib(result.get("device_peak_bytes")), times[0], times[1],
                       status_of(result)))


def format_table(results):
    lines = [format_row(HEADER), "  ".join("-" * w for w in WIDTHS + (6,))]
    return "\n".join(lines + [row_of(r) for r in results])


def outputs_match(mine, reference):
    a, b = mine.get("output_fingerprint"), reference.get("output_fingerprint")
    if a is None or b is None:
        return None
    return all(abs(a[k] - b[k]) <= OUTPUT_TOLERANCE * max(1.0, abs(b[k]))
               for k in ("sum", "abs_sum"))


def verdicts(results):
    """The bars, per sdalloc configuration, and the outputs against native's: (ok, line)."""
    by_name = {r["config"]: r for r in results if not r.get("error")}
    native, expandable = by_name.get("native"), by_name.get("expandable")
    lines = []
    for name, r in by_name.items():
        if native is not None and name != "native":
            same = outputs_match(r, native)
            if same is not None:
                lines.append((same, f"{name}: output equals native's (fingerprint within "
                                    f"{OUTPUT_TOLERANCE:g})"))
        if not name.startswith("sdalloc") or r.get("peak_reserved_bytes") is None:
            continue
        mine = r["peak_reserved_bytes"]
        if native and native.get("peak_reserved_bytes") is not None:
            lines.append((mine < native["peak_reserved_bytes"],
                          f"{name}: peak reserved {mib(mine)} MiB < native "
                          f"{mib(native['peak_reserved_bytes'])} MiB"))
        if expandable and expandable.get("peak_reserved_bytes") is not None:
            lines.append((mine <= expandable["peak_reserved_bytes"],
                          f"{name}: peak reserved {mib(mine)} MiB <= expandable "
                          f"{mib(expandable['peak_reserved_bytes'])} MiB"))
        for shape in r.get("per_shape", []):
            if shape.get("steady_iterations"):
                size = shape["shape"][-1]
                calls = shape["steady_device_calls"]
                lines.append((calls == 0, f"{name}: {calls} cudaMalloc+cudaFree in the last "
                                          f"{shape['steady_iterations']} of "
                                          f"{shape['iterations']} steps at {size}x{size} "
                                          "(bar: 0, a settled pool)"))
        if expandable and expandable.get("peak_reserved_bytes") is not None:
            for mine_shape, theirs in zip(r.get("per_shape", []),
                                          expandable.get("per_shape", [])):
                ratio = mine_shape["median_s"] / theirs["median_s"]
                size = mine_shape["shape"][-1]
                bar = DEFAULT_TIME_BAR if name == "sdalloc-vmm" else TIME_BAR
                lines.append((ratio <= bar, f"{name}: time at {size}x{size} {ratio:.3f} x "
                                            f"expandable's (bar: <= {bar:g})"))
    return lines


def load_stages(path):
    stages = []
    if path and os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if len(parts) == 4:
                    stages.append({"stage": parts[0], "status": parts[1],
                                   "seconds": float(parts[2]), "detail": parts[3]})
    return stages


def table(args):
    results = load_results(args.files)
    print(format_table(results))
    checks = verdicts(results)
    for ok, line in checks:
        print(f"{'PASS' if ok else 'MISS'}  {line}")
    contract = []
    for path in args.contract or []:
        try:
            with open(path, encoding="utf-8") as f:
                contract += json.load(f)["checks"]
        except (OSError, ValueError, KeyError) as error:
            contract.append({"check": os.path.basename(path), "status": "FAILED",
                             "detail": f"no result: {error}"})
    for c in contract:
        print(f"contract {c['check']:<14} {c['status']:<6} {c['detail']}")
    import gpu_offload  # pylint: disable=import-outside-toplevel,import-error
    offloaded = gpu_offload.load_offload(args.offload)
    if offloaded is not None:
        print(gpu_offload.format_offload(offloaded))
        bar = gpu_offload.offload_bar(offloaded) if not offloaded.get("cpu_smoke") else None
        if bar is not None:
            checks.append(bar)
    import gpu_pipeline_table  # pylint: disable=import-outside-toplevel,import-error
    pipeline = load_results(args.pipeline) if args.pipeline else []
    if pipeline:
        print()
        print("pipeline: text encoder, UNet denoising loop, VAE decode; the server's mixed "
              "sizes under the cap")
        print(gpu_pipeline_table.format_table(pipeline))
        pipeline_checks = gpu_pipeline_table.verdicts(pipeline)
        for ok, line in pipeline_checks:
            print(f"{'PASS' if ok else 'MISS'}  {line}")
        checks += pipeline_checks
    stages = load_stages(args.stages)
    for s in stages:
        print(f"stage {s['stage']:<26} {s['status']:<7} {s['seconds']:6.1f} s  {s['detail']}")
    failed = [r["config"] for r in results if r.get("error") or r.get("problems")]
    failed += ["pipeline:" + name for name in gpu_pipeline_table.problems(pipeline)]
    failed_stages = [s["stage"] for s in stages if s["status"] == "FAILED"]
    outputs_differ = [line for ok, line in checks if not ok and "output equals" in line]
    bars_missed = [line for ok, line in checks if not ok and "output equals" not in line]
    failed_checks = [c["check"] for c in contract if c["status"] == "FAILED"]
    offload_failed = gpu_offload.offload_problems(offloaded)
    verdict = not (failed or failed_stages or failed_checks or outputs_differ or
                   offload_failed or (args.strict and bars_missed))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump({"verdict": "PASS" if verdict else "FAIL", "stages": stages,
                       "contract": contract,
                       "results": results, "offload": offloaded, "pipeline": pipeline,
                       "bars": [{"ok": ok, "check": line} for ok, line in checks]},
                      out, indent=1)
    if failed:
        print(f"gpu_workload: FAILED runs: {', '.join(failed)}", file=sys.stderr)
    if failed_stages:
        print(f"gpu_workload: FAILED stages: {', '.join(failed_stages)}", file=sys.stderr)
    if failed_checks:
        print(f"gpu_workload: FAILED contract checks: {', '.join(failed_checks)}",
              file=sys.stderr)
    if outputs_differ:
        print("gpu_workload: outputs differ from native's", file=sys.stderr)
    if offload_failed:
        print(f"gpu_workload: FAILED offload: {'; '.join(offload_failed)}", file=sys.stderr)
    print(f"gpu-check: VERDICT: {'PASS' if verdict else 'FAIL'} ({len(bars_missed)} bars "
          "missed)")
    return 0 if verdict else 1


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run the workload under one configuration")
    r.add_argument("--config", required=True, choices=sorted(CONFIGS))
    r.add_argument("--out", required=True)
    r.add_argument("--iterations", type=int, default=20, help="timed iterations per shape")
    r.add_argument("--warmup", type=int, default=2, help="warm-up iterations per shape")
    r.add_argument("--cpu-smoke", action="store_true")
    o = sub.add_parser("offload", help="step times with weights offloaded at 50 %% / 25 %%")
    o.add_argument("--out", required=True)
    o.add_argument("--iterations", type=int, default=5, help="timed steps per setting")
    o.add_argument("--warmup", type=int, default=3, help="warm-up steps per setting (at least)")
    o.add_argument("--cpu-smoke", action="store_true")
    w = sub.add_parser("row", help="print one result file as a table row")
    w.add_argument("file", nargs="?")
    w.add_argument("--header", action="store_true")
    t = sub.add_parser("table", help="print the table of result files")
    t.add_argument("files", nargs="*")
    t.add_argument("--json")
    t.add_argument("--stages")
    t.add_argument("--contract", action="append", help="a gpu_contract.py result (repeatable)")
    t.add_argument("--offload", help="the offload command's result")
    t.add_argument("--pipeline", action="append",
                   help="a scripts/gpu_pipeline.py result (repeatable)")
    t.add_argument("--strict", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "run":
        if args.iterations < 1 or args.warmup < 0:
            parser.error("--iterations must be >= 1, --warmup >= 0")
        try:
            run(args)
        except BaseException as error:  # pylint: disable=broad-except
            with open(args.out, "w", encoding="utf-8") as out:
                json.dump({"config": args.config, "error": f"{type(error).__name__}: {error}"},
                          out)
            raise
        return 0
    if args.command == "offload":
        if args.iterations < 1 or args.warmup < 2:
            parser.error("--iterations must be >= 1, --warmup >= 2 (the first step is "
                         "recorded, the second is the first planned one)")
        import gpu_offload  # pylint: disable=import-outside-toplevel,import-error
        try:
            gpu_offload.offload(args)
        except BaseException as error:  # pylint: disable=broad-except
            with open(args.out, "w", encoding="utf-8") as out:
                json.dump({"error": f"{type(error).__name__}: {error}"}, out)
            raise
        return 0
    if args.command == "row":
        if args.header:
            print(format_table([]))
        if args.file:
            print(row_of(load_results([args.file])[0]))
        return 0
    return table(args)


if __name__ == "__main__":
    sys.exit(main())
