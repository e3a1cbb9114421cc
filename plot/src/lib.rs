//! ebbflow's charts, described as data and drawn with [plotters]' SVG backend.
//!
//! A [`Figure`] is a title and panels stacked in rows or side by side; a [`Panel`] has labelled
//! axes with ticks and holds lines (solid, dashed or as steps), point markers, vertical marks,
//! shaded bands and grouped bars. Everything with a label gets a legend entry, in a box right
//! of the plot so it never covers the data. The three charts ebbflow writes
//! (`ebbflow run`'s `chart.svg`, `ebbflow simulate`'s `cost.svg` and the fig. 4.15 plot of
//! `ebbflow-elastic-bench`) are all built from these parts, so they look alike and none writes
//! SVG by hand. SVG only: text stays text (the viewer's fonts), so no font files are needed to
//! build or run; a PNG would need a rasterizer and fonts in every image for little gain.

use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::Color as _;

/// A color, as red, green and blue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Color(pub u8, pub u8, pub u8);

impl Color {
    /// Blue.
    pub const BLUE: Self = Self(0x1f, 0x77, 0xb4);
    /// Orange.
    pub const ORANGE: Self = Self(0xff, 0x7f, 0x0e);
    /// Green.
    pub const GREEN: Self = Self(0x2c, 0xa0, 0x2c);
    /// Red.
    pub const RED: Self = Self(0xd6, 0x27, 0x28);
    /// Purple.
    pub const PURPLE: Self = Self(0x94, 0x67, 0xbd);
    /// Brown.
    pub const BROWN: Self = Self(0x8c, 0x56, 0x4b);
    /// Grey.
    pub const GREY: Self = Self(0x7f, 0x7f, 0x7f);
    /// Light grey.
    pub const LIGHT_GREY: Self = Self(0xbb, 0xbb, 0xbb);
    /// Dark blue.
    pub const DARK_BLUE: Self = Self(0x1f, 0x4e, 0x9c);
    /// The series colors, in order.
    pub const PALETTE: [Self; 6] = [
        Self::GREY,
        Self::BLUE,
        Self::GREEN,
        Self::RED,
        Self::ORANGE,
        Self::PURPLE,
    ];

    fn rgb(self) -> RGBColor {
        RGBColor(self.0, self.1, self.2)
    }
}

/// How a line is drawn.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Stroke {
    /// A solid line.
    #[default]
    Solid,
    /// A dashed line.
    Dashed,
}

/// A line through points in data coordinates.
#[derive(Clone, Debug, PartialEq)]
pub struct Line {
    /// Legend entry (none: not in the legend).
    pub label: Option<String>,
    /// The points, in order of x.
    pub points: Vec<(f64, f64)>,
    /// Its color.
    pub color: Color,
    /// Solid or dashed.
    pub stroke: Stroke,
    /// Width in pixels.
    pub width: u32,
    /// Drawn as steps: each value holds until the next point (counts that change at events).
    pub steps: bool,
}

impl Line {
    /// A solid, 2-pixel line.
    pub fn new(label: impl Into<String>, color: Color, points: Vec<(f64, f64)>) -> Self {
        Self {
            label: Some(label.into()),
            points,
            color,
            stroke: Stroke::Solid,
            width: 2,
            steps: false,
        }
    }

    /// Dashed.
    pub fn dashed(self) -> Self {
        Self {
            stroke: Stroke::Dashed,
            ..self
        }
    }

    /// As steps.
    pub fn steps(self) -> Self {
        Self {
            steps: true,
            ..self
        }
    }

    /// `width` pixels wide.
    pub fn width(self, width: u32) -> Self {
        Self { width, ..self }
    }

    /// Not in the legend.
    pub fn unlabelled(self) -> Self {
        Self {
            label: None,
            ..self
        }
    }

    /// The points to draw: as given, or with a corner before each change for steps.
    fn path(&self) -> Vec<(f64, f64)> {
        if !self.steps {
            return self.points.clone();
        }
        let mut path = Vec::with_capacity(self.points.len() * 2);
        for (i, &(x, y)) in self.points.iter().enumerate() {
            if i > 0 {
                path.push((x, self.points[i - 1].1));
            }
            path.push((x, y));
        }
        path
    }
}

/// The shape of point markers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// A filled circle.
    Circle,
    /// A filled triangle pointing up.
    Triangle,
    /// A cross.
    Cross,
}

/// Markers at points (events).
#[derive(Clone, Debug, PartialEq)]
pub struct Points {
    /// Legend entry.
    pub label: String,
    /// Where.
    pub points: Vec<(f64, f64)>,
    /// Color.
    pub color: Color,
    /// Shape.
    pub shape: Shape,
}

/// A dashed vertical line across the panel at `x`, with its text beside it at the top.
#[derive(Clone, Debug, PartialEq)]
pub struct Mark {
    /// Where.
    pub x: f64,
    /// Text at the top of the line (may be empty).
    pub text: String,
    /// Legend entry (marks with the same label share one).
    pub label: Option<String>,
    /// Color.
    pub color: Color,
}

/// A shaded span of x across the panel (a stage, a phase).
#[derive(Clone, Debug, PartialEq)]
pub struct Band {
    /// From.
    pub from: f64,
    /// To.
    pub to: f64,
    /// Legend entry (bands with the same label share one).
    pub label: String,
    /// Color (drawn faint).
    pub color: Color,
}

/// Grouped bars: one group per category on the x axis, one bar per series in each.
#[derive(Clone, Debug, PartialEq)]
pub struct Bars {
    /// The categories, left to right.
    pub groups: Vec<String>,
    /// Per series: legend entry, color and one value per group.
    pub series: Vec<(String, Color, Vec<f64>)>,
}

/// One chart with its axes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Panel {
    /// Caption above the panel.
    pub title: String,
    /// X axis label.
    pub x_label: String,
    /// Y axis label.
    pub y_label: String,
    /// X range (default: the data's).
    pub x_range: Option<(f64, f64)>,
    /// Y range (default: from the data; see `y_from_zero`).
    pub y_range: Option<(f64, f64)>,
    /// The automatic y range starts at zero (costs, counts) instead of just under the data
    /// (a loss that starts high and flattens).
    pub y_from_zero: bool,
    /// Lines.
    pub lines: Vec<Line>,
    /// Point markers.
    pub points: Vec<Points>,
    /// Vertical marks.
    pub marks: Vec<Mark>,
    /// Shaded spans.
    pub bands: Vec<Band>,
    /// Grouped bars (the x axis is then the groups).
    pub bars: Option<Bars>,
}

/// How panels are laid out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Layout {
    /// One above the other (sharing the x axis's meaning).
    #[default]
    Rows,
    /// Side by side.
    Columns,
}

/// A titled figure of panels.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Figure {
    /// Title at the top.
    pub title: String,
    /// Width in pixels.
    pub width: u32,
    /// Height of one panel in pixels (the figure's height with `Columns`).
    pub panel_height: u32,
    /// Rows or columns.
    pub layout: Layout,
    /// The panels.
    pub panels: Vec<Panel>,
    /// A line of small text under the panels (what the marks mean, the source).
    pub footnote: Option<String>,
}

/// Drawing failed.
#[derive(Debug, thiserror::Error)]
#[error("drawing the chart failed: {0}")]
pub struct PlotError(String);

fn err<E: std::fmt::Debug>(error: E) -> PlotError {
    PlotError(format!("{error:?}"))
}

const TITLE: u32 = 34;
const LEGEND_WIDTH: u32 = 190;
const FOOTNOTE: u32 = 22;

impl Figure {
    /// The figure as an SVG document.
    pub fn svg(&self) -> Result<String, PlotError> {
        let n = self.panels.len().max(1) as u32;
        let height = TITLE
            + match self.layout {
                Layout::Rows => self.panel_height * n,
                Layout::Columns => self.panel_height,
            }
            + if self.footnote.is_some() { FOOTNOTE } else { 0 };
        let mut out = String::new();
        {
            let root = SVGBackend::with_string(&mut out, (self.width, height)).into_drawing_area();
            root.fill(&WHITE).map_err(err)?;
            let (head, body) = root.split_vertically(TITLE);
            head.draw(&Text::new(
                self.title.clone(),
                (12, 10),
                ("sans-serif", 21).into_font(),
            ))
            .map_err(err)?;
            let (body, foot) = match self.footnote {
                Some(_) => {
                    let (body, foot) = body.split_vertically(height - TITLE - FOOTNOTE);
                    (body, Some(foot))
                }
                None => (body, None),
            };
            let areas = match self.layout {
                Layout::Rows => body.split_evenly((n as usize, 1)),
                Layout::Columns => body.split_evenly((1, n as usize)),
            };
            for (panel, area) in self.panels.iter().zip(&areas) {
                draw_panel(area, panel)?;
            }
            if let (Some(text), Some(foot)) = (&self.footnote, foot) {
                foot.draw(&Text::new(
                    text.clone(),
                    (12, 4),
                    ("sans-serif", 14).into_font().color(&RGBColor(80, 80, 80)),
                ))
                .map_err(err)?;
            }
            root.present().map_err(err)?;
        }
        Ok(out)
    }
}

/// The data's extent over `values`, ignoring non-finite ones.
fn extent(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    values
        .filter(|v| v.is_finite())
        .fold(None, |acc, v| match acc {
            None => Some((v, v)),
            Some((lo, hi)) => Some((lo.min(v), hi.max(v))),
        })
}

/// A range that is never empty.
fn widen((lo, hi): (f64, f64)) -> (f64, f64) {
    if hi > lo {
        (lo, hi)
    } else if lo == 0.0 {
        (0.0, 1.0)
    } else {
        (lo - lo.abs() * 0.1, hi + hi.abs() * 0.1)
    }
}

/// Tick text: as many decimals as a fifth of the axis's span needs, trailing zeros dropped.
fn tick(value: f64, span: f64) -> String {
    let step = span / 5.0;
    let decimals = if step > 0.0 && step.is_finite() {
        (-step.log10().floor()).clamp(0.0, 9.0) as usize
    } else {
        2
    };
    let mut text = format!("{value:.decimals$}");
    if text.contains('.') {
        text = text.trim_end_matches('0').trim_end_matches('.').to_owned();
    }
    if text == "-0" { "0".to_owned() } else { text }
}

/// What a legend entry shows beside its text.
#[derive(Clone, Copy)]
enum Swatch {
    Line(RGBColor, u32, Stroke),
    Patch(RGBColor, f64),
    Marker(RGBColor, Shape),
}

/// The legend entries of `panel`, in drawing order, each label once.
fn legend(panel: &Panel) -> Vec<(String, Swatch)> {
    let mut entries: Vec<(String, Swatch)> = Vec::new();
    let mut add = |label: &str, swatch| {
        if !entries.iter().any(|(l, _)| l == label) {
            entries.push((label.to_owned(), swatch));
        }
    };
    for band in &panel.bands {
        add(&band.label, Swatch::Patch(band.color.rgb(), 0.3));
    }
    if let Some(bars) = &panel.bars {
        for (label, color, _) in &bars.series {
            add(label, Swatch::Patch(color.rgb(), 1.0));
        }
    }
    for mark in &panel.marks {
        if let Some(label) = &mark.label {
            add(label, Swatch::Line(mark.color.rgb(), 1, Stroke::Dashed));
        }
    }
    for line in &panel.lines {
        if let Some(label) = &line.label {
            add(
                label,
                Swatch::Line(line.color.rgb(), line.width, line.stroke),
            );
        }
    }
    for points in &panel.points {
        add(
            &points.label,
            Swatch::Marker(points.color.rgb(), points.shape),
        );
    }
    entries
}

/// Draws `entries` top-down in `area` (beside the plot, so never over the data).
fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    entries: &[(String, Swatch)],
) -> Result<(), PlotError> {
    const TOP: i32 = 36;
    const ROW: i32 = 19;
    for (i, (label, swatch)) in entries.iter().enumerate() {
        let y = TOP + ROW * i as i32;
        let (x0, x1) = (8, 28);
        match *swatch {
            Swatch::Line(color, width, Stroke::Solid) => area
                .draw(&PathElement::new(
                    vec![(x0, y), (x1, y)],
                    color.stroke_width(width),
                ))
                .map_err(err)?,
            Swatch::Line(color, width, Stroke::Dashed) => area
                .draw(&DashedPathElement::new(
                    vec![(x0, y), (x1, y)],
                    5,
                    3,
                    color.stroke_width(width),
                ))
                .map_err(err)?,
            Swatch::Patch(color, alpha) => area
                .draw(&Rectangle::new(
                    [(x0, y - 6), (x1, y + 6)],
                    color.mix(alpha).filled(),
                ))
                .map_err(err)?,
            Swatch::Marker(color, shape) => {
                let at = ((x0 + x1) / 2, y);
                match shape {
                    Shape::Circle => area.draw(&Circle::new(at, 4, color.filled())),
                    Shape::Triangle => area.draw(&TriangleMarker::new(at, 5, color.filled())),
                    Shape::Cross => area.draw(&Cross::new(at, 4, color.stroke_width(2))),
                }
                .map_err(err)?;
            }
        }
        area.draw(&Text::new(
            label.clone(),
            (x1 + 8, y - 8),
            ("sans-serif", 14).into_font(),
        ))
        .map_err(err)?;
    }
    Ok(())
}

fn draw_panel<DB: DrawingBackend>(
    whole: &DrawingArea<DB, Shift>,
    panel: &Panel,
) -> Result<(), PlotError> {
    let entries = legend(panel);
    let (area, legend_area) = if entries.is_empty() {
        (whole.clone(), None)
    } else {
        let width = whole.dim_in_pixel().0;
        let (left, right) = whole.split_horizontally(width.saturating_sub(LEGEND_WIDTH));
        (left, Some(right))
    };
    let area = &area;
    let groups = panel.bars.as_ref().map_or(0, |b| b.groups.len());
    let xs = panel
        .lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.0))
        .chain(
            panel
                .points
                .iter()
                .flat_map(|p| p.points.iter().map(|p| p.0)),
        )
        .chain(panel.bands.iter().flat_map(|b| [b.from, b.to]))
        .chain(panel.marks.iter().map(|m| m.x));
    let (x0, x1) = widen(match (&panel.bars, panel.x_range) {
        (_, Some(range)) => range,
        // group g is centred on x = g + 1, so the axis's integer ticks name the groups
        (Some(_), None) => (0.5, groups.max(1) as f64 + 0.5),
        (None, None) => extent(xs).unwrap_or((0.0, 1.0)),
    });
    let ys = panel
        .lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .chain(
            panel
                .points
                .iter()
                .flat_map(|p| p.points.iter().map(|p| p.1)),
        )
        .chain(
            panel
                .bars
                .iter()
                .flat_map(|b| b.series.iter().flat_map(|s| s.2.iter().copied())),
        );
    let (y0, y1) = match panel.y_range {
        Some(range) => widen(range),
        None => {
            let (lo, hi) = widen(extent(ys).unwrap_or((0.0, 1.0)));
            let lo = if panel.y_from_zero || panel.bars.is_some() {
                lo.min(0.0)
            } else {
                lo - (hi - lo) * 0.05
            };
            (lo, hi + (hi - lo) * 0.08)
        }
    };
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, ("sans-serif", 17))
        .margin(8)
        .margin_right(18)
        .x_label_area_size(38)
        .y_label_area_size(64)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(err)?;
    let (x_span, y_span) = (x1 - x0, y1 - y0);
    let group_names = panel
        .bars
        .as_ref()
        .map(|b| b.groups.clone())
        .unwrap_or_default();
    let x_format = |x: &f64| -> String {
        if group_names.is_empty() {
            tick(*x, x_span)
        } else {
            let g = x.round();
            if (x - g).abs() < 1e-6 && g >= 1.0 {
                group_names.get(g as usize - 1).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        }
    };
    let y_format = |y: &f64| tick(*y, y_span);
    let mut mesh = chart.configure_mesh();
    mesh.x_desc(panel.x_label.as_str())
        .y_desc(panel.y_label.as_str())
        .x_label_formatter(&x_format)
        .y_label_formatter(&y_format)
        .y_labels(6)
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 15))
        .light_line_style(WHITE)
        .bold_line_style(RGBColor(230, 230, 230));
    if groups > 0 {
        mesh.x_labels(groups + 1).disable_x_mesh();
    } else {
        mesh.x_labels(10);
    }
    mesh.draw().map_err(err)?;

    for band in &panel.bands {
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(band.from.max(x0), y0), (band.to.min(x1), y1)],
                band.color.rgb().mix(0.13).filled(),
            )))
            .map_err(err)?;
    }
    if let Some(bars) = &panel.bars {
        let width = 0.8 / bars.series.len().max(1) as f64;
        for (s, (_, color, values)) in bars.series.iter().enumerate() {
            let color = color.rgb();
            chart
                .draw_series(values.iter().enumerate().map(|(g, &v)| {
                    let left = g as f64 + 0.6 + s as f64 * width;
                    Rectangle::new([(left, 0.0), (left + width * 0.9, v)], color.filled())
                }))
                .map_err(err)?;
        }
    }
    for mark in &panel.marks {
        let color = mark.color.rgb();
        chart
            .draw_series(DashedLineSeries::new(
                [(mark.x, y0), (mark.x, y1)],
                5,
                4,
                color.stroke_width(1),
            ))
            .map_err(err)?;
        if !mark.text.is_empty() {
            chart
                .draw_series(std::iter::once(Text::new(
                    mark.text.clone(),
                    (mark.x, y1),
                    ("sans-serif", 13).into_font().color(&color),
                )))
                .map_err(err)?;
        }
    }
    for line in &panel.lines {
        let style = line.color.rgb().stroke_width(line.width);
        let path = line.path();
        match line.stroke {
            Stroke::Solid => chart.draw_series(LineSeries::new(path, style)),
            Stroke::Dashed => chart.draw_series(DashedLineSeries::new(path, 6, 4, style)),
        }
        .map_err(err)?;
    }
    for points in &panel.points {
        let color = points.color.rgb();
        let at = points.points.iter().copied();
        match points.shape {
            Shape::Circle => chart.draw_series(at.map(|p| Circle::new(p, 4, color.filled()))),
            Shape::Triangle => {
                chart.draw_series(at.map(|p| TriangleMarker::new(p, 5, color.filled())))
            }
            Shape::Cross => chart.draw_series(at.map(|p| Cross::new(p, 4, color.stroke_width(2)))),
        }
        .map_err(err)?;
    }
    if let Some(legend_area) = legend_area {
        draw_legend(&legend_area, &entries)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figure() -> Figure {
        Figure {
            title: "rank <1000> & more".into(),
            width: 600,
            panel_height: 200,
            layout: Layout::Rows,
            footnote: Some("a note".into()),
            panels: vec![
                Panel {
                    title: "loss".into(),
                    x_label: "trace hours".into(),
                    y_label: "loss".into(),
                    lines: vec![Line::new(
                        "training loss",
                        Color::BLUE,
                        vec![(0.0, 3.0), (1.0, 1.0), (2.0, 0.9)],
                    )],
                    points: vec![Points {
                        label: "notice".into(),
                        points: vec![(1.5, 2.0)],
                        color: Color::ORANGE,
                        shape: Shape::Triangle,
                    }],
                    marks: vec![Mark {
                        x: 1.0,
                        text: "evicted".into(),
                        label: None,
                        color: Color::RED,
                    }],
                    bands: vec![Band {
                        from: 0.5,
                        to: 1.5,
                        label: "stage 2".into(),
                        color: Color::GREEN,
                    }],
                    ..Panel::default()
                },
                Panel {
                    title: "nodes".into(),
                    y_from_zero: true,
                    lines: vec![
                        Line::new(
                            "transient",
                            Color::GREEN,
                            vec![(0.0, 0.0), (1.0, 4.0), (2.0, 2.0)],
                        )
                        .steps(),
                    ],
                    ..Panel::default()
                },
            ],
        }
    }

    #[test]
    fn a_figure_is_one_svg_document_with_every_label_and_escaped_text() {
        let svg = figure().svg().unwrap();
        assert!(
            svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"),
            "{svg}"
        );
        for text in [
            "training loss",
            "notice",
            "evicted",
            "stage 2",
            "transient",
            "trace hours",
            "a note",
        ] {
            assert!(svg.contains(text), "{text} missing");
        }
        assert!(
            svg.contains("rank &lt;1000&gt; &amp; more"),
            "title not escaped"
        );
        // ticks with values on both axes, not only the extremes
        assert!(svg.matches("<text").count() > 25, "{svg}");
    }

    #[test]
    fn steps_hold_each_value_until_the_next_point() {
        let line = Line::new("n", Color::GREY, vec![(0.0, 1.0), (2.0, 3.0), (3.0, 0.0)]).steps();
        assert_eq!(
            line.path(),
            vec![(0.0, 1.0), (2.0, 1.0), (2.0, 3.0), (3.0, 3.0), (3.0, 0.0)]
        );
    }

    #[test]
    fn grouped_bars_name_their_groups_on_the_x_axis() {
        let figure = Figure {
            title: "costs".into(),
            width: 500,
            panel_height: 260,
            layout: Layout::Columns,
            panels: vec![Panel {
                title: "cost".into(),
                bars: Some(Bars {
                    groups: vec!["2 h jobs".into(), "20 h jobs".into()],
                    series: vec![
                        ("on-demand".into(), Color::GREY, vec![1.0, 1.0]),
                        ("spot".into(), Color::BLUE, vec![0.4, 0.3]),
                    ],
                }),
                ..Panel::default()
            }],
            ..Figure::default()
        };
        let svg = figure.svg().unwrap();
        assert!(
            svg.contains("2 h jobs\n") && svg.contains("20 h jobs\n"),
            "{svg}"
        );
        assert_eq!(svg.matches("<rect").count() >= 4, true);
    }

    #[test]
    fn ticks_read_short_and_never_as_minus_zero() {
        assert_eq!(tick(1234.56, 2000.0), "1235");
        assert_eq!(tick(0.123_456, 0.3), "0.12");
        assert_eq!(tick(0.011_76, 0.0013), "0.0118");
        assert_eq!(tick(-0.0001, 1.0), "0");
        assert_eq!(tick(2.5, 4.0), "2.5");
        assert_eq!(tick(3.0, 4.0), "3");
    }
}
