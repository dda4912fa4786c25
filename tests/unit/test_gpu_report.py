"""The GPU check's pure parts: its plan of train.py runs, the parsers of their answers, the MPI launcher it picks, the
verdicts it reads from its JSON, and docs/gpu.md, which must be what the generator makes of docs/gpu.json (no
sockets, no subprocesses)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from bench.gpu import machine, page, plan, verdicts

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"


# --- the plan --------------------------------------------------------------------------------------------------


def test_the_correctness_runs_cover_the_items():
    runs = {r.name: r for r in plan.correctness_runs("cuda")}
    assert set(runs) == {"fp32", "bf16", "fp16", "resume_full", "resume_stopped", "resume_resumed", "gloo_ddp_2",
                         "mpi_plane_2"}
    assert all(r.args[r.args.index("--device") + 1] == "gpu" for r in runs.values())
    assert runs["bf16"].args[runs["bf16"].args.index("--amp") + 1] == "bf16"
    assert runs["fp16"].args[runs["fp16"].args.index("--amp") + 1] == "fp16"
    # the resume: the same run stopped (exit 3) then resumed from its snapshot directory, deterministic throughout
    assert runs["resume_stopped"].expect_exit == 3 and runs["resume_resumed"].snapshot_of == "resume_stopped"
    for name in ("resume_full", "resume_stopped", "resume_resumed", "gloo_ddp_2", "mpi_plane_2"):
        assert "--deterministic" in runs[name].args
    assert runs["resume_full"].args[-2:] == runs["resume_resumed"].args[-2:]
    # two ranks on one device: gloo (NCCL refuses two ranks on one GPU), the same epochs for DDP and the MPI plane
    assert "--spawn" in runs["gloo_ddp_2"].args and "gloo" in runs["gloo_ddp_2"].args
    assert runs["mpi_plane_2"].launcher == "mpirun" and runs["mpi_plane_2"].ranks == 2
    assert runs["gloo_ddp_2"].args[-2:] == runs["mpi_plane_2"].args[-2:]
    assert plan.waits_for(runs["resume_resumed"]) == "resume_stopped" and plan.waits_for(runs["fp32"]) is None


def test_the_cpu_rehearsal_runs_the_same_on_the_cpu():
    assert all(r.args[r.args.index("--device") + 1] == "cpu" for r in plan.correctness_runs("cpu", quick=True))


def test_timing_runs_alternate_cpu_and_gpu():
    names = [r.name for r in plan.timing_runs("cuda", 2)]
    assert names == ["mlp_cpu_1", "mlp_gpu_1", "mlp_cpu_2", "mlp_gpu_2"]
    assert [r.args[1] for r in plan.timing_runs("cuda", 1)] == ["cpu", "gpu"]


def test_argv_with_and_without_mpirun():
    runs = {r.name: r for r in plan.correctness_runs("cuda")}
    line = plan.argv(runs["mpi_plane_2"], "py", "t.py", ("mpirun", "--allow-run-as-root"), "m", "s")
    assert line[:4] == ["mpirun", "--allow-run-as-root", "-np", "2"] and line[4:6] == ["py", "t.py"]
    assert line[-4:] == ["--metrics-dir", "m", "--snapshot-dir", "s"]
    assert plan.argv(runs["fp32"], "py", "t.py", None, "m", "s")[:2] == ["py", "t.py"]
    with pytest.raises(ValueError, match="no MPI runtime"):
        plan.argv(runs["mpi_plane_2"], "py", "t.py", None, "m", "s")


def test_a_run_that_cannot_be_started_as_planned_is_refused():
    with pytest.raises(ValueError, match="launcher 'srun'"):
        plan.TrainRun("x", (), launcher="srun")
    with pytest.raises(ValueError, match="ranks=2"):
        plan.TrainRun("x", (), ranks=2)


# --- the parsers -----------------------------------------------------------------------------------------------


def test_markers_last_wins_and_prefixes_are_read():
    out = ('noise\nRESULT {"a": 1}\n[rank 0] RESULT {"a": 2}\nGPUCHECK-DEVICE {"arch": "sm_90"}\n'
           'GPUCHECK {"ok": true}\nSTEP {"n": 1}\nSTEP {"n": 2}\n')
    assert plan.marker(out, "RESULT") == {"a": 2}
    assert plan.marker(out, "GPUCHECK") == {"ok": True}  # not GPUCHECK-DEVICE
    assert [s["n"] for s in plan.markers(out, "STEP")] == [1, 2]
    assert plan.marker(out, "RESUMED") is None


def test_last_epoch_skips_the_test_line():
    text = '{"epoch": 0, "loss": 2}\n{"epoch": 1, "loss": 1}\n{"event": "test", "test_loss": 0.5}\n'
    assert plan.last_epoch(text) == {"epoch": 1, "loss": 1}
    assert plan.last_epoch("") is None


def test_median_of_paired_ratios():
    assert plan.median_ratio([(4.0, 1.0), (3.0, 1.0), (10.0, 1.0)]) == 4.0
    assert plan.median_ratio([(1.0, 0.0), (None, 1.0)]) is None


def test_mpi_launcher_choice():
    ompi = machine.mpi_launcher("/usr/bin/mpirun", "mpirun (Open MPI) 4.1.6\n", "/tmp/mpich")
    assert ompi["argv"] == ["/usr/bin/mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]
    assert ompi["library"] == "mpirun (Open MPI) 4.1.6" and ompi["env"] == {}
    assert machine.mpi_launcher("/usr/bin/mpirun", "HYDRA build details:\n", None)["argv"] == ["/usr/bin/mpirun"]
    carried = machine.mpi_launcher(None, "", "/tmp/mpich")
    assert carried["argv"] == ["/tmp/mpich/bin/mpiexec"]
    assert carried["env"] == {"MPI4PY_LIBMPI": "/tmp/mpich/lib/libmpi.so.12", "MPIR_CVAR_ENABLE_GPU": "0"}
    assert machine.mpi_launcher(None, "", None) is None


# --- the verdicts ----------------------------------------------------------------------------------------------


def _published() -> dict:
    return json.loads((DOCS / "gpu.json").read_text())


def _verdict(data: dict, check: str) -> dict:
    return next(r for r in verdicts.rows(data) if r["check"].startswith(check))


def test_the_published_run_is_a_gpu_run_that_names_its_machine():
    data = _published()
    assert data["mode"] == "cuda" and not data["quick"]
    m = data["machine"]
    for key in ("gpu", "driver", "torch", "torch_cuda", "nccl", "capability"):
        assert m.get(key), key
    text = (DOCS / "gpu.md").read_text()
    for value in (m["gpu"], m["driver"], m["torch"], m["nccl"]):
        assert str(value) in text


def test_docs_gpu_md_is_what_the_generator_makes_of_docs_gpu_json():
    pin = page.pinned_torch((REPO / "pyproject.toml").read_text())
    assert (DOCS / "gpu.md").read_text() == page.render(_published(), pin), \
        "docs/gpu.md is not docs/gpu.json rendered: run python -m bench.gpu.page on the check's gpu.json"


def test_a_lower_accuracy_fails_its_precision():
    data = copy.deepcopy(_published())
    data["train"]["bf16"]["result"]["test_accuracy"] = plan.ACCURACY - 0.01
    assert _verdict(data, "digits bf16")["ok"] is False


def test_amp_that_did_not_run_fails():
    data = copy.deepcopy(_published())
    data["train"]["fp16"]["result"]["amp"] = "off"
    assert _verdict(data, "digits fp16")["ok"] is False
    data = copy.deepcopy(_published())
    data["train"]["fp16"]["scaler"] = {}  # no GradScaler state in the snapshot
    assert _verdict(data, "digits fp16")["ok"] is False


def test_a_resume_that_differs_fails():
    data = copy.deepcopy(_published())
    data["compare"]["resume"].update(bitwise=False, max_abs_diff=1e-7)
    assert _verdict(data, "snapshot + resume")["ok"] is False


def test_the_mpi_plane_must_be_bitwise_and_ranks_must_agree():
    data = copy.deepcopy(_published())
    data["compare"]["mpi_vs_ddp"].update(bitwise=False, max_abs_diff=3e-8)
    assert _verdict(data, "MPI data plane = DDP")["ok"] is False
    data = copy.deepcopy(_published())
    data["train"]["gloo_ddp_2"]["result"]["ranks_weights_equal"] = False
    assert _verdict(data, "2 ranks on one device, gloo-ddp")["ok"] is False


def test_a_timeout_that_never_reached_python_fails():
    data = copy.deepcopy(_published())
    data["timeout"]["fault"]["record"]["raised"] = False
    assert _verdict(data, "a timed-out collective raises")["ok"] is False


def test_a_resume_without_the_survivors_snapshot_fails_even_with_equal_weights():
    data = copy.deepcopy(_published())
    data["timeout"]["fault"]["resumed"] = None  # trained from scratch: the same weights, nothing was kept
    assert _verdict(data, "after the watchdog's abort")["ok"] is False
    data = copy.deepcopy(_published())
    data["timeout"]["fault"]["record"]["kept"]["by_survivor_path"] = False
    assert _verdict(data, "the state is readable")["ok"] is False


def test_gpucheck_must_report_the_gpus_own_arch():
    data = copy.deepcopy(_published())
    data["smoke"]["answers"][0]["answer"]["arch"] = "sm_75"
    assert _verdict(data, "gpucheck passes")["ok"] is False


def test_a_stage_cut_by_the_budget_is_a_failure_not_a_pass():
    data = copy.deepcopy(_published())
    data["timing"] = {"not_run": "the check's budget of 400 s was spent"}
    row = _verdict(data, "mlp step time")
    assert row["ok"] is False and "budget" in row["figure"]


def test_a_second_gpu_is_not_applicable_on_one():
    data = copy.deepcopy(_published())
    assert _verdict(data, "a peer killed mid-step")["ok"] is None
    data["machine"]["gpus"] = 2
    assert "no two-GPU case" in _verdict(data, "a peer killed mid-step")["figure"]


def test_a_cpu_rehearsal_says_so_on_its_page():
    data = copy.deepcopy(_published())
    data["mode"] = "cpu"
    assert "A CPU rehearsal" in page.render(data, "2.13.0")


def test_the_page_says_which_torch_ran_against_the_pin():
    data = _published()
    text = page.render(data, "9.9.9")
    assert "not the 9.9.9 that pyproject.toml pins" in text
    same = copy.deepcopy(data)
    same["machine"]["torch"] = "9.9.9+cu130"
    assert "pyproject.toml pins" not in page.render(same, "9.9.9")


def test_published_json_has_no_path_of_the_machine_that_ran_it():
    raw = {"command": "python -m bench.gpu --out /srv/o --work /srv/w --jobs 6",
           "a": {"final_model": "/tmp/x", "b": [{"final_model": 1}], "tail": ["#4 hook from /srv/ck/bench/gpu/t.py:61"]}}
    out = page.published(raw)
    assert out["command"] == "python -m bench.gpu --out OUT --work WORK --jobs 6"
    assert out["a"] == {"b": [{}], "tail": ["#4 hook from bench/gpu/t.py:61"]}
    text = (DOCS / "gpu.json").read_text()
    assert "final_model" not in text and not page.CHECKOUT.search(text)
