//! The memory report and the sweep as SVG charts (plotters' SVG backend; text as `<text>`
//! elements, no fonts read).

use super::text::{human, mode_name};
use super::{MemoryReport, TimelinePoint, CATEGORIES};
use crate::plan::BufferKind;
use crate::sweep::Sweep;

/// Why [`render_svg`] failed (the plotting backend's error, as text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("rendering the memory chart: {0}")]
pub struct RenderError(pub String);

/// The colour of each category, in [`CATEGORIES`] order.
const COLORS: [(u8, u8, u8); 8] = [
    (31, 119, 180),  // parameters: blue
    (148, 103, 189), // optimizer state: purple
    (127, 127, 127), // inputs: grey
    (44, 160, 44),   // activations: green
    (255, 127, 14),  // gradients: orange
    (188, 189, 34),  // workspace: olive
    (23, 190, 207),  // running statistics: cyan
    (214, 39, 40),   // gradient buffers: red
];

/// A chart of live bytes over the step (x: kernel position in the step, y: MiB; KiB or bytes for small programs), stacked by category, with the
/// arena size and, when given, the cap as horizontal lines; legend and axis labels. Pure SVG:
/// text is emitted as `<text>` elements, no fonts are read.
pub fn render_svg(r: &MemoryReport, cap: Option<u64>) -> Result<String, RenderError> {
    use plotters::prelude::*;

    let err = |e: &dyn std::fmt::Display| RenderError(e.to_string());
    let xmax = r.timeline.len().max(1) as f64;
    let max_bytes = r
        .lower_bound_bytes
        .max(r.arena_bytes)
        .max(cap.unwrap_or(0))
        .max(1);
    // MiB, or a smaller unit for small programs so that the axis stays readable.
    let (unit, unit_name) = if max_bytes >= 1 << 20 {
        ((1u64 << 20) as f64, "MiB")
    } else if max_bytes >= 1 << 10 {
        (1024.0, "KiB")
    } else {
        (1.0, "bytes")
    };
    let y = |bytes: u64| bytes as f64 / unit;
    // Headroom above the highest line for the legend in the upper right corner.
    let top = y(max_bytes) * 1.45;

    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (1100, 620)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let caption = format!(
            "dmc: live bytes over one step ({} mode, batch {}; peak {} at kernel {})",
            mode_name(r.mode),
            r.batch,
            human(r.lower_bound_bytes),
            r.peak.step
        );
        let mut chart = ChartBuilder::on(&root)
            .caption(caption, ("sans-serif", 20))
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(80)
            .build_cartesian_2d(0f64..xmax, 0f64..top)
            .map_err(|e| err(&e))?;
        // Tick labels with as many decimals as the tick spacing needs, so that no two read the
        // same ("0, 0, 1, 2, 2" for a 3 MiB program); kernel positions are whole numbers, at most
        // one tick per kernel.
        let y_ticks = 8;
        let decimals = (-(top / y_ticks as f64).log10().floor()).clamp(0.0, 6.0) as usize;
        let x_ticks = (xmax as usize).clamp(1, 12) + 1;
        chart
            .configure_mesh()
            .x_desc("kernel, in the order the step runs them")
            .y_desc(format!("live {unit_name}"))
            .x_labels(x_ticks)
            .y_labels(y_ticks)
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.decimals$}"))
            .label_style(("sans-serif", 13))
            .axis_desc_style(("sans-serif", 15))
            .light_line_style(RGBColor(235, 235, 235))
            .draw()
            .map_err(|e| err(&e))?;

        // Stacked areas: each category's area reaches the cumulative sum up to it; drawn from the
        // top down so each lower one covers the ones above it. Values step at step boundaries.
        for (i, (kind, name)) in CATEGORIES.iter().enumerate().rev() {
            if matches!(kind, BufferKind::RunningStat | BufferKind::GradAccum)
                && r.timeline.iter().all(|p| p.by_category.get(*kind) == 0)
            {
                continue;
            }
            let cum = |p: &TimelinePoint| -> f64 {
                CATEGORIES[..=i]
                    .iter()
                    .map(|(k, _)| p.by_category.get(*k))
                    .sum::<u64>() as f64
                    / unit
            };
            let pts: Vec<(f64, f64)> = r
                .timeline
                .iter()
                .flat_map(|p| [(p.step as f64, cum(p)), (p.step as f64 + 1.0, cum(p))])
                .collect();
            let (cr, cg, cb) = COLORS[i];
            let color = RGBColor(cr, cg, cb);
            chart
                .draw_series(AreaSeries::new(pts, 0.0, color.filled()).border_style(color))
                .map_err(|e| err(&e))?
                .label(*name)
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled())
                });
        }

        let hline = |y: f64| vec![(0.0, y), (xmax, y)];
        let arena = RGBColor(0, 0, 0);
        chart
            .draw_series(LineSeries::new(
                hline(y(r.arena_bytes)),
                arena.stroke_width(2),
            ))
            .map_err(|e| err(&e))?
            .label(format!("arena {}", human(r.arena_bytes)))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 12, y)], arena.stroke_width(2))
            });
        if let Some(cap) = cap {
            let red = RGBColor(214, 39, 40);
            chart
                .draw_series(LineSeries::new(hline(y(cap)), red.stroke_width(2)))
                .map_err(|e| err(&e))?
                .label(format!("cap {}", human(cap)))
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 12, y)], red.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .label_font(("sans-serif", 13))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
    }
    Ok(out)
}

/// The sweep as an SVG chart: recompute % over the cap (MiB), dmc's curve with sqrt(n) and
/// checkpoint-all (each from the cap where it fits).
pub fn render_sweep_svg(sw: &Sweep) -> Result<String, RenderError> {
    use plotters::prelude::*;
    let err = |e: &dyn std::fmt::Display| RenderError(e.to_string());
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let xmin = mib(sw.min_arena) * 0.95;
    let xmax = mib(sw.no_remat_arena.max(sw.sqrt_arena)) * 1.05;
    let ymax = sw
        .points
        .iter()
        .map(|p| p.recompute_pct)
        .fold(sw.sqrt_pct, f64::max)
        .max(1.0)
        * 1.3;
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (900, 520)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                "dmc: recompute FLOPs (% of the step) vs. memory cap",
                ("sans-serif", 20),
            )
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(60)
            .build_cartesian_2d(xmin..xmax, 0f64..ymax)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc("cap (MiB)")
            .y_desc("recompute (% of step FLOPs)")
            .label_style(("sans-serif", 13))
            .axis_desc_style(("sans-serif", 15))
            .light_line_style(RGBColor(235, 235, 235))
            .draw()
            .map_err(|e| err(&e))?;
        let blue = RGBColor(31, 119, 180);
        let pts: Vec<(f64, f64)> = sw
            .points
            .iter()
            .map(|p| (mib(p.cap), p.recompute_pct))
            .collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), blue.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label("dmc (optimal)")
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 12, y)], blue.stroke_width(2))
            });
        chart
            .draw_series(pts.iter().map(|p| Circle::new(*p, 3, blue.filled())))
            .map_err(|e| err(&e))?;
        let orange = RGBColor(255, 127, 14);
        chart
            .draw_series(LineSeries::new(
                vec![(mib(sw.sqrt_arena), sw.sqrt_pct), (xmax, sw.sqrt_pct)],
                orange.stroke_width(2),
            ))
            .map_err(|e| err(&e))?
            .label("sqrt(n) checkpointing")
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 12, y)], orange.stroke_width(2))
            });
        let green = RGBColor(44, 160, 44);
        chart
            .draw_series(std::iter::once(Circle::new(
                (mib(sw.no_remat_arena), 0.0),
                6,
                green.filled(),
            )))
            .map_err(|e| err(&e))?
            .label("checkpoint-all (no remat)")
            .legend(move |(x, y)| Circle::new((x + 6, y), 4, green.filled()));
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .label_font(("sans-serif", 13))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
    }
    Ok(out)
}
