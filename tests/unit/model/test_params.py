"""Parameter counts from the config's architecture against the published counts in the catalog."""

import pytest

from kvops.model.catalog import catalog
from kvops.model.config import spec_from_config

# Published totals that hold what the count does not: stored rotary buffers (Llama 2), FP8 block scales
# (DeepSeek-V3: its F32 tensors are 41,540,496 scale values and 15,104 routing biases; the R1 figure of the same
# architecture is the count exactly), an unexplained 13,880,064 above MiniMax-M2/M2.1/M2.7 of the same shape
# (MiniMax-M2.5).
BEYOND_THE_COUNT = {"deepseek-ai/DeepSeek-V3": 1e-4, "MiniMaxAI/MiniMax-M2.5": 1e-4}
PUBLISHED = [entry for entry in catalog() if entry.parameters]


@pytest.mark.parametrize("entry", PUBLISHED, ids=lambda entry: entry.id)
def test_counted_parameters_match_published(entry):
    spec = spec_from_config(entry.config, name=entry.id, source="catalog", where=entry.file)
    counted = spec.checkpoint_parameters
    if entry.tied_lm_head_stored:
        counted += spec.vocab_size * spec.hidden_size
    tolerance = BEYOND_THE_COUNT.get(entry.id, 1e-6)
    assert abs(counted - entry.parameters) / entry.parameters <= tolerance
    assert counted <= entry.parameters


def test_most_catalog_entries_have_a_published_count():
    assert len(PUBLISHED) >= 0.8 * len(catalog())


@pytest.mark.parametrize("entry", catalog(), ids=lambda entry: entry.id)
def test_every_entry_names_its_sources(entry):
    assert entry.config_source and entry.parameters_source


def test_what_the_engine_does_not_load_is_left_out():
    """MTP layers and a stored copy of tied embeddings are in the published total, not in the loaded weights."""
    by_id = {entry.id: entry for entry in catalog()}
    r1 = by_id["deepseek-ai/DeepSeek-R1"]
    spec = spec_from_config(r1.config, name=r1.id, source="catalog", where=r1.file, parameters=r1.parameters)
    assert spec.mtp_parameters > 10**10
    assert spec.parameters == r1.parameters - spec.mtp_parameters
    small = by_id["Qwen/Qwen3-0.6B"]
    spec = spec_from_config(
        small.config,
        name=small.id,
        source="catalog",
        where=small.file,
        parameters=small.parameters,
        stored_tied_head=True,
    )
    assert spec.parameters == small.parameters - spec.vocab_size * spec.hidden_size
