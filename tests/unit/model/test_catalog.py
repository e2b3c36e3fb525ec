"""The shipped catalog index: every name a catalog model answers to, to its file."""

from kvops.model.catalog import catalog, find, index_of, shipped_index, suggestions


def test_the_shipped_index_is_the_one_the_files_give():
    # after adding or renaming a catalog model: python -c "from kvops.model.catalog import write_index; write_index()"
    assert shipped_index() == index_of(catalog())


def test_every_name_finds_its_entry_and_only_the_matching_file_is_read():
    by_file = {entry.file.rsplit("/", 1)[-1]: entry for entry in catalog()}
    for key, file_name in shipped_index().items():
        assert find(key.upper()) is by_file[file_name]
        assert find(f"  {key} ") is by_file[file_name]


def test_unknown_names_find_nothing_and_close_ones_are_suggested():
    assert find("no-such-model") is None
    assert suggestions("lama-3-8") == [
        "meta-llama/Meta-Llama-3-8B",
        "meta-llama/Llama-3.1-8B",
        "meta-llama/Llama-3.2-3B",
    ]
