"""Traces, memory maps, figures and the out-of-memory error, from Python."""

import csv
import os
import shutil
import struct
import subprocess
import zlib

import pytest

import kmm
from conftest import BACKEND


def small_manager(**extra):
    return kmm.Manager(backend=BACKEND, chunk_size=2 << 20, **extra)


def test_a_ring_trace_holds_each_event_in_order(tmp_path):
    m = small_manager()
    m.trace_start(capacity=100)
    a = m.alloc(1000)
    b = m.alloc(64, kind="pinned")
    a.close()
    b.close()
    t = m.trace()
    # Python's buffers hold their address: each allocation is mapped at once.
    assert [r.action for r in t] == ["allocate", "map", "allocate", "map", "free", "free"]
    assert [r.kind for r in t] == ["device", "device", "pinned", "pinned", "device", "pinned"]
    assert t.records[0].bytes == 1000 and t.records[0].in_use == 1000
    assert t.records[4].in_use == 0 and t.dropped == 0
    assert t.records[0].thread > 0 and t.records[0].reserved >= 2 << 20
    m.trace_stop()
    m.alloc(5).close()
    assert len(m.trace()) == 6, "a stopped trace keeps its records and adds none"
    full, rmm = tmp_path / "full.csv", tmp_path / "rmm.csv"
    m.save_trace(full)
    m.save_trace(str(rmm), rmm_only=True)
    rows = list(csv.DictReader(open(full)))
    assert list(rows[0])[:6] == ["Thread", "Time", "Action", "Pointer", "Size", "Stream"]
    assert [r["Action"] for r in rows] == ["allocate", "map", "allocate", "map", "free", "free"]
    assert int(rows[0]["Size"]) == 1000 and int(rows[0]["Pointer"], 16) == t.records[0].address
    rmm_rows = list(csv.DictReader(open(rmm)))
    assert [r["Action"] for r in rmm_rows] == ["allocate", "free"], "device rows only"
    assert all(r["Stream"] == "0x0" for r in rmm_rows)
    m.close()


def test_a_file_trace_is_written_as_events_happen(tmp_path):
    m = small_manager()
    path = tmp_path / "live.csv"
    m.trace_start(path=path)
    m.alloc(300).close()
    m.trace_stop()
    rows = list(csv.DictReader(open(path)))
    assert [(r["Action"], r["Size"], r["Kind"]) for r in rows] == [
        ("allocate", "300", "device"), ("map", "300", "device"), ("free", "300", "device")]
    with pytest.raises(kmm.InvalidArgumentError, match="no ring trace"):
        m.trace()
    m.close()


def test_the_memory_map_and_status(manager):
    bufs = [manager.alloc(n) for n in (100_000, 3 << 20, 5000)]
    bufs[0].close()
    mm = manager.memory_map()
    used = [s for s in mm.segments if s.state != "free"]
    assert sorted(s.requested for s in used) == [5000, 3 << 20]
    assert {s.state for s in used} == {"mapped"}, "Python's buffers hold their address: mapped"
    assert sum(s.bytes for s in mm.segments) == manager.stats("device")["reserved"]
    # Free address space; a binned pool serves a slab's free slots to their own size only.
    assert mm.largest_free >= manager.stats("device")["largest_free_block"]
    assert 0.0 <= mm.fragmentation < 1.0
    assert mm._repr_svg_().startswith("<svg") and "Device memory map" in mm.svg
    st = manager.status()
    assert str(st).startswith("Kmm manager on") and st.device["live_buffers"] == 2
    html = st._repr_html_()
    assert html.startswith("<pre>Kmm manager on") and "Device memory map" in html
    assert "Memory timeline" not in html, "no timeline without a trace"
    manager.trace_start()
    assert "Memory timeline" in manager.status().svg
    assert manager.memory_map("pinned").kind == "pinned"


def test_out_of_memory_explains_itself_and_shows_the_map():
    m = small_manager(hard_limit=4 << 20)
    keep = m.alloc(3 << 20)
    with pytest.raises(kmm.OutOfMemoryError) as info:
        m.alloc(3 << 20)
    e = info.value
    for words in ("3.00 MiB (3145728 bytes) of device memory", "largest free block", "fragmentation",
                  "largest holders: buffer 0x%x 3.00 MiB" % keep.handle, "hard limit 4.00 MiB", "memory_map"):
        assert words in str(e), words
    assert e.memory_status is not None and e.memory_status.device["in_use"] == 3 << 20
    assert e._repr_html_().startswith("<pre>") and "Device memory map" in e._repr_html_()
    m.close()


def test_bad_arguments_are_refused(manager, tmp_path):
    with pytest.raises(kmm.InvalidArgumentError, match="capacity"):
        manager.trace_start(capacity=-1)
    with pytest.raises(kmm.InvalidArgumentError, match="capacity"):
        manager.trace_start(capacity=(1 << 24) + 1)
    with pytest.raises(ValueError, match="rmm_only"):
        manager.trace_start(rmm_only=True)
    with pytest.raises(ValueError, match="capacity"):
        manager.trace_start(capacity=10, path=tmp_path / "x.csv")
    with pytest.raises(ValueError, match="empty"):
        manager.trace_start(path="")
    with pytest.raises(kmm.InvalidArgumentError, match="cannot create"):
        manager.trace_start(path=tmp_path / "no" / "such" / "dir.csv")
    with pytest.raises(kmm.InvalidArgumentError, match="no ring trace"):
        manager.save_trace(tmp_path / "none.csv")
    with pytest.raises(ValueError):
        manager.memory_map("shared")


def png_pixels(path):
    """(width, height, bytes per pixel, rows of pixel bytes) of an 8-bit RGB or RGBA PNG, as
    rsvg-convert writes them."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + n
    width, height, depth, colour = header[:4]
    assert depth == 8 and colour in (2, 6), "8-bit RGB or RGBA"
    bpp = 4 if colour == 6 else 3
    raw, stride, rows, prev = zlib.decompress(idat), width * bpp, [], bytearray(width * bpp)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return width, height, bpp, rows


@pytest.mark.skipif(shutil.which("rsvg-convert") is None, reason="rsvg-convert (Debian's librsvg2-bin) is not installed")
def test_figures_render_to_png_with_their_colours(tmp_path):
    m = small_manager()
    m.trace_start()
    bufs = [m.alloc(n << 18) for n in range(1, 7)]
    bufs[2].close()
    svg = tmp_path / "overview.svg"
    svg.write_text(m.status().svg)
    png = tmp_path / "overview.png"
    subprocess.run(["rsvg-convert", "-o", str(png), str(svg)], check=True)
    width, height, bpp, rows = png_pixels(png)
    assert width == 760 and height > 500
    pixels = [row[i:i + 3] for row in rows for i in range(0, len(row), bpp)]
    colours = set(pixels)
    # More orange than the legend's swatch (14 x 10 pixels): the blocks themselves.
    assert pixels.count(bytes.fromhex("ef8636")) > 1000, "mapped blocks are drawn (Python's buffers are mapped)"
    assert bytes.fromhex("e6e6e6") in colours, "free space is drawn"
    assert bytes.fromhex("3b75af") in colours, "the timeline's device lines are drawn"
    if os.environ.get("KMM_KEEP_FIGURES"):
        shutil.copy(png, os.environ["KMM_KEEP_FIGURES"])
    m.close()


def test_figures_drawn_while_another_thread_allocates_are_whole():
    import threading
    import xml.etree.ElementTree as ET

    m = small_manager()
    m.trace_start()
    stop = threading.Event()

    def churn():
        live = []
        while not stop.is_set():
            live.append(m.alloc(4096 * (1 + len(live) % 7)))
            if len(live) > 40:
                for b in live:
                    b.close()
                live = []

    t = threading.Thread(target=churn)
    t.start()
    try:
        for _ in range(40):
            for svg in (m.status().svg, m.memory_map().svg, m.trace().svg):
                ET.fromstring(svg)  # raises on a cut-off figure
            assert m.summary().startswith("Kmm manager on")
    finally:
        stop.set()
        t.join()
    m.close()
