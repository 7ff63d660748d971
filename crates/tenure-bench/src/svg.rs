//! Latency distributions drawn as SVG: one empirical CDF per series, on a
//! logarithmic time axis, so that a floor of a tenth of a millisecond and a
//! naive poller's half second fit in one picture.
//!
//! Plain SVG 1.1 written by hand (no plotting crate): a few hundred bytes of
//! markup per series, readable at the book's width (720 px), rendered the
//! same by browsers and `rsvg-convert`. A curve is a step path: it rises by
//! 1/n at each of its n samples, sorted, so it never falls and ends at 100 %.

use std::fmt::Write;

use crate::stats::Samples;

/// What a series is, which decides how it is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// tenure itself: solid blue, drawn on top.
    Tenure,
    /// The naive baseline: solid orange.
    Naive,
    /// The floor measured in the same run: dashed grey.
    Floor,
    /// Another library (the peers section), the nth series of its chart:
    /// a colour of its own, dotted.
    Peer(usize),
}

impl Kind {
    fn stroke(self) -> &'static str {
        match self {
            Kind::Tenure => "#1f5fbf",
            Kind::Naive => "#d9620b",
            Kind::Floor => "#6b6b6b",
            Kind::Peer(n) => ["#d9620b", "#2e8b3a", "#8e3fb0", "#b8860b", "#c0304a"][n % 5],
        }
    }

    fn dash(self) -> &'static str {
        match self {
            Kind::Floor => r#" stroke-dasharray="6 4""#,
            Kind::Peer(_) => r#" stroke-dasharray="2 3""#,
            Kind::Tenure | Kind::Naive => "",
        }
    }
}

/// One curve: its legend and its samples.
#[derive(Debug, Clone)]
pub struct Series {
    pub label: String,
    pub kind: Kind,
    pub samples: Samples,
}

/// One picture, written to `<file>.svg` by `--svg DIR`.
#[derive(Debug, Clone)]
pub struct Chart {
    /// The file name without `.svg`.
    pub file: &'static str,
    pub title: String,
    /// Under the title: the machine and the mode of the run.
    pub subtitle: String,
    /// What the time axis measures (its unit and scale are added).
    pub x_label: String,
    pub series: Vec<Series>,
}

const WIDTH: f64 = 720.0;
const LEFT: f64 = 72.0;
const RIGHT: f64 = 36.0;
const TOP: f64 = 64.0;
const PLOT_HEIGHT: f64 = 280.0;
const LEGEND_LINE: f64 = 20.0;
/// Samples at or below zero (a takeover that came before the expiry the
/// bench computed) are drawn at the left edge of an axis at least this low.
const SMALLEST_MS: f64 = 0.001;

/// A series to draw: the series and its samples sorted, in ms.
type Curve<'a> = (&'a Series, Vec<f64>);

/// Where things go in the picture: the plot's axis and edges.
struct Frame {
    axis: Axis,
    plot_width: f64,
    bottom: f64,
    height: f64,
}

impl Frame {
    /// The x of `ms`.
    fn x(&self, ms: f64) -> f64 {
        LEFT + self.plot_width * self.axis.fraction(ms)
    }

    /// The y of a share of the rounds (0 to 1).
    fn y(&self, share: f64) -> f64 {
        self.bottom - PLOT_HEIGHT * share
    }
}

impl Chart {
    /// The picture as a standalone SVG document.
    pub fn svg(&self) -> String {
        let series: Vec<Curve> = self
            .series
            .iter()
            .filter(|s| !s.samples.is_empty())
            .map(|s| (s, s.samples.sorted_ms()))
            .collect();
        let axis = Axis::spanning(series.iter().flat_map(|(_, ms)| ms.iter().copied()));
        let bottom = TOP + PLOT_HEIGHT;
        let frame = Frame {
            axis,
            plot_width: WIDTH - LEFT - RIGHT,
            bottom,
            height: bottom + 62.0 + LEGEND_LINE * series.len() as f64,
        };
        let mut out = String::new();
        self.header(&mut out, &frame);
        grid(&mut out, &frame);
        self.axes(&mut out, &frame);
        curves(&mut out, &frame, &series);
        legend(&mut out, &frame, &series);
        out.push_str("</svg>\n");
        out
    }

    /// The document's start, its background, the title and the subtitle.
    fn header(&self, out: &mut String, frame: &Frame) {
        let height = frame.height;
        // Writing to a String cannot fail.
        let _ = writeln!(
            out,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="13">"#
        );
        let _ = writeln!(
            out,
            r#"<rect width="{WIDTH}" height="{height}" fill="white"/>"#
        );
        let _ = writeln!(
            out,
            r#"<text x="{LEFT}" y="24" font-size="16" font-weight="bold">{}</text>"#,
            escape(&self.title)
        );
        let _ = writeln!(
            out,
            r##"<text x="{LEFT}" y="44" fill="#555">{}</text>"##,
            escape(&self.subtitle)
        );
    }

    /// The axes: their lines, the decades' and percentages' labels and the
    /// axes' titles.
    fn axes(&self, out: &mut String, frame: &Frame) {
        let (plot_width, bottom) = (frame.plot_width, frame.bottom);
        let _ = writeln!(
            out,
            r##"<path d="M{LEFT},{TOP} V{bottom} H{}" fill="none" stroke="#333" stroke-width="1"/>"##,
            LEFT + plot_width
        );
        out.push_str("<g text-anchor=\"middle\">\n");
        for decade in frame.axis.decades() {
            let _ = writeln!(
                out,
                r#"<text x="{:.1}" y="{}">{}</text>"#,
                frame.x(decade),
                bottom + 18.0,
                tick_label(decade)
            );
        }
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}">{} (ms, log scale)</text>"#,
            LEFT + plot_width / 2.0,
            bottom + 38.0,
            escape(&self.x_label)
        );
        out.push_str("</g>\n<g text-anchor=\"end\">\n");
        for percent in [0, 25, 50, 75, 100] {
            let _ = writeln!(
                out,
                r#"<text x="{}" y="{:.1}">{percent} %</text>"#,
                LEFT - 8.0,
                frame.y(f64::from(percent) / 100.0) + 4.5
            );
        }
        out.push_str("</g>\n");
        let _ = writeln!(
            out,
            r#"<text transform="translate(18 {:.1}) rotate(-90)" text-anchor="middle">rounds done within x (%)</text>"#,
            TOP + PLOT_HEIGHT / 2.0
        );
    }
}

/// The grid: a light line at each minor tick, a darker one at each decade
/// and at each quarter of the rounds.
fn grid(out: &mut String, frame: &Frame) {
    let bottom = frame.bottom;
    out.push_str("<g stroke=\"#e3e3e3\" stroke-width=\"1\">\n");
    for minor in frame.axis.minor_ticks() {
        let _ = writeln!(
            out,
            r#"<line x1="{0:.1}" y1="{TOP}" x2="{0:.1}" y2="{bottom}"/>"#,
            frame.x(minor)
        );
    }
    out.push_str("</g>\n<g stroke=\"#bdbdbd\" stroke-width=\"1\">\n");
    for decade in frame.axis.decades() {
        let _ = writeln!(
            out,
            r#"<line x1="{0:.1}" y1="{TOP}" x2="{0:.1}" y2="{bottom}"/>"#,
            frame.x(decade)
        );
    }
    for percent in [25, 50, 75, 100] {
        let _ = writeln!(
            out,
            r#"<line x1="{LEFT}" y1="{0:.1}" x2="{1}" y2="{0:.1}"/>"#,
            frame.y(f64::from(percent) / 100.0),
            LEFT + frame.plot_width
        );
    }
    out.push_str("</g>\n");
}

/// The curves, tenure last so that it is drawn on top.
fn curves(out: &mut String, frame: &Frame, series: &[Curve]) {
    let mut order: Vec<&Curve> = series.iter().collect();
    order.sort_by_key(|(s, _)| s.kind == Kind::Tenure);
    for (s, ms) in order {
        let _ = writeln!(
            out,
            r#"<path class="cdf" d="{}" fill="none" stroke="{}" stroke-width="2.2"{}/>"#,
            step_path(ms, |ms| frame.x(ms), |share| frame.y(share)),
            s.kind.stroke(),
            s.kind.dash()
        );
    }
}

/// The legend, under the axis title, one line per series.
fn legend(out: &mut String, frame: &Frame, series: &[Curve]) {
    for (i, (s, ms)) in series.iter().enumerate() {
        let line_y = frame.bottom + 62.0 + LEGEND_LINE * i as f64;
        let _ = writeln!(
            out,
            r#"<line x1="{LEFT}" y1="{0:.1}" x2="{1}" y2="{0:.1}" stroke="{2}" stroke-width="2.5"{3}/>"#,
            line_y - 4.5,
            LEFT + 28.0,
            s.kind.stroke(),
            s.kind.dash()
        );
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{line_y:.1}">{} (n = {}, p50 {} ms, p99 {} ms)</text>"#,
            LEFT + 36.0,
            escape(&s.label),
            ms.len(),
            figure(s.samples.p50()),
            figure(s.samples.p99())
        );
    }
}

/// The step path of a CDF: from 0 % at the first sample, up by 1/n at each.
fn step_path(ms: &[f64], x: impl Fn(f64) -> f64, y: impl Fn(f64) -> f64) -> String {
    let n = ms.len() as f64;
    let mut d = format!("M{:.1},{:.1}", x(ms[0]), y(0.0));
    for (i, &v) in ms.iter().enumerate() {
        let _ = write!(d, " H{:.1} V{:.1}", x(v), y((i + 1) as f64 / n));
    }
    d
}

/// A logarithmic axis from one power of ten to another.
struct Axis {
    low_exp: i32,
    high_exp: i32,
}

impl Axis {
    /// The smallest whole decades that hold every value (at least one decade).
    fn spanning(values: impl Iterator<Item = f64>) -> Axis {
        let (mut low, mut high) = (f64::INFINITY, 0.0f64);
        for v in values.filter(|v| v.is_finite()) {
            let v = v.max(SMALLEST_MS);
            low = low.min(v);
            high = high.max(v);
        }
        if !low.is_finite() {
            return Axis {
                low_exp: -1,
                high_exp: 1,
            };
        }
        let low_exp = low.log10().floor() as i32;
        let high_exp = (high.log10().ceil() as i32).max(low_exp + 1);
        Axis { low_exp, high_exp }
    }

    /// Where `ms` lies, 0 at the left edge and 1 at the right.
    fn fraction(&self, ms: f64) -> f64 {
        let v = ms.max(SMALLEST_MS).log10();
        ((v - f64::from(self.low_exp)) / f64::from(self.high_exp - self.low_exp)).clamp(0.0, 1.0)
    }

    fn decades(&self) -> impl Iterator<Item = f64> {
        (self.low_exp..=self.high_exp).map(|e| 10f64.powi(e))
    }

    /// 2, 3, ... 9 times each decade but the last.
    fn minor_ticks(&self) -> impl Iterator<Item = f64> {
        (self.low_exp..self.high_exp)
            .flat_map(|e| (2..10).map(move |m| f64::from(m) * 10f64.powi(e)))
    }
}

fn tick_label(ms: f64) -> String {
    if ms >= 1.0 {
        format!("{ms:.0}")
    } else {
        // 0.1, 0.01, 0.001: as many places as the decade needs.
        let places = (-ms.log10()).round() as usize;
        format!("{ms:.places$}")
    }
}

/// A figure for the legend: three significant digits or so.
fn figure(ms: f64) -> String {
    if ms >= 100.0 {
        format!("{ms:.0}")
    } else if ms >= 10.0 {
        format!("{ms:.1}")
    } else {
        format!("{ms:.2}")
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn samples(ms: &[f64]) -> Samples {
        let mut s = Samples::default();
        for &v in ms {
            s.push(Duration::from_secs_f64(v / 1000.0));
        }
        s
    }

    fn chart() -> Chart {
        Chart {
            file: "handover",
            title: "Hand-over <after> resign & more".into(),
            subtitle: "2 x cpu, quick mode".into(),
            x_label: "resign → next leader".into(),
            series: vec![
                Series {
                    label: "floor: one EVALSHA".into(),
                    kind: Kind::Floor,
                    samples: samples(&[0.1, 0.12, 0.09, 0.3]),
                },
                Series {
                    label: "naive".into(),
                    kind: Kind::Naive,
                    samples: samples(&[400.0, 30.0, 900.0]),
                },
                Series {
                    label: "tenure".into(),
                    kind: Kind::Tenure,
                    samples: samples(&[0.7, 0.0, 0.9, 0.65, 1.2]),
                },
                Series {
                    label: "nothing measured".into(),
                    kind: Kind::Naive,
                    samples: Samples::default(),
                },
            ],
        }
    }

    /// Checks that tags nest, attributes are quoted and text holds no bare
    /// `<` or `&`: enough of XML's well-formedness for markup without
    /// comments, CDATA or entities other than the five predefined.
    fn assert_well_formed(xml: &str) {
        let mut open: Vec<&str> = Vec::new();
        let mut rest = xml;
        while let Some(start) = rest.find(['<', '&']) {
            let text = &rest[..start];
            assert!(!text.contains('>'), "bare > in text: {text}");
            if rest[start..].starts_with('&') {
                let entity = &rest[start..rest[start..].find(';').map_or(start, |e| start + e + 1)];
                assert!(
                    ["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"].contains(&entity),
                    "bad entity at {}",
                    &rest[start..]
                );
                rest = &rest[start + entity.len()..];
                continue;
            }
            let end = start + rest[start..].find('>').expect("unclosed tag");
            let tag = &rest[start + 1..end];
            assert!(!tag.contains('<'), "< inside a tag: {tag}");
            assert_eq!(tag.matches('"').count() % 2, 0, "unbalanced quotes: {tag}");
            if let Some(name) = tag.strip_prefix('/') {
                assert_eq!(open.pop(), Some(name), "mismatched </{name}>");
            } else if !tag.ends_with('/') {
                open.push(tag.split_whitespace().next().expect("a tag name"));
            }
            rest = &rest[end + 1..];
        }
        assert!(rest.trim().is_empty(), "text after the root: {rest}");
        assert!(open.is_empty(), "unclosed: {open:?}");
    }

    /// Each curve's (x, y) corners, from its `d` attribute.
    fn curves(svg: &str) -> Vec<Vec<(f64, f64)>> {
        svg.lines()
            .filter(|l| l.starts_with(r#"<path class="cdf""#))
            .map(|l| {
                let d = l
                    .split(r#"d=""#)
                    .nth(1)
                    .expect("d")
                    .split('"')
                    .next()
                    .expect("d");
                let (mut x, mut y) = (0.0, 0.0);
                let mut points = Vec::new();
                for step in d.split_whitespace() {
                    let (op, value) = step.split_at(1);
                    match op {
                        "M" => {
                            let (a, b) = value.split_once(',').expect("M x,y");
                            (x, y) = (a.parse().expect("x"), b.parse().expect("y"));
                        }
                        "H" => x = value.parse().expect("H x"),
                        "V" => y = value.parse().expect("V y"),
                        other => panic!("unexpected path command {other}"),
                    }
                    points.push((x, y));
                }
                points
            })
            .collect()
    }

    #[test]
    fn the_chart_is_well_formed_svg_with_escaped_text() {
        let svg = chart().svg();
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert_well_formed(&svg);
        assert!(svg.contains("Hand-over &lt;after&gt; resign &amp; more"));
        assert!(svg.contains("resign → next leader (ms, log scale)"));
    }

    #[test]
    fn there_is_one_curve_and_one_legend_entry_per_series_with_samples() {
        let svg = chart().svg();
        assert_eq!(curves(&svg).len(), 3, "the empty series is left out");
        for label in [
            "floor: one EVALSHA (n = 4,",
            "naive (n = 3,",
            "tenure (n = 5,",
        ] {
            assert_eq!(svg.matches(label).count(), 1, "{label}");
        }
        assert!(!svg.contains("nothing measured"));
        let last = curves(&svg).pop().expect("a curve");
        assert_eq!(
            last.len(),
            1 + 2 * 5,
            "tenure, drawn last, has a step per sample"
        );
    }

    #[test]
    fn every_curve_rises_left_to_right_from_0_to_100_percent() {
        let svg = chart().svg();
        let (bottom, top) = (TOP + PLOT_HEIGHT, TOP);
        for points in curves(&svg) {
            for pair in points.windows(2) {
                let ((x0, y0), (x1, y1)) = (pair[0], pair[1]);
                assert!(x1 >= x0, "time goes back: {points:?}");
                // SVG's y grows downwards: a rising CDF has a falling y.
                assert!(y1 <= y0, "the share falls: {points:?}");
            }
            let (first, last) = (points[0], points[points.len() - 1]);
            assert!((first.1 - bottom).abs() < 0.1, "starts at 0 %: {points:?}");
            assert!((last.1 - top).abs() < 0.1, "ends at 100 %: {points:?}");
            for (x, _) in points {
                assert!((LEFT..=WIDTH - RIGHT).contains(&x), "inside the plot: {x}");
            }
        }
    }

    #[test]
    fn the_axis_spans_whole_decades_around_every_sample() {
        let axis = Axis::spanning([0.09, 0.0, 900.0].into_iter());
        assert_eq!((axis.low_exp, axis.high_exp), (-3, 3), "zero sits at 1 µs");
        let axis = Axis::spanning([0.2, 0.9].into_iter());
        assert_eq!((axis.low_exp, axis.high_exp), (-1, 0));
        let axis = Axis::spanning([1.0].into_iter());
        assert_eq!((axis.low_exp, axis.high_exp), (0, 1), "at least one decade");
        assert_eq!(tick_label(0.01), "0.01");
        assert_eq!(tick_label(1000.0), "1000");
    }
}
