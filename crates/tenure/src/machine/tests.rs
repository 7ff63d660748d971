//! The state machine's decisions, instant by instant (no clock, no I/O:
//! every instant is made up).

use super::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// An instant on a host that is never suspended.
fn at(now: Instant) -> Reading {
    Reading {
        now,
        slept: Duration::ZERO,
    }
}

fn timing() -> Timing {
    Timing::new(ms(3000), None, Some(ms(300)), None).unwrap()
}

#[test]
fn defaults_follow_the_ttl() {
    let t = Timing::new(Duration::from_secs(15), None, None, None).unwrap();
    assert_eq!(t.renew_every, Duration::from_secs(5));
    assert_eq!(t.margin, ms(1500));
    assert_eq!(t.call_timeout, Duration::from_secs(2));
}

#[test]
fn renew_interval_not_shorter_than_ttl_is_rejected() {
    let err = Timing::new(ms(1000), Some(ms(1000)), None, None).unwrap_err();
    assert!(
        err.to_string().contains("must be shorter than the ttl"),
        "{err}"
    );
    assert!(Timing::new(ms(1000), Some(ms(2000)), None, None).is_err());
}

#[test]
fn margin_must_leave_room_for_a_renewal() {
    let err = Timing::new(ms(1000), Some(ms(500)), Some(ms(500)), None).unwrap_err();
    assert!(err.to_string().contains("safety margin"), "{err}");
}

#[test]
fn zero_values_are_rejected() {
    assert!(Timing::new(Duration::ZERO, None, None, None).is_err());
    assert!(Timing::new(ms(99), None, None, None).is_err());
    assert!(Timing::new(Duration::from_secs(24 * 3600 + 1), None, None, None).is_err());
    assert!(Timing::new(ms(1000), Some(ms(9)), None, None).is_err());
    assert!(Timing::new(ms(1000), Some(Duration::ZERO), None, None).is_err());
    assert!(Timing::new(ms(1000), None, None, Some(Duration::ZERO)).is_err());
    assert!(Timing::new(Duration::from_micros(1500), None, None, None).is_err());
}

#[test]
fn deadline_counts_from_the_send_time() {
    let t = timing();
    let sent = Instant::now();
    let step = after_acquire(
        &t,
        at(sent),
        at(sent + ms(900)),
        Some(AcquireReply::Won { token: 7 }),
        ms(0),
        0,
    );
    let CandidateStep::Elected(state) = step else {
        panic!("not elected: {step:?}")
    };
    assert_eq!(state.deadline, sent + ms(2700));
    assert_eq!(state.next_renewal, sent + ms(1000));
}

#[test]
fn unanswered_renewal_never_moves_the_deadline() {
    let t = timing();
    let start = Instant::now();
    let mut state = LeaderState::elected(&t, 1, at(start));
    let step = state.after_renew(&t, at(start + ms(1000)), at(start + ms(1500)), None);
    assert_eq!(state.deadline, start + ms(2700));
    assert_eq!(step, LeaderStep::RenewAt(start + ms(1500) + t.retry_every));
    let step = state.after_renew(&t, at(start + ms(2600)), at(start + ms(2700)), None);
    assert_eq!(step, LeaderStep::Lost(LostReason::DeadlinePassed));
}

#[test]
fn late_renewal_reply_extends_from_its_send_time_only() {
    let t = timing();
    let start = Instant::now();
    let mut state = LeaderState::elected(&t, 1, at(start));
    let step = state.after_renew(
        &t,
        at(start + ms(1000)),
        at(start + ms(2000)),
        Some(RenewReply::Renewed),
    );
    assert_eq!(state.deadline, start + ms(3700));
    assert_eq!(step, LeaderStep::RenewAt(start + ms(2000)));
}

#[test]
fn renewal_answered_after_the_deadline_does_not_revive_the_term() {
    let t = timing();
    let start = Instant::now();
    let mut state = LeaderState::elected(&t, 1, at(start));
    // Sent just before the deadline, answered long after the lease it
    // would have extended could have expired.
    let step = state.after_renew(
        &t,
        at(start + ms(100)),
        at(start + ms(5000)),
        Some(RenewReply::Renewed),
    );
    assert_eq!(step, LeaderStep::Lost(LostReason::DeadlinePassed));
}

#[test]
fn renewal_sent_before_the_deadline_but_answered_after_it_does_not_revive_the_term() {
    let t = timing();
    let start = Instant::now();
    let mut state = LeaderState::elected(&t, 1, at(start));
    // Deadline at 2700: sent at 2600, answered at 2750.
    let step = state.after_renew(
        &t,
        at(start + ms(2600)),
        at(start + ms(2750)),
        Some(RenewReply::Renewed),
    );
    assert_eq!(step, LeaderStep::Lost(LostReason::DeadlinePassed));
    assert_eq!(state.deadline, start + ms(2700));
}

#[test]
fn acquire_answered_after_its_deadline_is_retried_not_trusted() {
    let t = timing();
    let sent = Instant::now();
    let late = sent + ms(2700);
    let step = after_acquire(
        &t,
        at(sent),
        at(late),
        Some(AcquireReply::Won { token: 3 }),
        ms(0),
        0,
    );
    assert_eq!(step, CandidateStep::Retry { at: late });
}

#[test]
fn follower_waits_for_the_holders_ttl() {
    let t = timing();
    let now = Instant::now();
    let holder = Holder {
        id: "b".into(),
        token: 4,
        ttl_left: ms(1200),
        since_ms: 0,
        attempt: String::new(),
        ttl: ms(3000),
    };
    let step = after_acquire(
        &t,
        at(now),
        at(now),
        Some(AcquireReply::Held(holder.clone())),
        ms(3),
        0,
    );
    assert_eq!(
        step,
        CandidateStep::Follow {
            until: now + ms(1203),
            holder
        }
    );
}

#[test]
fn failed_acquire_backs_off_up_to_the_renew_interval() {
    let t = timing();
    let now = Instant::now();
    let first = after_acquire(&t, at(now), at(now), None, ms(0), 0);
    assert_eq!(
        first,
        CandidateStep::Retry {
            at: now + t.retry_every
        }
    );
    let many = after_acquire(&t, at(now), at(now), None, ms(0), 30);
    assert_eq!(
        many,
        CandidateStep::Retry {
            at: now + t.renew_every
        }
    );
}

#[test]
fn losing_to_another_owner_names_it() {
    let t = timing();
    let start = Instant::now();
    let mut state = LeaderState::elected(&t, 1, at(start));
    let holder = Holder {
        id: "other".into(),
        token: 9,
        ttl_left: ms(10),
        since_ms: 0,
        attempt: String::new(),
        ttl: ms(3000),
    };
    let step = state.after_renew(
        &t,
        at(start),
        at(start),
        Some(RenewReply::NotOwner(Some(holder))),
    );
    assert_eq!(
        step,
        LeaderStep::Lost(LostReason::Taken {
            by: "other".into(),
            token: 9
        })
    );
    let step = state.after_renew(&t, at(start), at(start), Some(RenewReply::NotOwner(None)));
    assert_eq!(step, LeaderStep::Lost(LostReason::Expired));
}

#[test]
fn time_the_host_slept_counts_against_the_deadline_whatever_the_renewals_say() {
    let t = timing();
    let start = Instant::now();
    let mut state = LeaderState::elected(&t, 1, at(start));
    // Half a second asleep: the deadline is half a second earlier.
    let woken = Reading {
        now: start + ms(1000),
        slept: ms(500),
    };
    assert_eq!(state.deadline_as_of(woken.slept), Some(start + ms(2200)));
    // A renewal sent after waking fails: the sleep still counts.
    let step = state.after_renew(&t, woken, woken, None);
    assert!(matches!(step, LeaderStep::RenewAt(_)), "{step:?}");
    assert_eq!(state.deadline_as_of(woken.slept), Some(start + ms(2200)));
    // One that succeeds counts from its own send, after the sleep.
    let step = state.after_renew(&t, woken, woken, Some(RenewReply::Renewed));
    assert!(matches!(step, LeaderStep::RenewAt(_)), "{step:?}");
    assert_eq!(state.deadline_as_of(woken.slept), Some(start + ms(3700)));
    // Slept past the deadline: over, and a success sent before the sleep
    // but answered after it does not revive the term.
    let overslept = Reading {
        now: start + ms(1100),
        slept: ms(5000),
    };
    let step = state.after_renew(&t, woken, overslept, Some(RenewReply::Renewed));
    assert_eq!(step, LeaderStep::Lost(LostReason::DeadlinePassed));
    // Asleep for longer than the clock can count back: long past.
    let forever = Reading {
        now: start,
        slept: Duration::from_secs(u32::MAX.into()) * 1000,
    };
    assert!(!state.is_current(forever));
}
