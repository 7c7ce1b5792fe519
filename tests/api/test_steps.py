"""The step log that ``srun`` records steps in: numbering, ends, and its bounds."""

from __future__ import annotations

from mtgpu.api import steps


def test_steps_are_numbered_per_job_and_end_with_their_status() -> None:
    log = steps.StepLog()
    assert log.begin("7", "gpu01", 3, 0, "python train.py", 1.0) == 0
    assert log.begin("7", "gpu01", 1, 0, "hostname", 2.0) == 1
    assert log.begin("8", "gpu01", 1, 0, "true", 2.0) == 0
    assert log.end("7", 0, 3, 5.0) and not log.end("7", 0, 0, 6.0)  # a step ends once
    assert not log.end("7", 9, 0, 6.0) and not log.end("nope", 0, 0, 6.0)
    got = [(s["step_id"], s["state"], s["exit_code"], s["ntasks"]) for s in log.of("7")]
    assert got == [("7.0", "FAILED", 3, 3), ("7.1", "RUNNING", None, 1)]
    log.of("7")[0]["state"] = "forged"
    assert log.of("7")[0]["state"] == "FAILED"  # answers are copies


def test_the_log_keeps_a_bounded_number_of_steps_and_jobs() -> None:
    log = steps.StepLog()
    for _ in range(steps.MAX_STEPS_KEPT + 50):
        n = log.begin("7", "gpu01", 1, 0, "true", 1.0)
    kept = log.of("7")
    assert len(kept) == steps.MAX_STEPS_KEPT and kept[-1]["step"] == n == steps.MAX_STEPS_KEPT + 49
    for i in range(steps.MAX_JOBS_KEPT + 1):
        log.begin(f"j{i}", "gpu01", 1, 0, "true", 1.0)
    assert log.of("7") == [] and log.of(f"j{steps.MAX_JOBS_KEPT}") != []
