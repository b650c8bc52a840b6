"""scripts/gpu_pipeline_table.py - the pipeline stage's table and bars (scripts/gpu-check.sh):
rows printed as each pipeline:CONFIG run finishes (gpu_pipeline.py row), and the table, the
bars and the outputs against native's at the end (gpu_workload.py table --pipeline FILE...).

Columns: peak reserved and peak allocated (the allocator's own figures) and the device's
used memory (cudaMemGetInfo, above what was used before the models) over the warm-up and
the server sequence; the median time of a call at the first size once warm ("s/call"); the
sequence's time (its completed calls); its out-of-memory count under the cap; the largest
image that completed (px; "~" marks a bracket the search could not close in time, "+" the
search's upper bound); the mean allocator calls of a call after the first call of its size
(gpu_pipeline.py's doc says what each configuration's calls are; "-" where nothing is
counted).

Bars (PASS/MISS lines; a MISS fails the verdict only under --strict, except outputs):
  sdalloc-vmm (sdalloc's default): peak reserved <= expandable's; time per call and the
    sequence's time <= DEFAULT_TIME_BAR x expandable's; largest image >= expandable's and
    > native's; sequence OOMs <= every other configuration's;
  sdalloc-planned: no allocator call in a UNet step after the first step of each latent
    size; peak reserved <= PLANNED_RESERVE_BAR x peak allocated;
  every configuration: each call that completed both here and under native gives the same
    image and latents (4x4 average pools within OUTPUT_RTOL / OUTPUT_ATOL: fp16 kernels may
    differ in the last bits).
"""

import math

DEFAULT = "sdalloc-vmm"
DEFAULT_TIME_BAR = 1.02
PLANNED_RESERVE_BAR = 1.02
OUTPUT_RTOL = 1e-2
OUTPUT_ATOL = 1e-2
MiB = 1 << 20

WIDTHS = (16, 12, 12, 12, 8, 8, 5, 10, 10)
HEADER = ("config", "reserved MiB", "alloc'd MiB", "device MiB", "s/call", "seq s", "OOMs",
          "largest px", "calls/call", "status")


def mib(value):
    return "-" if value is None else f"{value / MiB:.1f}"


def number(value, digits):
    return "-" if value is None else f"{value:.{digits}f}"


def largest_text(result):
    largest = result.get("largest")
    if not largest:
        return "-"
    mark = "+" if largest.get("at_bound") and largest.get("converged") else \
        ("" if largest.get("converged") else "~")
    return f"{largest['px']}{mark}"


def status_of(result):
    if result.get("error"):
        return "FAILED: " + result["error"].splitlines()[0]
    if result.get("problems"):
        return "FAILED: " + "; ".join(result["problems"])
    notes = []
    after = result.get("step_calls_after_first")
    if result.get("step_stats") is not None:
        steps = result["step_stats"]
        notes.append(f"steps: {steps['recorded_steps']} recorded, {steps['planned_steps']} "
                     f"planned, {steps['divergent_steps']} divergent, {steps['plans']} plans")
    if after is not None:
        notes.append(f"{after} calls in steps after each size's first")
    if result.get("alloc_retries"):
        notes.append(f"{result['alloc_retries']} cache flushes")
    if result.get("notes"):
        notes.append(f"{len(result['notes'])} probes failed, not for memory (the JSON says "
                     "why)")
    return "; ".join(["ok"] + notes)


def format_row(cells):
    parts = [str(cells[0]).ljust(WIDTHS[0])]
    parts += [str(c).rjust(w) for c, w in zip(cells[1:9], WIDTHS[1:])]
    return "  ".join(parts + [str(cells[9])]).rstrip()


def row_of(result):
    if result.get("error"):
        return format_row((result["config"],) + ("-",) * 8 + (status_of(result),))
    return format_row((result["config"], mib(result.get("peak_reserved_bytes")),
                       mib(result.get("peak_allocated_bytes")),
                       mib(result.get("device_peak_bytes")),
                       number(result.get("call_seconds"), 3),
                       number(result.get("sequence_seconds"), 2),
                       result.get("sequence_ooms", "-"), largest_text(result),
                       number(result.get("calls_per_repeat_call"), 1), status_of(result)))


def format_table(results):
    lines = [format_row(HEADER), "  ".join("-" * w for w in WIDTHS + (6,))]
    return "\n".join(lines + [row_of(r) for r in results])


def close(mine, reference):
    return len(mine) == len(reference) and all(
        math.isfinite(a) and abs(a - b) <= OUTPUT_ATOL + OUTPUT_RTOL * abs(b)
        for a, b in zip(mine, reference))


def output_check(name, result, native):
    """(ok, line) comparing every call both runs completed (warm-up and sequence: the probes
    differ between allocators), or None when none did."""
    pairs = [(a, b) for a, b in zip(result.get("calls", []), native.get("calls", []))
             if a["role"] != "probe" and a["role"] == b["role"] and a["size"] == b["size"]
             and a["ok"] and b["ok"]]
    if not pairs:
        return None
    differ = [f"{a['size']} px" for a, b in pairs
              if not (close(a["image"]["pooled"], b["image"]["pooled"]) and
                      close(a["latents"]["pooled"], b["latents"]["pooled"]))]
    identical = sum(1 for a, b in pairs if a["image"]["sha256"] == b["image"]["sha256"])
    text = (f"{name}: pipeline output equals native's in {len(pairs) - len(differ)} of "
            f"{len(pairs)} calls ({identical} bit-identical; 4x4 pools within rtol "
            f"{OUTPUT_RTOL:g}, atol {OUTPUT_ATOL:g})")
    if differ:
        text += "; differs at " + ", ".join(differ)
    return not differ, text


def ratio_line(name, what, mine, theirs, bar):
    ratio = mine / theirs
    return ratio <= bar, f"{name}: pipeline {what} {ratio:.3f} x expandable's (bar: <= {bar:g})"


def default_checks(mine, by_name):
    lines = []
    expandable, native = by_name.get("expandable"), by_name.get("native")
    reserved = mine.get("peak_reserved_bytes")
    if expandable is not None:
        theirs = expandable.get("peak_reserved_bytes")
        if reserved is not None and theirs is not None:
            lines.append((reserved <= theirs, f"{DEFAULT}: pipeline peak reserved "
                                              f"{mib(reserved)} MiB <= expandable "
                                              f"{mib(theirs)} MiB"))
        if mine.get("call_seconds") and expandable.get("call_seconds"):
            lines.append(ratio_line(DEFAULT, "time per call", mine["call_seconds"],
                                    expandable["call_seconds"], DEFAULT_TIME_BAR))
        same_calls = [c["ok"] for c in mine["calls"] if c["role"] == "sequence"] == \
            [c["ok"] for c in expandable["calls"] if c["role"] == "sequence"]
        if same_calls and mine.get("sequence_seconds") and expandable.get("sequence_seconds"):
            lines.append(ratio_line(DEFAULT, "sequence time", mine["sequence_seconds"],
                                    expandable["sequence_seconds"], DEFAULT_TIME_BAR))
    for other, compare, word in ((expandable, lambda a, b: a >= b, ">="),
                                 (native, lambda a, b: a > b, ">")):
        if other is None or not other.get("largest") or not mine.get("largest"):
            continue
        a, b = mine["largest"], other["largest"]
        exact = "" if a["converged"] and b["converged"] else " (a bracket: the search ran " \
                                                               "out of time)"
        lines.append((compare(a["px"], b["px"]),
                      f"{DEFAULT}: largest image under the cap {a['px']} px {word} "
                      f"{other['config']}'s {b['px']} px{exact}"))
    others = [r["sequence_ooms"] for n, r in by_name.items()
              if n != DEFAULT and r.get("sequence_ooms") is not None]
    if others and mine.get("sequence_ooms") is not None:
        lines.append((mine["sequence_ooms"] <= min(others),
                      f"{DEFAULT}: {mine['sequence_ooms']} OOMs in the mixed sequence under "
                      f"the cap, fewest of all ({min(others)} elsewhere at best)"))
    return lines


def planned_checks(mine):
    lines = []
    after = mine.get("step_calls_after_first")
    if after is not None:
        lines.append((after == 0, f"sdalloc-planned: {after} allocator calls in the UNet steps "
                                  "after each size's first step (bar: 0)"))
    reserved, allocated = mine.get("peak_reserved_bytes"), mine.get("peak_allocated_bytes")
    if reserved is not None and allocated:
        lines.append((reserved <= PLANNED_RESERVE_BAR * allocated,
                      f"sdalloc-planned: pipeline peak reserved {reserved / allocated:.3f} x "
                      f"peak allocated (bar: <= {PLANNED_RESERVE_BAR:g})"))
    return lines


def verdicts(results):
    """The pipeline's bars and output checks: [(ok, line)] (see the module doc). Bars need
    the GPU's figures: --cpu-smoke results get the output checks only."""
    by_name = {r["config"]: r for r in results if not r.get("error") and not r.get("problems")}
    native = by_name.get("native")
    lines = []
    for name, r in by_name.items():
        if native is not None and name != "native":
            check = output_check(name, r, native)
            if check is not None:
                lines.append(check)
        if r.get("cpu_smoke"):
            continue
        if name == DEFAULT:
            lines += default_checks(r, by_name)
        if name == "sdalloc-planned":
            lines += planned_checks(r)
    return lines


def problems(results):
    """Configurations whose pipeline run failed or has problems."""
    return [r["config"] for r in results if r.get("error") or r.get("problems")]
