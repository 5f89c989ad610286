"""The hang watch's rules: a worker that has not reported since its latest start is hung past the longer of
--startup_timeout_sec and STARTUP_TIMEOUT_FACTOR times the longest start-up seen so far; a learner, once an update
goes without a gradient step past its timeout, or its start-up past --startup_timeout_sec."""

from __future__ import annotations

import dataclasses
import time

import torch

from sfengine.config import Config
from sfengine.engine.hang_watch import STARTUP_TIMEOUT_FACTOR, HangWatch
from sfengine.engine.supervision import Supervision


@dataclasses.dataclass
class Started:
    """What the watch reads of a worker's process: its name, when it (re)started, whether it runs."""

    name: str
    started_at: float
    alive: bool = True

    def is_alive(self) -> bool:
        return self.alive


def watch_with(startup_timeout_sec: float) -> HangWatch:
    cfg = Config()
    cfg = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, startup_timeout_sec=startup_timeout_sec))
    return HangWatch(cfg, splits=None)


def test_a_start_up_longer_than_the_option_and_the_slowest_so_far_is_hung():
    watch, now = watch_with(10.0), time.monotonic()
    first = Started("rollout_worker_0_process", now - 50)
    watch.up_since["rollout_worker_0"] = now - 30  # it took 20 s to start
    late = Started("rollout_worker_1_process", now - STARTUP_TIMEOUT_FACTOR * 20 + 1)
    assert watch.startup_hung([first, late]) is None  # within 3x the 20 s worker 0 took, though past 10 s
    late.started_at -= 2
    name, description = watch.startup_hung([first, late])
    assert name == "rollout_worker_1"
    assert "over its timeout of 60.0 s" in description and "longest start-up so far, 20.0 s" in description
    late.alive = False  # a dead one is the death watch's, not this one's
    assert watch.startup_hung([first, late]) is None


def test_the_option_sets_the_timeout_until_a_worker_has_started_and_zero_turns_it_off():
    now = time.monotonic()
    starting = [Started("inference_worker_0_process", now - 11), Started("learner_process", now - 1000)]
    assert watch_with(10.0).startup_hung(starting)[0] == "inference_worker_0"  # the learner is not a worker
    assert watch_with(12.0).startup_hung(starting) is None
    assert watch_with(0.0).startup_hung(starting) is None


def test_a_respawned_worker_is_in_its_start_up_again_until_it_reports():
    watch, now = watch_with(5.0), time.monotonic()
    worker = Started("rollout_worker_0_process", now - 1)
    watch.heard_from("rollout_worker_0")  # up within a second
    assert watch.startup_hung([worker]) is None
    watch.forget("rollout_worker_0")  # respawned: its successor starts
    worker.started_at = now - 6
    assert watch.startup_hung([worker])[0] == "rollout_worker_0"
    watch.heard_from("rollout_worker_0")
    assert watch.startup_hung([worker]) is None


def test_a_learner_update_is_hung_only_once_it_goes_without_a_gradient_step_past_its_timeout():
    # [update began, longest update so far, in its start-up, latest gradient step]: a starved learner's update can
    # last far past the timeout and still be stepping.
    clock = torch.zeros(4, dtype=torch.float64)
    watch = HangWatch(Config(), splits=None, learner_clock=clock)  # --hang_timeout_sec 120
    now = time.time()
    clock[:] = torch.tensor([now - 500, 2.0, 0.0, now - 1], dtype=torch.float64)  # 500 s in, stepping: slow, not hung
    assert watch.learner_hung() is None
    clock[3] = now - 200  # no gradient step for 200 s, over max(120, 10 x 2 s)
    stuck = watch.learner_hung()
    assert stuck is not None and "inside one update or save for 500 s, 200 s of it without a gradient step" in stuck
    clock[:] = torch.tensor(
        [now - 130, 20.0, 0.0, 0.0], dtype=torch.float64
    )  # a save (no steps) within 10x its longest, 200 s
    assert watch.learner_hung() is None
    clock[:] = torch.tensor(
        [now - 130, 0.0, 1.0, 0.0], dtype=torch.float64
    )  # a start-up: --startup_timeout_sec (600) applies
    assert watch.learner_hung() is None
    clock[0] = now - 601
    assert "in its start-up" in watch.learner_hung()


def test_silences_begun_with_a_respawned_workers_count_again_from_its_respawn():
    # An inference worker frozen holding an inbox blocks a rollout worker writing to it, whose last report may be up
    # to a second older; once the frozen one is respawned the writer is free, and must not be named before its next
    # report reaches the runner. A silence begun well before the frozen one's is the silent worker's own.
    cfg = Config()
    watch = HangWatch(dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, hang_timeout_sec=10)), splits=None)
    now = time.monotonic()
    watch.last_heard = {"inference_worker_0": now - 30, "rollout_worker_0": now - 31, "rollout_worker_1": now - 60}
    supervision = type("Watched", (Supervision,), {})()
    frozen = Started("inference_worker_0_process", now - 100)
    supervision.hang_watch, supervision.reported, supervision.processes = watch, {"inference_worker_0"}, [frozen]
    supervision.respawner = type("Respawning", (), {"respawn": lambda self, process, processes: []})()
    announced = []
    supervision.inference_respawned = type("Signal", (), {"emit": lambda self, index: announced.append(index)})()
    supervision._respawn(frozen)
    assert announced == [0]
    assert "inference_worker_0" not in watch.last_heard  # watched again from its successor's first report
    assert watch.silent_for("rollout_worker_0") < 1 and watch.silent_for("rollout_worker_1") > 59
    assert watch.silent() == ["rollout_worker_1"]
    # The death of one that was reporting (a crash, a chaos kill) blocked no one: silences go on, also one begun
    # just before it (restarted at every such respawn, a hung worker's would never pass the timeout).
    now = time.monotonic()
    watch.last_heard |= {"inference_worker_0": now - 0.5, "rollout_worker_0": now - 1.5}
    supervision._respawn(frozen)
    assert watch.silent_for("rollout_worker_0") >= 1.5 and watch.silent() == ["rollout_worker_1"]
