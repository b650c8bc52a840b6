"""The sdalloc Python package over libsdalloc.so: host pools, statistics under sdalloc's and
PyTorch's names, layouts, snapshots PyTorch's _memory_viz reads, event traces, DLPack hand-off
to torch with the memory returned when the tensor dies, and the errors of each."""

import gc
import os
import pickle

import pytest

import sdalloc
from sdalloc import _native

MiB = 1 << 20


@pytest.fixture
def pool(libraries):  # pylint: disable=unused-argument
    """The segment cache: a layout of whole segments the tests can predict."""
    p = sdalloc.Pool(mode="pool")
    yield p
    p.close()


@pytest.fixture(params=["pool", "vmm"])
def pool_mode(request):
    """Each pool a host caller can build, for what every pool promises."""
    return request.param


@pytest.fixture
def any_pool(pool_mode, libraries):  # pylint: disable=unused-argument,redefined-outer-name
    p = sdalloc.Pool(mode=pool_mode)
    yield p
    p.close()


def test_version_matches_the_library(libraries):  # pylint: disable=unused-argument
    assert sdalloc.version().count(".") == 2


def test_missing_library_dir_names_where_it_looked(monkeypatch, tmp_path):
    monkeypatch.setenv("SDALLOC_LIBRARY_DIR", str(tmp_path))
    with pytest.raises(sdalloc.LibraryNotFound) as error:
        _native.find(_native.HOST_LIBRARY)
    assert str(tmp_path) in str(error.value)
    assert "SDALLOC_LIBRARY_DIR" in str(error.value)


def test_malloc_free_and_stats(any_pool):
    pool = any_pool
    a = pool.malloc(1000)
    b = pool.malloc(3 * MiB)
    assert pool.allocation_size(a) == 1000
    s = sdalloc.stats(pool)
    assert s["live_bytes"] == 1000 + 3 * MiB
    assert s["live_allocations"] == 2
    # PyTorch's key names carry the same figures.
    assert s["allocated_bytes.all.current"] == s["allocated_bytes"]
    assert s["reserved_bytes.all.current"] == s["reserved_bytes"]
    assert s["requested_bytes.all.current"] == 1000 + 3 * MiB
    assert s["allocation.all.current"] == 2
    pool.free(a)
    pool.free(b)
    assert sdalloc.stats(pool)["allocated_bytes.all.current"] == 0
    assert pool.trim() > 0
    assert sdalloc.stats(pool)["reserved_bytes.all.current"] == 0


def test_stats_count_the_caching_pools_work_on_its_segments(pool):
    """Segments released to grow (a churn) and the stream emptied: the next allocation
    makes its free segments one arena (consolidations); the pool's counts reach Python."""
    a, b = pool.malloc(4 * MiB), pool.malloc(4 * MiB)
    pool.free(a)
    pool.free(b)
    c = pool.malloc(12 * MiB)  # the two go back to grow: a churn
    pool.free(c)
    small = pool.malloc(MiB)  # the stream was empty: one arena
    s = sdalloc.stats(pool)
    assert s["consolidations"] == 1, s
    assert s["segments"] == 1, s
    # Retired in 0.2 with the host-only page work: always 0.
    assert s["arena_growths"] == s["stitches"] == s["segment_splits"] == 0, s
    pool.free(small)


def test_mode_picks_the_pool(libraries):  # pylint: disable=unused-argument
    """Default (auto) is vmm on host memory: 100 bytes hold one 64 KiB page; mode="pool"
    holds a 2 MiB segment; hugepages come in whole segments, so auto picks pool there; planned
    takes its pages from a VirtualMemoryPool of 16 KiB pages where memory is virtual."""
    def reserved(built="vmm", **options):
        p = sdalloc.Pool(**options)
        assert p.mode == built, (options, p.mode)
        ptr = p.malloc(100)
        held = p.stats()["reserved_bytes"]
        p.free(ptr)
        p.close()
        return held
    assert reserved() == 64 * 1024
    assert reserved(mode="vmm") == 64 * 1024
    assert reserved("pool", mode="pool") == 2 * MiB
    assert reserved("pool", hugepages=True) == 2 * MiB
    assert reserved("planned", mode="planned") == 16 * 1024  # the fallback's page
    with pytest.raises(ValueError, match="unknown mode 'segments'"):
        sdalloc.Pool(mode="segments")
    with pytest.raises(sdalloc.SdallocError, match="mode:vmm needs memory"):
        sdalloc.Pool(mode="vmm", hugepages=True)
    with pytest.warns(DeprecationWarning, match="small_pool_limit no longer has any effect"):
        assert reserved("pool", mode="pool", small_pool_limit=0) == 2 * MiB
    with pytest.raises(sdalloc.SdallocError, match="mode:async needs a stream-ordered"):
        sdalloc.Pool(mode="async")


def test_memory_stats_has_torch_key_names_only(pool):
    keys = pool.memory_stats()
    for key in ("allocated_bytes.all.peak", "reserved_bytes.all.peak", "num_ooms",
                "num_alloc_retries", "segment.all.current", "active_bytes.all.current"):
        assert key in keys
    assert all("." in k or k.startswith("num_") for k in keys)


def test_errors_raise_with_the_library_message(any_pool, pool_mode):
    pool = any_pool
    p = pool.malloc(64)
    pool.free(p)
    with pytest.raises(sdalloc.SdallocError) as error:
        pool.free(p)  # double free
    assert error.value.status == "INVALID_POINTER"
    assert "sdalloc_free" in str(error.value)
    with pytest.raises(sdalloc.SdallocError) as error:
        pool.malloc(64, alignment=3)
    assert error.value.status == "INVALID_ARGUMENT"
    capped = sdalloc.Pool(mode=pool_mode, capacity=4 * MiB)
    with pytest.raises(sdalloc.SdallocError) as error:
        capped.malloc(8 * MiB)
    assert error.value.status == "OUT_OF_MEMORY"
    assert capped.malloc(MiB) is not None  # the pool is still usable
    capped.close()
    with pytest.raises(TypeError, match="unknown option 'capcity'"):
        sdalloc.Pool(capcity=1)
    with pytest.raises(sdalloc.SdallocError, match="segment_granularity"):
        sdalloc.Pool(segment_granularity=1000)


def test_zero_byte_malloc_is_none(any_pool):
    pool = any_pool
    assert pool.malloc(0) is None
    pool.free(None)  # a no-op


def test_layout_tiles_segments_and_agrees_with_stats(pool):
    live = [pool.malloc(size) for size in (512, 4096, 3 * MiB, 700_000)]
    pool.free(live[1])
    layout = pool.layout()
    stats = pool.stats()
    assert sum(seg["size"] for seg in layout) == stats["reserved_bytes"]
    for seg in layout:
        at = seg["address"]
        for block in seg["blocks"]:
            assert block["address"] == at
            at += block["size"]
        assert at == seg["address"] + seg["size"]
    live_blocks = [b for seg in layout for b in seg["blocks"] if b["state"] == 1]
    assert sum(b["size"] for b in live_blocks) == stats["allocated_bytes"]
    assert sum(b["requested"] for b in live_blocks) == 512 + 3 * MiB + 700_000


def test_snapshot_layout_and_totals_match_stats(pool, tmp_path):
    kept = [pool.malloc(size) for size in (1000, 3 * MiB, 64 << 10)]
    pool.free(pool.malloc(256 << 10))
    path = tmp_path / "snap.pickle"
    sdalloc.dump_snapshot(str(path), pool)
    with open(path, "rb") as f:
        snap = pickle.load(f)
    assert set(snap) == {"segments", "device_traces", "allocator_settings"}
    stats = sdalloc.stats(pool)
    segments = snap["segments"]
    assert sum(s["total_size"] for s in segments) == stats["reserved_bytes.all.current"]
    assert sum(s["allocated_size"] for s in segments) == stats["allocated_bytes.all.current"]
    assert sum(s["requested_size"] for s in segments) == stats["requested_bytes.all.current"]
    for seg in segments:
        assert {"device", "address", "total_size", "stream", "segment_type", "blocks",
                "allocated_size", "active_size", "requested_size", "frames"} <= set(seg)
        assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
        for block in seg["blocks"]:
            assert block["state"] in ("active_allocated", "active_pending_free", "inactive")
    assert snap["allocator_settings"]["allocator"] == "sdalloc"
    for p in kept:
        pool.free(p)


def test_snapshot_is_read_by_torch_memory_viz(pool, torch, tmp_path):
    from torch.cuda import _memory_viz  # pylint: disable=import-outside-toplevel
    kept = [pool.malloc(size) for size in (1000, 3 * MiB, 5 * MiB)]
    path = tmp_path / "snap.pickle"
    sdalloc.dump_snapshot(str(path), pool)
    with open(path, "rb") as f:
        snap = pickle.load(f)
    # PyTorch 1.13's functions take the segment list; 2.x takes the whole snapshot.
    major = int(torch.__version__.split(".")[0])
    data = snap if major >= 2 else snap["segments"]
    summary = _memory_viz.stats(data) if hasattr(_memory_viz, "stats") else None
    stats = sdalloc.stats(pool)
    if summary is not None:  # it asserts every segment's blocks add up to its total_size
        assert summary["segments"] == len(snap["segments"])
        assert summary["total_size"].value == stats["reserved_bytes.all.current"]
        assert summary["active_allocated"].value == stats["allocated_bytes.all.current"]
    text = _memory_viz.segments(data, format_flamegraph=lambda lines: lines)
    assert "active_allocated" in text
    assert _memory_viz.memory(data, format_flamegraph=lambda lines: lines)
    for p in kept:
        pool.free(p)


def test_record_writes_a_replayable_event_trace(pool, tmp_path):
    before = pool.malloc(100)
    path = tmp_path / "trace.csv"
    with sdalloc.record(str(path), pool) as recording:
        a = pool.malloc(4096)
        b = pool.malloc(300, stream=0x700)
        pool.free(a)
        pool.free(before)  # allocated before the start: no event
    assert recording.events == 3
    assert path.read_text() == "op,id,size,stream\na,0,4096,0\na,1,300,1\nf,0,4096,0\n"
    pool.free(b, stream=0x700)
    with pytest.raises(sdalloc.SdallocError, match="cannot create trace file"):
        sdalloc.record(str(tmp_path / "no" / "such" / "dir.csv"), pool)


def test_host_tensor_goes_to_torch_and_returns_when_it_dies(pool, torch):
    import sdalloc.torch as sdalloc_torch  # pylint: disable=import-outside-toplevel
    before = pool.stats()["live_allocations"]
    x = sdalloc_torch.host_tensor((64, 32), torch.float16, pool=pool)
    assert x.dtype == torch.float16 and tuple(x.shape) == (64, 32) and x.is_contiguous()
    assert pool.stats()["live_allocations"] == before + 1
    assert pool.stats()["live_bytes"] == 64 * 32 * 2
    x.fill_(3)
    assert float(x.float().sum()) == 3 * 64 * 32
    view = x[1:3]  # a view keeps the storage alive
    del x
    gc.collect()
    assert pool.stats()["live_allocations"] == before + 1
    del view
    gc.collect()
    assert pool.stats()["live_allocations"] == before
    assert sdalloc.live_exports() == 0


def test_host_tensor_through_from_dlpack_and_unexported_one_is_freed(pool, torch):
    from torch.utils import dlpack  # pylint: disable=import-outside-toplevel
    t = pool.tensor((3, 5), "int32")
    x = dlpack.from_dlpack(t)
    assert x.dtype == torch.int32 and tuple(x.shape) == (3, 5)
    with pytest.raises(RuntimeError, match="already exported"):
        t.__dlpack__()
    del t  # the consumer owns it now: nothing is freed
    gc.collect()
    assert pool.stats()["live_allocations"] == 1
    del x
    gc.collect()
    assert pool.stats()["live_allocations"] == 0
    unexported = pool.tensor((10,), "float32")
    assert pool.stats()["live_allocations"] == 1
    del unexported
    gc.collect()
    assert pool.stats()["live_allocations"] == 0
    with pytest.raises(ValueError, match="unsupported dtype"):
        pool.tensor((2,), "complex64")
    with pytest.raises(ValueError, match="negative dimension"):
        pool.tensor((2, -1))


def test_runtime_only_install_is_found_by_its_soname(monkeypatch, tmp_path, libraries):  # pylint: disable=unused-argument
    real = os.path.realpath(_native.find(_native.HOST_LIBRARY))
    (tmp_path / "libsdalloc.so.0").symlink_to(real)
    monkeypatch.setenv("SDALLOC_LIBRARY_DIR", str(tmp_path))
    assert _native.find(_native.HOST_LIBRARY) == str(tmp_path / "libsdalloc.so.0")
