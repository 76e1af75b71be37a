# A minimal PNG writer in plain Julia, for parameter maps: 8-bit RGB, zlib "stored"
# (uncompressed) deflate blocks, CRC-32 per chunk, Adler-32 over the image data.

const PNG_SIGNATURE = UInt8[0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]

const CRC_TABLE = let t = Vector{UInt32}(undef, 256)
    for n in 0:255
        c = UInt32(n)
        for _ in 1:8
            c = (c & 0x1) != 0 ? 0xedb88320 ⊻ (c >> 1) : c >> 1
        end
        t[n+1] = c
    end
    t
end

"CRC-32 (ISO 3309, as PNG uses) of `data`, continuing from `crc`."
function crc32(data::AbstractVector{UInt8}, crc::UInt32 = 0x00000000)
    c = ~crc
    @inbounds for b in data
        c = CRC_TABLE[((c ⊻ b) & 0xff) + 1] ⊻ (c >> 8)
    end
    ~c
end

"Adler-32 of `data` (zlib's checksum)."
function adler32(data::AbstractVector{UInt8})
    a, b = UInt32(1), UInt32(0)
    for chunk in Iterators.partition(data, 5552)
        for x in chunk
            a += x
            b += a
        end
        a %= 65521
        b %= 65521
    end
    (b << 16) | a
end

"A zlib stream of `data` in stored (uncompressed) deflate blocks."
function zlib_stored(data::Vector{UInt8})
    out = UInt8[0x78, 0x01]
    n = length(data)
    pos = 1
    while true
        len = min(65535, n - pos + 1)
        final = pos + len > n
        push!(out, final ? 0x01 : 0x00)
        push!(out, UInt8(len & 0xff), UInt8(len >> 8))
        nlen = ~UInt16(len)
        push!(out, UInt8(nlen & 0xff), UInt8(nlen >> 8))
        append!(out, view(data, pos:pos+len-1))
        pos += len
        final && break
    end
    ad = adler32(data)
    append!(out, UInt8[(ad >> 24) & 0xff, (ad >> 16) & 0xff, (ad >> 8) & 0xff, ad & 0xff])
    out
end

be32(x::Integer) = UInt8[(x >> 24) & 0xff, (x >> 16) & 0xff, (x >> 8) & 0xff, x & 0xff]

function write_chunk(io::IO, kind::String, data::Vector{UInt8})
    write(io, be32(length(data)))
    body = vcat(Vector{UInt8}(codeunits(kind)), data)
    write(io, body)
    write(io, be32(crc32(body)))
end

"""
    write_png(path, rgb::Array{UInt8,3})

Writes an 8-bit RGB image (`height x width x 3`) as a PNG file.
"""
function write_png(path::AbstractString, rgb::Array{UInt8,3})
    h, w, c = size(rgb)
    c == 3 || throw(ArgumentError("write_png: need height x width x 3, got $(size(rgb))"))
    raw = Vector{UInt8}(undef, h * (1 + 3w))
    k = 1
    for i in 1:h
        raw[k] = 0x00   # filter: none
        k += 1
        for j in 1:w, ch in 1:3
            raw[k] = rgb[i, j, ch]
            k += 1
        end
    end
    mkpath(dirname(abspath(path)))
    open(path, "w") do io
        write(io, PNG_SIGNATURE)
        write_chunk(io, "IHDR", vcat(be32(w), be32(h), UInt8[8, 2, 0, 0, 0]))
        write_chunk(io, "IDAT", zlib_stored(raw))
        write_chunk(io, "IEND", UInt8[])
    end
    path
end

# viridis at 0, 1/4, 1/2, 3/4, 1
const VIRIDIS = ((68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37))

"RGB of `t` in [0, 1] on a colormap (`:viridis` or `:gray`)."
function colormap_rgb(t::Real, cmap::Symbol)
    t = clamp(Float64(t), 0.0, 1.0)
    if cmap === :gray
        v = round(UInt8, 255t)
        return (v, v, v)
    end
    cmap === :viridis || throw(ArgumentError("colormap must be :viridis or :gray, got $(repr(cmap))"))
    x = 4t
    i = min(floor(Int, x), 3)
    f = x - i
    a, b = VIRIDIS[i+1], VIRIDIS[i+2]
    ntuple(ch -> round(UInt8, a[ch] + f * (b[ch] - a[ch])), 3)
end

"Pixels of one map, upscaled by `scale`; NaN shows black."
function render(img::AbstractMatrix{<:Real}, lo, hi, scale::Int, cmap::Symbol)
    h, w = size(img)
    out = zeros(UInt8, h * scale, w * scale, 3)
    for j in 1:w, i in 1:h
        v = img[i, j]
        isfinite(v) || continue
        rgb = colormap_rgb(hi > lo ? (v - lo) / (hi - lo) : 0.5, cmap)
        for dj in 1:scale, di in 1:scale, ch in 1:3
            out[(i-1)*scale+di, (j-1)*scale+dj, ch] = rgb[ch]
        end
    end
    out
end

function colorbar(width::Int, height::Int, cmap::Symbol)
    out = zeros(UInt8, height, width, 3)
    for j in 1:width
        rgb = colormap_rgb((j - 1) / max(1, width - 1), cmap)
        for i in 1:height, ch in 1:3
            out[i, j, ch] = rgb[ch]
        end
    end
    out
end

finite_extrema(a) = (v = filter(isfinite, vec(Float64.(a))); isempty(v) ? (0.0, 1.0) : extrema(v))

"""
    save_png(path, img; range = extrema, scale = 4, colormap = :viridis, colorbar = true)

Saves a real matrix (rows down, columns across) as a PNG: values mapped linearly from
`range = (lo, hi)` onto the colormap (`:viridis` or `:gray`), NaN black, each value
`scale x scale` pixels, with a colour bar from `lo` (left) to `hi` (right) below. A KmmArray
is copied to the host first. Returns `path`.
"""
function save_png(path::AbstractString, img::AbstractMatrix; range = nothing, scale::Integer = 4,
                  colormap::Symbol = :viridis, colorbar::Bool = true)
    save_png_pair(path, img, nothing; range = range, scale = scale, colormap = colormap,
                  colorbar = colorbar)
end

"""
    save_png_pair(path, left, right; range = joint extrema, scale = 4, gap = 2, colormap = :viridis)

Saves two maps of one size side by side (e.g. true | estimated) on one colour scale, with a
white gap of `gap` values between them and a colour bar below. Returns `path`.
"""
function save_png_pair(path::AbstractString, left::AbstractMatrix, right; range = nothing,
                       scale::Integer = 4, gap::Integer = 2, colormap::Symbol = :viridis,
                       colorbar::Bool = true)
    a = Float64.(Array(left))
    b = right === nothing ? nothing : Float64.(Array(right))
    b === nothing || size(a) == size(b) || throw(DimensionMismatch(
        "save_png_pair: the maps are $(size(a)) and $(size(b)); they must have one size"))
    lo, hi = range === nothing ? finite_extrema(b === nothing ? a : vcat(vec(a), vec(b))) : range
    s = Int(scale)
    pa = render(a, lo, hi, s, colormap)
    img = if b === nothing
        pa
    else
        g = fill(0xff, size(pa, 1), gap * s, 3)
        cat(pa, g, render(b, lo, hi, s, colormap); dims = 2)
    end
    if colorbar
        w = size(img, 2)
        space = fill(0xff, 2s, w, 3)
        img = cat(img, space, QMRI.colorbar(w, 3s, colormap); dims = 1)
    end
    write_png(path, img)
end
