"""workloads/sd_unet.py: the --small UNet runs its denoising loop with the right shapes and
the same output bytes twice; the full configuration is SD 1.5's UNet (859,520,964
parameters, counted on the meta device, so no weights are allocated); bad options exit 2.

Run: /usr/bin/python3 -m pytest -q tests/python/test_workload_sd_unet.py
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "workloads" / "sd_unet.py"
IN_CI = bool(os.environ.get("CI"))

if importlib.util.find_spec("torch") is None:
    if IN_CI:
        raise RuntimeError("torch is not importable (CI needs Debian's python3-torch)")
    pytest.skip("torch is not installed", allow_module_level=True)

_spec = importlib.util.spec_from_file_location("sd_unet", SCRIPT)
sd_unet = importlib.util.module_from_spec(_spec)
sys.modules["sd_unet"] = sd_unet  # dataclasses look the module up by name
_spec.loader.exec_module(sd_unet)


def run_small(tmp_path, name, *extra):
    """Runs the script with --small in a fresh interpreter; answers (process, its JSON)."""
    out = tmp_path / f"{name}.json"
    # One thread: the bytes then do not depend on how the BLAS splits work, and a loaded
    # machine does not stall an OpenMP barrier.
    proc = subprocess.run([sys.executable, str(SCRIPT), "--small", "--steps", "2",
                           "--threads", "1", "--json", str(out), *extra],
                          capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc, json.loads(out.read_text(encoding="utf-8"))


def test_small_loop_has_latent_shapes_and_reports_each_step(tmp_path):
    proc, report = run_small(tmp_path, "a", "--warmup", "1")
    assert report["config"] == "small"
    assert report["output_shape"] == [1, 4, 16, 16]  # batch 2 = one image under guidance
    assert len(report["step_seconds"]) == 2 and len(report["warmup_seconds"]) == 1
    assert report["finite"]
    assert report["blas"]["blas_info"] != "unknown"
    assert "BLAS:" in proc.stdout and "step 2/2" in proc.stdout


def test_two_runs_give_the_same_output_bytes(tmp_path):
    _, first = run_small(tmp_path, "a")
    _, second = run_small(tmp_path, "b")
    assert first["sha256"] == second["sha256"]
    assert first["checksum"] == second["checksum"]
    _, other_seed = run_small(tmp_path, "c", "--seed", "1")
    assert other_seed["sha256"] != first["sha256"]


def test_odd_batch_runs_without_guidance(tmp_path):
    _, report = run_small(tmp_path, "odd", "--batch", "3", "--latent", "8")
    assert report["output_shape"] == [3, 4, 8, 8]
    assert report["guidance"] is None


def test_unet_forward_keeps_the_latent_shape():
    cfg = sd_unet.SMALL
    unet = sd_unet.UNet(cfg).eval()
    import torch  # pylint: disable=import-outside-toplevel
    with torch.inference_mode():
        out = unet(torch.zeros(2, 4, 8, 8), torch.tensor([10, 10]),
                   torch.zeros(2, cfg.context_tokens, cfg.context_dim))
    assert tuple(out.shape) == (2, 4, 8, 8)


def test_full_config_is_sd15_unet_size():
    # Counted on the meta device (UNet(cfg, device="meta")): shapes only, no 3.4 GB of weights.
    assert sd_unet.parameter_count(sd_unet.FULL) == 859_520_964


def test_full_config_has_sd15_skip_layout():
    unet = sd_unet.UNet(sd_unet.FULL, device="meta")
    assert unet.conv_in.out_channels == 320
    # Up ResNet blocks take the running width plus one skip, as SD 1.5's UNet.
    first_ins = [stage[0].norm1.num_channels for stage in unet.up[3][:3]]
    assert first_ins == [640 + 320, 320 + 320, 320 + 320]
    assert unet.mid_attn.attn2.to_k.in_features == 768


@pytest.mark.parametrize("args", [["--latent", "6"], ["--steps", "0"], ["--warmup", "-1"]])
def test_bad_options_exit_2(args, capsys):
    with pytest.raises(SystemExit) as exit_info:  # argparse's exit, before any model is built
        sd_unet.main(["--small", *args])
    assert exit_info.value.code == 2
    assert "error:" in capsys.readouterr().err
