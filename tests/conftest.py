from pathlib import Path

import pytest

from helpers import kill_started_runs


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which turns the groups into node ids
def pytest_collection_modifyitems(items):
    """Under ``pytest -n 2 --dist loadgroup`` (the README's test command) the tests that start runs (``slow``) go
    to one worker, one after another as without xdist, so none competes with another for the cores; the quick
    ones (units, commands refused at once) spread over the other worker meanwhile."""
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(pytest.mark.xdist_group("runs"))


@pytest.fixture
def train_dir(tmp_path: Path) -> Path:
    return tmp_path / "train_dir"


@pytest.fixture(autouse=True)
def no_run_outlives_its_test():
    """A test that fails half-way (a timeout, an assertion) must not leave a run and its workers behind."""
    yield
    kill_started_runs()
