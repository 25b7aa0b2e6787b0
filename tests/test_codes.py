import numpy as np
import pytest

from dhim_ray.codes import bytes_to_codes, check_codes, check_n_bits, codes_to_bytes, pack_codes, unpack_codes
from dhim_ray.errors import CodeFormatError, ConfigError


def test_pack_unpack_round_trip_msb_first():
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2, size=(50, 64), dtype=np.uint8)
    codes = pack_codes(bits)
    assert codes.dtype == np.uint8 and codes.shape == (50, 8)
    assert np.array_equal(unpack_codes(codes, 64), bits)
    # most significant bit first: bit 0 set -> first byte 0b10000000
    one = np.zeros((1, 8), dtype=np.uint8)
    one[0, 0] = 1
    assert pack_codes(one)[0, 0] == 128


def test_bytes_round_trip_and_length_check():
    codes = pack_codes(np.random.default_rng(1).integers(0, 2, (5, 32)))
    rows = codes_to_bytes(codes, 32)
    assert all(isinstance(r, bytes) and len(r) == 4 for r in rows)
    assert np.array_equal(bytes_to_codes(rows, 32), codes)
    with pytest.raises(CodeFormatError, match="code 1 has 3 bytes: expected 4"):
        bytes_to_codes([rows[0], rows[1][:3]], 32)


@pytest.mark.parametrize(
    "bad, message",
    [
        (np.zeros((2, 8), dtype=np.int64), "dtype int64"),
        (np.zeros(8, dtype=np.uint8), "expected 2-D"),
        (np.zeros((2, 7), dtype=np.uint8), "56 bits .* expected 64 bits"),
        ([[0, 1]], "type list"),
    ],
)
def test_check_codes_refuses_bad_codes(bad, message):
    with pytest.raises(CodeFormatError, match=message):
        check_codes(bad, 64)


@pytest.mark.parametrize("bits", [0, 4, 100, 2048, 1032, -8])
def test_bad_bit_lengths(bits):
    with pytest.raises(ConfigError, match=f"n_bits={bits}: must be a multiple of 8 between 8 and 1024"):
        check_n_bits(bits)


def test_good_bit_lengths():
    assert [check_n_bits(b) for b in (8, 16, 64, 1024)] == [8, 16, 64, 1024]
