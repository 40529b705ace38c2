"""The progress line of a pretraining (eae_platform.progress.progress_line) on hand-built
metrics dicts, compared whole: a piece dropped, reordered or reformatted fails."""

from eae_platform.progress import progress_line, root_cause

LOSSES = {"loss": 25.18345, "loss_mention": 1.0091, "loss_mlm": 10.3551, "grad_norm": 3.2}
THROUGHPUT = {"tokens_per_s": 2997.4, "step_time_s": 0.5431, "launch_time_s": 0.51234, "data_wait_s": 0.0004,
              "gc_s": 0.0123, "lr": 1e-3, "table_gib_per_worker": 0.25}
COLLECTIVES = {"exchange_s": 0.07334, "grad_sync_wait_s": 0.15341}
GPU = {"gpu_lag_s": 0.0421, "peak_gpu_gib": 61.27, "peak_gpu_gib_min": 60.5}
DEV = {"dev/token_accuracy": 0.51234, "dev/perplexity": 29581.2, "dev/entity_accuracy": 0.0}

ONE_CPU_WORKER = ("step 8: loss 25.183 mention 1.009 mlm 10.355 | 2,997 tokens/s, 0.543 s/step "
                  "(waiting for data 0.000, in gc 0.012)")
DEV_LINE = "step 8 dev: dev/token_accuracy 0.5123, dev/perplexity 2.958e+04, dev/entity_accuracy 0"


def test_a_window_on_one_cpu_worker():
    assert progress_line(8, {**LOSSES, **THROUGHPUT}) == ONE_CPU_WORKER


def test_a_window_on_several_gpu_workers_adds_collectives_lag_and_peak():
    assert progress_line(8, {**LOSSES, **THROUGHPUT, **COLLECTIVES, **GPU}) == (
        ONE_CPU_WORKER + " | exchanges 73.3 ms, all-reduce wait 153.4 ms"
        " | GPU lag 42.1 ms, launched in 0.5123 s/step | peak 61.3 GiB")


def test_a_window_without_throughput_shows_its_losses():
    assert progress_line(3, LOSSES) == "step 3: loss 25.183 mention 1.009 mlm 10.355"


def test_dev_metrics_alone_and_beside_a_window():
    assert progress_line(8, DEV) == DEV_LINE
    assert progress_line(8, {**LOSSES, **THROUGHPUT, **DEV}) == ONE_CPU_WORKER + "\n" + DEV_LINE


def test_a_failure_of_workers_ray_killed_for_memory_says_so():
    """Ray's memory monitor says why it killed the workers deep in the message of the error it
    leaves (here as `eae pretrain` of the paper preset on a 2-core machine met it): the one-line
    report carries that line, not the first line alone."""
    oom = ("3 worker(s) were killed due to the node running low on memory. Memory on the node (IP: 192.0.2.2) was "
           "22.47GB used / 23.54GB limit (0.954456)")
    error = RuntimeError(f"A worker health check failed.\nWorker info: Worker(\n  pid=28708,\n)\n{oom}\nOOM kill reason: ...")
    assert root_cause(error) == f"RuntimeError: A worker health check failed. ({oom})"
    assert root_cause(RuntimeError("boom\nmore")) == "RuntimeError: boom"
