//! The reports' plots, as SVG (plotters), one colour per switch: an NDR run's throughput
//! against frame size (NDR solid, MRR thin) and latency against offered load (p99 solid, p50
//! thin); an MRR sweep's rate against the VNF's ring size.

use crate::ndr::{Latency, Measured, Results};
use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use std::path::Path;

const COLORS: [RGBColor; 5] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
];

/// The switches of a run, in the order asked, with their colour.
fn switches(r: &Results) -> impl Iterator<Item = (crate::switches::Kind, RGBColor)> + '_ {
    r.config.switches.iter().enumerate().map(|(i, k)| (*k, COLORS[i % COLORS.len()]))
}

/// A drawing area of the reports' size on a white SVG at `path`.
fn canvas(path: &Path) -> anyhow::Result<DrawingArea<SVGBackend<'_>, Shift>> {
    let root = SVGBackend::new(path, (760, 440)).into_drawing_area();
    root.fill(&WHITE)?;
    Ok(root)
}

/// A chart of the reports' layout over `x` and `y`.
type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// The reports' chart on `root`, captioned, over `x` and `y`.
fn chart<'a, 'b>(
    root: &'a DrawingArea<SVGBackend<'b>, Shift>,
    caption: String,
    x: std::ops::Range<f64>,
    y: std::ops::Range<f64>,
) -> anyhow::Result<Chart<'a, 'b>> {
    Ok(ChartBuilder::on(root)
        .caption(caption, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(x, y)?)
}

/// The legend's mark for a thick line of `color`.
fn thick(color: RGBColor) -> impl Fn((i32, i32)) -> PathElement<(i32, i32)> {
    move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3))
}

/// Draws the legend and writes the file.
fn finish<'a, 'b: 'a>(
    mut chart: Chart<'a, 'b>,
    root: &DrawingArea<SVGBackend<'b>, Shift>,
) -> anyhow::Result<()> {
    chart.configure_series_labels().background_style(WHITE.mix(0.85)).border_style(BLACK).draw()?;
    Ok(root.present()?)
}

/// A range around `lo..hi` with room at both ends (and some width when they are equal).
fn padded(lo: f64, hi: f64) -> std::ops::Range<f64> {
    let pad = ((hi - lo) * 0.08).max(hi.abs() * 0.1).max(1.0);
    (lo - pad).max(0.0)..hi + pad
}

/// NDR and MRR (Mpps) against frame size.
pub fn throughput(r: &Results, path: &Path) -> anyhow::Result<()> {
    let sizes = &r.config.sizes;
    let (lo, hi) = sizes
        .iter()
        .map(|s| s.mean())
        .fold((f64::INFINITY, 0f64), |(lo, hi), m| (lo.min(m), hi.max(m)));
    let (lo, hi) = if lo.is_finite() { (lo, hi) } else { (64.0, 64.0) };
    let top = r.measured.iter().map(|m| m.mrr.received / 1e6).fold(1.0, f64::max) * 1.15;
    let root = canvas(path)?;
    let mut chart = chart(
        &root,
        format!("{}: NDR (thick) and MRR (thin), Mpps", r.config.scenario.name()),
        padded(lo, hi),
        0f64..top,
    )?;
    chart
        .configure_mesh()
        .x_desc("frame size on the wire, bytes (IMIX at its mean)")
        .y_desc("Mpps")
        .draw()?;
    for (kind, color) in switches(r) {
        let of = |f: &dyn Fn(&Measured) -> Option<f64>| -> Vec<(f64, f64)> {
            // IMIX sits at its mean size.
            let mut v: Vec<(f64, f64)> = r
                .measured
                .iter()
                .filter(|m| m.switch == kind)
                .filter_map(|m| Some((m.size.mean(), f(m)? / 1e6)))
                .collect();
            v.sort_by(|a, b| a.0.total_cmp(&b.0));
            v
        };
        chart
            .draw_series(LineSeries::new(of(&|m| m.ndr), color.stroke_width(3)))?
            .label(format!("{} NDR", kind.name()))
            .legend(thick(color));
        chart.draw_series(LineSeries::new(of(&|m| Some(m.mrr.received)), color.stroke_width(1)))?;
    }
    finish(chart, &root)
}

/// p50 and p99 latency (µs) against offered load (Mpps) at one frame size.
pub fn latency(r: &Results, size: crate::frames::FrameSize, path: &Path) -> anyhow::Result<()> {
    let curve = |m: &Measured| -> Vec<Latency> {
        let mut v: Vec<Latency> = m.latency_curve.iter().chain(&m.latency).copied().collect();
        v.sort_by(|a, b| a.load.total_cmp(&b.load));
        v
    };
    let here: Vec<&Measured> = r.measured.iter().filter(|m| m.size == size).collect();
    let all: Vec<Latency> = here.iter().flat_map(|m| curve(m)).collect();
    if all.is_empty() {
        return Ok(());
    }
    let right = all.iter().map(|l| l.load / 1e6).fold(0.0, f64::max) * 1.1;
    let top = all.iter().map(|l| l.p99).fold(1.0, f64::max) * 1.15;
    let root = canvas(path)?;
    let mut chart = chart(
        &root,
        format!("{}, {size} B: latency p99 (thick) and p50 (thin), µs", r.config.scenario.name()),
        0f64..right,
        0f64..top,
    )?;
    chart.configure_mesh().x_desc("offered load, Mpps").y_desc("µs").draw()?;
    for (kind, color) in switches(r) {
        let Some(m) = here.iter().find(|m| m.switch == kind) else { continue };
        let c = curve(m);
        chart
            .draw_series(LineSeries::new(
                c.iter().map(|l| (l.load / 1e6, l.p99)),
                color.stroke_width(3),
            ))?
            .label(kind.name())
            .legend(thick(color));
        chart.draw_series(LineSeries::new(
            c.iter().map(|l| (l.load / 1e6, l.p50)),
            color.stroke_width(1),
        ))?;
    }
    finish(chart, &root)
}

/// The median rate (thick) and the rounds' range (thin bars) against the ring size, one
/// line a switch, at frame size `size`.
pub fn across_rings(
    runs: &[crate::mrr::Results],
    size: crate::frames::FrameSize,
    path: &Path,
) -> anyhow::Result<()> {
    let Some(first) = runs.first() else { return Ok(()) };
    // The x axis is log2 of the ring size, labelled with the sizes (powers of two).
    let x = |r: &crate::mrr::Results| f64::from(r.config.vnf.ring).log2();
    let rings: Vec<f64> = runs.iter().map(x).collect();
    let lo = rings.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = rings.iter().copied().fold(0.0, f64::max);
    let top = runs
        .iter()
        .flat_map(|r| first.config.switches.iter().filter_map(move |&k| r.switch_at(size, k)))
        .map(|w| w.mpps.max)
        .fold(1.0, f64::max)
        * 1.15;
    let root = canvas(path)?;
    let mut chart = chart(
        &root,
        format!("{}, {size} B: Mpps against the VNF's ring size", first.config.scenario.name()),
        lo - 0.5..hi + 0.5,
        0f64..top,
    )?;
    chart
        .configure_mesh()
        .x_desc("entries of each virtqueue (queue_size, --rxd/--txd)")
        .x_labels((hi - lo) as usize + 2)
        .x_label_formatter(&|v| format!("{:.0}", v.exp2()))
        .y_desc("Mpps")
        .draw()?;
    for (i, &k) in first.config.switches.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let points: Vec<(f64, crate::stats::Summary)> =
            runs.iter().filter_map(|r| Some((x(r), r.switch_at(size, k)?.mpps))).collect();
        chart
            .draw_series(LineSeries::new(
                points.iter().map(|(x, m)| (*x, m.median)),
                color.stroke_width(3),
            ))?
            .label(k.name())
            .legend(thick(color));
        chart.draw_series(
            points.iter().map(|(x, m)| PathElement::new(vec![(*x, m.min), (*x, m.max)], color)),
        )?;
    }
    finish(chart, &root)
}
