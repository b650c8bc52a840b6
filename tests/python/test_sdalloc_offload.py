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
