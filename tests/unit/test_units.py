import pytest

from kvops.errors import UsageError
from kvops.units import format_bytes, parse_bytes


@pytest.mark.parametrize(
    "text, expected",
    [
        ("24GiB", 24 << 30),
        ("24 GiB", 24 << 30),
        ("80GB", 80 * 10**9),
        ("512MiB", 512 << 20),
        ("4096", 4096),
        ("1.5GiB", 3 << 29),
        ("17.8GiB", 19112604467),
        ("20G", 20 << 30),  # vLLM's human_readable_int: an upper-case letter is binary
        ("20g", 20 * 10**9),  # a lower-case one decimal
        ("512M", 512 << 20),
        ("20gb", 20 * 10**9),
    ],
)
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "12 parsecs", "-1GiB", "0", "1..2GiB"])
def test_parse_bytes_rejects_with_one_line(text):
    with pytest.raises(UsageError) as caught:
        parse_bytes(text, "--gpu-memory")
    assert "--gpu-memory" in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "value, text",
    [
        (131072, "128 KiB"),
        (1 << 20, "1 MiB"),
        (3 << 29, "1.5 GiB"),
        (1000, "1000 B"),
        (19112604467, "~17.8 GiB"),
        (2 << 40, "2 TiB"),
    ],
)
def test_format_bytes_marks_rounding(value, text):
    assert format_bytes(value) == text


@pytest.mark.parametrize(
    "text, expected",
    [("32K", 32768), ("32k", 32000), ("1M", 1 << 20), ("1m", 10**6), ("25.6k", 25600), ("131072", 131072)],
)
def test_counts_as_vllm_parses_them(text, expected):
    from kvops.units import parse_count

    assert parse_count(text, "--max-model-len") == expected


@pytest.mark.parametrize("text", ["1.5K", "0", "-5", "32 KB", "lots"])
def test_counts_vllm_would_refuse(text):
    from kvops.units import parse_count

    with pytest.raises(UsageError, match="--max-model-len"):
        parse_count(text, "--max-model-len")
