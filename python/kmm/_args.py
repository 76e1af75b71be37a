"""Argument checks shared by every public function: exact integers within the range of the C type
they become (no silent truncation, wrap or coercion from floats, strings or bools), plain-data
element types, and sizes libkmm can hold. Each error names the argument and the bound, as
libkmm's own messages do."""

import numbers

import numpy as np

from ._errors import InvalidArgumentError, SizeOverflowError

U64_MAX = (1 << 64) - 1
U32_MAX = (1 << 32) - 1
I32_MIN, I32_MAX = -(1 << 31), (1 << 31) - 1
I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1
#: The most dimensions an array may have (NumPy's limit, which DLPack and CAI consumers share).
MAX_NDIM = 64
#: The largest buffer libkmm allocates (KMM_ERROR_SIZE_OVERFLOW beyond).
MAX_BUFFER_BYTES = 1 << 48


def integer(value, name, lo=0, hi=U64_MAX, error=InvalidArgumentError):
    """`value` as an int if it is an integer (int, NumPy integer, anything with `__index__`;
    not a bool) in `lo..hi`. TypeError for other types, `error` outside the range."""
    v = _index(value, name)
    if v < lo or v > hi:
        raise error("%s = %d is outside %s..%s" % (name, v, _bound(lo), _bound(hi)))
    return v


#: Types that are not integers whatever `__index__` a subclass of theirs adds (numbers that are
#: not integral, Decimal and Fraction among them, are checked apart).
_NOT_INTEGERS = (str, bytes, bytearray, memoryview, np.str_, np.bytes_)


def _index(value, name):
    """`operator.index(value)`, refusing bools: given as such, or returned by an `__index__`
    (`operator.index` turns those into 0 or 1 with only a warning). `__index__` runs once."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError("%s = %r must be an integer, not a bool" % (name, value))
    if (isinstance(value, _NOT_INTEGERS) or (isinstance(value, numbers.Number) and not isinstance(value, numbers.Integral))
            or (isinstance(value, np.ndarray) and value.dtype.kind not in "iu")):
        # Subclasses too: a float or str subclass with an __index__ is still a float or str (3.0
        # was refused while a subclass of float that is 3.0 became what its __index__ said).
        raise TypeError("%s = %r must be an integer, not a %s" % (name, value, type(value).__name__))
    if isinstance(value, int):
        # The value itself: int(value) would call a subclass's __int__, which may say another.
        return int.__index__(value)
    method = getattr(type(value), "__index__", None)
    try:
        if method is None:
            raise TypeError
        v = method(value)
    except TypeError:
        raise TypeError("%s = %r must be an integer (got %s)" % (name, value, type(value).__name__)) from None
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError("%s = %r must be an integer (its __index__ returned %r)" % (name, value, v))
    return int.__index__(v)


def _bound(n):
    for text, value in (("2^64 - 1", U64_MAX), ("2^63 - 1", I64_MAX), ("-2^63", I64_MIN), ("2^48", MAX_BUFFER_BYTES),
                        ("2^32 - 1", U32_MAX), ("2^31 - 1", I32_MAX), ("-2^31", I32_MIN)):
        if n == value:
            return text
    return str(n)


def flag(value, name):
    """`value` as a bool if it is one (Python or NumPy): a flag given as a string ("no") or a
    number would otherwise be taken for its truth value."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError("%s = %r must be True or False (got %s)" % (name, value, type(value).__name__))
    return bool(value)


def nbytes(value, name="nbytes"):
    """A byte count: 0..2^64 - 1 (libkmm refuses more than 2^48 with its own message)."""
    return integer(value, name, 0, U64_MAX, SizeOverflowError)


def kind(value, name="kind"):
    """A memory kind: a name ("device", "pinned") as given, or its integer code (Python or
    NumPy, not a bool) as an int; the caller looks it up."""
    if isinstance(value, str):
        return value
    try:
        return _index(value, name)
    except TypeError:
        return value  # not an integer (or a bool): refused by the lookup, which names it


def handle(value, name="handle"):
    """A raw manager handle (`Manager.handle`): within uint64, which ctypes would wrap (the
    handle + 2^64 named the manager); libkmm says whether it names a live manager."""
    return integer(value, name)


def stream(value, name="stream"):
    """A raw stream handle (a CUstream as an int, or a host-backend stream id)."""
    return integer(value, name)


def device(value, name="device"):
    return integer(value, name, 0, I32_MAX)


def as_dtype(dtype, name="dtype"):
    """`np.dtype(dtype)`, with NumPy's refusal naming the argument."""
    try:
        return np.dtype(dtype)
    except (TypeError, ValueError) as e:
        raise TypeError("%s = %r is not a NumPy data type (%s)" % (name, dtype, e)) from None


def plain_dtype(dtype, name="dtype"):
    """A NumPy dtype whose items are plain bytes: Kmm memory cannot hold Python objects (their
    references would not be counted) or zero-size items."""
    d = as_dtype(dtype, name)
    if d.hasobject:
        raise TypeError("%s = %s holds Python objects; Kmm memory holds plain data only "
                        "(numbers, bools, fixed-size strings and records of them)" % (name, d))
    if d.itemsize == 0:
        raise TypeError("%s = %s has items of 0 bytes" % (name, d))
    if d.subdtype is not None:
        # NumPy moves a sub-array's dimensions into the shape (get() would not match `shape`).
        base, dims = d.subdtype
        raise TypeError("%s = %s is a sub-array type: give its dimensions %s in the shape, with dtype %s"
                        % (name, d, dims, base))
    return d


def shape_and_dtype(shape_, dtype):
    """(shape, dtype) of a new array, checked; a sub-array dtype's dimensions join the shape,
    as in NumPy (empty((2,), (float32, (3,))) is a 2 x 3 float32 array)."""
    shape_, d = shape(shape_), as_dtype(dtype)
    # Nested ones too (a sub-array of sub-arrays), outer dimensions first, as NumPy.
    while d.subdtype is not None and not d.hasobject:
        d, dims = d.subdtype
        shape_ = shape(shape_ + dims)
    return shape_, plain_dtype(d)


def shape(value, name="shape"):
    """A shape: an integer or a sequence of integers, each 0..2^63 - 1 (DLPack's and NumPy's
    int64 dimensions: a larger one would wrap to a negative size in an export)."""
    if isinstance(value, np.ndarray) and value.ndim == 1:
        value = tuple(value)  # (an array has __index__, for its one-element case)
    elif not isinstance(value, (tuple, list)) and hasattr(type(value), "__index__"):
        value = (value,)
    dims = shape_like(value, name)
    if len(dims) > MAX_NDIM:
        # NumPy (get(), exports to it) takes no more; refused here rather than there.
        raise ValueError("%s has %d dimensions; at most %d" % (name, len(dims), MAX_NDIM))
    return tuple(integer(n, "%s[%d]" % (name, i), 0, I64_MAX) for i, n in enumerate(dims))


def shape_like(value, name):
    """A sequence of integers as a tuple (TypeError naming `name` otherwise). Strings, bytes
    (b"\\x02\\x03" would read as (2, 3)) and unordered collections (sets, dicts) are not
    sequences of dimensions."""
    if isinstance(value, (str, bytes, bytearray, memoryview, set, frozenset, dict)):
        raise TypeError("%s = %r must be a sequence of integers (got %s)" % (name, value, type(value).__name__))
    try:
        return tuple(value)
    except TypeError:
        raise TypeError("%s = %r must be a sequence of integers" % (name, value)) from None


def strides(value, name="strides"):
    """Byte strides: a sequence of integers, each within int64."""
    return tuple(integer(s, "%s[%d]" % (name, i), I64_MIN, I64_MAX)
                 for i, s in enumerate(shape_like(value, name)))


def array_bytes(dims, dtype, name="shape"):
    """Bytes of a C-contiguous array of `dims` and `dtype`, at most 2^48. Its C strides (and
    NumPy's size check) count a dimension of 0 as 1: that product must stay within int64 too,
    even where a 0 makes the array empty ((0, 2, 2^62) bytes would have a stride of 2^63, which
    an export as int64 wraps negative and NumPy refuses)."""
    n = span = dtype.itemsize
    for d in dims:
        n *= d
        span *= max(d, 1)
    if n > MAX_BUFFER_BYTES:
        raise SizeOverflowError("%s = %s of %s is %d bytes, more than the largest buffer (2^48 bytes)"
                                % (name, dims, dtype, n))
    if span > I64_MAX:
        raise SizeOverflowError("%s = %s of %s has C strides past int64: the item size times each dimension "
                                "(a 0 counted as 1) is %d bytes, more than 2^63 - 1" % (name, dims, dtype, span))
    return n
