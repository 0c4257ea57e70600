"""Tinker's column of the feature table (its documented loss menu and the cookbook's KL metrics), beside SkyRL's
and ms-swift's."""

from benchmarks.references import features, tinker


def test_feature_table_has_the_new_columns_and_tinkers_menu():
    text = features.feature_report([])
    header = next(line for line in text.splitlines() if line.startswith("| name | this suite |"))
    for heading in ("SkyRL 0.4.0", "ms-swift 4.6.0", "Tinker (docs)"):
        assert heading in header
    kl_row = next(line for line in text.splitlines() if line.startswith("| `k1` |"))
    assert "kl_sample_train_v1" in kl_row
    assert "(importance_sampling)" in text and "(dro)" in text
    assert set(tinker.POLICY_LOSSES_THEIRS_ONLY) >= {"importance_sampling", "dro"}
