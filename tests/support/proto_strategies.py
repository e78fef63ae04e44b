"""Hypothesis strategies built from protobuf descriptors: random and malformed requests.

Every field gets values of its wire type that a careless or hostile client might send:
empty, huge, negative, unknown enum numbers, odd unicode, wrong-length bytes, nested
messages (depth-limited) and repeated fields of varying length.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

_INT32 = st.one_of(st.integers(-(2**31), 2**31 - 1), st.sampled_from([0, 1, -1, 16, 65536, 2**31 - 1]))
_INT64 = st.one_of(st.integers(-(2**63), 2**63 - 1), st.sampled_from([0, 1, -1, 2**40]))
_UINT = st.integers(0, 2**32 - 1)
_TEXT = st.one_of(
    st.just(""),
    st.text(max_size=40),
    st.text(alphabet="abcdef-0123456789", min_size=1, max_size=20),
    st.sampled_from(["a" * 300, " ", "\x00", "tenant/../x", "' OR 1=1 --", "é€𝄞", "c" * 257]),
)
_BYTES = st.one_of(st.binary(max_size=70), st.sampled_from([b"", b"x" * 16, b"y" * 32, b"z" * 15]))
_DOUBLE = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -1.0, 5.0, 1e18]))


def _scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    t = field.type
    if t in (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SFIXED32):
        return _INT32
    if t in (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64, FieldDescriptor.TYPE_SFIXED64):
        return _INT64
    if t in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32):
        return _UINT
    if t in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64):
        return st.integers(0, 2**64 - 1)
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return _DOUBLE if t == FieldDescriptor.TYPE_DOUBLE else st.floats(width=32)
    if t == FieldDescriptor.TYPE_STRING:
        return _TEXT
    if t == FieldDescriptor.TYPE_BYTES:
        return _BYTES
    if t == FieldDescriptor.TYPE_ENUM:
        known = [v.number for v in field.enum_type.values]
        return st.one_of(st.sampled_from(known), st.integers(-5, 50))
    raise TypeError(f"unsupported field type {t}")


def messages(descriptor: Descriptor, cls: type[Message], depth: int = 3) -> st.SearchStrategy[Message]:
    """Random instances of `cls` (whose descriptor is `descriptor`)."""

    @st.composite
    def build(draw: st.DrawFn) -> Message:
        msg = cls()
        for field in descriptor.fields:
            if not draw(st.booleans()):
                continue
            is_message = field.type == FieldDescriptor.TYPE_MESSAGE
            if is_message and (depth <= 0 or field.message_type.full_name.startswith("google.protobuf.")):
                continue
            if field.is_repeated:
                count = draw(st.integers(0, 4))
                target = getattr(msg, field.name)
                for _ in range(count):
                    if is_message:
                        sub_cls = type(target.add())
                        target.pop()
                        target.append(draw(messages(field.message_type, sub_cls, depth - 1)))
                    else:
                        target.append(draw(_scalar(field)))
            elif is_message:
                sub = getattr(msg, field.name)
                sub.CopyFrom(draw(messages(field.message_type, type(sub), depth - 1)))
            else:
                setattr(msg, field.name, draw(_scalar(field)))
        return msg

    return build()
