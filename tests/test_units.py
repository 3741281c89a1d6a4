"""Memory sizes and durations as users type them."""

from __future__ import annotations

import pytest

from autotune._units import format_mb, parse_duration_s, parse_memory_mb
from autotune.errors import ConfigError


@pytest.mark.parametrize("text, mb", [
    ("12GiB", 12288.0),
    ("12gib", 12288.0),
    (" 2 GiB ", 2048.0),
    ("800MiB", 800.0),
    ("800MB", 800e6 / 2**20),
    ("800m", 800.0),  # bare letters are binary
    ("1.5g", 1.5 * 1024),  # a bare letter is binary, like docker's 8g
    ("2GB", 2e9 / 2**20),
    ("1TiB", 1024.0 * 1024),
    ("1T", 1024.0 * 1024),
    ("512KiB", 0.5),
    ("1048576B", 1.0),
    ("1048576b", 1.0),
    (".5GiB", 512.0),
    ("512", 512.0),
    ("1.5", 1.5),
    (512, 512.0),
    (1.5, 1.5),
])
def test_parse_memory_mb(text, mb):
    assert parse_memory_mb(text) == pytest.approx(mb)


@pytest.mark.parametrize("text", ["lots", "12XB", "", "GiB", "-5GiB", "1e3", "12 GiB extra", "1,5GiB", True])
def test_parse_memory_mb_rejects_garbage(text):
    with pytest.raises(ConfigError, match="does not parse"):
        parse_memory_mb(text)


@pytest.mark.parametrize("text", ["0", "0GiB", 0, -1])
def test_parse_memory_mb_rejects_non_positive(text):
    with pytest.raises(ConfigError, match="must be positive"):
        parse_memory_mb(text)


def test_parse_memory_mb_names_the_option():
    with pytest.raises(ConfigError) as info:
        parse_memory_mb("plenty", what="--memory-cap")
    assert str(info.value).startswith("--memory-cap 'plenty' does not parse")
    assert "12GiB" in str(info.value)  # says how to write it


@pytest.mark.parametrize("text, seconds", [
    ("8h", 8 * 3600.0),
    ("1h30m", 5400.0),
    ("1h 30m", 5400.0),
    ("90s", 90.0),
    ("90sec", 90.0),
    ("20m", 1200.0),
    ("20min", 1200.0),
    ("2d", 2 * 86400.0),
    ("1.5h", 5400.0),
    ("90", 90.0),
    ("  10M ", 600.0),
    (45, 45.0),
    (0.5, 0.5),
])
def test_parse_duration_s(text, seconds):
    assert parse_duration_s(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["soon", "", "h", "10x", "5 minutes", "-5s", "1h-30m", "1..5s", "ten s"])
def test_parse_duration_s_rejects_garbage(text):
    with pytest.raises(ConfigError):
        parse_duration_s(text)


@pytest.mark.parametrize("text", ["0s", "0", 0, -3])
def test_parse_duration_s_rejects_non_positive(text):
    with pytest.raises(ConfigError, match="must be positive"):
        parse_duration_s(text)


def test_parse_duration_s_names_the_option():
    with pytest.raises(ConfigError, match=r"^--trial-timeout 'soon' does not parse"):
        parse_duration_s("soon", what="--trial-timeout")
    with pytest.raises(ConfigError, match="unknown unit 'weeks'"):
        parse_duration_s("2weeks", what="--timeout")


def test_a_bare_number_needs_a_unit_where_asked():
    assert parse_duration_s("5") == 5.0  # the Python API: seconds
    with pytest.raises(ConfigError, match=r"^--timeout '5' has no unit: write 5s, 5m or 5h$"):
        parse_duration_s("5", what="--timeout", require_unit=True)
    assert parse_duration_s("5m", require_unit=True) == 300.0


def test_parse_duration_s_rejects_two_decimal_points():
    with pytest.raises(ConfigError):
        parse_duration_s("1.2.3s")


def test_format_mb():
    assert format_mb(None) == "-"
    assert format_mb(512) == "512 MiB"
    assert format_mb(1023.4) == "1023 MiB"
    assert format_mb(1024) == "1.00 GiB"
    assert format_mb(1536) == "1.50 GiB"


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_parse_memory_mb_rejects_non_finite_numbers(value):
    with pytest.raises(ConfigError):
        parse_memory_mb(value)


def test_a_first_window_is_warm_up_only_outside_the_later_windows_range_widened_by_the_tolerance():
    from autotune.measure import window_settled

    later = [100.0, 120.0]  # the later windows' own spread is the yardstick: 90 ... 132 at 10%
    assert window_settled(90.0, later, 0.10) and window_settled(132.0, later, 0.10)
    assert not window_settled(89.0, later, 0.10)  # slow: a late allocation, a recompile
    assert not window_settled(133.0, later, 0.10)  # fast: prefetched batches running out after it
    assert window_settled(50.0, [], 0.10)  # nothing to judge it by
