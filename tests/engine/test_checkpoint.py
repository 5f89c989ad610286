"""Checkpoint files: one that cannot be read is one line that says so, wherever it was cut."""

from __future__ import annotations

import pytest
import torch

from sfengine.engine.checkpoint import CheckpointError, load_checkpoint


@pytest.mark.parametrize("kept", [0.005, 0.5, 0.999])
def test_a_checkpoint_cut_short_anywhere_is_named_damaged(tmp_path, kept):
    # Cut inside its entries, torch's reader failed a seek ("[Errno 22] Invalid argument"), which named nothing.
    whole = tmp_path / "whole.pt"
    torch.save({"format_version": 1, "model": {"weight": torch.zeros(250_000)}}, whole)
    data = whole.read_bytes()
    cut = tmp_path / "checkpoint_000000001_100.pt"
    cut.write_bytes(data[: int(len(data) * kept)])
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(cut)
    assert "(not a checkpoint file: damaged, cut short, or never one)" in str(info.value)
    assert "\n" not in str(info.value)
