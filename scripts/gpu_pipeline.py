#!/usr/bin/env python3
"""scripts/gpu_pipeline.py - a whole text-to-image pipeline and a mixed-size "server"
sequence under one allocator, under a VRAM cap (scripts/gpu-check.sh, stages pipeline:CONFIG).

  gpu_pipeline.py run --config NAME --out FILE.json [--cap-gib G] [--time-limit S]
                      [--cpu-smoke]
  gpu_pipeline.py row [FILE.json] [--header]     one table row (scripts/gpu_pipeline_table.py)

One fresh process per allocator configuration (gpu_workload.py's CONFIGS: its PyTorch
settings go into the environment before torch is imported, sdalloc's through
sdalloc.torch.install() before CUDA starts). Before any allocation the process caps its
allocator at G GiB (default 8) with torch.cuda.set_per_process_memory_fraction(G GiB / the
device's memory): a card of that size, whatever the machine. Then, on
workloads/sd_pipeline.py's SD 1.5 pipeline (CLIP text encoder, UNet, VAE decoder; random
weights, fp16, guidance scale 7.5 on batch 2, DDIM):
  1. warm-up: one call at the first size (lazy CUDA, cuBLAS and cuDNN set-up land here);
  2. the server sequence: a call at each of SIZES (512, 768, 640, 1024, 512 px), STEPS
     denoising steps each; a call that raises out of memory is counted and the server goes
     on. Per call: its time (torch.cuda.synchronize() on both sides), the allocator calls it
     made, and per UNet step a sample of cudaMemGetInfo (and sdalloc-planned's calls in the
     step: reading them costs each step time the others need not pay). The peaks (the
     allocator's own reserved and allocated, the device's used memory above what was used
     before the models) are read after this phase, before the probes push every allocator
     to the cap;
  3. the largest image: bisection over the latent side (steps of 8 px of image) between the
     largest size that completed and the smallest that failed (else PROBE_HIGH_PX, not
     probed), PROBE_STEPS steps per probe, at most MAX_PROBES probes, and none started when
     --time-limit would be passed (then the answer is a bracket, marked so).
Every completed call's image and latents are fingerprinted (sha256, sums and 4x4 average
pools), so the table compares each allocator's outputs with native's. A run has problems (a
FAILED row) when its allocator setting is not in effect, a warm-up or sequence call fails
for another reason than memory, its peak reserved once the probes reached the cap is above
the cap (the fraction was not in effect; cudaMallocAsync's cap counts bytes in use, not its
pool, so not there), or sdalloc-planned planned nothing; a probe that fails for another
reason than memory counts as too large and is noted.

"Allocator calls" (device_calls) are what torch.cuda.memory_stats() counts as
num_device_alloc + num_device_free: cudaMalloc and cudaFree for native and sdalloc-pool;
for expandable the cuMemMap/cuMemUnmap of ranges (each maps several 2 MiB pages); for
sdalloc-vmm cuMemCreate and cuMemRelease of 2 MiB pages plus the pages it unmapped
(sdalloc_torch_vmm_unmaps); for sdalloc-planned the recording's and the fallback pool's
segments and the arenas' reservations. cudaMallocAsync keeps its own pool inside the
driver: nothing to count (null). With sdalloc-planned every UNet step is an
sdalloc.torch.step(); its steps after the first of each latent size should make no call.

--cpu-smoke: the small pipeline on the CPU in fp32 (sd_pipeline.SMALL, CPU_SIZES, one
thread), no allocator swap and no cap (memory figures and calls null); sdalloc-planned steps
a backend:host planned pool of the shim that torch's CPU tensors never reach. Every probe
completes there, so the search climbs to its upper bound: the code path, not a figure.
"""

import argparse
import contextlib
import hashlib
import json
import os
import statistics
import sys
import time

import gpu_workload  # pylint: disable=import-error

ROOT = gpu_workload.ROOT
CONFIGS = ("native", "expandable", "async", "sdalloc-vmm", "sdalloc-pool", "sdalloc-planned")
GiB = 1 << 30
SIZES = (512, 768, 640, 1024, 512)  # image sides in px
STEPS = 10
PROBE_STEPS = 2  # the recording step and one planned step for sdalloc-planned
PROBE_HIGH_PX = 2560  # exclusive upper bound of the search: assumed not to fit the cap
MAX_PROBES = 8  # enough to converge on the (<= 256 latent px wide) bracket
CPU_SIZES = (64, 96, 80, 128, 64)
CPU_STEPS = 2
CPU_PROBE_STEPS = 1
CPU_PROBE_HIGH_PX = 160
CPU_MAX_PROBES = 3
POOL = 4  # side of the average pools kept as fingerprints
LATENT_PX = 8  # image px per latent px
CAP_SLACK = 2 << 20  # one page: a cap is a fraction of the device, rounded by the allocator


def largest_that_fits(fits, lo, hi, max_probes):
    """Bisection over integer sizes. lo is known to complete (0: nothing is), hi is known to
    fail or is the search's bound (never probed); fits(size) answers True, False, or None
    when no probe may start (time). Answers (lo, hi, probes): lo the largest size known to
    complete, hi the smallest known to fail (or the bound), probes [[size, ok], ...]."""
    if lo >= hi:
        raise ValueError(f"empty bracket [{lo}, {hi})")
    probes = []
    while hi - lo > 1 and len(probes) < max_probes:
        mid = (lo + hi) // 2
        ok = fits(mid)
        if ok is None:
            break
        probes.append([mid, bool(ok)])
        if ok:
            lo = mid
        else:
            hi = mid
    return lo, hi, probes


def bracket_from_calls(calls, bound):
    """The search's starting bracket in latent px: the largest completed size and the
    smallest failed size above it (else `bound`), from calls [{"size", "ok"}, ...]."""
    done = [c["size"] // LATENT_PX for c in calls if c["ok"]]
    lo = max(done, default=0)
    failed = [c["size"] // LATENT_PX for c in calls if not c["ok"] and c["size"] // LATENT_PX > lo]
    return lo, min(failed, default=bound)


def is_oom(torch, error):
    """An out-of-memory error of any allocator: torch's OutOfMemoryError, or a RuntimeError
    saying so (sdalloc's "CUDA out of memory (sdalloc): ...", older torch's own)."""
    oom_type = getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom_type is not None and isinstance(error, oom_type)) or \
        "out of memory" in str(error).lower()


def fingerprint(torch, tensor):
    flat = tensor.detach().float()
    pooled = torch.nn.functional.adaptive_avg_pool2d(flat, POOL)
    return {"sha256": hashlib.sha256(tensor.detach().contiguous().cpu().numpy().tobytes())
                      .hexdigest(),
            "sum": float(flat.sum()), "abs_sum": float(flat.abs().sum()),
            "pooled": [round(float(v), 6) for v in pooled.flatten()]}


class Meter:
    """What the run reads from the allocator and the device: calls, memory samples."""

    def __init__(self, torch, config, cuda):
        self.torch, self.cuda = torch, cuda
        self.counted = cuda and config != "async"
        self.vmm = cuda and config == "sdalloc-vmm"
        self.used_before = 0
        self.device_peak = 0
        if cuda:
            free, total = torch.cuda.mem_get_info()
            self.total, self.used_before = total, total - free

    def calls(self):
        """Allocator calls so far (see the module doc), or None where nothing is counted."""
        if not self.counted:
            return None
        stats = self.torch.cuda.memory_stats()
        count = int(stats.get("num_device_alloc", 0)) + int(stats.get("num_device_free", 0))
        if self.vmm:
            from sdalloc import _native  # pylint: disable=import-outside-toplevel
            count += int(_native.shim().c.sdalloc_torch_vmm_unmaps(
                self.torch.cuda.current_device()))
        return count

    def sample(self):
        if self.cuda:
            free, total = self.torch.cuda.mem_get_info()
            self.device_peak = max(self.device_peak, total - free - self.used_before)

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()


def diff(after, before):
    return None if after is None or before is None else after - before


class StepWatch:
    """step_scope for sd_pipeline.Pipeline: each UNet step inside `step` (sdalloc.torch.step
    for sdalloc-planned), the device sampled after it. Only with a `step` are its allocator
    calls counted (None otherwise): reading the allocator's figures twice a step costs time
    that the other configurations' calls need not pay."""

    def __init__(self, meter, step=None):
        self.meter, self.step, self.calls = meter, step, []

    @contextlib.contextmanager
    def __call__(self, index):  # pylint: disable=unused-argument
        if self.step is None:
            yield
            self.calls.append(None)
        else:
            before = self.meter.calls()
            with self.step():
                yield
            self.calls.append(diff(self.meter.calls(), before))
        self.meter.sample()


def one_call(torch, pipe, meter, watch, size, steps, seed, role, seen):
    """Runs one pipeline call; answers its record. A RuntimeError (torch's OutOfMemoryError
    is one) makes a record with ok False, oom saying whether it was out of memory, and the
    error's first line: one failed call must not lose the run's other figures."""
    record = {"role": role, "size": size, "steps": steps, "first_of_size": size not in seen,
              "ok": False, "oom": False}
    seen.add(size)
    watch.calls = []
    meter.sync()
    before = meter.calls()
    start = time.perf_counter()
    try:
        image, latents = pipe(size, steps, seed=seed)
        meter.sync()
        record["seconds"] = time.perf_counter() - start
        record["ok"] = True
        record["image"] = fingerprint(torch, image)
        record["latents"] = fingerprint(torch, latents)
        del image, latents
    except (RuntimeError, MemoryError) as error:  # torch's OutOfMemoryError is a RuntimeError
        record["oom"] = is_oom(torch, error)
        record["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
    meter.sync()
    meter.sample()
    record["device_calls"] = diff(meter.calls(), before)
    record["step_calls"] = list(watch.calls)
    return record


def summarise(result):
    """The figures the table shows, from the calls (see gpu_pipeline_table.py)."""
    sequence = [c for c in result["calls"] if c["role"] == "sequence"]
    result["sequence_ooms"] = sum(1 for c in sequence if c["oom"])
    done = [c for c in sequence if c["ok"]]
    result["sequence_seconds"] = sum(c["seconds"] for c in done)
    first = SIZES[0] if not result["cpu_smoke"] else CPU_SIZES[0]
    repeat = [c["seconds"] for c in done if c["size"] == first and not c["first_of_size"]]
    result["call_seconds"] = statistics.median(repeat) if repeat else None
    later = [c["device_calls"] for c in result["calls"] if c["role"] != "probe" and
             not c["first_of_size"] and c["device_calls"] is not None]
    result["calls_per_repeat_call"] = statistics.mean(later) if later else None
    # Steps after the first step of each latent size (sdalloc-planned's bar: none).
    stepped, after_first = set(), 0
    counted = True
    for c in result["calls"]:
        for i, calls in enumerate(c["step_calls"]):
            if calls is None:
                counted = False
            elif i > 0 or c["size"] in stepped:
                after_first += calls
        if c["step_calls"]:
            stepped.add(c["size"])
    result["step_calls_after_first"] = after_first if counted else None


def run(args):
    spec = gpu_workload.CONFIGS[args.config]
    gpu_workload.set_torch_conf(None if args.cpu_smoke else spec["torch_conf"])
    started = time.perf_counter()
    import torch  # pylint: disable=import-outside-toplevel
    sys.path.insert(0, os.path.join(ROOT, "workloads"))
    import sd_pipeline  # pylint: disable=import-outside-toplevel,import-error

    result = {"config": args.config, "torch": torch.__version__, "cpu_smoke": args.cpu_smoke,
              "allocator_conf": spec["torch_conf"], "sdalloc": spec["sdalloc"], "problems": [],
              "calls": []}
    shim = None
    if spec["sdalloc"] is not None and not args.cpu_smoke:
        import sdalloc.torch as shim  # pylint: disable=import-outside-toplevel
        shim.install(**spec["sdalloc"])
        result["sdalloc_conf"] = shim.config_text()
    step = None
    if spec.get("steps"):
        import sdalloc.torch as step_shim  # pylint: disable=import-outside-toplevel
        step_device = None
        if args.cpu_smoke:
            step_shim.configure(backend="host", **spec["sdalloc"])
            step_device = 0
            result["sdalloc_conf"] = step_shim.config_text()

        def step():
            return step_shim.step(device=step_device)

    if args.cpu_smoke:
        torch.set_num_threads(1)
        device, dtype, small = "cpu", torch.float32, True
        sizes, steps, probe_steps = CPU_SIZES, CPU_STEPS, CPU_PROBE_STEPS
        high, max_probes = CPU_PROBE_HIGH_PX, CPU_MAX_PROBES
    else:
        if not torch.cuda.is_available():
            raise SystemExit("gpu_pipeline: torch.cuda.is_available() is False")
        device, dtype, small = "cuda", torch.float16, False
        sizes, steps, probe_steps, high, max_probes = SIZES, STEPS, PROBE_STEPS, \
            PROBE_HIGH_PX, MAX_PROBES
        torch.cuda.init()
    cuda = device == "cuda"
    meter = Meter(torch, args.config, cuda)
    if cuda:
        result["device_total_bytes"] = meter.total
        result["cap_bytes"] = int(args.cap_gib * GiB)
        result["memory_fraction"] = result["cap_bytes"] / meter.total
        if result["memory_fraction"] > 1.0:
            raise SystemExit(f"gpu_pipeline: a cap of {args.cap_gib} GiB is more than the "
                             f"device's {meter.total / GiB:.1f} GiB")
        torch.cuda.set_per_process_memory_fraction(result["memory_fraction"])
    watch = StepWatch(meter, step)
    pipe = sd_pipeline.make_pipeline(small, device, dtype, step_scope=watch)
    result["parameters"] = pipe.parameters()
    result["fused_attention"] = pipe.fused
    result.update({"sizes": list(sizes), "steps": steps, "probe_steps": probe_steps})
    if cuda:
        found, problems = gpu_workload.allocator_in_effect(torch, spec)
        result.update(found)
        result["problems"] += problems
        if shim is not None and found["allocator_backend"] == "native":
            result["problems"].append("sdalloc installed, but torch reports the native "
                                      "allocator")

    seen = set()
    calls = result["calls"]
    calls.append(one_call(torch, pipe, meter, watch, sizes[0], steps, 0, "warm-up", seen))
    for n, size in enumerate(sizes):
        calls.append(one_call(torch, pipe, meter, watch, size, steps, n + 1, "sequence", seen))
        print(f"gpu_pipeline: {args.config}: {size}x{size} "
              f"{'ok' if calls[-1]['ok'] else 'OUT OF MEMORY'} "
              f"{calls[-1].get('seconds', 0.0):.2f} s, {calls[-1]['device_calls']} calls",
              flush=True)
    result["device_peak_bytes"] = meter.device_peak if cuda else None
    result["peak_reserved_bytes"] = result["peak_allocated_bytes"] = None
    if cuda:
        stats = torch.cuda.memory_stats()
        result["peak_reserved_bytes"] = stats.get("reserved_bytes.all.peak")
        result["peak_allocated_bytes"] = stats.get("allocated_bytes.all.peak")
        result["alloc_retries"] = stats.get("num_alloc_retries")
        if shim is not None:  # the pool mode:auto resolved to (sdalloc_pool_mode)
            result["sdalloc_mode"] = shim.pool(torch.cuda.current_device()).mode

    last = [0.0]

    def fits(latent):
        left = args.time_limit - (time.perf_counter() - started)
        if left < max(3.0, 2 * last[0]):
            return None
        start = time.perf_counter()
        calls.append(one_call(torch, pipe, meter, watch, latent * LATENT_PX, probe_steps,
                              100 + latent, "probe", seen))
        last[0] = time.perf_counter() - start
        return calls[-1]["ok"]

    lo, hi = bracket_from_calls(calls, high // LATENT_PX)
    lo, hi, probes = largest_that_fits(fits, lo, hi, max_probes) if hi - lo > 1 else \
        (lo, hi, [])
    result["largest"] = {"px": lo * LATENT_PX, "failed_px": hi * LATENT_PX,
                         "converged": hi - lo == 1, "at_bound": hi == high // LATENT_PX,
                         "probes": [[s * LATENT_PX, ok] for s, ok in probes]}
    # A call that failed but not for memory is a fault of the run; a probe's is only noted
    # (a kernel may refuse a size whatever the allocator).
    result["notes"] = []
    for c in calls:
        if not c["ok"] and not c["oom"]:
            line = f"the {c['role']} call at {c['size']} px failed: {c['error']}"
            (result["notes"] if c["role"] == "probe" else result["problems"]).append(line)
    summarise(result)
    if cuda:
        # The probes took every allocator to its cap: above it (but for cudaMallocAsync,
        # whose cap counts the bytes in use, not its pool's) the cap was not in effect.
        peak = torch.cuda.memory_stats().get("reserved_bytes.all.peak")
        result["peak_reserved_with_probes_bytes"] = peak
        if args.config != "async" and peak is not None and \
                peak > result["cap_bytes"] + CAP_SLACK:
            result["problems"].append(f"peak reserved {peak} B > the cap {result['cap_bytes']} "
                                      "B: set_per_process_memory_fraction is not in effect")
    if spec.get("steps"):
        figures = step_shim.step_stats(device=step_device)
        result["step_stats"] = {k: figures[k] for k in gpu_workload.STEP_FIGURES}
        if cuda and figures["planned_allocations"] == 0:
            result["problems"].append("no planned allocations")
    result["seconds"] = time.perf_counter() - started
    with open(args.out, "w", encoding="utf-8") as out_file:
        json.dump(result, out_file, indent=1)
    print(f"gpu_pipeline: {args.config}: {result['sequence_ooms']} OOMs in the sequence, "
          f"largest image {result['largest']['px']} px "
          f"({'exact' if result['largest']['converged'] else 'bracket'}), "
          f"{result['seconds']:.1f} s", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run the pipeline and the server under one configuration")
    r.add_argument("--config", required=True, choices=CONFIGS)
    r.add_argument("--out", required=True)
    r.add_argument("--cap-gib", type=float, default=8.0, help="the VRAM cap (default 8)")
    r.add_argument("--time-limit", type=float, default=60.0,
                   help="no probe starts past this many seconds of the run (default 60)")
    r.add_argument("--cpu-smoke", action="store_true")
    w = sub.add_parser("row", help="print one result file as a table row")
    w.add_argument("file", nargs="?")
    w.add_argument("--header", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "row":
        import gpu_pipeline_table as table  # pylint: disable=import-outside-toplevel,import-error
        if args.header:
            print(table.format_table([]))
        if args.file:
            print(table.row_of(gpu_workload.load_results([args.file])[0]))
        return 0
    if not args.cap_gib > 0 or not args.time_limit > 0:
        parser.error("--cap-gib and --time-limit must be positive")
    try:
        run(args)
    except BaseException as error:  # pylint: disable=broad-except
        with open(args.out, "w", encoding="utf-8") as out:
            json.dump({"config": args.config, "error": f"{type(error).__name__}: {error}"}, out)
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
