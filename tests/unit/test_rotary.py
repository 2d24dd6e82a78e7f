"""The rotary cos/sin table: built for the positions the engine serves, resized exactly."""

import pytest
import torch

from engine.layers.rotary import RotaryEmbedding

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}


@pytest.mark.parametrize("scaling", [None, LLAMA3, {"rope_type": "linear", "factor": 2.0}])
@pytest.mark.parametrize("n", [1, 7, 672, 1000])
def test_a_table_of_n_positions_is_the_first_rows_of_a_longer_one(scaling, n):
    full = RotaryEmbedding(64, 8192, 100000.0, scaling)
    short = RotaryEmbedding(64, n, 100000.0, scaling)
    assert short.max_position == n
    assert torch.equal(short.cos_sin_cache, full.cos_sin_cache[:n])


def test_resize_shrinks_and_grows_exactly():
    full = RotaryEmbedding(64, 4096, 10000.0, None).cos_sin_cache
    rot = RotaryEmbedding(64, 4096, 10000.0, None)
    rot.resize(672)
    assert rot.max_position == 672 and torch.equal(rot.cos_sin_cache, full[:672])
    assert rot.cos_sin_cache.untyped_storage().nbytes() == 672 * 64 * 4  # a copy: the dropped rows are freed
    rot.resize(2000)
    assert rot.max_position == 2000 and torch.equal(rot.cos_sin_cache, full[:2000])
    rot.resize(2000)
    assert rot.max_position == 2000
    assert "cos_sin_cache" not in rot.state_dict()  # still the non-persistent buffer
    assert dict(rot.named_buffers())["cos_sin_cache"] is rot.cos_sin_cache
