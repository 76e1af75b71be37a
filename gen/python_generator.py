"""Turns gen/kmm.h (cbindgen output) into python/kmm/_capi.py, the raw ctypes declarations.

    python3 gen/python_generator.py            # rewrite python/kmm/_capi.py
    python3 gen/python_generator.py --check    # exit 1 when python/kmm/_capi.py is stale (CI)

`--header` and `--output` choose other files (tests use them to show that --check notices a
changed header). Python 3 standard library only.

The header is regular (cbindgen writes it), so a small line-based parser suffices, as in
gen/generator.jl (the Julia bindings): `#define` constants, `enum` blocks, `typedef struct { ...
} Name;`, `typedef uint64_t Name;`, function pointer typedefs and function prototypes. A line the
parser does not understand is an error, so a header change that needs generator work is noticed
instead of silently dropped.

The output holds declarations only: constants, enum values, handle types, Structures with their
fields in the header's order, and FUNCTIONS (name -> (restype, argtypes), in the header's order).
Loading the library and applying the declarations is python/kmm/_lib.py's work (hand-written).
"""

import argparse
import difflib
import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
HEADER = os.path.join(ROOT, "gen", "kmm.h")
OUTPUT = os.path.join(ROOT, "python", "kmm", "_capi.py")

#: C scalar types -> ctypes names. `void` appears only as a return type or behind a pointer.
SCALARS = {
    "uint64_t": "c_uint64", "int64_t": "c_int64", "uint32_t": "c_uint32", "int32_t": "c_int32",
    "uint16_t": "c_uint16", "int16_t": "c_int16", "uint8_t": "c_uint8", "int8_t": "c_int8",
    "size_t": "c_size_t", "ptrdiff_t": "c_ssize_t", "bool": "c_bool", "char": "c_char",
    "float": "c_float", "double": "c_double", "int": "c_int",
}


class HeaderError(Exception):
    """The header holds something this generator does not understand."""


class Header:
    """What the generator takes from the header, each list in the header's order."""

    def __init__(self):
        self.defines = []    # (name, value)
        self.enums = []      # (name, [(member, value)])
        self.aliases = []    # (name, ctypes type, C spelling)
        self.structs = []    # (name, [(field, ctypes type)])
        self.functions = []  # (name, restype, [(argument, ctypes type)])
        self.types = set()   # names of the header's own types (enums, aliases, structs)


def ctype(spelling, types, where):
    """The ctypes expression for a C type as cbindgen spells it (`const KmmConfig *`)."""
    t = re.sub(r"\bconst\b", "", spelling).replace(" ", "")
    nptr = t.count("*")
    base = t.replace("*", "")
    if base == "char" and nptr >= 1:  # C strings: bytes in, bytes out
        base, nptr = "c_char_p", nptr - 1
    elif base == "void" and nptr >= 1:
        base, nptr = "c_void_p", nptr - 1
    elif base == "void":
        return "None"
    elif base in SCALARS:
        base = SCALARS[base]
    elif base not in types:
        raise HeaderError("%s: unknown C type `%s`" % (where, spelling.strip()))
    for _ in range(nptr):
        base = "POINTER(%s)" % base
    return base


def uncommented_lines(text):
    """The header's lines with `/* ... */` comments blanked (line numbers kept)."""
    return re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S).split("\n")


def parse_enum(lines, i, where):
    """The members of the `enum` starting at line i, and the line of its `};`."""
    members = []
    while not lines[i].strip().startswith("{"):
        i += 1
    i += 1
    while not lines[i].strip().startswith("};"):
        s = lines[i].strip()
        m = re.match(r"^(\w+) = (\d+),$", s)
        if m:
            members.append((m.group(1), int(m.group(2))))
        elif s:
            raise HeaderError("%s: cannot parse enum member `%s`" % (where(i), s))
        i += 1
    return members, i


def parse_struct(lines, i, types, where):
    """The name and fields of the `typedef struct {` at line i, and the line of its `} Name;`."""
    fields = []
    i += 1
    while not lines[i].strip().startswith("}"):
        s = lines[i].strip()
        m = re.match(r"^([\w *]+?) ?(\w+);$", s)
        if m:
            fields.append((m.group(2), ctype(m.group(1), types, where(i))))
        elif s:
            raise HeaderError("%s: cannot parse struct field `%s`" % (where(i), s))
        i += 1
    m = re.match(r"^} (\w+);$", lines[i].strip())
    if not m:
        raise HeaderError("%s: cannot parse struct end `%s`" % (where(i), lines[i].strip()))
    return m.group(1), fields, i


def parse_prototype(lines, i, types, where):
    """(name, restype, [(argument, type)]) of the prototype starting at line i, and its last line."""
    first, sig = i, lines[i].strip()
    while not sig.endswith(";"):
        i += 1
        sig += " " + lines[i].strip()
    m = re.match(r"^([\w ]+?\**) ?(kmm_\w+)\((.*)\);$", sig)
    if not m:
        raise HeaderError("%s: cannot parse prototype `%s`" % (where(first), sig))
    args = []
    if m.group(3).strip() != "void":
        for a in m.group(3).split(","):
            ma = re.match(r"^(.*?)(\w+)$", a.strip())
            if not ma:
                raise HeaderError("%s: cannot parse argument `%s`" % (where(first), a.strip()))
            args.append((ma.group(2), ctype(ma.group(1), types, where(first))))
    return (m.group(2), ctype(m.group(1), types, where(first)), args), i


def parse(text, name="gen/kmm.h"):
    h = Header()
    lines = uncommented_lines(text)

    def where(i):
        return "%s line %d" % (name, i + 1)

    i = 0
    while i < len(lines):
        line = lines[i].strip()
        m_define = re.match(r"^#define (KMM_\w+) (\d+)$", line)
        m_enum = re.match(r"^enum (\w+)$", line)
        m_alias = re.match(r"^typedef (\w+) (\w+);$", line)
        m_fnptr = re.match(r"^typedef (.+?)\(\*(\w+)\)\((.*)\);$", line)
        if m_define:
            h.defines.append((m_define.group(1), int(m_define.group(2))))
        elif m_enum:
            members, i = parse_enum(lines, i, where)
            h.enums.append((m_enum.group(1), members))
            h.types.add(m_enum.group(1))
        elif m_alias:
            if m_alias.group(2) not in h.types:  # `typedef uint32_t KmmStatus;` after its enum
                typ = ctype(m_alias.group(1), h.types, where(i))
                h.aliases.append((m_alias.group(2), typ, m_alias.group(1)))
                h.types.add(m_alias.group(2))
        elif m_fnptr:
            # A C function pointer: passed as an address (c_void_p), as CuPy and ctypes hand them out.
            spelling = "%s(*)(%s)" % (m_fnptr.group(1), m_fnptr.group(3))
            h.aliases.append((m_fnptr.group(2), "c_void_p", spelling))
            h.types.add(m_fnptr.group(2))
        elif line == "typedef struct {":
            struct_name, fields, i = parse_struct(lines, i, h.types, where)
            h.structs.append((struct_name, fields))
            h.types.add(struct_name)
        elif re.match(r"^[\w ]+?\** ?kmm_\w+\(", line):
            function, i = parse_prototype(lines, i, h.types, where)
            h.functions.append(function)
        elif line and not re.match(r"^(#|}|extern|: |typedef enum )", line):
            raise HeaderError("%s: cannot parse `%s`" % (where(i), line))
        i += 1
    if not h.functions:
        raise HeaderError("%s: no kmm_* functions found" % name)
    return h


def wrap(head, items, tail, indent, width=100):
    """`head` + items joined by ", " + `tail`, broken before items that would pass `width`."""
    out, line = [], head
    for k, item in enumerate(items):
        last = k == len(items) - 1
        piece = item + ("" if last else ", ")
        if len(line) + len(piece.rstrip()) + (len(tail) if last else 0) > width and line != head:
            out.append(line.rstrip())
            line = " " * indent
        line += piece
    out.append(line + tail)
    return out


def emit(h):
    body = []
    body.append("# constants (#define)")
    body += ["%s = %d" % (name, value) for name, value in h.defines]
    body.append("")
    body.append("# enums: plain integers, as in the C ABI (a uint32_t each)")
    for name, members in h.enums:
        body.append("%s = c_uint32" % name)
        body += ["%s = %d" % (member, value) for member, value in members]
        body.append("")
    body.append("# handle and callback types")
    for name, typ, spelling in h.aliases:
        note = "" if typ == SCALARS.get(spelling) else "  # %s" % spelling
        body.append("%s = %s%s" % (name, typ, note))
    body.append("")
    for name, fields in h.structs:
        body.append("")
        body.append("class %s(Structure):" % name)
        body.append("    _fields_ = [")
        body += ['        ("%s", %s),' % field for field in fields]
        body.append("    ]")
        body.append("")
    body.append("")
    body.append("#: Every enum of the header: name -> {value: member name}.")
    body.append("ENUMS = {")
    for name, members in h.enums:
        body += wrap('    "%s": {' % name, ['%d: "%s"' % (v, k) for k, v in members], "},", 8)
    body.append("}")
    body.append("")
    body.append("#: Every struct of the header, by name.")
    body += wrap("STRUCTS = {", ['"%s": %s' % (name, name) for name, _ in h.structs], "}", 4)
    body.append("")
    body.append("#: Every function of the header: name -> (restype, argtypes), in the header's order.")
    body.append("FUNCTIONS = {")
    for name, restype, args in h.functions:
        body += wrap('    "%s": (%s, [' % (name, restype), [t for _, t in args], "]),", 8)
    body.append("}")

    text = "\n".join(body)
    used = sorted(set(re.findall(r"\b(POINTER|Structure|c_\w+)\b", text)),
                  key=lambda n: (n != "POINTER" and n != "Structure", n))
    head = [
        "# generated by gen/python_generator.py from gen/kmm.h; do not edit",
        "# Regenerate: python3 gen/python_generator.py   (CI: python3 gen/python_generator.py --check)",
        '"""Raw ctypes declarations of libkmm\'s C ABI, one entry per item of gen/kmm.h (documented there).',
        "",
        "Declarations only: python/kmm/_lib.py (hand-written) loads the library and applies FUNCTIONS.",
        '"""',
        "",
    ]
    one_line = "from ctypes import " + ", ".join(used)
    head += [one_line] if len(one_line) <= 100 else wrap("from ctypes import (", used, ")", 4)
    head.append("")
    return "\n".join(head + body) + "\n"


def generate(header_path):
    with open(header_path, encoding="utf-8") as f:
        return emit(parse(f.read(), shown(header_path)))


def shown(path):
    """`path` relative to the repository when inside it, else absolute."""
    rel = os.path.relpath(os.path.abspath(path), ROOT)
    return os.path.abspath(path) if rel.startswith("..") else rel


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="exit 1 when the output file differs from what the header gives")
    ap.add_argument("--header", default=HEADER, help="the C header (default gen/kmm.h)")
    ap.add_argument("--output", default=OUTPUT, help="the generated file (default python/kmm/_capi.py)")
    args = ap.parse_args(argv)
    rel = shown(args.output)
    try:
        text = generate(args.header)
    except HeaderError as e:
        print("python_generator: %s" % e, file=sys.stderr)
        return 2
    if args.check:
        current = ""
        if os.path.exists(args.output):
            with open(args.output, encoding="utf-8", newline="") as f:
                current = f.read()
        if current != text:
            diff = list(difflib.unified_diff(current.splitlines(), text.splitlines(),
                                             rel + " (committed)", rel + " (from the header)", lineterm=""))
            print("%s is stale: it differs from what %s gives. Run `python3 gen/python_generator.py` "
                  "and commit it." % (rel, shown(args.header)), file=sys.stderr)
            print("\n".join(diff[:40] + (["..."] if len(diff) > 40 else [])), file=sys.stderr)
            return 1
        print("%s is current" % rel)
        return 0
    with open(args.output, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    print("wrote %s" % rel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
