//! The checker: reads what happened from the logs alone and judges it.
//!
//! **Safety**
//! - *Stale writes accepted*: the resource's own record of accepted writes,
//!   in acceptance order, must never show a token lower than one accepted
//!   before it.
//! - *Overlaps*: each term's *acting interval* runs from its first write to
//!   the end of its belief (the last deadline it relied on, or its loss, or
//!   its process's exit, whichever is first). Two terms of different
//!   instances whose acting intervals intersect, and that both wrote inside
//!   the intersection, acted as leaders at the same time.
//!   One kind of overlap is reported apart, as *fenced*: in CLI mode (the
//!   older term's writer is a command under `tenure run` and knows no
//!   deadline), its writes inside the intersection were all rejected by
//!   fencing and each came within [`RESUME_SLACK`] after a whole-instance
//!   `pause` of its instance that began before the intersection. That is a
//!   pause of the whole host (tenure, guardian and command stopped
//!   together): on resuming, the command's next write can race the
//!   guardian's overdue kill, and only fencing covers it. Anything else stays
//!   an overlap: a late write accepted, or later than that, or after
//!   `pause-tenure-only` (the guardian's job), or by a library instance,
//!   which checks its own deadline before every write.
//! - Rejected stale writes are counted separately: they are fencing
//!   working, expected under pauses.
//! - *Tokens that fall or repeat*: two terms of different instances with
//!   the same token, or a term elected after another term had ended whose
//!   token is not larger. Fencing rejects such a term's writes once the
//!   resource has seen the larger token, so the resource's record alone
//!   would show nothing; but a resource that never saw it (a second fenced
//!   resource, or one restored from a backup) could not tell the stale
//!   leader from the new one.
//!
//! **Liveness**: the longest time without any leader outside Redis-wide
//! faults and etcd outages, when nobody can lead (only the part of a
//! leaderless gap that no such fault covers counts), the time from each
//! fault to the next new term, and the terms lost to faults that must cost
//! none ([`COSTS_NO_TERM`]).

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use tenure_test_support::overlap::{self, Among};

use crate::log::Event;

/// How soon after a whole-instance pause ends the command under a resumed
/// `tenure run` may still write once: its timer and the guardian's overdue
/// kill fire together on resuming, and the kill lands within milliseconds.
const RESUME_SLACK: u64 = 50_000_000;

/// A fault window during which no instance could be healthy: Redis is
/// down, paused, or restarted (`rollback` and `mixed-ttl` restart it too),
/// or the election's data moved to another node (a failover, also one
/// while a sentinel hangs, a killed primary, a resharded slot), whose
/// start-up hold-off then lasts one ttl by design. Killing one of three
/// sentinels is not among them: it should cost no leader at all. A fault
/// that says itself whether the store was down (`store_down`: on etcd, a
/// killed or paused raft leader until another member leads, every member
/// killed until a leader is back, a backup and restore; on a Cluster, never
/// for a killed primary of another shard) is taken at its word instead.
const REDIS_WIDE: [&str; 10] = [
    "restart",
    "stall",
    "rollback",
    "mixed-ttl",
    "sentinel-kill-primary",
    "sentinel-failover",
    "hang-sentinel",
    "cluster-failover",
    "cluster-kill-primary",
    "cluster-reshard",
];

/// Faults that must cost no term at all: a paused minority member of etcd
/// (the others answer, and a client hedges to them), and a killed primary
/// of a shard that does not serve the election (with
/// `cluster-require-full-coverage no`, the other shards keep serving). A
/// term that ends by its lease or deadline (not by its own resign or exit)
/// from such a fault's start until a ttl after it ended is counted in
/// [`Report::terms_lost_to_harmless_faults`], which must be 0 for a run to
/// be live.
pub const COSTS_NO_TERM: [&str; 2] = ["pause-minority-member", "kill-shard-primary"];

/// The reasons a term ends that a fault can cause (see
/// [`tenure::LostReason::label`]); resigns, shutdowns and drops are the
/// instance's own doing.
const LOST_TO_THE_STORE: [&str; 3] = ["taken", "expired", "deadline"];

#[derive(Debug, Clone, Serialize, Default)]
pub struct Report {
    pub ttl_ms: u64,
    pub duration_s: f64,
    pub faults: BTreeMap<String, u32>,
    pub terms: usize,
    pub writes_accepted: u64,
    pub writes_rejected: u64,
    pub stale_writes_accepted: u64,
    pub overlaps: u64,
    pub overlap_ms: f64,
    /// Overlaps after a whole-instance pause whose late writes fencing
    /// rejected (see the module docs); not safety violations.
    pub fenced_overlaps: u64,
    pub fenced_overlap_ms: f64,
    /// Terms whose token was not larger than an earlier term's (see the
    /// module docs); must be 0.
    pub tokens_not_rising: u64,
    /// Terms lost to faults that must cost none ([`COSTS_NO_TERM`]); must
    /// be 0 for the run to be live.
    pub terms_lost_to_harmless_faults: u64,
    pub longest_gap_ms: f64,
    pub longest_gap_outside_redis_faults_ms: f64,
    pub recovery_ms: BTreeMap<String, Recovery>,
    pub crashes: Vec<String>,
    pub leaked: Vec<String>,
    pub torn_lines: usize,
    pub safe: bool,
    pub live: bool,
}

/// Time from a fault of one kind to the next new term.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Recovery {
    pub count: u32,
    pub median_ms: f64,
    pub max_ms: f64,
}

#[derive(Debug, Clone)]
pub struct Term {
    pub inst: String,
    pub token: u64,
    pub elected: u64,
    /// End of leadership for liveness (loss, exit, or last deadline relied on).
    pub end: u64,
    /// First write .. end of belief, if the term wrote at all.
    pub acting: Option<(u64, u64)>,
    pub writes: Vec<(u64, bool)>,
    /// Its writer knew no deadline (every write logged `until == t`): a
    /// command under `tenure run`, in CLI mode.
    pub blind: bool,
}

/// A term's span for the overlap check is its acting interval: a term that
/// never wrote never acted. An empty one (a single write by a writer that
/// knows no deadline: it relied on nothing past that instant) is no span
/// either, here: an overlap is time both terms acted, and it has none.
impl overlap::Term for Term {
    type Time = u64;

    fn holder(&self) -> &str {
        &self.inst
    }

    fn span(&self) -> Option<(u64, u64)> {
        self.acting.filter(|(start, end)| start < end)
    }
}

/// Group the events into terms. A term starts at an `elected` event (or
/// the first write of a term nobody saw elected) and ends at its `lost`
/// event, its process's exit, or the last deadline it relied on, whichever
/// comes first. An instance that adopts its own term again after losing it
/// (same token) opens a new segment, so the gap in between is not counted
/// as leadership.
pub fn terms(events: &[Event]) -> Vec<Term> {
    struct Open {
        index: usize,
        max_until: u64,
    }
    let mut terms: Vec<Term> = Vec::new();
    let mut open: HashMap<(String, u64), Open> = HashMap::new();
    let open_term = |terms: &mut Vec<Term>,
                     open: &mut HashMap<(String, u64), Open>,
                     inst: &str,
                     token: u64,
                     t: u64| {
        terms.push(Term {
            inst: inst.to_string(),
            token,
            elected: t,
            end: u64::MAX,
            acting: None,
            writes: Vec::new(),
            blind: true,
        });
        open.insert(
            (inst.to_string(), token),
            Open {
                index: terms.len() - 1,
                max_until: 0,
            },
        );
    };
    let close = |terms: &mut Vec<Term>, segment: Open, at: u64| {
        let term = &mut terms[segment.index];
        let end = at.min(if term.writes.is_empty() {
            at
        } else {
            segment.max_until
        });
        term.end = end;
        if let Some(first) = term.writes.iter().map(|(t, _)| *t).min() {
            term.acting = Some((first, end.max(first)));
        }
    };
    for event in events {
        match event {
            Event::Elected { inst, token, t } => {
                if let Some(previous) = open.remove(&(inst.clone(), *token)) {
                    close(&mut terms, previous, *t);
                }
                open_term(&mut terms, &mut open, inst, *token, *t);
            }
            Event::Write {
                inst,
                token,
                t,
                until,
                ok,
            } => {
                let key = (inst.clone(), *token);
                if !open.contains_key(&key) {
                    open_term(&mut terms, &mut open, inst, *token, *t);
                }
                if let Some(segment) = open.get_mut(&key) {
                    terms[segment.index].writes.push((*t, *ok));
                    terms[segment.index].blind &= until == t;
                    segment.max_until = segment.max_until.max(*until);
                }
            }
            Event::Lost { inst, token, t, .. } => {
                if let Some(segment) = open.remove(&(inst.clone(), *token)) {
                    close(&mut terms, segment, *t);
                }
            }
            Event::Exit { inst, t, .. } => {
                let keys: Vec<(String, u64)> =
                    open.keys().filter(|(i, _)| i == inst).cloned().collect();
                for key in keys {
                    if let Some(segment) = open.remove(&key) {
                        close(&mut terms, segment, *t);
                    }
                }
            }
            _ => {}
        }
    }
    let last = events.last().map(Event::t).unwrap_or(0);
    for (_, segment) in open.drain() {
        close(&mut terms, segment, last);
    }
    terms.sort_by_key(|t| (t.elected, t.token));
    terms
}

/// Judge a run. `accepted` is the resource's list of accepted writes
/// ("TOKEN INSTANCE" per line) in acceptance order.
pub fn check(
    events: &[Event],
    accepted: &str,
    ttl_ms: u64,
    crashes: Vec<String>,
    leaked: Vec<String>,
    torn_lines: usize,
) -> Report {
    let terms = terms(events);
    let first = events.first().map(Event::t).unwrap_or(0);
    let last = events.last().map(Event::t).unwrap_or(0);
    let mut report = Report {
        ttl_ms,
        duration_s: (last - first) as f64 / 1e9,
        terms: terms.len(),
        crashes,
        leaked,
        torn_lines,
        ..Report::default()
    };

    for term in &terms {
        for (_, ok) in &term.writes {
            if *ok {
                report.writes_accepted += 1;
            } else {
                report.writes_rejected += 1;
            }
        }
    }

    let mut highest = 0u64;
    for line in accepted.lines() {
        let Some(token) = line
            .split_whitespace()
            .next()
            .and_then(|t| t.parse::<u64>().ok())
        else {
            continue;
        };
        if token < highest {
            report.stale_writes_accepted += 1;
        }
        highest = highest.max(token);
    }

    // Whole-instance pauses: (instance, from, until).
    let pauses: Vec<(&str, u64, u64)> = events
        .iter()
        .filter_map(|event| match event {
            Event::Fault {
                kind,
                target,
                t,
                until,
                ..
            } if kind == "pause" => Some((target.as_str(), *t, *until)),
            _ => None,
        })
        .collect();
    for both in overlap::overlaps(&terms, Among::OtherHolders) {
        let (a, b) = (&terms[both.first], &terms[both.second]);
        let (from, to) = (both.from, both.to);
        let wrote_inside = |term: &Term| term.writes.iter().any(|(t, _)| (from..=to).contains(t));
        if !(wrote_inside(a) && wrote_inside(b)) {
            continue;
        }
        let older = if a.token < b.token { a } else { b };
        if late_after_whole_pause(older, (from, to), &pauses) {
            report.fenced_overlaps += 1;
            report.fenced_overlap_ms += (to - from) as f64 / 1e6;
        } else {
            report.overlaps += 1;
            report.overlap_ms += (to - from) as f64 / 1e6;
        }
    }

    report.tokens_not_rising = tokens_not_rising(&terms);
    report.terms_lost_to_harmless_faults = lost_to_harmless_faults(events, ttl_ms);

    let mut redis_down: Vec<(u64, u64)> = Vec::new();
    let mut faults: Vec<(String, u64)> = Vec::new();
    for event in events {
        if let Event::Fault {
            kind,
            t,
            until,
            store_down,
            ..
        } = event
        {
            *report.faults.entry(kind.clone()).or_default() += 1;
            faults.push((kind.clone(), *t));
            if store_down.unwrap_or_else(|| REDIS_WIDE.contains(&kind.as_str())) {
                // Nobody can lead until Redis answers and a lease ttl passed.
                redis_down.push((*t, until.max(t) + ttl_ms * 1_000_000));
            }
        }
    }

    let mut intervals: Vec<(u64, u64)> = terms
        .iter()
        .map(|t| (t.elected, t.end.min(last).max(t.elected)))
        .collect();
    intervals.sort();
    let mut covered_until = intervals.first().map_or(first, |i| i.0);
    for (start, end) in intervals {
        if start > covered_until {
            let gap_ms = (start - covered_until) as f64 / 1e6;
            report.longest_gap_ms = report.longest_gap_ms.max(gap_ms);
            let outside_ms = longest_uncovered((covered_until, start), &redis_down) as f64 / 1e6;
            report.longest_gap_outside_redis_faults_ms =
                report.longest_gap_outside_redis_faults_ms.max(outside_ms);
        }
        covered_until = covered_until.max(end);
    }

    let mut recoveries: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for (index, (kind, t)) in faults.iter().enumerate() {
        let next_fault = faults.get(index + 1).map_or(u64::MAX, |f| f.1);
        let before = terms
            .iter()
            .filter(|term| term.elected <= *t)
            .map(|term| term.token)
            .max()
            .unwrap_or(0);
        if let Some(next) = terms
            .iter()
            .find(|term| term.elected > *t && term.elected < next_fault && term.token > before)
        {
            recoveries
                .entry(kind.clone())
                .or_default()
                .push((next.elected - t) as f64 / 1e6);
        }
    }
    for (kind, mut times) in recoveries {
        times.sort_by(f64::total_cmp);
        report.recovery_ms.insert(
            kind,
            Recovery {
                count: times.len() as u32,
                median_ms: times[times.len() / 2],
                max_ms: times.last().copied().unwrap_or(0.0),
            },
        );
    }

    report.safe = report.stale_writes_accepted == 0
        && report.overlaps == 0
        && report.tokens_not_rising == 0
        && report.crashes.is_empty()
        && report.leaked.is_empty();
    let slack_ms = ttl_ms as f64 * 0.25 + 100.0;
    report.live = report.longest_gap_outside_redis_faults_ms <= ttl_ms as f64 + slack_ms
        && report.terms_lost_to_harmless_faults == 0;
    report
}

/// Terms whose token repeats another instance's or does not exceed the
/// token of a term that had ended before they were elected. (A term's
/// `elected` is when its instance logged it, after the store granted it, so
/// a term elected after another ended was granted after that one began.)
fn tokens_not_rising(terms: &[Term]) -> u64 {
    let mut count = 0;
    for (i, term) in terms.iter().enumerate() {
        let repeats = terms[..i]
            .iter()
            .any(|earlier| earlier.inst != term.inst && earlier.token == term.token);
        let falls = terms
            .iter()
            .any(|ended| ended.end < term.elected && ended.token > term.token);
        if repeats || falls {
            count += 1;
        }
    }
    count
}

/// Terms lost by their lease or deadline while a fault of
/// [`COSTS_NO_TERM`] ran, or within a ttl after it ended.
fn lost_to_harmless_faults(events: &[Event], ttl_ms: u64) -> u64 {
    let windows: Vec<(u64, u64)> = events
        .iter()
        .filter_map(|event| match event {
            Event::Fault { kind, t, until, .. } if COSTS_NO_TERM.contains(&kind.as_str()) => {
                Some((*t, until.max(t) + ttl_ms * 1_000_000))
            }
            _ => None,
        })
        .collect();
    events
        .iter()
        .filter(|event| match event {
            Event::Lost { t, reason, .. } => {
                LOST_TO_THE_STORE.contains(&reason.as_str())
                    && windows.iter().any(|(from, to)| (*from..=*to).contains(t))
            }
            _ => false,
        })
        .count() as u64
}

/// The longest stretch of `gap` that no window of `down` covers: a gap is
/// held against the liveness goal only where the store could serve (a gap
/// that merely touches a store outage is not excused as a whole).
fn longest_uncovered((from, to): (u64, u64), down: &[(u64, u64)]) -> u64 {
    let mut windows: Vec<(u64, u64)> = down
        .iter()
        .filter(|(a, b)| *a < to && from < *b)
        .map(|(a, b)| ((*a).max(from), (*b).min(to)))
        .collect();
    windows.sort_unstable();
    let (mut cursor, mut longest) = (from, 0);
    for (a, b) in windows {
        longest = longest.max(a.saturating_sub(cursor));
        cursor = cursor.max(b);
    }
    longest.max(to.saturating_sub(cursor))
}

/// Whether `older` is a command under `tenure run` whose writes inside
/// `overlap` were all rejected by fencing and came within [`RESUME_SLACK`]
/// after a whole-instance pause of its instance that began before the
/// overlap: its last breath on resuming, before the guardian's kill landed.
fn late_after_whole_pause(
    older: &Term,
    (from, to): (u64, u64),
    pauses: &[(&str, u64, u64)],
) -> bool {
    older.blind
        && older
            .writes
            .iter()
            .filter(|(t, _)| (from..=to).contains(t))
            .all(|&(t, ok)| {
                !ok && pauses.iter().any(|&(inst, began, resumed)| {
                    inst == older.inst
                        && began < from
                        && resumed <= t
                        && t <= resumed + RESUME_SLACK
                })
            })
}

impl Report {
    /// A table for people.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let row = |out: &mut String, k: &str, v: String| out.push_str(&format!("| {k} | {v} |\n"));
        out.push_str("| figure | value |\n|---|---|\n");
        row(&mut out, "run time", format!("{:.0} s", self.duration_s));
        row(&mut out, "ttl", format!("{} ms", self.ttl_ms));
        let faults: Vec<String> = self
            .faults
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        row(
            &mut out,
            "faults injected",
            format!(
                "{} ({})",
                self.faults.values().sum::<u32>(),
                faults.join(", ")
            ),
        );
        row(&mut out, "terms", self.terms.to_string());
        row(
            &mut out,
            "fenced writes accepted",
            self.writes_accepted.to_string(),
        );
        row(
            &mut out,
            "stale writes rejected by fencing",
            self.writes_rejected.to_string(),
        );
        row(
            &mut out,
            "stale writes accepted (must be 0)",
            self.stale_writes_accepted.to_string(),
        );
        row(
            &mut out,
            "overlapping leaders (must be 0)",
            format!("{} ({:.1} ms)", self.overlaps, self.overlap_ms),
        );
        row(
            &mut out,
            "overlaps after a whole-instance pause, late writes all rejected by fencing",
            format!(
                "{} ({:.1} ms)",
                self.fenced_overlaps, self.fenced_overlap_ms
            ),
        );
        row(
            &mut out,
            "tokens that fell or repeated (must be 0)",
            self.tokens_not_rising.to_string(),
        );
        row(
            &mut out,
            "terms lost to faults that must cost none (must be 0)",
            self.terms_lost_to_harmless_faults.to_string(),
        );
        row(
            &mut out,
            "longest leaderless gap",
            format!("{:.0} ms", self.longest_gap_ms),
        );
        row(
            &mut out,
            "longest gap outside Redis-wide faults (goal: ttl + 25 % + 100 ms)",
            format!(
                "{:.0} ms = {:.2} x ttl",
                self.longest_gap_outside_redis_faults_ms,
                self.longest_gap_outside_redis_faults_ms / self.ttl_ms as f64
            ),
        );
        for (kind, r) in &self.recovery_ms {
            row(
                &mut out,
                &format!("fault to next leader: {kind}"),
                format!(
                    "median {:.0} ms, max {:.0} ms ({} terms)",
                    r.median_ms, r.max_ms, r.count
                ),
            );
        }
        row(
            &mut out,
            "crashes / panics (must be 0)",
            format!("{} {}", self.crashes.len(), self.crashes.join("; ")),
        );
        row(
            &mut out,
            "leaked processes (must be 0)",
            format!("{} {}", self.leaked.len(), self.leaked.join("; ")),
        );
        row(
            &mut out,
            "verdict",
            format!(
                "{} / {}",
                if self.safe { "SAFE" } else { "UNSAFE" },
                if self.live {
                    "live"
                } else {
                    "liveness goal missed"
                }
            ),
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn write(inst: &str, token: u64, t: u64, until: u64, ok: bool) -> Event {
        Event::Write {
            inst: inst.into(),
            token,
            t: t * MS,
            until: until * MS,
            ok,
        }
    }

    fn elected(inst: &str, token: u64, t: u64) -> Event {
        Event::Elected {
            inst: inst.into(),
            token,
            t: t * MS,
        }
    }

    #[test]
    fn a_clean_handover_is_safe() {
        let events = vec![
            elected("a", 1, 0),
            write("a", 1, 10, 900, true),
            write("a", 1, 500, 1400, true),
            Event::Lost {
                inst: "a".into(),
                token: 1,
                t: 600 * MS,
                reason: "resigned".into(),
            },
            elected("b", 2, 610),
            write("b", 2, 620, 1500, true),
        ];
        let report = check(&events, "1 a\n1 a\n2 b\n", 1000, vec![], vec![], 0);
        assert!(report.safe, "{report:?}");
        assert_eq!(report.overlaps, 0);
        assert!((report.longest_gap_ms - 10.0).abs() < 0.001, "{report:?}");
    }

    #[test]
    fn two_instances_acting_inside_each_others_deadline_are_an_overlap() {
        let events = vec![
            elected("a", 1, 0),
            write("a", 1, 10, 900, true),
            elected("b", 2, 300),
            write("b", 2, 310, 1200, true),
            write("a", 1, 400, 900, false),
        ];
        let report = check(&events, "1 a\n2 b\n", 1000, vec![], vec![], 0);
        assert_eq!(report.overlaps, 1);
        assert!(!report.safe);
        assert_eq!(report.writes_rejected, 1);
    }

    fn pause(inst: &str, from: u64, until: u64) -> Event {
        Event::Fault {
            kind: "pause".into(),
            target: inst.into(),
            t: from * MS,
            until: until * MS,
            store_down: None,
        }
    }

    /// CLI mode (writers know no deadline): a leads and is paused whole at
    /// 100 ms until 2000 ms; b leads from 1100 ms; a's command writes once
    /// more on resuming, at `late` ms.
    fn whole_pause_then_late_write(late: u64, ok: bool, fault: Event) -> Vec<Event> {
        let mut events = vec![
            elected("a", 1, 0),
            write("a", 1, 10, 10, true),
            write("a", 1, 90, 90, true),
            fault,
            elected("b", 2, 1100),
            write("b", 2, 1110, 1110, true),
            write("b", 2, 1990, 1990, true),
            write("b", 2, late + 50, late + 50, true),
            write("a", 1, late, late, ok),
        ];
        events.sort_by_key(Event::t);
        events
    }

    #[test]
    fn a_rejected_last_write_after_a_whole_instance_pause_is_fenced_not_an_overlap() {
        let events = whole_pause_then_late_write(2005, false, pause("a", 100, 2000));
        let report = check(
            &events,
            "1 a\n1 a\n2 b\n2 b\n2 b\n",
            1000,
            vec![],
            vec![],
            0,
        );
        assert_eq!(report.overlaps, 0, "{report:?}");
        assert_eq!(report.fenced_overlaps, 1, "{report:?}");
        assert!(report.safe, "{report:?}");
    }

    #[test]
    fn late_writes_are_real_overlaps_unless_fenced_right_after_a_whole_pause() {
        let real = |events: Vec<Event>, why: &str| {
            let report = check(&events, "", 1000, vec![], vec![], 0);
            assert_eq!(report.overlaps, 1, "{why}: {report:?}");
            assert_eq!(report.fenced_overlaps, 0, "{why}: {report:?}");
            assert!(!report.safe, "{why}");
        };
        real(
            whole_pause_then_late_write(2005, true, pause("a", 100, 2000)),
            "the late write was accepted",
        );
        let tenure_only = Event::Fault {
            kind: "pause-tenure-only".into(),
            target: "a".into(),
            t: 100 * MS,
            until: 2000 * MS,
            store_down: None,
        };
        real(
            whole_pause_then_late_write(2005, false, tenure_only),
            "only tenure was paused: the guardian should have stopped the command",
        );
        real(
            whole_pause_then_late_write(2100, false, pause("a", 100, 2000)),
            "the command still wrote 100 ms after the pause ended",
        );
        let mut library = whole_pause_then_late_write(2005, false, pause("a", 100, 2000));
        for event in &mut library {
            if let Event::Write { inst, until, .. } = event {
                if inst == "a" {
                    *until = u64::MAX;
                }
            }
        }
        real(
            library,
            "a library instance checks its deadline before every write",
        );
        real(
            whole_pause_then_late_write(2005, false, pause("b", 100, 2000)),
            "another instance was paused",
        );
    }

    #[test]
    fn a_stale_token_accepted_after_a_newer_one_is_a_violation() {
        let report = check(&[], "5 a\n7 b\n5 a\n", 1000, vec![], vec![], 0);
        assert_eq!(report.stale_writes_accepted, 1);
        assert!(!report.safe);
    }

    #[test]
    fn a_long_gap_outside_redis_faults_misses_the_liveness_goal() {
        let events = vec![
            elected("a", 1, 0),
            write("a", 1, 10, 100, true),
            Event::Exit {
                inst: "a".into(),
                t: 100 * MS,
                how: "killed".into(),
            },
            elected("b", 2, 3000),
        ];
        let report = check(&events, "", 1000, vec![], vec![], 0);
        assert!(!report.live);
        let events_with_stall = [
            vec![Event::Fault {
                kind: "stall".into(),
                target: String::new(),
                t: 50 * MS,
                until: 2500 * MS,
                store_down: None,
            }],
            events,
        ]
        .concat();
        let mut sorted = events_with_stall;
        sorted.sort_by_key(Event::t);
        let report = check(&sorted, "", 1000, vec![], vec![], 0);
        assert!(
            report.live,
            "gaps while Redis is down do not count: {report:?}"
        );
    }

    #[test]
    fn only_the_part_of_a_gap_outside_store_outages_is_excused() {
        // Nobody leads from 100 ms to 9 s; the store was down only from 6 s
        // (etcd's raft leader killed) until 7 s, plus a ttl.
        let outage = |store_down| Event::Fault {
            kind: "etcd-kill-member".into(),
            target: String::new(),
            t: 6000 * MS,
            until: 7000 * MS,
            store_down,
        };
        let events = |store_down| {
            vec![
                elected("a", 1, 0),
                write("a", 1, 10, 100, true),
                Event::Exit {
                    inst: "a".into(),
                    t: 100 * MS,
                    how: "killed".into(),
                },
                outage(store_down),
                elected("b", 2, 9000),
            ]
        };
        let report = check(&events(Some(true)), "", 1000, vec![], vec![], 0);
        assert!(!report.live, "{report:?}");
        assert!(
            (report.longest_gap_outside_redis_faults_ms - 5900.0).abs() < 0.001,
            "100 ms to 6 s counts: {report:?}"
        );
        // A fault that says the store kept serving excuses nothing, whatever
        // its kind.
        let report = check(&events(Some(false)), "", 1000, vec![], vec![], 0);
        assert!((report.longest_gap_outside_redis_faults_ms - 8900.0).abs() < 0.001);
    }

    fn lost(inst: &str, token: u64, t: u64, reason: &str) -> Event {
        Event::Lost {
            inst: inst.into(),
            token,
            t: t * MS,
            reason: reason.into(),
        }
    }

    #[test]
    fn a_token_that_repeats_or_falls_after_a_term_ended_is_a_violation() {
        // As after an etcd restore from an older snapshot with tokens taken
        // from revisions: c's term reuses b's token, d's falls below it.
        // Fencing rejects their writes, so only the tokens show it.
        let events = vec![
            elected("a", 4, 0),
            lost("a", 4, 100, "resigned"),
            elected("b", 6, 110),
            lost("b", 6, 200, "resigned"),
            elected("c", 6, 1300),
            write("c", 6, 1310, 2000, false),
            lost("c", 6, 1400, "resigned"),
            elected("d", 5, 1500),
        ];
        let report = check(&events, "", 1000, vec![], vec![], 0);
        assert_eq!(report.tokens_not_rising, 2, "{report:?}");
        assert!(!report.safe);
        // Rising tokens, and one instance taking up its own term again after
        // losing it, are fine.
        let events = vec![
            elected("a", 4, 0),
            lost("a", 4, 100, "deadline"),
            elected("a", 4, 150),
            lost("a", 4, 200, "resigned"),
            elected("b", 9, 300),
        ];
        let report = check(&events, "", 1000, vec![], vec![], 0);
        assert_eq!(report.tokens_not_rising, 0, "{report:?}");
        assert!(report.safe);
    }

    #[test]
    fn a_term_lost_to_a_fault_that_must_cost_none_misses_the_liveness_goal() {
        let pause = Event::Fault {
            kind: "pause-minority-member".into(),
            target: String::new(),
            t: 1000 * MS,
            until: 3000 * MS,
            store_down: Some(false),
        };
        let run = |reason: &str, at: u64| {
            vec![
                elected("a", 1, 0),
                write("a", 1, 10, 900, true),
                pause.clone(),
                lost("a", 1, at, reason),
                elected("b", 2, at + 5),
            ]
        };
        let report = check(&run("deadline", 2000), "", 1000, vec![], vec![], 0);
        assert_eq!(report.terms_lost_to_harmless_faults, 1, "{report:?}");
        assert!(report.safe && !report.live, "{report:?}");
        // Within a ttl after the fault ended still counts; later, or the
        // instance's own resign, does not.
        let report = check(&run("expired", 3900), "", 1000, vec![], vec![], 0);
        assert_eq!(report.terms_lost_to_harmless_faults, 1, "{report:?}");
        for (reason, at) in [("deadline", 4100), ("resigned", 2000)] {
            let report = check(&run(reason, at), "", 1000, vec![], vec![], 0);
            assert_eq!(
                report.terms_lost_to_harmless_faults, 0,
                "{reason}: {report:?}"
            );
        }
    }
}
