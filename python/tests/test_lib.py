"""The ctypes declarations match gen/kmm.h: every function, every struct size, the ABI version."""

import ctypes
import os
import re

import pytest

from kmm import _lib

HEADER = os.path.join(os.path.dirname(__file__), "..", "..", "gen", "kmm.h")
SIZES = {"uint64_t": 8, "KmmBuffer": 8, "KmmManager": 8, "KmmEvent": 8, "int64_t": 8, "uint32_t": 4, "int32_t": 4, "uint16_t": 2, "uint8_t": 1, "bool": 1,
         "float": 4, "double": 8, "pointer": 8}


def header():
    if not os.path.exists(HEADER):
        pytest.skip("gen/kmm.h not found (not a source checkout)")
    with open(HEADER) as f:
        text = f.read()
    return re.sub(r"/\*.*?\*/", "", text, flags=re.S)


def test_every_function_is_declared():
    names = set(re.findall(r"\b(kmm_\w+)\s*\(", header()))
    assert names, "no functions found in the header"
    missing = names - set(_lib.FUNCTIONS)
    assert not missing, "declare in kmm/_lib.py: %s" % sorted(missing)
    extra = set(_lib.FUNCTIONS) - names
    assert not extra, "declared but not in the header: %s" % sorted(extra)


def test_argument_counts_match():
    text = header()
    for name, (_, argtypes) in _lib.FUNCTIONS.items():
        m = re.search(r"\b%s\s*\(([^)]*)\)" % name, text)
        params = [p for p in m.group(1).split(",") if p.strip() and p.strip() != "void"]
        assert len(params) == len(argtypes), name


def c_size(fields):
    offset, align = 0, 1
    for t in fields:
        size = SIZES[t]
        offset = (offset + size - 1) // size * size + size
        align = max(align, size)
    return (offset + align - 1) // align * align


@pytest.mark.parametrize("name", sorted(_lib.STRUCTS))
def test_struct_sizes_match(name):
    m = re.search(r"typedef struct \{([^}]*)\}\s*%s;" % name, header())
    assert m, name
    fields = ["pointer" if "*" in t else t.replace("const", "").strip()
              for t in re.findall(r"^\s*([\w\s*]+?)\s*\b\w+;", m.group(1), flags=re.M)]
    assert ctypes.sizeof(_lib.STRUCTS[name]) == c_size(fields)
    assert len(_lib.STRUCTS[name]._fields_) == len(fields)


def test_constants_match():
    text = header()
    assert int(re.search(r"#define KMM_ABI_VERSION (\d+)", text).group(1)) == _lib.ABI_VERSION
    assert int(re.search(r"#define KMM_MAX_BUFFER_BYTES (\d+)", text).group(1)) == _lib.KMM_MAX_BUFFER_BYTES
    for code, name in _lib.STATUS.items():
        assert re.search(r"\b%s = %d\b" % (name, code), text), name


def test_library_abi_and_names():
    assert _lib.lib.kmm_abi_version() == _lib.ABI_VERSION
    for code, name in _lib.STATUS.items():
        assert _lib.lib.kmm_status_name(code).decode() == name


def test_loaded_library_has_every_function():
    assert not _lib.MISSING, "libkmm is older than the header; rebuild it: %s" % sorted(_lib.MISSING)
