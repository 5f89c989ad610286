"""Test helpers: run the real CLI in a subprocess and read what it wrote."""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import numpy as np
import psutil
import pytest

from sfengine.config import Config
from sfengine.demos.dataset import Demo, DemoSet
from sfengine.env.registry import env_context, resolve_env_factory
from sfengine.tasks.scheduler import Assignment
from sfengine_envs.sparse_reach import ReachDemonstrator, SparseReachEnv

FAST = ["--env=CartPole-v1", "--num_workers=2", "--num_envs_per_worker=4", "--worker_num_splits=2"]
# A test that needs LIBERO's simulators; the suite's other tests run without the extra.
requires_libero = pytest.mark.skipif(
    importlib.util.find_spec("libero") is None, reason="the libero extra is not installed: pip install -e '.[libero]'"
)
STARTED: list[subprocess.Popen] = []  # runs started in the background by the current test (see conftest.py)


def make_env(env_name: str, **options):
    """One env built as a rollout worker builds it, with these flat options (``libero_sim_cache=2``)."""
    cfg = Config()
    cfg.env.env = env_name
    for name, value in options.items():
        cfg.set(name, value)
    return resolve_env_factory(env_name)(env_context(cfg, 0, 0, 0))


def train_command(train_dir: Path, experiment: str, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "sfengine.train",
        f"--train_dir={train_dir}",
        f"--experiment={experiment}",
        "--report_every_sec=2",
        *args,
    ]


def run_train(train_dir: Path, experiment: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run(
        train_command(train_dir, experiment, *args), capture_output=True, text=True, timeout=timeout, env=env
    )


def evaluate(*args: str, script: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m sfengine.evaluate`` (or a user script that runs it) with these arguments."""
    command = [sys.executable, str(script)] if script else [sys.executable, "-m", "sfengine.evaluate"]
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run(
        [*command, "--report_every_sec=2", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def read_summary(train_dir: Path, experiment: str) -> dict:
    return json.loads((train_dir / experiment / "summary.json").read_text())


RECORDING_SCRIPT = textwrap.dedent(
    """
    import os
    import sys
    import time

    import gymnasium as gym

    from sfengine import register_env
    from sfengine.{module} import main
    from sfengine_envs.multitask_toy import make_multitask_toy

    LOG_DIR = {log_dir!r}
    STEP_SEC = float(os.environ.get("RECORDED_STEP_SEC", 0))  # a slower env, for a test that stops a run midway


    class RecordsAssignments(gym.Wrapper):
        # Appends every (task, init state) the env is reset to, one line each, to a file of its own (.txt), and
        # every one it played to the end to another (.ended).

        def __init__(self, env, path):
            super().__init__(env)
            self.log = open(path, "a", buffering=1)
            self.ended = open(path.removesuffix(".txt") + ".ended", "a", buffering=1)

        def reset(self, *, seed=None, options=None):
            self.assignment = f"{{options['task']}} {{options['init_state']}}\\n"
            self.log.write(self.assignment)
            return self.env.reset(seed=seed, options=options)

        def step(self, action):
            time.sleep(STEP_SEC)
            obs, reward, terminated, truncated, info = self.env.step(action)
            if terminated or truncated:
                self.ended.write(self.assignment)
            return obs, reward, terminated, truncated, info


    def make_recorded_toy(ctx):
        if ctx.worker_index < 0:  # the main process's env, reset once to check the API: not one of the workers'
            return make_multitask_toy(ctx)
        rank = os.environ.get("RANK", "0")
        path = os.path.join(LOG_DIR, f"rank{{rank}}_{{os.getpid()}}_{{ctx.worker_index}}_{{ctx.env_index}}.txt")
        return RecordsAssignments(make_multitask_toy(ctx), path)


    register_env("recorded_toy", make_recorded_toy)

    if __name__ == "__main__":
        sys.exit(main(sys.argv[1:]))
    """
)


def reached_target(summary: dict, target: str) -> bool:
    """Whether the run stopped because its target (``stop_at_return=400``, ``stop_at_success=0.9``) was reached,
    a full stats window at or above it, rather than at its env-step limit; and the summary reports the window that
    reached it (the mean in the stop reason), not one moved on by the episodes that finished while the run stopped."""
    reason = summary.get("stop_reason") or ""
    if not reason.endswith(f"reached --{target}"):
        return False
    name, mean = re.search(r"the mean (return|success) of the last \d+ episodes, (\S+), reached", reason).groups()
    summarised = summary["episode_return_mean" if name == "return" else "success_rate"]
    assert f"{summarised:.{1 if name == 'return' else 3}f}" == mean, (summarised, reason)
    return True


# A user script whose model (--model=hangs_once) never returns from its 50th forward on the inference worker, once
# (the marker file is the run's memory): a device call that hangs with a batch of requests in hand.
INFERENCE_FAULT_SCRIPT = textwrap.dedent(
    """
    import os
    import sys
    import time

    from sfengine import ActorCritic, register_model
    from sfengine.{module} import main

    FAULTED_ONCE = {marker!r}

    {fault}

    class FaultsOnce(ActorCritic):
        forwards = 0

        def act(self, obs, deterministic=False):
            FaultsOnce.forwards += 1
            if FaultsOnce.forwards == 50 and not os.path.exists(FAULTED_ONCE):
                with open("/proc/self/comm") as comm:
                    if comm.read().strip() == "sfe-inference-0":
                        open(FAULTED_ONCE, "w").close()
                        fault()
            return super().act(obs, deterministic)


    def make_faults_once(cfg, obs_spec, action_spec):
        return FaultsOnce(obs_spec, action_spec, cfg.model, critic=cfg.needs_critic)


    register_model("faults_once", make_faults_once)

    if __name__ == "__main__":
        sys.exit(main(sys.argv[1:]))
    """
)
HANG = "def fault():\n    time.sleep(100_000)\n"


def write_inference_fault_script(script: Path, marker: Path, module: str = "train", fault: str = HANG) -> None:
    """A user script running ``sfengine.<module>`` with a model ``faults_once``: in its 50th forward in
    sfe-inference-0, the first time (``marker`` marks it), it calls ``fault`` (Python defining ``fault()``; by
    default, a hang)."""
    script.write_text(INFERENCE_FAULT_SCRIPT.format(marker=str(marker), module=module, fault=fault.strip()))


def write_recording_script(script: Path, log_dir: Path, module: str = "train") -> None:
    """A user script that runs ``sfengine.<module>`` with an env ``recorded_toy`` (multitask_toy) that logs every
    assignment it receives, and every episode it ends, to log_dir."""
    log_dir.mkdir(parents=True, exist_ok=True)
    script.write_text(RECORDING_SCRIPT.format(log_dir=str(log_dir), module=module))


def received_assignments(log_dir: Path, pattern: str = "*.txt") -> Counter:
    """How often each (task, init state) was received by the envs whose logs match ``pattern``."""
    lines = [line.split() for path in log_dir.glob(pattern) for line in path.read_text().splitlines()]
    return Counter(Assignment(int(task), int(init_state)) for task, init_state in lines)


def shm_entries() -> set[str]:
    return set(os.listdir("/dev/shm"))


def unmapped_new_shm(before: set[str]) -> set[str]:
    """Entries created since ``before`` that exist now and that no live process maps."""
    mapped = set()
    for maps in glob.glob("/proc/[0-9]*/maps"):
        try:
            with open(maps) as f:
                mapped.update(line.split()[-1] for line in f if "/dev/shm/" in line)
        except OSError:
            pass
    return {e for e in shm_entries() - before if f"/dev/shm/{e}" not in mapped}


def leaked_shm(before: set[str], settle_sec: float = 120.0) -> set[str]:
    """Entries created since ``before`` that no live process maps and that stay: a run's leftovers.

    Another test's run (the suite runs two at once) holds entries that no process maps for a while, from the
    moment one of its processes ends until its resource tracker unlinks them as that run ends: those vanish,
    so an entry counts only if it is still there, unmapped, after ``settle_sec``. A clean run waits not at all.
    """
    leaked = unmapped_new_shm(before)
    deadline = time.time() + settle_sec
    while leaked and time.time() < deadline:
        time.sleep(0.5)
        leaked &= unmapped_new_shm(before)
    return leaked


def start(command: list[str], **popen) -> subprocess.Popen:
    """Start a run in the background; it is killed with its workers if the test ends first."""
    STARTED.append(subprocess.Popen(command, text=True, **popen))
    return STARTED[-1]


def kill_started_runs() -> None:
    while STARTED:
        process = STARTED.pop()
        try:
            tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for member in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                member.kill()
        psutil.wait_procs(tree, timeout=10)


def wait_for_training(process: subprocess.Popen, timeout: float = 120) -> None:
    """Read status lines until the learner has consumed env steps."""
    deadline = time.time() + timeout
    for line in process.stdout:
        if "steps" in line and "FPS" in line and line.split("steps")[1].split()[0].replace(",", "") != "0":
            return
        assert time.time() < deadline, "training made no progress"
    raise AssertionError(f"the run ended early with code {process.wait()}")


def start_long_training(train_dir, experiment: str, *args: str, **popen) -> subprocess.Popen:
    """Start a run that would go on for a long time, and return once the learner has trained."""
    process = start(
        train_command(train_dir, experiment, *FAST, "--train_for_env_steps=100000000", *args),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        **popen,
    )
    wait_for_training(process)
    return process


def start_script(script: Path, train_dir: Path, experiment: str, *args: str) -> subprocess.Popen:
    """Start a user script that runs ``sfengine.train``, with these options; its output piped (stderr into stdout)."""
    command = [sys.executable, str(script), *train_command(train_dir, experiment, *args)[3:]]
    return start(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def component_processes(process: subprocess.Popen, count: int = 4) -> list[psutil.Process]:
    """The run's processes (the fork server that starts its components among them) once ``count`` components run
    (2 rollout workers, inference and learner by default), or as many as it had when it ended: to check afterwards
    that none outlived it."""
    children, deadline = [], time.time() + 60
    while len(components(children)) < count and time.time() < deadline and process.poll() is None:
        time.sleep(0.2)
        with contextlib.suppress(psutil.NoSuchProcess):
            children = psutil.Process(process.pid).children(recursive=True)
    return children


def components(processes: list[psutil.Process]) -> list[psutil.Process]:
    """The engine's components among ``processes`` (sfe-rollout-0, sfe-inference-0, sfe-learner, ...)."""
    named = []
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            if process.name().startswith("sfe-"):
                named.append(process)
    return named


def running_component(process: subprocess.Popen, name: str) -> psutil.Process | None:
    """The run's component process shown as ``name`` (sfe-rollout-1, sfe-inference-0, sfe-learner), if it runs."""
    with contextlib.suppress(psutil.NoSuchProcess):
        for child in psutil.Process(process.pid).children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                if child.name() == name:
                    return child
    return None


def component(process: subprocess.Popen, name: str) -> psutil.Process:
    """The run's component process shown as ``name``, waiting up to a minute for it to start."""
    deadline = time.time() + 60
    while time.time() < deadline:
        if (found := running_component(process, name)) is not None:
            return found
        time.sleep(0.2)
    raise AssertionError(f"no component process {name}")


def demo(obs: list[np.ndarray], actions: list[np.ndarray], init_state: int = 0) -> Demo:
    steps = len(actions)
    return Demo(
        {"obs": np.array(obs)},
        np.array(actions),
        np.zeros(steps, np.float32),
        np.zeros(steps, np.uint8),
        None,
        0,
        init_state,
    )


def scripted_demos(count: int, noise: float = 0.2) -> DemoSet:
    """Episodes of sparse_reach's scripted demonstrator (full speed toward the goal), with Gaussian noise on each
    action."""
    rng, env, demonstrator, demos = np.random.default_rng(0), SparseReachEnv(), ReachDemonstrator(), []
    for episode in range(count):
        obs, _ = env.reset(seed=1000 + episode)
        observations, actions, done = [], [], False
        while not done:
            action = np.clip(demonstrator.act(env) + noise * rng.standard_normal(2), -1.0, 1.0).astype(np.float32)
            observations.append(obs)
            actions.append(action)
            obs, _, terminated, truncated, _ = env.step(action)
            done = terminated or truncated
        demos.append(demo(observations, actions, init_state=episode))
    return DemoSet("sparse_reach", "state", demos)


def assert_nothing_left(processes: list[psutil.Process], shm_before: set[str]) -> None:
    """No process of the run outlived it (within 15 s) and it left nothing in /dev/shm."""
    _, alive = psutil.wait_procs(processes, timeout=15)
    assert not alive, f"stray processes: {alive}"
    assert leaked_shm(shm_before) == set()


@contextlib.contextmanager
def registered_base(name: str, seed: int):
    """A registered model to put a residual over (``--residual_over=name``): the built-in policy, without a critic,
    for the env's spaces, with random weights of its own (seeded). Unregistered at the end."""
    import torch

    from sfengine.models.actor_critic import MODELS, ActorCritic

    def factory(cfg, obs_spec, action_spec):
        torch.manual_seed(seed)
        model = ActorCritic(obs_spec, action_spec, cfg.model, critic=False)
        with torch.no_grad():
            model.policy_head.weight.normal_()
        return model

    MODELS[name] = factory
    try:
        yield factory
    finally:
        del MODELS[name]
