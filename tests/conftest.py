from pathlib import Path

import pytest


@pytest.fixture
def train_dir(tmp_path: Path) -> Path:
    return tmp_path / "train_dir"
