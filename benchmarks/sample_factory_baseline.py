"""Sample Factory 2.1.1 baseline: CartPole-v1 training throughput.

Run this with the python of a separate venv that has sample-factory==2.1.1 installed (see SAMPLE_FACTORY.md),
never with sfengine's python: it does not import sfengine, so the two engines can be benchmarked side by side.

    /tmp/sf-venv/bin/python benchmarks/sample_factory_baseline.py \
        --num_workers=2 --num_envs_per_worker=8 --worker_num_splits=2 --serial_mode=0 --async_rl=1 --seconds=30

Everything Sample Factory logs goes to stderr. Stdout gets exactly one line of JSON at the end:

    {"fps": ..., "env_steps": ..., "wall_seconds": ..., "peak_rss_mb": ..., "settings": {...}, ...extra keys}

How the numbers are measured
----------------------------
* env_steps: Sample Factory's own frame counter (``learner_env_steps``), i.e. env frames the learner has trained on.
  Frames still in flight in the sampler when training stops are not counted.
* fps: the runner (main) process reads that counter at every finished training iteration; fps is
  (last reading - first non-zero reading) / (time between the two readings). The window opens once training is
  under way, so process spawning, model creation and the first rollout and training iteration are excluded.
  ``wall_seconds`` is that window, ``window_env_steps`` the frames in it.
* fps_incl_startup: final env_steps / seconds since this script started (start-up included), for reference.
* sf_main_loop_fps: what Sample Factory itself prints at the end ("Collected ..., FPS"): steps / runner main loop time,
  which includes starting the worker processes.
* peak_rss_mb: a background thread samples, every ~0.5 s, the RSS of this process plus all its recursive children
  (psutil) and keeps the max of the sum. Memory shared between processes (torch shared tensors) is counted once per
  process that maps it, as RSS does.

Time limit: Sample Factory 2.1.1 ignores ``--train_for_seconds`` (``Runner.total_train_seconds`` is never updated;
fixed upstream after 2.1.1), so this script keeps that counter up to date through a public ``AlgoObserver``. The clock
starts at the first non-zero reading, so the measured window lasts about ``--seconds``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time

ENV_NAME = "CartPole-v1"
EXPERIMENT = "sf_cartpole_baseline"


def make_cartpole(full_env_name, cfg=None, env_config=None, render_mode=None):
    """Env factory in the form Sample Factory's register_env expects (module level: spawned workers import it)."""
    import gymnasium as gym

    return gym.make(full_env_name, render_mode=render_mode)


class TreeRssSampler(threading.Thread):
    """Peak of (RSS of this process + RSS of all its recursive children), sampled every `interval` seconds."""

    def __init__(self, interval: float = 0.5):
        super().__init__(name="rss-sampler", daemon=True)
        import psutil

        self._psutil = psutil
        self.interval = interval
        self.root = psutil.Process(os.getpid())
        self.peak_bytes = 0
        self.peak_num_processes = 0
        self.samples = 0
        self._stop_event = threading.Event()

    def sample(self) -> None:
        psutil = self._psutil
        try:
            procs = [self.root] + self.root.children(recursive=True)
        except psutil.Error:
            return
        total = 0
        alive = 0
        for proc in procs:
            try:
                total += proc.memory_info().rss
                alive += 1
            except psutil.Error:  # exited between listing and reading
                pass
        self.samples += 1
        if total > self.peak_bytes:
            self.peak_bytes = total
        self.peak_num_processes = max(self.peak_num_processes, alive)

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.sample()
            self._stop_event.wait(self.interval)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5)
        self.sample()


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num_workers", type=int, default=2)
    p.add_argument("--num_envs_per_worker", type=int, default=8)
    p.add_argument("--worker_num_splits", type=int, default=2)
    p.add_argument("--serial_mode", type=int, choices=(0, 1), default=0)
    p.add_argument("--async_rl", type=int, choices=(0, 1), default=1)
    p.add_argument("--seconds", type=float, default=30.0, help="training time, counted from the first learner report")
    p.add_argument("--train_dir", default=None, help="where SF writes its experiment folder (default: a temp dir)")
    p.add_argument("--rollout", type=int, default=32)
    p.add_argument("--batch_size", type=int, default=1024)
    p.add_argument("--num_batches_per_epoch", type=int, default=1)
    p.add_argument("--num_epochs", type=int, default=1)
    p.add_argument("--hidden", default="64,64", help="MLP encoder widths, comma separated")
    p.add_argument("--nonlinearity", default="tanh", choices=("tanh", "elu", "relu"))
    p.add_argument("--rss_interval", type=float, default=0.5)
    p.add_argument(
        "--hard_timeout", type=float, default=None, help="kill everything after this many seconds (default seconds+300)"
    )
    return p.parse_args(argv)


def sf_argv(args: argparse.Namespace, train_dir: str) -> list[str]:
    hidden = [str(int(h)) for h in args.hidden.split(",") if h.strip()]
    return [
        "--algo=APPO",
        f"--env={ENV_NAME}",
        f"--experiment={EXPERIMENT}",
        f"--train_dir={train_dir}",
        "--restart_behavior=overwrite",
        "--device=cpu",
        f"--num_workers={args.num_workers}",
        f"--num_envs_per_worker={args.num_envs_per_worker}",
        f"--worker_num_splits={args.worker_num_splits}",
        f"--serial_mode={bool(args.serial_mode)}",
        f"--async_rl={bool(args.async_rl)}",
        f"--rollout={args.rollout}",
        f"--batch_size={args.batch_size}",
        f"--num_batches_per_epoch={args.num_batches_per_epoch}",
        f"--num_epochs={args.num_epochs}",
        "--recurrence=1",
        "--use_rnn=False",
        "--encoder_mlp_layers",
        *hidden,
        f"--nonlinearity={args.nonlinearity}",
        "--with_wandb=False",
        # our observer enforces this (SF 2.1.1 itself never stops on train_for_seconds)
        f"--train_for_seconds={max(1, int(round(args.seconds)))}",
    ]


def reap_children(timeout: float) -> int:
    """Wait for SF's worker processes to exit; kill what is still alive after `timeout`. Returns how many were killed.

    multiprocessing's resource tracker and torch's torch_shm_manager only exit after this process does,
    so they are neither waited for nor killed.
    """
    import psutil

    def workers():
        out = []
        for child in psutil.Process(os.getpid()).children(recursive=True):
            cmd = " ".join(_cmdline(child))
            if "resource_tracker" not in cmd and "torch_shm_manager" not in cmd:
                out.append(child)
        return out

    deadline = time.time() + timeout
    while time.time() < deadline:
        if not workers():
            return 0
        time.sleep(0.2)
    killed = 0
    for child in workers():
        try:
            child.kill()
            killed += 1
        except psutil.Error:
            pass
    return killed


def _cmdline(proc) -> list[str]:
    try:
        return proc.cmdline()
    except Exception:
        return []


def describe_model(cfg, env_info) -> dict:
    """Build SF's actor-critic in this process once, only to report what architecture SF uses for this config."""
    from sample_factory.model.actor_critic import create_actor_critic

    model = create_actor_critic(cfg, env_info.obs_space, env_info.action_space)
    info = {
        "class": type(model).__name__,
        "num_parameters": int(sum(p.numel() for p in model.parameters())),
        "trainable_parameters": int(sum(p.numel() for p in model.parameters() if p.requires_grad)),
        "encoder_mlp_layers": list(cfg.encoder_mlp_layers),
        "nonlinearity": cfg.nonlinearity,
        "actor_critic_share_weights": bool(cfg.actor_critic_share_weights),
        "normalize_input": bool(cfg.normalize_input),
        "normalize_returns": bool(cfg.normalize_returns),
        "repr": " ".join(str(model).split()),
    }
    del model
    return info


def main(argv=None) -> int:
    t_script_start = time.time()
    args = parse_args(argv)

    # Keep stdout for the single JSON line: point fd 1 at stderr (inherited by SF's spawned workers too).
    json_out = os.fdopen(os.dup(1), "w")
    sys.stdout.flush()
    os.dup2(2, 1)
    try:
        return _benchmark(args, t_script_start, json_out)
    except BaseException as exc:  # still answer with one JSON line, and leave no worker behind
        import traceback

        traceback.print_exc()
        err = {"error": repr(exc), "fps": None, "env_steps": None, "wall_seconds": None, "peak_rss_mb": None}
        err["settings"] = vars(args)
        json_out.write(json.dumps(err) + "\n")
        json_out.flush()
        reap_children(timeout=5.0)
        return 2


def _benchmark(args: argparse.Namespace, t_script_start: float, json_out) -> int:
    rss = TreeRssSampler(args.rss_interval)
    rss.start()

    own_train_dir = args.train_dir is None
    train_dir = tempfile.mkdtemp(prefix="sf-baseline-") if own_train_dir else os.path.abspath(args.train_dir)
    os.makedirs(train_dir, exist_ok=True)

    hard_timeout = args.hard_timeout if args.hard_timeout is not None else args.seconds + 300.0
    done = threading.Event()
    watchdog_fired = threading.Event()

    def watchdog():
        import psutil

        if done.wait(hard_timeout):
            return
        watchdog_fired.set()
        err = {"error": f"hard timeout after {hard_timeout:.0f} s", "fps": None, "settings": vars(args)}
        json_out.write(json.dumps(err) + "\n")
        json_out.flush()
        for child in psutil.Process(os.getpid()).children(recursive=True):
            try:
                child.kill()
            except psutil.Error:
                pass
        os._exit(3)

    threading.Thread(target=watchdog, name="watchdog", daemon=True).start()

    import sample_factory
    from sample_factory.algo.runners.runner import AlgoObserver
    from sample_factory.algo.utils.misc import ExperimentStatus
    from sample_factory.cfg.arguments import parse_full_cfg, parse_sf_args
    from sample_factory.envs.env_utils import register_env
    from sample_factory.train import make_runner

    register_env(ENV_NAME, make_cartpole)
    argv_sf = sf_argv(args, train_dir)
    parser, _ = parse_sf_args(argv=argv_sf, evaluation=False)
    cfg = parse_full_cfg(parser, argv_sf)

    # (time, SF's env-step counter) sampled at every finished training iteration, once the counter is > 0.
    # runner.env_steps is filled by SF's own handler of the learner's reports; it lags one iteration behind the
    # iteration signal, the same lag at both ends of the window.
    reports: list[tuple[float, int]] = []
    iterations = [0]

    class Meter(AlgoObserver):
        """Samples the step counter and keeps SF's train_for_seconds counter up to date (SF 2.1.1 never does)."""

        def on_training_step(self, runner, training_iteration_since_resume: int) -> None:
            now = time.time()
            iterations[0] = training_iteration_since_resume
            steps = int(sum(runner.env_steps.values())) if runner.env_steps else 0
            if steps > 0:
                reports.append((now, steps))
            if reports:
                runner.total_train_seconds = now - reports[0][0]

    cfg, runner = make_runner(cfg)
    # Note: Runner.register_policy_msg_handler() is unusable in SF 2.1.1 (it stores a bare function where a list
    # is expected, and the runner crashes on the first message), so we measure through an AlgoObserver instead.
    runner.register_observer(Meter())

    status = runner.init()
    model_info = None
    t_run_start = t_run_end = None
    if status == ExperimentStatus.SUCCESS:
        try:
            model_info = describe_model(cfg, runner.env_info)
        except Exception as exc:  # reporting only
            model_info = {"error": repr(exc)}
        t_run_start = time.time()
        status = runner.run()
        t_run_end = time.time()
    rss.stop()
    leftovers = reap_children(timeout=15.0)
    done.set()
    if watchdog_fired.is_set():
        return 3

    final_steps = int(sum(runner.env_steps.values())) if runner.env_steps else 0
    if len(reports) >= 2:
        (t0, s0), (t1, s1) = reports[0], reports[-1]
        window_seconds = t1 - t0
        window_steps = s1 - s0
        fps = window_steps / window_seconds if window_seconds > 0 else None
    else:
        window_seconds, window_steps, fps = None, None, None

    main_loop = getattr(runner.timing, "main_loop", None)
    sf_fps = (runner.total_env_steps_since_resume or 0) / main_loop if main_loop else None

    result = {
        "fps": fps,
        "env_steps": final_steps,
        "wall_seconds": window_seconds,
        "peak_rss_mb": rss.peak_bytes / 2**20,
        "settings": {
            "engine": "sample-factory",
            "sample_factory_version": getattr(sample_factory, "__version__", None) or _dist_version("sample-factory"),
            "env": ENV_NAME,
            "num_workers": cfg.num_workers,
            "num_envs_per_worker": cfg.num_envs_per_worker,
            "worker_num_splits": cfg.worker_num_splits,
            "serial_mode": int(bool(cfg.serial_mode)),
            "async_rl": int(bool(cfg.async_rl)),
            "seconds": args.seconds,
            "rollout": cfg.rollout,
            "batch_size": cfg.batch_size,
            "num_batches_per_epoch": cfg.num_batches_per_epoch,
            "num_epochs": cfg.num_epochs,
            "encoder_mlp_layers": list(cfg.encoder_mlp_layers),
            "nonlinearity": cfg.nonlinearity,
            "device": cfg.device,
            "policy_workers_per_policy": cfg.policy_workers_per_policy,
            "batched_sampling": bool(cfg.batched_sampling),
            "set_workers_cpu_affinity": bool(cfg.set_workers_cpu_affinity),
            "torch_version": _dist_version("torch"),
        },
        "fps_method": "SF learner env-step counter, first non-zero to last reading at training iterations (start-up excluded)",
        "window_env_steps": window_steps,
        "fps_incl_startup": final_steps / (time.time() - t_script_start),
        "sf_main_loop_fps": sf_fps,
        "startup_seconds": (reports[0][0] - t_script_start) if reports else None,
        "run_seconds": (t_run_end - t_run_start) if t_run_start and t_run_end else None,
        "total_seconds": time.time() - t_script_start,
        "train_iterations": iterations[0],
        "peak_num_processes": rss.peak_num_processes,
        "rss_samples": rss.samples,
        "leftover_children_killed": leftovers,
        "status": "success" if status == ExperimentStatus.SUCCESS else f"status={status}",
        "model": model_info,
    }
    if own_train_dir:
        shutil.rmtree(train_dir, ignore_errors=True)
    result["total_seconds"] = time.time() - t_script_start
    json_out.write(json.dumps(result) + "\n")
    json_out.flush()
    return 0 if status == ExperimentStatus.SUCCESS and fps is not None else 1


def _dist_version(name: str):
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return None


if __name__ == "__main__":
    sys.exit(main())
