//! Two leaders at once: which terms overlapped.
//!
//! A term is held over a span of time by one holder (an instance's id).
//! Two terms *overlap* when each began before the other ended: spans are
//! half-open, so a term that begins the instant another ends does not
//! overlap it. The time is whatever the caller measured in (nanoseconds in
//! a log, `Instant`s), as long as it is ordered.
//!
//! Each checker keeps what is its own: `tenure-chaos` counts only the
//! overlaps in which both terms wrote and tells fenced ones apart; the
//! library's tests fail at the first overlap, or measure the longest one.
//! (The simulation's check is not here: it asks every live handle
//! `is_leader()` at one simulated instant, with no spans to compare.)

/// A term as the overlap check sees it.
pub trait Term {
    /// The time its span is measured in.
    type Time: Ord + Copy;
    /// Who held it (an instance's id).
    fn holder(&self) -> &str;
    /// When it was held, `[start, end)`; `None`: it never was (a term that
    /// never acted, for a checker that counts acting only).
    fn span(&self) -> Option<(Self::Time, Self::Time)>;
}

/// Which pairs of terms are compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Among {
    /// Every pair: each holder takes its terms one after another, so even
    /// its own must not overlap (the library's tests, whose contenders
    /// campaign again only after a term was lost).
    Everyone,
    /// Pairs of different holders only: one holder's terms may overlap in
    /// the record without being two leaders (`tenure-chaos`, where an
    /// instance that takes up its own term again opens a new segment of
    /// it, and one process cannot race itself).
    OtherHolders,
}

/// Two terms that overlapped, by their indices in the slice checked
/// (`first < second`), and the time both held: from the later start to the
/// earlier end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overlap<T> {
    /// Index of one term.
    pub first: usize,
    /// Index of the other (after `first` in the slice).
    pub second: usize,
    /// The later of the two starts.
    pub from: T,
    /// The earlier of the two ends (not before `from` for spans that end
    /// after they start).
    pub to: T,
}

/// Every pair of `terms` (among those `among` names) whose spans overlap,
/// in the order of the slice.
pub fn overlaps<I: Term>(terms: &[I], among: Among) -> Vec<Overlap<I::Time>> {
    let mut found = Vec::new();
    for (i, a) in terms.iter().enumerate() {
        let Some((a_start, a_end)) = a.span() else {
            continue;
        };
        for (j, b) in terms.iter().enumerate().skip(i + 1) {
            if among == Among::OtherHolders && a.holder() == b.holder() {
                continue;
            }
            let Some((b_start, b_end)) = b.span() else {
                continue;
            };
            if a_start < b_end && b_start < a_end {
                found.push(Overlap {
                    first: i,
                    second: j,
                    from: a_start.max(b_start),
                    to: a_end.min(b_end),
                });
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    struct T(&'static str, Option<(u32, u32)>);

    impl Term for T {
        type Time = u32;
        fn holder(&self) -> &str {
            self.0
        }
        fn span(&self) -> Option<(u32, u32)> {
            self.1
        }
    }

    #[test]
    fn terms_that_touch_do_not_overlap_and_terms_that_cross_do() {
        let terms = [
            T("a", Some((0, 10))),
            T("b", Some((10, 20))),
            T("c", Some((15, 30))),
            T("d", None),
        ];
        assert_eq!(
            overlaps(&terms, Among::Everyone),
            [Overlap {
                first: 1,
                second: 2,
                from: 15,
                to: 20
            }]
        );
    }

    #[test]
    fn one_holders_terms_count_only_among_everyone() {
        let terms = [T("a", Some((0, 10))), T("a", Some((5, 20)))];
        assert_eq!(overlaps(&terms, Among::Everyone).len(), 1);
        assert!(overlaps(&terms, Among::OtherHolders).is_empty());
    }

    #[test]
    fn a_term_begun_inside_another_overlaps_it_even_if_it_ended_at_once() {
        // b began at 5, while a held until 10, and ended at once: it still
        // began before a ended, and a before it ended.
        let terms = [T("a", Some((0, 10))), T("b", Some((5, 5)))];
        let found = overlaps(&terms, Among::Everyone);
        assert_eq!(found.len(), 1);
        assert_eq!((found[0].from, found[0].to), (5, 5));
    }
}
