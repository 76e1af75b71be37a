# Figures of parameter maps for the examples: one SVG per quantity with a title, the maps side by
# side on voxel axes, a colour bar with ticks and the unit, a table of values per region and a
# caption. Text is SVG text; each map is an embedded PNG (8-bit palette, compressed by the
# system's zlib through ccall). Plain Julia and Libdl, nothing else to install.
#
#     include("figures.jl")
#     MapFigures.write_map_figure("T1.svg", [("true", A), ("estimated", B)]; title = "T1 map",
#                                 quantity = "T1", unit = "ms", scale = :log, caption = ["..."])

module MapFigures

using Libdl

export write_map_figure

# ---------------------------------------------------------------------------------------------
# Colour map: viridis sampled at 17 points (entries 0, 16, ..., 255 of its 256-entry table),
# interpolated linearly in between.

const VIRIDIS = UInt32[0x440154, 0x48186a, 0x472d7b, 0x424086, 0x3b528b, 0x33638d, 0x2c728e,
                       0x26828e, 0x21918c, 0x1f9f88, 0x27ad81, 0x3dbc74, 0x5cc863, 0x81d34d,
                       0xaadc32, 0xd5e21a, 0xfde725]
const NO_VALUE = (0xd9, 0xd9, 0xd9)     # light grey: no value (NaN), e.g. outside the head
const LEVELS = 255                      # palette entries of the colour map; entry 255 is NO_VALUE

rgb(c::UInt32) = (UInt8(c >> 16), UInt8((c >> 8) & 0xff), UInt8(c & 0xff))
hex(c::UInt32) = string("#", string(c, base = 16, pad = 6))

"RGB of `t` in [0, 1] on viridis."
function viridis(t::Real)
    x = clamp(Float64(t), 0.0, 1.0) * (length(VIRIDIS) - 1)
    i = min(floor(Int, x), length(VIRIDIS) - 2)
    f = x - i
    a, b = rgb(VIRIDIS[i+1]), rgb(VIRIDIS[i+2])
    ntuple(ch -> round(UInt8, a[ch] + f * (Int(b[ch]) - Int(a[ch]))), 3)
end

# ---------------------------------------------------------------------------------------------
# Scales: where a value sits on the colour bar (0 at the bottom, 1 at the top), ranges that hold
# every value, ticks.

bar_position(v, lo, hi, scale::Symbol) =
    scale === :log ? log(v / lo) / log(hi / lo) : (v - lo) / (hi - lo)

const LOG_STEPS = (1.0, 2.0, 3.0, 5.0)

"The largest 1, 2, 3, 5 x 10^k not above `x` (`up = false`) or the smallest not below it."
function nice_log(x::Real, up::Bool)
    e = floor(Int, log10(x))
    candidates = [m * 10.0^k for k in e-1:e+1 for m in LOG_STEPS]
    up ? minimum(filter(c -> c >= x * (1 - 1e-12), candidates)) :
         maximum(filter(c -> c <= x * (1 + 1e-12), candidates))
end

"A tick step of 1, 2 or 5 x 10^k giving about `n` intervals over `span`."
function nice_step(span::Real, n::Integer = 5)
    raw = span / n
    p = 10.0^floor(log10(raw))
    for m in (1, 2, 5, 10)
        m * p >= raw && return m * p
    end
end

"""
    colour_range(values, scale; low = nothing)

A range that holds every finite value: on a log scale from the largest 1-2-3-5 value at or
below the smallest value to the smallest one at or above the largest; linear from `low` (or a
tick step below the smallest value) to a tick step at or above the largest.
"""
function colour_range(values, scale::Symbol; low = nothing)
    v = [Float64(x) for x in values if isfinite(x) && (scale !== :log || x > 0)]
    isempty(v) && return scale === :log ? (1.0, 10.0) : (0.0, 1.0)
    vmin, vmax = extrema(v)
    if scale === :log
        lo, hi = nice_log(vmin, false), nice_log(vmax, true)
        return hi > lo ? (lo, hi) : (lo, nice_log(lo * 1.5, true))
    end
    lo = low === nothing ? vmin : Float64(low)
    step = nice_step(max(vmax - lo, abs(vmax) * 1e-3, 1e-12), 20)
    low === nothing && (lo = round(floor(lo / step) * step; sigdigits = 12))
    hi = round(ceil(vmax / step - 1e-9) * step; sigdigits = 12)
    hi > lo ? (lo, hi) : (lo, lo + step)
end

"""
Tick values within `(lo, hi)`. On a log scale 1, 2, 3, 5 x 10^k, fewer where they would be
closer than `min_gap` (a fraction of the bar), and the ends of the range.
"""
function ticks(lo, hi, scale::Symbol; min_gap = 0.06)
    if scale === :log
        inside(x) = lo * (1 - 1e-9) <= x <= hi * (1 + 1e-9)
        local t
        for steps in (LOG_STEPS, (1.0, 2.0, 5.0), (1.0, 3.0), (1.0,))
            t = [m * 10.0^k for k in floor(Int, log10(lo)):ceil(Int, log10(hi)) for m in steps]
            t = sort(unique(vcat(filter(inside, t), [lo, hi])))
            minimum(diff(log.(t))) / log(hi / lo) >= min_gap && break
        end
        return t
    end
    step = nice_step(hi - lo, 8)
    collect(ceil(lo / step - 1e-9) * step : step : hi + step * 1e-9)
end

"A tick label: with as many decimals as the step between ticks needs (none from a step of 1)."
function tick_label(x::Real, step::Real)
    digits = clamp(-floor(Int, log10(step) + 1e-9), 0, 6)
    digits == 0 && return string(round(Int, x))
    whole, frac = split(string(round(x; digits = digits)), ".")
    string(whole, ".", rpad(frac, digits, '0'))
end

# ---------------------------------------------------------------------------------------------
# PNG: 8-bit palette image, zlib stream from the system's zlib (compress2).

function load_libz()
    names = ["libz", "libz.so.1", "libz.1.dylib", "zlib1", "libz.dll"]
    # Julia's own copy (Zlib_jll) next to its libraries
    libdir = joinpath(Sys.BINDIR, isdefined(Base, :LIBDIR) ? Base.LIBDIR : joinpath("..", "lib"))
    for dir in (joinpath(libdir, "julia"), libdir, Sys.BINDIR)
        append!(names, joinpath.(dir, ["libz.so.1", "libz.1.dylib", "libz.dll", "zlib1.dll"]))
    end
    for name in names
        h = Libdl.dlopen_e(name)
        h != C_NULL && Libdl.dlsym_e(h, :compress2) != C_NULL && return h
    end
    error("MapFigures: no zlib found (tried $(join(names, ", "))); the map images need it")
end

const LIBZ = Ref{Ptr{Cvoid}}(C_NULL)
libz(sym::Symbol) = (LIBZ[] == C_NULL && (LIBZ[] = load_libz()); Libdl.dlsym(LIBZ[], sym))

"`data` as a zlib stream (deflate, level 9)."
function zlib_compress(data::Vector{UInt8})
    bound = ccall(libz(:compressBound), Culong, (Culong,), length(data))
    out = Vector{UInt8}(undef, bound)
    len = Ref{Culong}(bound)
    status = ccall(libz(:compress2), Cint, (Ptr{UInt8}, Ref{Culong}, Ptr{UInt8}, Culong, Cint),
                   out, len, data, length(data), 9)
    status == 0 || error("MapFigures: zlib compress2 returned $status")
    resize!(out, len[])
end

"CRC-32 of `data` (zlib's, the one PNG uses)."
crc32(data::Vector{UInt8}) =
    UInt32(ccall(libz(:crc32), Culong, (Culong, Ptr{UInt8}, Cuint), 0, data, length(data)))

be32(x::Integer) = UInt8[(x >> 24) & 0xff, (x >> 16) & 0xff, (x >> 8) & 0xff, x & 0xff]

function png_chunk(io::IO, kind::String, data::Vector{UInt8})
    body = vcat(Vector{UInt8}(codeunits(kind)), data)
    write(io, be32(length(data)), body, be32(crc32(body)))
end

"""
    png_palette(index::Matrix{UInt8}, palette) -> Vector{UInt8}

A PNG file of an 8-bit palette image (`index[row, column]`, 0-based palette entries).
"""
function png_palette(index::AbstractMatrix{UInt8}, palette::Vector{NTuple{3,UInt8}})
    h, w = size(index)
    raw = Vector{UInt8}(undef, h * (w + 1))
    k = 1
    for i in 1:h
        raw[k] = 0x00                      # filter: none (zlib finds the repeated rows)
        raw[k+1:k+w] = view(index, i, :)
        k += w + 1
    end
    io = IOBuffer()
    write(io, UInt8[0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])
    png_chunk(io, "IHDR", vcat(be32(w), be32(h), UInt8[8, 3, 0, 0, 0]))
    png_chunk(io, "PLTE", [c for colour in palette for c in colour])
    png_chunk(io, "IDAT", zlib_compress(raw))
    png_chunk(io, "IEND", UInt8[])
    take!(io)
end

const BASE64 = Vector{UInt8}("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")

"`data` in base64 (RFC 4648, with padding)."
function base64(data::Vector{UInt8})
    out = IOBuffer()
    for i in 1:3:length(data)
        n = min(3, length(data) - i + 1)
        b = UInt32(data[i]) << 16
        n > 1 && (b |= UInt32(data[i+1]) << 8)
        n > 2 && (b |= UInt32(data[i+2]))
        for k in 0:3
            write(out, k <= n ? BASE64[((b >> (18 - 6k)) & 0x3f) + 1] : UInt8('='))
        end
    end
    String(take!(out))
end

const PALETTE = vcat([viridis(k / (LEVELS - 1)) for k in 0:LEVELS-1], [NO_VALUE])

"Palette indices of a map, each value `s x s` pixels; NaN (no value) is the last entry."
function map_indices(img::AbstractMatrix, lo, hi, scale::Symbol, s::Int)
    h, w = size(img)
    out = fill(UInt8(LEVELS), h * s, w * s)
    for j in 1:w, i in 1:h
        v = Float64(img[i, j])
        (isfinite(v) && (scale !== :log || v > 0)) || continue
        k = round(Int, clamp(bar_position(v, lo, hi, scale), 0, 1) * (LEVELS - 1))
        out[(i-1)*s+1:i*s, (j-1)*s+1:j*s] .= UInt8(k)
    end
    out
end

# ---------------------------------------------------------------------------------------------
# SVG

xml(s) = replace(replace(replace(string(s), "&" => "&amp;"), "<" => "&lt;"), ">" => "&gt;")
num(x) = string(round(x; digits = 1))
textwidth_px(s, size) = 0.6 * size * length(s)     # a rough width, for the layout

function text(io, x, y, s; size = 12, anchor = "start", attrs = "")
    println(io, "<text x=\"$(num(x))\" y=\"$(num(y))\" font-size=\"$size\" ",
            "text-anchor=\"$anchor\"$attrs>", xml(s), "</text>")
end

"Text turned a quarter to the left, centred on `(x, y)`."
vertical_text(io, x, y, s; size = 12) =
    text(io, x, y, s; size = size, anchor = "middle",
         attrs = " transform=\"rotate(-90 $(num(x)) $(num(y)))\"")

line(io, x1, y1, x2, y2) =
    println(io, "<line x1=\"$(num(x1))\" y1=\"$(num(y1))\" x2=\"$(num(x2))\" y2=\"$(num(y2))\" ",
            "stroke=\"black\"/>")

frame(io, x, y, w, h; fill = "none") =
    println(io, "<rect x=\"$x\" y=\"$y\" width=\"$w\" height=\"$h\" fill=\"$fill\" ",
            "stroke=\"black\" stroke-width=\"0.8\"/>")

"One map at `(x0, top)`: its label, the image, a frame and ticks every `step` voxels."
function panel(io, x0, top, label, png, n1, n2, s, step, axis; yaxis::Bool)
    pw, ph = n2 * s, n1 * s
    text(io, x0 + pw / 2, top - 10, label; size = 14, anchor = "middle")
    println(io, "<image x=\"$x0\" y=\"$top\" width=\"$pw\" height=\"$ph\" ",
            "preserveAspectRatio=\"none\" style=\"image-rendering:pixelated\" ",
            "xlink:href=\"data:image/png;base64,", base64(png), "\"/>")
    frame(io, x0, top, pw, ph)
    for v in 0:step:n2
        line(io, x0 + v * s, top + ph, x0 + v * s, top + ph + 4)
        text(io, x0 + v * s, top + ph + 16, string(v); size = 10, anchor = "middle")
    end
    text(io, x0 + pw / 2, top + ph + 32, "x ($axis)"; anchor = "middle")
    yaxis || return
    for v in 0:step:n1
        line(io, x0 - 4, top + v * s, x0, top + v * s)
        text(io, x0 - 6, top + v * s, string(v); size = 10, anchor = "end",
             attrs = " dy=\"0.35em\"")
    end
    vertical_text(io, x0 - 36, top + ph / 2, "y ($axis)")
end

"The colour bar: the viridis samples as a gradient, `lo` at the bottom, with its ticks."
function colour_bar(io, x, top, w, h, lo, hi, scale, tick_vals, labels)
    println(io, "<defs><linearGradient id=\"bar\" x1=\"0\" y1=\"1\" x2=\"0\" y2=\"0\">")
    for (k, c) in enumerate(VIRIDIS)
        offset = round((k - 1) / (length(VIRIDIS) - 1); digits = 4)
        println(io, "<stop offset=\"$offset\" stop-color=\"$(hex(c))\"/>")
    end
    println(io, "</linearGradient></defs>")
    frame(io, x, top, w, h; fill = "url(#bar)")
    for (t, label) in zip(tick_vals, labels)
        y = top + h * (1 - bar_position(t, lo, hi, scale))
        line(io, x + w, y, x + w + 5, y)
        text(io, x + w + 8, y, label; size = 11, attrs = " dy=\"0.35em\"")
    end
end

"Rows of strings in columns of `widths`, the first row bold."
function table_text(io, x, top, rows, widths)
    for (r, row) in enumerate(rows)
        cx = x
        for (c, cell) in enumerate(row)
            text(io, cx, top + 18 * r, cell; attrs = r == 1 ? " font-weight=\"bold\"" : "")
            cx += widths[c]
        end
    end
end

"""
    write_map_figure(path, maps; title, quantity = title, unit, scale = :linear, range = nothing,
                     low = nothing, caption = String[], table = nothing, axis = "voxel",
                     no_value = "no value") -> path

Writes maps of one quantity as an SVG figure:
- `maps`: `[(label, matrix), ...]` of one size, rows down and columns across, drawn side by side
  on one colour scale (viridis); NaN is drawn light grey, which the caption explains as
  `no_value`.
- `title`: the heading; `quantity`, `unit`: the colour bar's label `"\$quantity (\$unit)"`.
- `scale`: `:linear` or `:log` (values <= 0 then have no colour).
- `range = (lo, hi)`: the colour bar's ends; by default one that holds every finite value of
  every map (`colour_range`; a linear one starts at `low` when given). Values outside a range
  given here are drawn at its ends, and the caption says how many there are.
- `table`: rows of strings (the first is the header) printed beside the colour bar, e.g. the
  true and estimated value of each region.
- `caption`: lines printed below the maps; `axis`: the unit of the map axes.
"""
function write_map_figure(path::AbstractString, maps::AbstractVector; title::AbstractString,
                          quantity::AbstractString = title, unit::AbstractString,
                          scale::Symbol = :linear, range = nothing, low = nothing,
                          caption = String[], table = nothing, axis::AbstractString = "voxel",
                          no_value::AbstractString = "no value")
    scale in (:linear, :log) ||
        throw(ArgumentError("write_map_figure: scale must be :linear or :log, got $(repr(scale))"))
    isempty(maps) && throw(ArgumentError("write_map_figure: no maps"))
    arrays = [Float64.(Array(m)) for (_, m) in maps]
    n1, n2 = size(arrays[1])
    all(a -> size(a) == (n1, n2), arrays) || throw(DimensionMismatch(
        "write_map_figure: the maps have sizes $(map(size, arrays)); they must have one size"))
    values = [x for a in arrays for x in a]
    lo, hi = range === nothing ? colour_range(values, scale; low = low) : Float64.(range)
    clipped = count(x -> isfinite(x) && (x < lo || x > hi), values)

    # layout: maps side by side, the colour bar and its label, the table; the caption below
    s = max(1, cld(256, max(n1, n2)))              # pixels per voxel
    pw, ph = n2 * s, n1 * s
    left, top, gap, bar_w = 64, 64, 28, 18
    bar_x = left + length(maps) * (pw + gap) + 12
    tick_vals = ticks(lo, hi, scale; min_gap = 16 / ph)
    step = length(tick_vals) > 1 ? minimum(diff(tick_vals)) : hi - lo
    labels = [tick_label(t, step) for t in tick_vals]
    table_x = bar_x + bar_w + 8 + maximum(textwidth_px.(labels, 11)) + 40
    widths = table === nothing ? Int[] :
        [round(Int, maximum(textwidth_px(row[c], 12) for row in table) + 16)
         for c in 1:length(table[1])]
    lines = String[caption...]
    clipped > 0 && push!(lines, "$clipped value(s) outside $(tick_label(lo, step)) to " *
                                "$(tick_label(hi, step)) $unit are drawn at the ends of the scale.")
    push!(lines, "Light grey: $no_value. Each square is one $axis; " *
                 "$(scale === :log ? "logarithmic" : "linear") colour scale (viridis).")
    width = round(Int, table_x + sum(widths) + 16)
    height = top + ph + 58 + 18 * length(lines)

    io = IOBuffer()
    println(io, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>")
    println(io, "<svg xmlns=\"http://www.w3.org/2000/svg\" ",
            "xmlns:xlink=\"http://www.w3.org/1999/xlink\" ",
            "width=\"$width\" height=\"$height\" viewBox=\"0 0 $width $height\" ",
            "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">")
    println(io, "<title>", xml(title), "</title>")
    println(io, "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>")
    text(io, left, 30, title; size = 18, attrs = " font-weight=\"bold\"")
    axis_step = max(1, round(Int, nice_step(max(n1, n2), 4)))
    for (k, (label, _)) in enumerate(maps)
        png = png_palette(map_indices(arrays[k], lo, hi, scale, s), PALETTE)
        panel(io, left + (k - 1) * (pw + gap), top, label, png, n1, n2, s, axis_step, axis;
              yaxis = k == 1)
    end
    colour_bar(io, bar_x, top, bar_w, ph, lo, hi, scale, tick_vals, labels)
    vertical_text(io, table_x - 18, top + ph / 2, "$quantity ($unit)")
    table === nothing || table_text(io, table_x, top + 4, table, widths)
    for (i, l) in enumerate(lines)
        text(io, left - 50, top + ph + 58 + 18 * (i - 1), l)
    end
    println(io, "</svg>")
    mkpath(dirname(abspath(path)))
    write(path, take!(io))
    path
end

end # module MapFigures
