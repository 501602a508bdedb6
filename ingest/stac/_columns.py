"""Which Arrow type a column of decoded JSON values takes, if one holds every value exactly.

A column is typed only when its values come back as they went in: scalars of
one kind (integers widen to doubles beside floats, unless a double cannot
hold one), and objects or lists whose Arrow struct/list form decodes back to
them once the nulls Arrow fills in for missing keys are dropped.
"""

from __future__ import annotations

from typing import Any

import orjson
import pyarrow as pa

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
#: Every integer up to 2**53 in magnitude is exactly a double; beyond it, integers mixed with floats overflow.
_DOUBLE_EXACT = 2**53


def strip_nulls(value: Any) -> Any:
    """Drop ``None``-valued keys from objects, recursively: how typed structs decode."""
    if isinstance(value, dict):
        return {key: strip_nulls(inner) for key, inner in value.items() if inner is not None}
    if isinstance(value, list):
        return [strip_nulls(inner) for inner in value]
    return value


_SIMPLE_TYPES = {frozenset((str,)): pa.string(), frozenset((float,)): pa.float64(), frozenset((bool,)): pa.bool_()}
_NUMBERS = frozenset((int, float))
_CONTAINERS = frozenset((dict, list))


def _scalar_type(values: list[Any]) -> pa.DataType | None:
    """The Arrow type for a column of non-null JSON scalars, or None if they do not share one."""
    # Decoded JSON holds exactly these types: one pass in C tells most columns apart.
    types = frozenset(map(type, values))
    simple = _SIMPLE_TYPES.get(types)
    if simple is not None:
        return simple
    if types <= _CONTAINERS:  # objects and lists: no scalar type
        return None
    if int in types and types <= _NUMBERS:
        integers = [value for value in values if type(value) is int]
        low, high = min(integers), max(integers)
        if low < _INT64_MIN or high > _INT64_MAX:
            return None
        if float not in types:
            return pa.int64()
        return pa.float64() if max(-low, high) <= _DOUBLE_EXACT else None
    return _scalar_type_of_any(values)


def _scalar_type_of_any(values: list[Any]) -> pa.DataType | None:
    """:func:`_scalar_type` for values of any Python types (subclasses of str, int and float included)."""
    kinds = set()
    beyond_double = False  # an integer a double cannot hold exactly: never widened to float64
    for value in values:
        if isinstance(value, bool):
            kinds.add("bool")
        elif isinstance(value, int):
            if not _INT64_MIN <= value <= _INT64_MAX:
                return None
            beyond_double = beyond_double or abs(value) > _DOUBLE_EXACT
            kinds.add("int")
        elif isinstance(value, float):
            kinds.add("float")
        elif isinstance(value, str):
            kinds.add("str")
        else:
            kinds.add("nested")
        if len(kinds) > 2:
            return None
    if kinds == {"str"}:
        return pa.string()
    if kinds == {"bool"}:
        return pa.bool_()
    if kinds == {"int"}:
        return pa.int64()
    if kinds == {"float"} or (kinds == {"int", "float"} and not beyond_double):
        return pa.float64()
    return None


MAX_TYPED_DEPTH = 32
"""Values nested deeper than this are kept in the overflow as JSON: Parquet refuses schemas 100 levels deep
(a list takes three), and no real property nests that far."""


def _storable(data_type: pa.DataType, depth: int = 0) -> bool:
    """Whether a nested Arrow type can live in Parquet and Iceberg unambiguously."""
    if depth > MAX_TYPED_DEPTH:
        return False
    if pa.types.is_null(data_type):
        return False
    if pa.types.is_struct(data_type):
        if data_type.num_fields == 0:
            return False
        names = [data_type.field(i).name for i in range(data_type.num_fields)]
        if len(set(names)) != len(names) or any("." in name or not name for name in names):
            return False
        return all(_storable(data_type.field(i).type, depth + 1) for i in range(data_type.num_fields))
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        return _storable(data_type.value_type, depth + 1)
    return not (pa.types.is_map(data_type) or pa.types.is_union(data_type) or pa.types.is_dictionary(data_type))


# What ``pa.array`` infers for objects and lists can differ from its input in four ways only: explicit nulls (and
# NaN) vanish, booleans beside doubles become 1.0 and 0.0, integers beside doubles widen (exactly up to 2**53, 16
# digits), and keys come back in another order (which JSON objects do not keep). Values whose JSON text holds no
# ``null``, ``true``, ``false`` nor 16 digits in a row cannot meet the first three, so they need no read-back.
_DIGITS_TO_ZERO = bytes(0 if 0x30 <= byte <= 0x39 else 1 for byte in range(256))
_SIXTEEN_DIGITS = bytes(16)


def _plain(values: list[Any]) -> tuple[bool, bool]:
    """Whether the (non-null) ``values`` hold nothing ``pa.array`` could change (see above), and whether they
    hold booleans: a few C-speed scans of their JSON text, against reading the whole column back."""
    try:
        text = orjson.dumps(values)
    except (orjson.JSONEncodeError, TypeError):
        return False, True
    booleans = b"true" in text or b"false" in text
    plain = not booleans and b"null" not in text and _SIXTEEN_DIGITS not in text.translate(_DIGITS_TO_ZERO)
    return plain, booleans


def _same(original: Any, decoded: Any) -> bool:
    """``original == decoded`` with booleans apart from numbers (True == 1.0 in Python; not in JSON)."""
    if isinstance(original, bool) or isinstance(decoded, bool):
        return type(original) is type(decoded) and original == decoded
    if isinstance(original, dict):
        return (
            isinstance(decoded, dict)
            and original.keys() == decoded.keys()
            and all(_same(value, decoded[key]) for key, value in original.items())
        )
    if isinstance(original, list):
        return (
            isinstance(decoded, list)
            and len(original) == len(decoded)
            and all(_same(value, other) for value, other in zip(original, decoded, strict=True))
        )
    return bool(original == decoded)


def _with_null_lists_typed(data_type: pa.DataType) -> pa.DataType | None:
    """``data_type`` with each list of nulls (what Arrow infers for lists that are empty in every row: an asset's
    ``roles: []``, a property's ``tags: []``) made a list of strings, which holds empty lists as well and takes
    later rows' strings; None when it has none."""
    if pa.types.is_list(data_type):
        if pa.types.is_null(data_type.value_type):
            return pa.list_(pa.string())
        inner = _with_null_lists_typed(data_type.value_type)
        return pa.list_(inner) if inner is not None else None
    if pa.types.is_struct(data_type):
        fields = [data_type.field(i) for i in range(data_type.num_fields)]
        typed = [_with_null_lists_typed(field.type) for field in fields]
        if all(inner is None for inner in typed):
            return None
        return pa.struct(
            [field if inner is None else field.with_type(inner) for field, inner in zip(fields, typed, strict=True)]
        )
    return None


def _nested_array(values: list[Any]) -> pa.Array | None:
    """Type a column of objects/lists if (and only if) it decodes back exactly."""
    try:
        array = pa.array(values)
        if (typed := _with_null_lists_typed(array.type)) is not None:
            array = array.cast(typed)
    except (pa.ArrowException, OverflowError, TypeError, ValueError):
        return None
    if not _storable(array.type):
        return None
    present = [value for value in values if value is not None]
    plain, booleans = _plain(present)
    if plain:
        return array
    decoded = [strip_nulls(value) for value in array.to_pylist() if value is not None]
    if decoded != present or (booleans and not _same(present, decoded)):
        return None
    return array


def column_array(values: list[Any]) -> pa.Array | None:
    present = [value for value in values if value is not None]
    if not present:
        return None
    scalar = _scalar_type(present)
    if scalar is not None:
        return pa.array(values, type=scalar)
    if all(isinstance(value, dict | list) for value in present):
        return _nested_array(values)
    return None


def nested_as_is(array: pa.Array, *, absent_members: bool = False) -> pa.Array | None:
    """A nested Arrow column (structs, lists; a row may be null) typed as :func:`column_array` types its values
    (``to_pylist()``), without making them: the column cast to the types JSON values take, when it holds no null
    below its rows, so that it decodes to exactly those values; else None. ``absent_members``: a null member of a
    row's object is one the row lacks (assets), left out of its value as decoding leaves it out."""
    target = _json_type(array.type)
    if target is None:
        return None
    if (typed := _with_null_lists_typed(target)) is not None:
        target = typed
    if not _storable(target):
        return None
    present = array.filter(array.is_valid()) if array.null_count else array
    if not _no_nulls_below(present, members=absent_members):
        return None
    return array.cast(target)


def _json_type(data_type: pa.DataType) -> pa.DataType | None:
    """The Arrow type ``pa.array`` gives the Python values of a column of ``data_type`` (None: values that are not
    all JSON, or whose inference this does not follow)."""
    if pa.types.is_boolean(data_type) or pa.types.is_null(data_type):
        return data_type
    if pa.types.is_signed_integer(data_type) or (pa.types.is_unsigned_integer(data_type) and data_type.bit_width < 64):
        return pa.int64()
    if pa.types.is_floating(data_type):
        return pa.float64()
    if pa.types.is_string(data_type) or pa.types.is_large_string(data_type):
        return pa.string()
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        inner = _json_type(data_type.value_type)
        return pa.list_(inner) if inner is not None else None
    if pa.types.is_struct(data_type):
        fields = []
        for index in range(data_type.num_fields):
            field = data_type.field(index)
            inner = _json_type(field.type)
            if inner is None:
                return None
            fields.append(pa.field(field.name, inner))
        return pa.struct(fields)
    return None


def _no_nulls_below(array: pa.Array, *, members: bool = False) -> bool:
    """Whether ``array`` (no null rows) holds no null in any member or element, at any depth (with ``members``,
    its own members may be null: absent)."""
    if pa.types.is_struct(array.type):
        for child in array.flatten():
            if child.null_count and not members:
                return False
            present = child.filter(child.is_valid()) if child.null_count else child
            if not _no_nulls_below(present):
                return False
        return True
    if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
        values = array.flatten()
        return values.null_count == 0 and _no_nulls_below(values)
    return True
