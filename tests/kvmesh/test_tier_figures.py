"""``kvmesh.tier_figures``: what a ``TierStats`` implies, total on empty tiers."""
from __future__ import annotations

import pytest

from kvmesh import tier_figures as tf
from kvmesh.tier_figures import TierStats


def test_figures_of_a_busy_tier():
    t = TierStats(tier="cpu", capacity_blocks=400, cached_blocks=100, hit_tokens=200,
                  onboard_blocks=4, onboard_seconds=0.002, index_promised_tokens=64,
                  index_missed_tokens=16)
    assert tf.load_factor(t) == 0.25 and tf.hit_rate(t, 1000) == 0.2
    assert tf.kept_share(t) == 0.75 and tf.onboard_s_per_block(t) == 0.0005


def test_an_empty_tier_reads_as_no_data_not_as_a_failure():
    t = TierStats(tier="disk")
    assert tf.load_factor(t) == 0.0 and tf.hit_rate(t, 0) == 0.0
    assert tf.kept_share(t) is None and tf.onboard_s_per_block(t) is None


def test_a_dict_of_the_fields_reads_back_into_the_message():
    t = TierStats(tier="gpu", capacity_blocks=8, cached_blocks=2)
    assert tf.tier_stats({"tier": "gpu", "capacity_blocks": 8, "cached_blocks": 2}) == t
    assert tf.tier_stats(t) is t
    with pytest.raises(ValueError):
        tf.tier_stats({"tier": "gpu", "load": 1})
