"""sdalloc.torch.offload on the host backend: outputs equal the unoffloaded model, the
budget holds, the order is planned after the first forward, parameters are swapped to the
engine's "device" tensors during their layer's forward and back after, and a budget below
the largest weight is refused with a message."""

import pytest

import sdalloc.torch
from sdalloc._native import SdallocError


def _model(torch, layers=8, width=64):
    torch.manual_seed(14)
    blocks = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*blocks).eval()


def test_offloaded_outputs_equal_and_the_budget_holds(torch):
    model = _model(torch)
    x = torch.randn(4, 64)
    with torch.no_grad():
        expected = [model(x + i) for i in range(3)]
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    budget = weight_bytes // 2
    off = sdalloc.torch.offload(model, budget=budget, prefetch=2)
    seen = []
    probe = model[0].register_forward_pre_hook(lambda m, i: seen.append(m.weight.data_ptr()))
    host_pointer = model[0].weight.data_ptr()
    with torch.no_grad():
        got = [model(x + i) for i in range(3)]
    probe.remove()
    for e, g in zip(expected, got):
        assert torch.equal(e, g)
    stats = off.stats()
    assert stats["peak_resident_bytes"] <= budget
    assert stats["recorded_steps"] == 1 and stats["planned_steps"] == 2
    assert stats["loads"] > 8  # half the weights fit: some are streamed every step
    assert seen and all(p != host_pointer for p in seen)  # the layer ran on the device copy
    assert model[0].weight.data_ptr() == host_pointer  # and the host tensor is back
    off.remove()
    with torch.no_grad():
        assert torch.equal(model(x), expected[0])


def test_budget_below_the_largest_weight_is_refused(torch):
    model = _model(torch, layers=2)
    largest = max(p.numel() * p.element_size() for p in model.parameters())
    with pytest.raises(SdallocError) as error:
        sdalloc.torch.offload(model, budget=largest - 1)
    assert "largest single weight" in str(error.value)
    assert error.value.status == "INVALID_ARGUMENT"
    with torch.no_grad():  # nothing was left installed
        model(torch.randn(1, 64))


def test_tied_weights_are_one_weight(torch):
    first, second = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)
    second.weight = first.weight  # tied: one tensor, two modules
    model = torch.nn.Sequential(first, second).eval()
    x = torch.randn(2, 16)
    with torch.no_grad():
        expected = model(x)
        off = sdalloc.torch.offload(model, budget=4 * 16 * 16 * 4)
        for _ in range(2):
            assert torch.equal(model(x), expected)
    assert off.stats()["planned_steps"] == 1
    off.remove()


def test_bad_arguments_are_refused_before_anything_is_made(torch):
    model = _model(torch, layers=2)
    for kwargs, error, message in (
            ({"budget": 0}, ValueError, "budget must be a positive number of bytes"),
            ({"budget": -1}, ValueError, "budget must be a positive number of bytes"),
            ({"budget": "1MiB"}, TypeError, "budget must be a number of bytes, not str"),
            ({"budget": True}, TypeError, "budget must be a number of bytes, not bool"),
            ({"budget": float("inf")}, ValueError, "budget must be finite"),
            ({"budget": 0.5}, ValueError, "budget must be a positive number of bytes"),
            ({"budget": 1 << 20, "prefetch": 1.5}, TypeError, "prefetch must be an int"),
            ({"budget": 1 << 20, "prefetch": -1}, ValueError, "prefetch must be >= 0"),
            ({"budget": 1 << 20, "device": "meta"}, ValueError, "neither 'cpu' nor 'cuda[:N]'"),
            ({"budget": 1 << 20, "device": 1.0}, TypeError, "device must be a str, int"),
            ({"budget": 1 << 20, "device": "cuda", "copy_bytes_per_second": 1e9}, ValueError,
             "copy_bytes_per_second is the host backend's")):
        with pytest.raises(error) as raised:
            sdalloc.torch.offload(model, **kwargs)
        assert message in str(raised.value), (kwargs, str(raised.value))
        assert not model[0]._forward_pre_hooks  # pylint: disable=protected-access
    with torch.no_grad():
        model(torch.randn(1, 64))


def test_a_cuda_target_without_a_usable_device_is_refused_saying_why(torch):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present here (gpu-check's offload stage runs that path)")
    model = _model(torch, layers=2)
    host_pointers = [p.data_ptr() for p in model.parameters()]
    expected = ("no CUDA device to offload to" if sdalloc.torch.has_cuda()
                else "built without CUDA")
    for device in ("cuda", "cuda:0", 0, torch.device("cuda", 0)):
        with pytest.raises(SdallocError) as error:
            sdalloc.torch.offload(model, budget=1 << 20, device=device)
        assert error.value.status == "INVALID_ARGUMENT"
        assert expected in str(error.value), str(error.value)
        assert "sdalloc_torch_transfer_engine_create_cuda" in str(error.value)
    # Nothing was installed: the model runs on its host weights as before.
    assert [p.data_ptr() for p in model.parameters()] == host_pointers
    assert not model[0]._forward_pre_hooks  # pylint: disable=protected-access
    with torch.no_grad():
        model(torch.randn(1, 64))


def test_device_cpu_is_the_host_backend(torch):
    model = _model(torch, layers=4)
    x = torch.randn(2, 64)
    with torch.no_grad():
        expected = model(x)
        # A float budget is taken as int(budget), as before the device argument.
        off = sdalloc.torch.offload(model, budget=2.0 * 64 * 64 * 4, device="cpu")
        for _ in range(3):
            assert torch.equal(model(x), expected)
    stats = off.stats()
    assert stats["planned_steps"] == 2 and "device_reserved_bytes" not in stats
    assert stats["budget"] == 2 * 64 * 64 * 4
    off.remove()
