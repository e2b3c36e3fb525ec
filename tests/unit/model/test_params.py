"""Parameter counts from the config's architecture against the published counts in the catalog."""

import pytest

from kvops.model.catalog import catalog
from kvops.model.config import spec_from_config

# Published totals that hold more than the language model: the vision tower (Gemma 3), the multi-token-
# prediction module and fp8 scales (DeepSeek-V3), stored rotary buffers (Llama 2).
BEYOND_THE_TEXT_MODEL = {"google/gemma-3-12b-it": 0.04, "deepseek-ai/DeepSeek-V3": 0.025}


@pytest.mark.parametrize("entry", catalog(), ids=lambda entry: entry.id)
def test_counted_parameters_match_published(entry):
    counted = spec_from_config(entry.config, name=entry.id, source="catalog", where=entry.file).parameters
    tolerance = BEYOND_THE_TEXT_MODEL.get(entry.id, 1e-6)
    assert abs(counted - entry.parameters) / entry.parameters <= tolerance
    assert counted <= entry.parameters
