from pathlib import Path

import pytest

from helpers import kill_started_runs


@pytest.fixture
def train_dir(tmp_path: Path) -> Path:
    return tmp_path / "train_dir"


@pytest.fixture(autouse=True)
def away_from_runs_in_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test in a folder of its own: the options' default --train_dir is ./train_dir, and where the README's
    first command ran in this checkout, its train_dir/default_experiment would be resumed, with its saved options,
    by every command line that names no --train_dir."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(autouse=True)
def no_run_outlives_its_test():
    """A test that fails half-way (a timeout, an assertion) must not leave a run and its workers behind."""
    yield
    kill_started_runs()
