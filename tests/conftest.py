from pathlib import Path

import pytest

from helpers import kill_started_runs


@pytest.fixture
def train_dir(tmp_path: Path) -> Path:
    return tmp_path / "train_dir"


@pytest.fixture(autouse=True)
def no_run_outlives_its_test():
    """A test that fails half-way (a timeout, an assertion) must not leave a run and its workers behind."""
    yield
    kill_started_runs()
