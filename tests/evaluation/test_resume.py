"""What --resume finds of an evaluation cut short: results.json and the ranks' progress files, merged."""

from __future__ import annotations

import json

import pytest

from sfengine.evaluation.resume import load_partial, progress_path

SETTINGS = {"env": "multitask_toy", "policy_version": 7, "deterministic": True, "episodes_per_init": 1}


def rows(*pairs):
    return [{"task_index": t, "init_state": i, "success": True, "return": 1.0, "length": 3} for t, i in pairs]


def test_results_and_every_ranks_progress_are_merged_and_a_file_of_other_settings_is_named(tmp_path):
    with pytest.raises(ValueError, match="no evaluation to resume"):
        load_partial(tmp_path, SETTINGS)
    # Rank 1 alone had written when the ranks were killed.
    rank1 = progress_path(tmp_path, 1, 1.0)
    rank1.write_text(json.dumps(SETTINGS | {"complete": False, "wall_sec": 7.0, "episodes": rows((1, 0), (1, 1))}))
    partial = load_partial(tmp_path, SETTINGS)
    assert [(e.task, e.init_state) for e in partial.episodes] == [(1, 0), (1, 1)] and not partial.complete
    # With rank 0's results.json: both, the longer wall (the ranks ran side by side), never complete.
    results = SETTINGS | {"complete": True, "wall_sec": 5.0, "episodes": rows((0, 0))}
    (tmp_path / "results.json").write_text(json.dumps(results))
    partial = load_partial(tmp_path, SETTINGS)
    assert sorted((e.task, e.init_state) for e in partial.episodes) == [(0, 0), (1, 0), (1, 1)]
    assert (partial.complete, partial.wall_sec, partial.progress_files) == (False, 7.0, [rank1])
    rank1.unlink()
    assert load_partial(tmp_path, SETTINGS).complete
    # A second killed run adds a file of its own (another process and start); one of other settings is named.
    later = progress_path(tmp_path, 1, 2.0)
    assert later != progress_path(tmp_path, 1, 1.0)
    later.write_text(json.dumps(SETTINGS | {"policy_version": 8, "episodes": rows((1, 2))}))
    with pytest.raises(ValueError, match=f"--resume: {later} was made with policy_version=8, this command asks for 7"):
        load_partial(tmp_path, SETTINGS)
