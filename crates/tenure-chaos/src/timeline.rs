//! A picture of a run: one row per instance slot, a bar per term (labelled
//! with its token), red ticks for rejected stale writes, and the faults as
//! marked columns, so a person can see a run at a glance.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::checker::Term;
use crate::log::Event;

const WIDTH: f64 = 1400.0;
const LEFT: f64 = 70.0;
const ROW: f64 = 34.0;
const TOP: f64 = 40.0;

pub fn svg(events: &[Event], terms: &[Term], title: &str) -> String {
    let first = events.first().map(Event::t).unwrap_or(0);
    let last = events
        .last()
        .map(Event::t)
        .unwrap_or(first + 1)
        .max(first + 1);
    let x = |t: u64| {
        LEFT + (t.saturating_sub(first)) as f64 / (last - first) as f64 * (WIDTH - LEFT - 10.0)
    };
    let slot = |inst: &str| inst.split('#').next().unwrap_or(inst).to_string();
    let mut rows: BTreeMap<String, usize> = BTreeMap::new();
    for term in terms {
        let next = rows.len();
        rows.entry(slot(&term.inst)).or_insert(next);
    }
    for event in events {
        if let Event::Start { inst, .. } = event {
            let next = rows.len();
            rows.entry(slot(inst)).or_insert(next);
        }
    }
    // Stable order: i1, i2, ... by number.
    let mut names: Vec<String> = rows.keys().cloned().collect();
    names.sort_by_key(|n| n.trim_start_matches('i').parse::<u32>().unwrap_or(u32::MAX));
    let row_of: BTreeMap<String, usize> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.clone(), i))
        .collect();
    let height = TOP + ROW * names.len() as f64 + 40.0;

    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="monospace" font-size="11">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{LEFT}" y="16" font-size="13">{}</text>"#,
        escape(title)
    );
    for (name, row) in &row_of {
        let y = TOP + ROW * *row as f64;
        let _ = writeln!(
            out,
            r#"<text x="8" y="{:.1}">{name}</text><line x1="{LEFT}" x2="{WIDTH}" y1="{:.1}" y2="{:.1}" stroke="gainsboro"/>"#,
            y + 18.0,
            y + 28.0,
            y + 28.0
        );
    }
    for event in events {
        if let Event::Fault {
            kind,
            target,
            t,
            until,
        } = event
        {
            let (x0, x1) = (x(*t), x((*until).max(*t)));
            let _ = writeln!(
                out,
                r#"<rect x="{x0:.1}" y="{TOP}" width="{:.1}" height="{:.1}" fill="orange" opacity="0.18"/>"#,
                (x1 - x0).max(1.5),
                ROW * names.len() as f64
            );
            let label = if target.is_empty() {
                kind.clone()
            } else {
                format!("{kind} {}", slot(target))
            };
            let _ = writeln!(
                out,
                r#"<text x="{x0:.1}" y="32" fill="darkorange" transform="rotate(-20 {x0:.1} 32)">{}</text>"#,
                escape(&label)
            );
        }
    }
    for term in terms {
        let Some(row) = row_of.get(&slot(&term.inst)) else {
            continue;
        };
        let y = TOP + ROW * *row as f64 + 6.0;
        let end = term.end.min(last);
        let (x0, x1) = (x(term.elected), x(end.max(term.elected)));
        let hue = (term.token.wrapping_mul(2654435761) % 360) as u32;
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
                let xt = x(*t);
                let _ = writeln!(
                    out,
                    r#"<line x1="{xt:.1}" x2="{xt:.1}" y1="{:.1}" y2="{:.1}" stroke="red" stroke-width="2"/>"#,
                    y - 4.0,
                    y + 20.0
                );
            }
        }
    }
    let _ = writeln!(
        out,
        r#"<text x="{LEFT}" y="{:.1}">bars: terms (label: last 5 digits of the token) - red: stale writes rejected by fencing - orange: faults - {:.0} s</text>"#,
        height - 12.0,
        (last - first) as f64 / 1e9
    );
    out.push_str("</svg>\n");
    out
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
