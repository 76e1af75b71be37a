"""kmm/_capi.py is what gen/python_generator.py makes of gen/kmm.h: current, complete, and a
changed header is noticed. (test_lib.py checks the loaded declarations against the header too.)"""

import ctypes
import os
import re
import subprocess
import sys

import pytest

from kmm import _capi, _lib

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
GENERATOR = os.path.join(ROOT, "gen", "python_generator.py")
HEADER = os.path.join(ROOT, "gen", "kmm.h")


def source_checkout():
    if not (os.path.exists(GENERATOR) and os.path.exists(HEADER)):
        pytest.skip("gen/python_generator.py or gen/kmm.h not found (not a source checkout)")


def run_generator(*args):
    return subprocess.run([sys.executable, GENERATOR, *args], capture_output=True, text=True, timeout=60)


def header_functions():
    with open(HEADER) as f:
        text = re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)
    return re.findall(r"\b(kmm_\w+)\s*\(", text)


def test_generated_file_is_current():
    source_checkout()
    r = run_generator("--check")
    assert r.returncode == 0, "python/kmm/_capi.py is stale:\n" + r.stderr


def test_every_header_function_is_generated():
    source_checkout()
    names = header_functions()
    assert len(names) > 50, "found only %d functions in gen/kmm.h" % len(names)
    missing = [n for n in names if n not in _capi.FUNCTIONS]
    assert not missing, "in gen/kmm.h but not in kmm/_capi.py (regenerate it): %s" % missing
    assert list(_capi.FUNCTIONS) == names  # nothing extra, the header's order
    assert list(_lib.FUNCTIONS) == names


def test_loaded_declarations_are_the_generated_ones_but_the_void_pointer_args():
    assert set(_lib.VOID_POINTER_ARGS) <= set(_capi.FUNCTIONS)
    for name, (restype, argtypes) in _capi.FUNCTIONS.items():
        loaded_restype, loaded = _lib.FUNCTIONS[name]
        assert loaded_restype is restype and len(loaded) == len(argtypes), name
        voided = _lib.VOID_POINTER_ARGS.get(name, ())
        for i, (declared, used) in enumerate(zip(argtypes, loaded)):
            if i in voided:
                assert issubclass(declared, ctypes._Pointer) and used is ctypes.c_void_p, (name, i)
            else:
                assert used is declared, (name, i)


def test_check_fails_on_a_changed_header(tmp_path):
    source_checkout()
    with open(HEADER) as f:
        text = f.read()
    changed = text.replace("KmmStatus kmm_buffer_unmap(KmmManager manager, KmmBuffer buffer);",
                           "KmmStatus kmm_buffer_unmap(KmmManager manager, KmmBuffer buffer, uint32_t flags);")
    assert changed != text, "the declaration this test edits is gone from gen/kmm.h; pick another"
    header = tmp_path / "kmm.h"
    header.write_text(changed)
    r = run_generator("--check", "--header", str(header))
    assert r.returncode == 1
    assert "is stale" in r.stderr and "kmm_buffer_unmap" in r.stderr


def test_generator_refuses_what_it_cannot_parse(tmp_path):
    source_checkout()
    with open(HEADER) as f:
        text = f.read()
    header = tmp_path / "kmm.h"
    header.write_text(text.replace("#endif  /* KMM_H */", "union KmmOdd { int a; };\n#endif  /* KMM_H */"))
    r = run_generator("--check", "--header", str(header), "--output", str(tmp_path / "_capi.py"))
    assert r.returncode == 2 and "cannot parse" in r.stderr
