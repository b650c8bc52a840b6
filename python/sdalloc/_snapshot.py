"""sdalloc's pools in the layout of PyTorch's memory snapshot.

torch.cuda.memory._snapshot() returns, and torch.cuda.memory._dump_snapshot() pickles:
    {"segments": [segment, ...],
     "device_traces": [[trace entry, ...] per device],
     "allocator_settings": {...}}
    segment = {"device", "address", "total_size", "stream", "segment_type" ("small" or
               "large"), "segment_pool_id", "is_expandable", "allocated_size", "active_size",
               "requested_size", "frames", "blocks": [block, ...]}
    block   = {"address", "size", "requested_size", "state", "frames"}, state one of
              "active_allocated", "active_pending_free", "inactive"
Blocks tile their segment in address order. pytorch.org/memory_viz and
torch.cuda._memory_viz read this layout (PyTorch 1.13's _memory_viz functions take the
"segments" list itself). sdalloc keeps no per-allocation stack traces, so "frames" are
empty and "device_traces" hold no entries; the segments and blocks are exact.
"""

STATE_NAMES = {0: "inactive", 1: "active_allocated", 2: "active_pending_free"}
SMALL_SEGMENT = 2 << 20  # PyTorch's small-pool segment size


def segments_of(pool, device):
    """The snapshot segments of one pool (a Pool object) for device index `device`."""
    segments = []
    for seg in pool.layout():
        blocks = [{"address": b["address"], "size": b["size"],
                   "requested_size": b["requested"],
                   "state": STATE_NAMES[b["state"]], "frames": []}
                  for b in seg["blocks"]]
        allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
        active = sum(b["size"] for b in blocks if b["state"] != "inactive")
        requested = sum(b["requested_size"] for b in blocks)
        segments.append({
            "device": device, "address": seg["address"], "total_size": seg["size"],
            "stream": seg["stream"],
            "segment_type": "small" if seg["size"] <= SMALL_SEGMENT else "large",
            "segment_pool_id": (0, 0), "is_expandable": False,
            "allocated_size": allocated, "active_size": active, "requested_size": requested,
            "frames": [], "blocks": blocks})
    return segments


def snapshot_of(pools_by_device, settings):
    """The whole snapshot dict for {device: Pool}."""
    segments = []
    for device in sorted(pools_by_device):
        segments.extend(segments_of(pools_by_device[device], device))
    device_count = max([d for d in pools_by_device if d >= 0], default=0) + 1
    return {"segments": segments, "device_traces": [[] for _ in range(device_count)],
            "allocator_settings": dict(settings)}
