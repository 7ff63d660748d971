//! A picture of a run: one row per instance slot, a bar per term (labelled
//! with its token), red ticks for rejected stale writes, and the faults as
//! shaded, colour-coded columns, so a person can see a run at a glance.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::checker::Term;
use crate::harness::FAULT_KINDS;
use crate::log::Event;

const LEFT: f64 = 70.0;
const ROW: f64 = 34.0;
const TOP: f64 = 40.0;
/// Fault labels are written out only when there is room for them.
const MAX_LABELS: usize = 30;

/// Colour of a fault kind, shared by the marks and the legend (every kind
/// has one, not the gray of an unknown kind; see the test below).
fn fault_colour(kind: &str) -> &'static str {
    match kind {
        "kill" => "crimson",
        "pause" => "darkorange",
        "restart" => "purple",
        "cut" => "steelblue",
        "drop" => "teal",
        "delay" => "olive",
        "stall" => "saddlebrown",
        "graceful" => "seagreen",
        "churn" => "goldenrod",
        "rollback" => "indigo",
        "mixed-ttl" => "hotpink",
        "dup-id" => "darkred",
        "forged" => "slategray",
        "pause-tenure-only" => "goldenrod",
        "kill-guardian" => "deeppink",
        "etcd-kill-member" => "firebrick",
        "etcd-pause-member" => "chocolate",
        "etcd-restart-all" => "darkmagenta",
        "etcd-compact" => "cadetblue",
        "delete-lease" => "darkorange",
        "cut-delete-lease" => "lightseagreen",
        "zk-kill-member" => "tomato",
        "zk-kill-leader" => "darkgoldenrod",
        "zk-pause-member" => "peru",
        "zk-restart-all" => "mediumorchid",
        "sqlite-lock" => "darkslateblue",
        "sqlite-delete-file" => "orangered",
        "pg-restart" => "steelblue",
        "pg-pause" => "slategray",
        "pg-lock" => "mediumpurple",
        "pg-failover" => "cornflowerblue",
        "revoke-lease" => "darkkhaki",
        "pause-minority-member" => "sandybrown",
        "restore-snapshot" => "mediumvioletred",
        "sentinel-kill-primary" => "maroon",
        "sentinel-failover" => "royalblue",
        "sentinel-kill-sentinel" => "rosybrown",
        "hang-sentinel" => "darkviolet",
        "cluster-failover" => "navy",
        "cluster-kill-primary" => "orangered",
        "cluster-reshard" => "darkcyan",
        "kill-shard-primary" => "tomato",
        _ => "gray",
    }
}

/// Where things go in the picture: time on x, one row per instance slot.
struct Frame {
    /// The first and last event's times (ns), `last` > `first`.
    first: u64,
    last: u64,
    seconds: f64,
    width: f64,
    height: f64,
    rows_height: f64,
    /// The row of each slot (`i3`), in slot order.
    row_of: BTreeMap<String, usize>,
}

impl Frame {
    fn new(events: &[Event], terms: &[Term]) -> Frame {
        let first = events.first().map(Event::t).unwrap_or(0);
        let last = events
            .last()
            .map(Event::t)
            .unwrap_or(first + 1)
            .max(first + 1);
        // About 8 px per second, so that long runs stay readable when zoomed.
        let seconds = (last - first) as f64 / 1e9;
        let width = (seconds * 8.0).clamp(1400.0, 8000.0);
        let mut names: Vec<String> = terms
            .iter()
            .map(|t| slot(&t.inst))
            .chain(events.iter().filter_map(|e| match e {
                Event::Start { inst, .. } => Some(slot(inst)),
                _ => None,
            }))
            .collect();
        names.sort_by_key(|n| n.trim_start_matches('i').parse::<u32>().unwrap_or(u32::MAX));
        names.dedup();
        let row_of: BTreeMap<String, usize> = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), i))
            .collect();
        let rows_height = ROW * names.len() as f64;
        let height = TOP + rows_height + 60.0;
        Frame {
            first,
            last,
            seconds,
            width,
            height,
            rows_height,
            row_of,
        }
    }

    /// The x of time `t` (ns).
    fn x(&self, t: u64) -> f64 {
        LEFT + (t.saturating_sub(self.first)) as f64 / (self.last - self.first) as f64
            * (self.width - LEFT - 10.0)
    }
}

/// The slot of an instance: `i3` of `i3#2`.
fn slot(inst: &str) -> String {
    inst.split('#').next().unwrap_or(inst).to_string()
}

pub fn svg(events: &[Event], terms: &[Term], title: &str) -> String {
    let frame = Frame::new(events, terms);
    let (width, height) = (frame.width, frame.height);
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height}" font-family="monospace" font-size="11">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{LEFT}" y="14" font-size="13">{}</text>"#,
        escape(title)
    );
    rows(&mut out, &frame);
    faults(&mut out, &frame, events);
    term_bars(&mut out, &frame, terms);
    legend(&mut out, &frame);
    out.push_str("</svg>\n");
    out
}

/// Each slot's name and the line under its row.
fn rows(out: &mut String, frame: &Frame) {
    let width = frame.width;
    for (name, row) in &frame.row_of {
        let y = TOP + ROW * *row as f64;
        let _ = writeln!(
            out,
            r#"<text x="8" y="{:.1}">{name}</text><line x1="{LEFT}" x2="{width:.0}" y1="{:.1}" y2="{:.1}" stroke="gainsboro"/>"#,
            y + 18.0,
            y + 28.0,
            y + 28.0
        );
    }
}

/// Each fault: a shaded column over every row, a mark above them and,
/// when there is room, a label.
fn faults(out: &mut String, frame: &Frame, events: &[Event]) {
    let rows_height = frame.rows_height;
    let fault_count = events
        .iter()
        .filter(|e| matches!(e, Event::Fault { .. }))
        .count();
    for event in events {
        if let Event::Fault {
            kind,
            target,
            t,
            until,
            ..
        } = event
        {
            let (x0, x1) = (frame.x(*t), frame.x((*until).max(*t)));
            let colour = fault_colour(kind);
            let _ = writeln!(
                out,
                r#"<rect x="{x0:.1}" y="{TOP}" width="{:.1}" height="{rows_height:.1}" fill="{colour}" opacity="0.15"><title>{}</title></rect>"#,
                (x1 - x0).max(1.5),
                escape(kind)
            );
            let _ = writeln!(
                out,
                r#"<rect x="{x0:.1}" y="{:.1}" width="3" height="6" fill="{colour}"/>"#,
                TOP - 8.0
            );
            if fault_count <= MAX_LABELS {
                let label = if target.is_empty() {
                    kind.clone()
                } else {
                    format!("{kind} {}", slot(target))
                };
                let _ = writeln!(
                    out,
                    r#"<text x="{x0:.1}" y="28" fill="{colour}" transform="rotate(-20 {x0:.1} 28)">{}</text>"#,
                    escape(&label)
                );
            }
        }
    }
}

/// Each term: a bar on its slot's row (labelled with its token when there
/// is room), and a red line for each of its writes that was rejected.
fn term_bars(out: &mut String, frame: &Frame, terms: &[Term]) {
    for term in terms {
        let Some(row) = frame.row_of.get(&slot(&term.inst)) else {
            continue;
        };
        let y = TOP + ROW * *row as f64 + 6.0;
        let end = term.end.min(frame.last);
        let (x0, x1) = (frame.x(term.elected), frame.x(end.max(term.elected)));
        let hue = (term.token.wrapping_mul(2_654_435_761) % 360) as u32;
        let _ = writeln!(
            out,
            r#"<rect x="{x0:.1}" y="{y:.1}" width="{:.1}" height="16" fill="hsl({hue},60%,65%)" stroke="hsl({hue},60%,35%)"><title>{} token {}</title></rect>"#,
            (x1 - x0).max(1.0),
            escape(&term.inst),
            term.token
        );
        if x1 - x0 > 60.0 {
            let _ = writeln!(
                out,
                r#"<text x="{:.1}" y="{:.1}">{}</text>"#,
                x0 + 3.0,
                y + 12.0,
                term.token % 100_000
            );
        }
        for (t, ok) in &term.writes {
            if !ok {
                let xt = frame.x(*t);
                let _ = writeln!(
                    out,
                    r#"<line x1="{xt:.1}" x2="{xt:.1}" y1="{:.1}" y2="{:.1}" stroke="red" stroke-width="2"/>"#,
                    y - 4.0,
                    y + 20.0
                );
            }
        }
    }
}

/// The colour of every fault kind, and a line saying what the marks are.
fn legend(out: &mut String, frame: &Frame) {
    let (height, seconds) = (frame.height, frame.seconds);
    let mut legend_x = LEFT;
    for kind in FAULT_KINDS {
        let _ = writeln!(
            out,
            r#"<rect x="{legend_x:.1}" y="{:.1}" width="10" height="10" fill="{}"/><text x="{:.1}" y="{:.1}">{kind}</text>"#,
            height - 44.0,
            fault_colour(kind),
            legend_x + 14.0,
            height - 35.0
        );
        legend_x += 24.0 + 7.0 * kind.len() as f64;
    }
    let _ = writeln!(
        out,
        r#"<text x="{LEFT}" y="{:.1}">bars: terms (label: last 5 digits of the token) - red lines: stale writes rejected by fencing - shaded: faults - {seconds:.0} s</text>"#,
        height - 12.0
    );
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fault_kind_has_a_colour() {
        for kind in crate::harness::FAULT_KINDS {
            assert_ne!(fault_colour(kind), "gray", "{kind} has no colour");
        }
    }
}
