"""Element types: ONNX TensorProto data types with short names, bit widths and numpy dtypes."""

from __future__ import annotations

import enum

import numpy as np
from onnx import TensorProto, helper

# Short names keep the printed IR compact: `%y<f32[1,64]>`.
_SHORT_NAMES = {
    "FLOAT": "f32", "UINT8": "u8", "INT8": "i8", "UINT16": "u16", "INT16": "i16",
    "INT32": "i32", "INT64": "i64", "STRING": "str", "BOOL": "bool", "FLOAT16": "f16",
    "DOUBLE": "f64", "UINT32": "u32", "UINT64": "u64", "COMPLEX64": "c64",
    "COMPLEX128": "c128", "BFLOAT16": "bf16", "FLOAT8E4M3FN": "f8e4m3fn",
    "FLOAT8E4M3FNUZ": "f8e4m3fnuz", "FLOAT8E5M2": "f8e5m2", "FLOAT8E5M2FNUZ": "f8e5m2fnuz",
    "UINT4": "u4", "INT4": "i4", "FLOAT4E2M1": "f4e2m1", "FLOAT8E8M0": "f8e8m0",
    "UINT2": "u2", "INT2": "i2", "FLOAT6E2M3": "f6e2m3", "FLOAT6E3M2": "f6e3m2",
}

_BITS = {
    "f32": 32, "u8": 8, "i8": 8, "u16": 16, "i16": 16, "i32": 32, "i64": 64, "bool": 8,
    "f16": 16, "f64": 64, "u32": 32, "u64": 64, "c64": 64, "c128": 128, "bf16": 16,
    "f8e4m3fn": 8, "f8e4m3fnuz": 8, "f8e5m2": 8, "f8e5m2fnuz": 8, "u4": 4, "i4": 4,
    "f4e2m1": 4, "f8e8m0": 8, "u2": 2, "i2": 2, "f6e2m3": 6, "f6e3m2": 6,
}


class DType(enum.IntEnum):
    """An ONNX element type; the integer value is TensorProto's."""

    UNDEFINED = 0
    FLOAT = 1
    UINT8 = 2
    INT8 = 3
    UINT16 = 4
    INT16 = 5
    INT32 = 6
    INT64 = 7
    STRING = 8
    BOOL = 9
    FLOAT16 = 10
    DOUBLE = 11
    UINT32 = 12
    UINT64 = 13
    COMPLEX64 = 14
    COMPLEX128 = 15
    BFLOAT16 = 16
    FLOAT8E4M3FN = 17
    FLOAT8E4M3FNUZ = 18
    FLOAT8E5M2 = 19
    FLOAT8E5M2FNUZ = 20
    UINT4 = 21
    INT4 = 22
    FLOAT4E2M1 = 23
    FLOAT8E8M0 = 24
    UINT2 = 25
    INT2 = 26
    FLOAT6E2M3 = 27
    FLOAT6E3M2 = 28

    @property
    def short(self) -> str:
        return _SHORT_OF[self]

    @property
    def bits(self) -> int:
        """Bits per element; strings have no fixed width and report 0."""
        return _BITS_OF[self]

    @property
    def numpy(self) -> np.dtype:
        return np.dtype(helper.tensor_dtype_to_np_dtype(int(self)))

    @property
    def is_float(self) -> bool:
        return self.short.startswith(("f", "bf"))

    @property
    def is_integer(self) -> bool:
        return self.short[0] in "iu" and self.short != "bool"

    @classmethod
    def from_numpy(cls, dtype) -> "DType":
        return cls(helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))

    @classmethod
    def from_short(cls, short: str) -> "DType":
        for member in cls:
            if member.short == short:
                return member
        raise KeyError(short)


# Per member, looked up by value: `self.name` goes through the enum machinery, and every
# tensor size asks for its element's bits (memory planning, export, cost models).
_SHORT_OF = {m: _SHORT_NAMES.get(m.name, m.name.lower()) for m in DType}
_BITS_OF = {m: _BITS.get(_SHORT_OF[m], 0) for m in DType}


def nbytes(dtype: DType, num_elements: int) -> int:
    """Storage bytes of `num_elements` packed elements (sub-byte types round up)."""
    return (dtype.bits * num_elements + 7) // 8


assert all(hasattr(TensorProto, m.name) for m in DType)
