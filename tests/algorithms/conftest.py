"""The algorithm tests parse configurations with the default --train_dir and --experiment: run each in a folder of
its own, so that a run of the README's main job in the checkout (train_dir/default_experiment, which a later
parse would resume with its saved PPO settings) does not leak into them."""

import pytest


@pytest.fixture(autouse=True)
def own_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
