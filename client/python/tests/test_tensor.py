"""Tensor conversion: dtypes, shapes, zero-copy views, errors."""
import numpy as np
import pytest

import statecache as sc
from statecache import tensor as st


def test_fp32_roundtrip_is_a_view():
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    t = sc.to_tensor(a)
    assert t.dtype == st.FP32 and list(t.shape) == [2, 3, 4]
    assert t.data == a.tobytes()
    data = t.data
    b = st.to_numpy(type(t)(dtype=t.dtype, shape=t.shape, data=data))
    np.testing.assert_array_equal(a, b)
    assert not b.flags.writeable  # a view of the message bytes, not a copy
    assert b.base is not None and bytes(b.base) == data


def test_fp16_and_explicit_dtype():
    a = np.linspace(-2, 2, 64, dtype=np.float16).reshape(4, 16)
    t = sc.to_tensor(a)
    assert t.dtype == st.FP16 and len(t.data) == 128
    np.testing.assert_array_equal(st.to_numpy(t), a)
    with pytest.raises(sc.InvalidArgument, match="q: array of float16 cannot be sent as fp32"):
        sc.to_tensor(a, "fp32", "q")


def test_bf16_bits():
    x = np.array([1.0, -2.5, 3.140625, 0.0, 65280.0], np.float32)
    bits = st.bf16_bits(x)
    assert bits.dtype == np.uint16
    assert bits[0] == 0x3F80 and bits[1] == 0xC020
    t = sc.to_tensor(bits, "bf16", "q")
    assert t.dtype == st.BF16 and list(t.shape) == [5]
    np.testing.assert_array_equal(st.to_numpy(t), x)  # all exactly representable
    np.testing.assert_array_equal(st.to_numpy(t, bf16_as="uint16"), bits)
    # round to nearest even at the bf16 boundary
    assert st.bf16_bits(np.array([1.0 + 2**-8], np.float32))[0] == 0x3F80
    assert st.bf16_bits(np.array([1.0 + 3 * 2**-8], np.float32))[0] == 0x3F82
    assert st.bf16_bits(np.array([np.nan], np.float32))[0] == 0x7FC0


def test_uint16_without_bf16_dtype_is_rejected():
    with pytest.raises(sc.InvalidArgument, match="v: numpy uint16 is not float32 or float16"):
        sc.to_tensor(np.zeros(4, np.uint16), name="v")


@pytest.mark.parametrize("x", [np.zeros(3, np.float64), np.zeros(3, np.int32),
                               np.zeros(3, np.int64), [0.0, 1.0], 1.5, "q"])
def test_unsupported_inputs_are_invalid_argument_naming_it(x):
    with pytest.raises(sc.InvalidArgument) as e:
        sc.to_tensor(x, name="g", method="update")
    assert e.value.message.startswith("g: ") and e.value.method == "update"
    assert isinstance(e.value, ValueError)  # `except ValueError` keeps working


def test_non_contiguous_and_big_endian_inputs():
    a = np.arange(32, dtype=np.float32).reshape(4, 8)
    t = sc.to_tensor(a.T)  # Fortran order: made C-contiguous
    np.testing.assert_array_equal(st.to_numpy(t), a.T)
    be = a.astype(">f4")
    t = sc.to_tensor(be)
    assert t.data == a.tobytes()  # little-endian on the wire
    assert t.dtype == st.FP32


def test_tensor_data_passthrough_and_size_check():
    raw = np.ones((2, 3), np.float32).tobytes()
    t = sc.to_tensor(sc.TensorData(raw, "fp32", (2, 3)))
    assert t.data == raw and list(t.shape) == [2, 3]
    with pytest.raises(sc.InvalidArgument, match=r"beta: 24 bytes, shape \(2, 4\) needs 32"):
        sc.to_tensor(sc.TensorData(raw, "fp32", (2, 4)), name="beta")
    with pytest.raises(sc.InvalidArgument, match="dtype: 'int8'"):
        sc.to_tensor(sc.TensorData(raw, "int8", (6,)))


def test_empty_tensor_is_none():
    assert st.to_numpy(None) is None
    assert st.to_numpy(st.pb2().Tensor()) is None


def test_numpy_outputs_stay_numpy_and_to_torch_accepts_arrays():
    """output() keeps numpy for numpy callers (the torch side of the
    contract is tests/torch_check.py, run where torch is installed)."""
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = sc.to_tensor(a)
    out = st.output(t, like=np.zeros(1, np.float32))
    assert isinstance(out, np.ndarray) and not out.flags.writeable
    np.testing.assert_array_equal(out, a)
    assert isinstance(st.output(t), np.ndarray)


def test_ml_dtypes_bfloat16_array():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = np.array([[1.0, -2.5], [0.15625, 3.0]], np.float32)
    a = x.astype(ml_dtypes.bfloat16)
    t = sc.to_tensor(a, name="q")
    assert t.dtype == st.BF16 and list(t.shape) == [2, 2]
    np.testing.assert_array_equal(st.to_numpy(t, bf16_as="uint16"), st.bf16_bits(x))
    np.testing.assert_array_equal(st.to_numpy(t), x)


def test_is_torch_of_messages_and_arrays():
    # A response Tensor message (its class's __module__ is None on protobuf 7)
    # is not a torch tensor: to_torch(message) goes on to decode it.
    assert not st.is_torch(sc.to_tensor(np.zeros(2, np.float32)))
    assert not st.is_torch(np.zeros(2, np.float32))
    assert not st.is_torch(None)
