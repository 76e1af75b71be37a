//! The figures notebooks show, as SVG (text stays text; Pluto, Jupyter and browsers draw it):
//! a memory map (each chunk a row, its blocks coloured free, in use or mapped) and a memory
//! timeline (bytes in use and reserved over time, per kind, from a trace). Pure functions of
//! the data; the bindings only pass the text on.

use crate::manager::trace::Record;
use crate::manager::{human_bytes, MapSegment, MemoryMap, SegmentState};
use std::fmt::Write;

const WIDTH: f64 = 760.0;
const LEFT: f64 = 150.0;
/// The maps' rows are labelled with a chunk's address and size.
const MAP_LEFT: f64 = 205.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 46.0;
const FONT: &str = "font-family=\"sans-serif\" font-size=\"12\"";

/// Rows drawn at most; a note above the rows counts the rest.
const MAX_ROWS: usize = 48;

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A unit for byte figures up to `max`: (divisor, name).
fn byte_unit(max: u64) -> (f64, &'static str) {
    match max {
        m if m >= 1 << 30 => ((1u64 << 30) as f64, "GiB"),
        m if m >= 1 << 20 => ((1u64 << 20) as f64, "MiB"),
        m if m >= 1 << 10 => (1024.0, "KiB"),
        _ => (1.0, "B"),
    }
}

/// About five round tick values (1, 2 or 5 times a power of ten) from 0 to past `max`.
fn ticks(max: f64) -> Vec<f64> {
    ticks_from(max, 0.0)
}

/// `ticks`, at least `min_step` apart (1 for a count of the smallest unit: no tick at 0.2 ns).
fn ticks_from(max: f64, min_step: f64) -> Vec<f64> {
    if max <= 0.0 {
        return vec![0.0, 1.0];
    }
    let raw = max / 5.0;
    let power = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].into_iter().map(|m| m * power).find(|s| *s >= raw).unwrap_or(10.0 * power).max(min_step);
    let n = (max / step).ceil() as usize;
    (0..=n).map(|i| i as f64 * step).collect()
}

fn number(v: f64) -> String {
    if v == v.trunc() {
        format!("{v:.0}")
    } else {
        format!("{:.3}", v).trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

fn header(out: &mut String, height: f64, title: &str) {
    let _ = write!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" viewBox=\"0 0 {WIDTH} {height}\">\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\
         <text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-family=\"sans-serif\" font-size=\"15\" font-weight=\"bold\">{}</text>",
        WIDTH / 2.0,
        escape(title)
    );
}

/// What a legend entry shows before its label: a box of a fill colour, or a line (dashed or
/// not) of a colour.
#[derive(Clone, Copy)]
enum Swatch<'a> {
    Box(&'a str),
    Line(&'a str, bool),
}

/// Legend rows are this far apart.
const LEGEND_ROW: f64 = 16.0;

/// Where each legend entry goes from `left` (x, row), and how many rows: entries wrap to a new
/// row before they would cross the right margin.
fn legend_layout(left: f64, labels: &[&str]) -> (Vec<(f64, usize)>, usize) {
    let (mut x, mut row) = (left, 0);
    let mut at = Vec::with_capacity(labels.len());
    for label in labels {
        // About 7 px a character at 12 px sans-serif, after the 27 px of the swatch.
        let width = 27.0 + 7.0 * label.chars().count() as f64;
        if x > left && x + width > WIDTH - RIGHT {
            (x, row) = (left, row + 1);
        }
        at.push((x, row));
        x += width + 13.0;
    }
    (at, row + 1)
}

/// The extra height a legend of these labels needs beyond its first row.
fn legend_extra_height(left: f64, labels: &[&str]) -> f64 {
    (legend_layout(left, labels).1 - 1) as f64 * LEGEND_ROW
}

/// A legend whose last row's text sits on `bottom`, its rows above.
fn legend(out: &mut String, left: f64, bottom: f64, entries: &[(Swatch, &str)]) {
    let labels: Vec<&str> = entries.iter().map(|e| e.1).collect();
    let (at, rows) = legend_layout(left, &labels);
    for ((swatch, label), (x, row)) in entries.iter().zip(at) {
        let y = bottom - (rows - 1 - row) as f64 * LEGEND_ROW;
        let _ = match swatch {
            Swatch::Box(colour) => write!(
                out,
                "<rect x=\"{x}\" y=\"{}\" width=\"14\" height=\"10\" fill=\"{colour}\" stroke=\"#333\" stroke-width=\"0.5\"/>",
                y - 9.0
            ),
            Swatch::Line(colour, dashed) => write!(
                out,
                "<line x1=\"{x}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{colour}\" stroke-width=\"2\"{}/>",
                y - 4.0,
                x + 22.0,
                y - 4.0,
                if *dashed { " stroke-dasharray=\"6,3\"" } else { "" }
            ),
        };
        let _ = write!(out, "<text x=\"{}\" y=\"{y}\" {FONT}>{}</text>", x + 27.0, escape(label));
    }
}

/// An x axis from 0 to `max` (in the unit its label names) over `width` pixels from `left`:
/// the line, round ticks (at least `min_step` apart) with their values, and the label.
fn x_axis(out: &mut String, left: f64, width: f64, y: f64, max: f64, min_step: f64, label: &str) {
    let _ = write!(out, "<line x1=\"{left}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\" stroke=\"#333\"/>", left + width);
    // An empty axis (nothing reserved, no records) has its 0 alone: every tick would sit on it.
    let (scale, ticks) = if max > 0.0 { (width / max, ticks_from(max, min_step)) } else { (0.0, vec![0.0]) };
    for t in ticks {
        let x = left + t * scale;
        if x > left + width + 0.5 {
            break;
        }
        let _ = write!(
            out,
            "<line x1=\"{x:.2}\" y1=\"{y}\" x2=\"{x:.2}\" y2=\"{}\" stroke=\"#333\"/><text x=\"{x:.2}\" y=\"{}\" text-anchor=\"middle\" {FONT}>{}</text>",
            y + 4.0,
            y + 17.0,
            number(t)
        );
    }
    let _ = write!(out, "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" {FONT}>{}</text>", left + width / 2.0, y + 33.0, escape(label));
}

const FREE: &str = "#e6e6e6";
const IN_USE: &str = "#3b75af";
const MAPPED: &str = "#ef8636";

/// A run of blocks of more than one state grows to this many pixels at most: it is drawn split
/// by state, so a wider one would show its states side by side far from where they lie.
const MIXED_RUN_PX: f64 = 8.0;

/// Blocks of one row drawn together: those that share pixels.
struct Run {
    x: f64,
    end: f64,
    first: MapSegment,
    blocks: usize,
    bytes: u64,
    /// Blocks per state (free, in use, mapped).
    count: [usize; 3],
    /// Bytes per state (free, in use, mapped).
    bytes_by: [u64; 3],
}

impl Run {
    fn new(s: &MapSegment, x: f64, end: f64) -> Run {
        let (mut count, mut bytes_by) = ([0; 3], [0; 3]);
        count[s.state as usize] = 1;
        bytes_by[s.state as usize] = s.bytes;
        Run { x, end, first: *s, blocks: 1, bytes: s.bytes, count, bytes_by }
    }

    /// Whether `s` may join: blocks of the run's one state always (one colour, drawn exactly);
    /// another state only while the run is narrower than `MIXED_RUN_PX`.
    fn takes(&self, s: &MapSegment) -> bool {
        self.count[s.state as usize] == self.blocks || self.end - self.x < MIXED_RUN_PX
    }

    fn add(&mut self, s: &MapSegment, end: f64) {
        self.end = self.end.max(end);
        self.blocks += 1;
        self.bytes += s.bytes;
        self.count[s.state as usize] += 1;
        self.bytes_by[s.state as usize] += s.bytes;
    }

    fn draw(&self, out: &mut String, y: f64, h: f64) {
        let s = &self.first;
        let what = if self.blocks > 1 {
            let [f, u, m] = self.count;
            format!("{} blocks: {m} mapped, {u} in use, {f} free", self.blocks)
        } else if s.state == SegmentState::Free {
            "free".to_string()
        } else {
            format!("buffer {:#x}: {} asked", s.buffer, human_bytes(s.requested))
        };
        let title = format!("{:#x}, {}: {}", s.address, human_bytes(self.bytes), escape(&what));
        let states = self.count.iter().filter(|&&c| c > 0).count();
        if states == 1 || self.bytes == 0 {
            let colour = [FREE, IN_USE, MAPPED][s.state as usize];
            let _ = write!(
                out,
                "<rect x=\"{:.2}\" y=\"{y}\" width=\"{:.2}\" height=\"{h}\" fill=\"{colour}\" stroke=\"white\" stroke-width=\"0.3\"><title>{title}</title></rect>",
                self.x,
                self.end - self.x
            );
            return;
        }
        // Blocks of several states under a few pixels: a rectangle per state, as wide as its
        // share of the bytes (one mapped block in fifty shows as a fiftieth, not as the whole
        // run), without strokes that would hide the narrow ones.
        let mut x = self.x;
        for (state, colour) in [(1, IN_USE), (2, MAPPED), (0, FREE)] {
            if self.bytes_by[state] == 0 {
                continue;
            }
            let w = (self.end - self.x) * self.bytes_by[state] as f64 / self.bytes as f64;
            let _ = write!(out, "<rect x=\"{x:.3}\" y=\"{y}\" width=\"{w:.3}\" height=\"{h}\" fill=\"{colour}\"><title>{title}</title></rect>");
            x += w;
        }
    }
}

/// Each chunk a row, scaled to the largest chunk; blocks coloured by state.
pub fn memory_map_svg(map: &MemoryMap, title: &str) -> String {
    let chunks: Vec<_> = map.chunks().collect();
    let rows = chunks.len().min(MAX_ROWS);
    let row_h = 18.0;
    let plot_h = (rows.max(1) as f64) * row_h;
    let free = format!("free ({}, largest {})", human_bytes(map.free_bytes()), human_bytes(map.largest_free()));
    let entries = [(Swatch::Box(FREE), free.as_str()), (Swatch::Box(IN_USE), "in use"), (Swatch::Box(MAPPED), "mapped (never moves)")];
    let labels = entries.map(|e| e.1);
    let height = TOP + plot_h + 78.0 + legend_extra_height(MAP_LEFT, &labels);
    let mut out = String::new();
    header(&mut out, height, title);
    let largest = chunks.iter().map(|c| c.iter().map(|s| s.bytes).sum::<u64>()).max().unwrap_or(0);
    let (div, unit) = byte_unit(largest);
    let plot_w = WIDTH - MAP_LEFT - RIGHT;
    let scale = if largest == 0 { 0.0 } else { plot_w / largest as f64 };
    if chunks.is_empty() {
        let _ = write!(out, "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" {FONT}>no memory reserved</text>", MAP_LEFT + plot_w / 2.0, TOP + 12.0);
    }
    for (row, chunk) in chunks.iter().take(MAX_ROWS).enumerate() {
        let y = TOP + row as f64 * row_h;
        let size: u64 = chunk.iter().map(|s| s.bytes).sum();
        let _ = write!(
            out,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\" font-family=\"monospace\" font-size=\"11\">{:#x} ({})</text>",
            MAP_LEFT - 6.0,
            y + row_h * 0.68,
            chunk[0].chunk,
            human_bytes(size)
        );
        // Blocks that fall on the pixel of the one drawn before, and end within one more, join
        // it: a row draws at most a few rectangles per pixel, however many buffers the chunk
        // holds. A run of one state is one rectangle; one of several (at most `MIXED_RUN_PX`
        // wide) a rectangle per state, in proportion to its bytes. A larger block that starts
        // there begins where the run ends: one small buffer does not colour the free space after
        // it.
        let mut run: Option<Run> = None;
        for s in chunk.iter() {
            // Both edges from byte offsets: a block starts exactly where the one before it ends
            // (a sum of scaled sizes rounds apart and could make a free block join a used one).
            // Every block stays visible, however small next to the largest chunk.
            let offset = s.address - s.chunk;
            let x = MAP_LEFT + offset as f64 * scale;
            let end = (MAP_LEFT + (offset + s.bytes) as f64 * scale).max(x + 1.0);
            if let Some(r) = run.as_mut().filter(|r| x < r.end && end <= r.end + 1.0 && r.takes(s)) {
                r.add(s, end);
                continue;
            }
            let start = match run.take() {
                Some(r) => {
                    r.draw(&mut out, y + 2.0, row_h - 4.0);
                    x.max(r.end)
                }
                None => x,
            };
            run = Some(Run::new(s, start, end.max(start + 1.0)));
        }
        if let Some(r) = run {
            r.draw(&mut out, y + 2.0, row_h - 4.0);
        }
    }
    // The x axis: offset within a chunk.
    let axis_y = TOP + plot_h + 4.0;
    x_axis(&mut out, MAP_LEFT, plot_w, axis_y, largest as f64 / div, 0.0, &format!("offset in chunk ({unit})"));
    let _ = write!(out, "<text x=\"{}\" y=\"{}\" text-anchor=\"end\" {FONT}>chunk (size)</text>", MAP_LEFT - 6.0, TOP - 6.0);
    let more = chunks.len().saturating_sub(MAX_ROWS);
    legend(&mut out, MAP_LEFT, height - 12.0, &entries);
    if more > 0 {
        // Above the rows, right (the legend takes the bottom line).
        let _ = write!(out, "<text x=\"{}\" y=\"{}\" text-anchor=\"end\" {FONT}>the first {MAX_ROWS} chunks; {more} more not drawn</text>", WIDTH - RIGHT, TOP - 6.0);
    }
    out += "</svg>";
    out
}

/// Bytes in use and reserved over the trace's time, per kind that has records.
pub fn timeline_svg(records: &[Record], title: &str) -> String {
    // One step line per kind and figure that has values (reserved: `u64::MAX` where the manager
    // does not count it), and device bytes on the host when the trace saw a spill.
    let lines: [(u32, bool, &str, &str); 4] = [
        (0, true, "#3b75af", "device in use"),
        (0, false, "#3b75af", "device reserved"),
        (1, true, "#ef8636", "pinned in use"),
        (1, false, "#ef8636", "pinned reserved"),
    ];
    let series = |kind: u32, in_use: bool| {
        records.iter().filter(move |r| r.kind == kind).filter_map(move |r| match (in_use, r.reserved) {
            (true, _) => Some((r.time_ns, r.in_use)),
            (false, u64::MAX) => None,
            (false, reserved) => Some((r.time_ns, reserved)),
        })
    };
    let spilled = spilled_series(records);
    let mut entries: Vec<(Swatch, &str)> =
        lines.iter().filter(|l| series(l.0, l.1).next().is_some()).map(|l| (Swatch::Line(l.2, !l.1), l.3)).collect();
    if !spilled.is_empty() {
        entries.push((Swatch::Line(SPILLED, false), "device spilled to host"));
    }
    let labels: Vec<&str> = entries.iter().map(|e| e.1).collect();
    let plot_h = 260.0;
    let height = TOP + plot_h + 84.0 + legend_extra_height(LEFT, &labels);
    let plot_w = WIDTH - LEFT - RIGHT;
    let mut out = String::new();
    header(&mut out, height, title);
    let end_ns = records.last().map_or(0, |r| r.time_ns).max(1);
    let counted = |r: &Record| if r.reserved == u64::MAX { r.in_use } else { r.reserved.max(r.in_use) };
    let max = records.iter().map(counted).chain(spilled.iter().map(|s| s.1)).max().unwrap_or(0);
    let (div, unit) = byte_unit(max);
    let y_ticks = ticks(max as f64 / div);
    let y_top = y_ticks.last().copied().unwrap_or(1.0).max(f64::MIN_POSITIVE) * div;
    // A unit in which the span is at least 10 (ns: at least 1, and ticks whole nanoseconds),
    // so the ticks' labels, three decimals at most, differ: a span of 1 ns in µs labelled its
    // ticks 0, 0, 0, 0.001.
    let (t_div, t_unit) = match end_ns {
        n if n >= 10_000_000_000 => (1e9, "s"),
        n if n >= 10_000_000 => (1e6, "ms"),
        n if n >= 10_000 => (1e3, "µs"),
        _ => (1.0, "ns"),
    };
    let x_of = |ns: u64| LEFT + ns as f64 / end_ns as f64 * plot_w;
    let y_of = |bytes: u64| TOP + plot_h - bytes as f64 / y_top * plot_h;
    // Axes, grid and labels.
    for t in &y_ticks {
        let y = y_of((t * div) as u64);
        let _ = write!(
            out,
            "<line x1=\"{LEFT}\" y1=\"{y:.2}\" x2=\"{}\" y2=\"{y:.2}\" stroke=\"#ddd\"/><text x=\"{}\" y=\"{:.2}\" text-anchor=\"end\" {FONT}>{}</text>",
            LEFT + plot_w,
            LEFT - 6.0,
            y + 4.0,
            number(*t)
        );
    }
    let axis_y = TOP + plot_h;
    let _ = write!(out, "<line x1=\"{LEFT}\" y1=\"{TOP}\" x2=\"{LEFT}\" y2=\"{axis_y}\" stroke=\"#333\"/>");
    // No records: no span, a tick at 0 alone.
    let span = if records.is_empty() { 0.0 } else { end_ns as f64 / t_div };
    x_axis(&mut out, LEFT, plot_w, axis_y, span, 1.0 / t_div, &format!("time since the trace started ({t_unit})"));
    let _ = write!(
        out,
        "<text transform=\"translate({},{}) rotate(-90)\" text-anchor=\"middle\" {FONT}>bytes ({unit})</text>",
        LEFT - 58.0,
        TOP + plot_h / 2.0
    );
    if records.is_empty() {
        let _ = write!(out, "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" {FONT}>no records in the trace</text>", LEFT + plot_w / 2.0, TOP + plot_h / 2.0);
    }
    for (kind, in_use, colour, _) in lines {
        let points = pixel_columns(series(kind, in_use), &x_of);
        step_line(&mut out, &points, LEFT + plot_w, colour, if in_use { "" } else { "6,3" }, &y_of);
    }
    if !spilled.is_empty() {
        let points = pixel_columns(spilled.iter().copied(), &x_of);
        step_line(&mut out, &points, LEFT + plot_w, SPILLED, "", &y_of);
    }
    legend(&mut out, LEFT, height - 12.0, &entries);
    out += "</svg>";
    out
}

/// The timeline's colour for device bytes on the host.
const SPILLED: &str = "#59a14f";

/// Bytes of device buffers on the host after each spill, restore and free of a spilled buffer
/// (a free at address 0), from the trace alone: a trace that started with buffers spilled is
/// lifted so it never goes below 0 (its least consistent level); empty without spills.
fn spilled_series(records: &[Record]) -> Vec<(u64, u64)> {
    use crate::manager::trace::Action;
    let mut level = 0i128;
    let mut lowest = 0i128;
    let mut steps = Vec::new();
    let mut any = false;
    for r in records.iter().filter(|r| r.kind == 0) {
        let delta = match Action::from_u32(r.action) {
            Some(Action::Spill) => r.bytes as i128,
            Some(Action::Restore) => -(r.bytes as i128),
            Some(Action::Free) if r.address == 0 && r.bytes > 0 => -(r.bytes as i128),
            _ => continue,
        };
        any |= !matches!(Action::from_u32(r.action), Some(Action::Free));
        level += delta;
        lowest = lowest.min(level);
        steps.push((r.time_ns, level));
    }
    if !any {
        return Vec::new();
    }
    steps.into_iter().map(|(ns, l)| (ns, (l - lowest) as u64)).collect()
}

/// (time, bytes) as (x, bytes), one point per half-pixel column at its largest: peaks survive
/// however many records there are.
fn pixel_columns(values: impl Iterator<Item = (u64, u64)>, x_of: &dyn Fn(u64) -> f64) -> Vec<(f64, u64)> {
    let mut points: Vec<(f64, u64)> = Vec::new();
    for (ns, value) in values {
        let x = (x_of(ns) * 2.0).round() / 2.0;
        match points.last_mut() {
            Some((px, v)) if *px == x => *v = (*v).max(value),
            _ => points.push((x, value)),
        }
    }
    points
}

/// A step line through `points` (x, bytes) that runs on to `right`.
fn step_line(out: &mut String, points: &[(f64, u64)], right: f64, colour: &str, dash: &str, y_of: &dyn Fn(u64) -> f64) {
    if points.is_empty() {
        return;
    }
    let mut path = String::new();
    for (i, (x, v)) in points.iter().enumerate() {
        let y = y_of(*v);
        let _ = if i == 0 { write!(path, "M{x:.1},{y:.1}") } else { write!(path, "H{x:.1}V{y:.1}") };
    }
    let _ = write!(path, "H{right:.1}");
    let dash = if dash.is_empty() { String::new() } else { format!(" stroke-dasharray=\"{dash}\"") };
    let _ = write!(out, "<path d=\"{path}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.6\"{dash}/>");
    if right - points[0].0 < 4.0 {
        // Records only in the last pixels (one record, a trace started just before it was
        // drawn): a line of a pixel or none is not seen; a dot shows where it ends.
        let (x, v) = points[points.len() - 1];
        let _ = write!(out, "<circle cx=\"{x:.1}\" cy=\"{:.1}\" r=\"3.5\" fill=\"{colour}\"/>", y_of(v));
    }
}

/// Figures one above the other, as one SVG (each keeps its own size).
pub fn stack(figures: &[String]) -> String {
    let height_of = |svg: &str| -> f64 {
        let at = svg.find("height=\"").map(|i| i + 8).unwrap_or(0);
        svg[at..].split('"').next().and_then(|h| h.parse().ok()).unwrap_or(0.0)
    };
    let total: f64 = figures.iter().map(|f| height_of(f)).sum();
    let mut out = format!("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{total}\" viewBox=\"0 0 {WIDTH} {total}\">");
    let mut y = 0.0;
    for f in figures {
        // A nested svg element takes a position; the figure's own attributes follow.
        out += &f.replacen("<svg ", &format!("<svg y=\"{y}\" "), 1);
        y += height_of(f);
    }
    out += "</svg>";
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manager::trace::Action;

    fn rec(time_ns: u64, action: Action, address: u64, bytes: u64) -> Record {
        Record { time_ns, action: action as u32, address, bytes, ..Default::default() }
    }

    #[test]
    fn the_spilled_series_follows_spills_restores_and_frees_and_never_goes_below_zero() {
        let r = [
            rec(1, Action::Allocate, 0x1000, 10),
            rec(2, Action::Spill, 0x1000, 10),
            rec(3, Action::Spill, 0x2000, 5),
            rec(4, Action::Restore, 0x3000, 10),
            rec(5, Action::Free, 0, 5), // the spilled buffer of 5 bytes, freed on the host
        ];
        assert_eq!(spilled_series(&r), vec![(2, 10), (3, 15), (4, 5), (5, 0)]);
        // A trace that began with 7 bytes on the host: restored first, lifted to stay >= 0.
        let r = [rec(1, Action::Restore, 0x1000, 7), rec(2, Action::Spill, 0x2000, 3)];
        assert_eq!(spilled_series(&r), vec![(1, 0), (2, 3)]);
        assert!(spilled_series(&[rec(1, Action::Free, 0, 4)]).is_empty(), "no spill, no line");
    }
}
