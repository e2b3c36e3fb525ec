"""The architecture-defaults table against the installed transformers' configuration classes."""

import pytest

from kvops.model.defaults import ARCHITECTURE_DEFAULTS

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURE_DEFAULTS))
def test_defaults_match_transformers(model_type):
    from transformers import CONFIG_MAPPING

    config = CONFIG_MAPPING[model_type]()
    for key, value in ARCHITECTURE_DEFAULTS[model_type].items():
        if key == "sliding_window_pattern":  # transformers 5 expands it into layer_types
            kinds = config.layer_types
            assert [kinds[i] == "full_attention" for i in range(len(kinds))] == [
                (i + 1) % value == 0 for i in range(len(kinds))
            ]
            continue
        assert getattr(config, key) == value, f"{model_type}.{key}"
