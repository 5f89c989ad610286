"""``sfengine.evaluate --compare_to``: two evaluations of the same pairs, and McNemar's test of one against the
other."""

from __future__ import annotations

import json
import math

import pytest

from sfengine.config import ConfigError
from sfengine.evaluation.compare import comparison_line, find_results, paired_test


def results(outcomes: dict[tuple[int, int], list[bool]], env: str = "multitask_toy") -> dict:
    episodes = [
        {"task": f"t{task}", "task_index": task, "init_state": init, "success": s, "return": float(s), "length": 5}
        for (task, init), successes in outcomes.items()
        for s in successes
    ]
    return {"env": env, "episodes": episodes}


def test_only_the_pairs_where_exactly_one_succeeded_decide_and_the_test_is_exact():
    before = results({(0, 0): [False], (0, 1): [True], (1, 0): [False], (1, 1): [True], (2, 0): [False]})
    after = results({(0, 0): [True], (0, 1): [True], (1, 0): [True], (1, 1): [False], (2, 0): [False], (3, 0): [True]})
    test = paired_test(before, after)
    # (3, 0) has no counterpart; of the 5 paired, 2 gained and 1 lost: p = 2 x P(X <= 1), X ~ Bin(3, 1/2) = 1.
    assert test == {"pairs": 5, "before": 0.4, "after": 0.6, "gained": 2, "lost": 1, "p_value": 1.0}
    # 12 gained and none lost: p = 2 / 2^12.
    many = paired_test(results({(0, i): [False] for i in range(12)}), results({(0, i): [True] for i in range(12)}))
    assert many["p_value"] == pytest.approx(2 / 2**12) and (many["gained"], many["lost"]) == (12, 0)
    line = comparison_line("clone/results.json", many)
    assert line == (
        "against clone/results.json: success 0.000 -> 1.000 over the same 12 pairs, +100.0 points; "
        "McNemar p = 0.00049 (12 gained, 0 lost)"
    )
    assert "no (task, init state) pair in common" in comparison_line("x", paired_test(results({}), after))


def test_several_episodes_a_pair_are_matched_in_turn():
    # The k-th episode of a pair against the other evaluation's (k mod n)-th: 4 against 2 and 2.
    test = paired_test(results({(0, 0): [True, False]}), results({(0, 0): [False, False, True, True]}))
    assert (test["pairs"], test["gained"], test["lost"]) == (4, 1, 1)
    assert math.isclose(test["before"], 0.5) and math.isclose(test["after"], 0.5)


def test_the_evaluation_to_compare_with_is_found_by_experiment_folder_or_file_or_refused_in_one_line(tmp_path):
    train_dir = tmp_path / "train_dir"
    evaluations = train_dir / "clone" / "eval"
    for name in ("checkpoint_000000001_100", "checkpoint_000000002_200", "checkpoint_000000002_200_sampled"):
        (evaluations / name).mkdir(parents=True)
        (evaluations / name / "results.json").write_text(json.dumps(results({(0, 0): [True]}) | {"name": name}))
    path, found = find_results("clone", str(train_dir), deterministic=True, env="multitask_toy")
    assert found["name"] == "checkpoint_000000002_200" and path == evaluations / found["name"] / "results.json"
    assert find_results("clone", train_dir, False, "multitask_toy")[1]["name"] == "checkpoint_000000002_200_sampled"
    folder = evaluations / "checkpoint_000000001_100"
    assert find_results(str(folder), train_dir, False, "multitask_toy")[0] == folder / "results.json"
    # An evaluation cut short (its --resume not yet run) is passed over for the latest complete one; named by its
    # path it is taken as it is (the test counts the pairs both played).
    cut = evaluations / "checkpoint_000000003_300"
    cut.mkdir()
    (cut / "results.json").write_text(json.dumps(results({(0, 0): [True]}) | {"name": cut.name, "complete": False}))
    assert find_results("clone", train_dir, True, "multitask_toy")[1]["name"] == "checkpoint_000000002_200"
    assert find_results(str(cut), train_dir, True, "multitask_toy")[1]["name"] == cut.name

    (train_dir / "mode_only" / "eval" / "checkpoint_000000001_100").mkdir(parents=True)
    (train_dir / "mode_only" / "eval" / "checkpoint_000000001_100" / "results.json").write_text(
        json.dumps(results({(0, 0): [True]}))
    )
    (train_dir / "cut_only" / "eval" / "checkpoint_000000001_100_sampled").mkdir(parents=True)
    (train_dir / "cut_only" / "eval" / "checkpoint_000000001_100_sampled" / "results.json").write_text(
        json.dumps(results({(0, 0): [True]}) | {"complete": False})
    )
    (tmp_path / "other_env.json").write_text(json.dumps(results({(0, 0): [True]}, env="CartPole-v1")))
    no_success = results({(0, 0): [True]}) | {"episodes": [{"task_index": 0, "init_state": 0, "success": None}]}
    (tmp_path / "no_success.json").write_text(json.dumps(no_success))
    (tmp_path / "garbled.json").write_text("{not json")
    refusals = {
        "nosuch": "no such results.json, and no evaluation of an experiment 'nosuch'",
        "mode_only": "holds no evaluation with sampled actions; evaluate it so (--eval_deterministic=False)",
        "cut_only": "did not complete; finish it (the command that made it, with --resume)",
        str(tmp_path / "other_env.json"): "evaluated env 'CartPole-v1', not 'multitask_toy'",
        str(tmp_path / "no_success.json"): "has no success for every episode",
        str(tmp_path / "garbled.json"): "is not an evaluation's results.json",
    }
    for spec, message in refusals.items():
        with pytest.raises(ConfigError) as caught:
            find_results(spec, train_dir, deterministic=False, env="multitask_toy")
        assert str(caught.value).startswith(f"--compare_to={spec}: ") and message in str(caught.value)
        assert "\n" not in str(caught.value)
