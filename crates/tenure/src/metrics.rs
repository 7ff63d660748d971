//! Metrics, through the [`metrics`](https://docs.rs/metrics) facade: the
//! embedding application installs the exporter it likes (Prometheus,
//! StatsD, ...). Without one, recording costs next to nothing.
//!
//! | name                                        | type      | labels           |
//! |---------------------------------------------|-----------|------------------|
//! | `leader_election_is_leader`                 | gauge     | `name`           |
//! | `leader_election_token`                     | gauge     | `name`           |
//! | `leader_election_acquired_total`            | counter   | `name`           |
//! | `leader_election_lost_total`                | counter   | `name`, `reason` |
//! | `leader_election_renewal_failure_total`     | counter   | `name`           |
//! | `leader_election_renew_duration_seconds`    | histogram | `name`           |
//! | `leader_election_phantom_members`           | gauge     | `group`          |
//! | `leader_election_master_status`             | gauge     | `name`           |
//! | `leader_election_partitions_held`           | gauge     | `name`           |
//! | `leader_election_schedule_slots_total`      | counter   | `name`, `outcome`|
//! | `leader_election_schedule_last_success_timestamp_seconds` | gauge | `name` |
//! | `leader_election_semaphore_permits`         | gauge     | `name`           |
//! | `leader_election_semaphore_held`            | gauge     | `name`           |
//! | `leader_election_semaphore_waiting`         | gauge     | `name`           |
//!
//! The semaphore's series are labelled with the semaphore's name (each
//! permit's election has its own series too, named `NAME/permit-K`): how
//! many permits it has, how many this process holds now, and how many
//! [`Semaphore::acquire`](crate::Semaphore::acquire) calls of this process
//! wait for one. Summed over the instances of a group, held and waiting
//! say how full the semaphore is and how many wait; held below the
//! permits while some wait, for longer than a ttl, means permits are
//! free that nobody takes.
//!
//! The schedule's series are a [`Runner::cron`](crate::Runner::cron)'s:
//! its slots by `outcome` (`ran`, `failed`, `missed`, `overrun`; see
//! [`Schedule`](crate::Schedule)), and the Unix time at which this
//! instance last completed a slot's run successfully (alert on
//! `time() - max(...)` growing past the schedule's period plus slack).
//!
//! `leader_election_master_status` is Kubernetes client-go's name for
//! `leader_election_is_leader` (1 while leading, else 0), recorded as well
//! so that dashboards and alerts written for client-go's leader election
//! work unchanged.
//!
//! `reason` is one of [`LostReason::label`](crate::LostReason::label):
//! `taken`, `expired`, `deadline`, `resigned`, `shutdown`.
//!
//! An election's series are labelled with its name. A partition set's are
//! labelled with its group name, counting every partition's terms together,
//! plus `leader_election_partitions_held`, so that the number of series does
//! not grow with the number of partitions; its renewal figures count batches.
//! [`PartitionSetBuilder::per_partition_metrics`](crate::PartitionSetBuilder::per_partition_metrics)
//! labels them by partition instead (one series per partition and metric).
//!
//! Without the crate's `metrics` feature nothing is recorded and every call
//! below compiles to nothing.

use std::time::Duration;

use crate::term::LostReason;

/// Describe tenure's metrics to the installed recorder (units and help
/// text). Called by [`crate::ElectionBuilder::build`]; call it yourself if
/// you install a recorder later. Does nothing without the `metrics` feature.
///
/// ```
/// tenure::describe_metrics();
/// ```
pub fn describe_metrics() {
    #[cfg(feature = "metrics")]
    record::describe();
}

pub(crate) fn describe() {
    describe_metrics();
}

pub(crate) fn elected(name: &str, token: u64) {
    #[cfg(feature = "metrics")]
    record::elected(name, token);
    #[cfg(not(feature = "metrics"))]
    let _ = (name, token);
}

pub(crate) fn lost(name: &str, reason: &LostReason) {
    #[cfg(feature = "metrics")]
    record::lost(name, reason);
    #[cfg(not(feature = "metrics"))]
    let _ = (name, reason);
}

pub(crate) fn renewed(name: &str, latency: Duration) {
    #[cfg(feature = "metrics")]
    record::renewed(name, latency);
    #[cfg(not(feature = "metrics"))]
    let _ = (name, latency);
}

pub(crate) fn renewal_failed(name: &str) {
    #[cfg(feature = "metrics")]
    record::renewal_failed(name);
    #[cfg(not(feature = "metrics"))]
    let _ = name;
}

/// `count` slots of the schedule of election `name` ended as `outcome`.
pub(crate) fn slots(name: &str, outcome: &'static str, count: u64) {
    #[cfg(feature = "metrics")]
    record::slots(name, outcome, count);
    #[cfg(not(feature = "metrics"))]
    let _ = (name, outcome, count);
}

/// A slot's run of election `name`'s schedule succeeded, at `at`.
pub(crate) fn slot_succeeded(name: &str, at: std::time::SystemTime) {
    #[cfg(feature = "metrics")]
    record::slot_succeeded(name, at);
    #[cfg(not(feature = "metrics"))]
    let _ = (name, at);
}

/// Semaphore `name` has `permits` permits.
pub(crate) fn semaphore_permits(name: &str, permits: usize) {
    #[cfg(feature = "metrics")]
    record::semaphore_permits(name, permits);
    #[cfg(not(feature = "metrics"))]
    let _ = (name, permits);
}

/// This process holds one more permit of semaphore `name` (`change` 1),
/// one fewer (-1), or as many (0: the series is made).
pub(crate) fn semaphore_held(name: &str, change: i8) {
    #[cfg(feature = "metrics")]
    record::semaphore_held(name, change);
    #[cfg(not(feature = "metrics"))]
    let _ = (name, change);
}

/// One more (`change` 1), one fewer (-1) or as many (0) calls of this
/// process wait for a permit of semaphore `name`.
pub(crate) fn semaphore_waiting(name: &str, change: i8) {
    #[cfg(feature = "metrics")]
    record::semaphore_waiting(name, change);
    #[cfg(not(feature = "metrics"))]
    let _ = (name, change);
}

pub(crate) fn group_elected(group: &str, held: usize) {
    #[cfg(feature = "metrics")]
    record::group_elected(group, held);
    #[cfg(not(feature = "metrics"))]
    let _ = (group, held);
}

pub(crate) fn group_lost(group: &str, reason: &LostReason, held: usize) {
    #[cfg(feature = "metrics")]
    record::group_lost(group, reason, held);
    #[cfg(not(feature = "metrics"))]
    let _ = (group, reason, held);
}

pub(crate) fn phantom_members(group: &str, count: u64) {
    #[cfg(feature = "metrics")]
    record::phantom_members(group, count);
    #[cfg(not(feature = "metrics"))]
    let _ = (group, count);
}

/// The calls into the `metrics` facade.
#[cfg(feature = "metrics")]
mod record {
    use std::time::Duration;

    use metrics::{
        counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Unit,
    };

    use crate::term::LostReason;

    pub(super) fn describe() {
        describe_gauge!(
            "leader_election_is_leader",
            "1 while this instance leads the election, else 0"
        );
        describe_gauge!(
            "leader_election_master_status",
            "1 while this instance leads the election, else 0 (client-go's name)"
        );
        describe_gauge!(
            "leader_election_token",
            "Fencing token of this instance's current or last term"
        );
        describe_counter!(
            "leader_election_acquired_total",
            "Terms won by this instance"
        );
        describe_counter!("leader_election_lost_total", "Terms ended, by reason");
        describe_counter!(
            "leader_election_renewal_failure_total",
            "Renewals that failed or timed out"
        );
        describe_gauge!(
            "leader_election_phantom_members",
            "Partition-set member entries ignored because their heartbeat expires more than 2 ttl ahead"
        );
        describe_gauge!(
            "leader_election_partitions_held",
            "Partitions of the set this member holds now"
        );
        describe_counter!(
            "leader_election_schedule_slots_total",
            "Slots of a calendar schedule, by outcome: ran, failed, missed, overrun"
        );
        describe_gauge!(
            "leader_election_schedule_last_success_timestamp_seconds",
            "Unix time at which this instance last completed a scheduled run successfully"
        );
        describe_gauge!(
            "leader_election_semaphore_permits",
            "Permits of the semaphore"
        );
        describe_gauge!(
            "leader_election_semaphore_held",
            "Permits of the semaphore this process holds now"
        );
        describe_gauge!(
            "leader_election_semaphore_waiting",
            "Calls of this process waiting for a permit of the semaphore"
        );
        describe_histogram!(
            "leader_election_renew_duration_seconds",
            Unit::Seconds,
            "Round trip of successful renewals"
        );
    }

    pub(super) fn elected(name: &str, token: u64) {
        gauge!("leader_election_is_leader", "name" => name.to_string()).set(1.0);
        gauge!("leader_election_master_status", "name" => name.to_string()).set(1.0);
        gauge!("leader_election_token", "name" => name.to_string()).set(token as f64);
        counter!("leader_election_acquired_total", "name" => name.to_string()).increment(1);
    }

    pub(super) fn lost(name: &str, reason: &LostReason) {
        gauge!("leader_election_is_leader", "name" => name.to_string()).set(0.0);
        gauge!("leader_election_master_status", "name" => name.to_string()).set(0.0);
        counter!("leader_election_lost_total", "name" => name.to_string(), "reason" => reason.label())
            .increment(1);
    }

    pub(super) fn slots(name: &str, outcome: &'static str, count: u64) {
        counter!("leader_election_schedule_slots_total", "name" => name.to_string(), "outcome" => outcome)
            .increment(count);
    }

    pub(super) fn slot_succeeded(name: &str, at: std::time::SystemTime) {
        let seconds = at
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |since| since.as_secs_f64());
        gauge!("leader_election_schedule_last_success_timestamp_seconds", "name" => name.to_string())
            .set(seconds);
    }

    pub(super) fn semaphore_permits(name: &str, permits: usize) {
        gauge!("leader_election_semaphore_permits", "name" => name.to_string()).set(permits as f64);
    }

    pub(super) fn semaphore_held(name: &str, change: i8) {
        gauge!("leader_election_semaphore_held", "name" => name.to_string())
            .increment(f64::from(change));
    }

    pub(super) fn semaphore_waiting(name: &str, change: i8) {
        gauge!("leader_election_semaphore_waiting", "name" => name.to_string())
            .increment(f64::from(change));
    }

    pub(super) fn group_elected(group: &str, held: usize) {
        counter!("leader_election_acquired_total", "name" => group.to_string()).increment(1);
        gauge!("leader_election_partitions_held", "name" => group.to_string()).set(held as f64);
    }

    pub(super) fn group_lost(group: &str, reason: &LostReason, held: usize) {
        counter!("leader_election_lost_total", "name" => group.to_string(), "reason" => reason.label())
            .increment(1);
        gauge!("leader_election_partitions_held", "name" => group.to_string()).set(held as f64);
    }

    pub(super) fn renewed(name: &str, latency: Duration) {
        histogram!("leader_election_renew_duration_seconds", "name" => name.to_string())
            .record(latency.as_secs_f64());
    }

    pub(super) fn renewal_failed(name: &str) {
        counter!("leader_election_renewal_failure_total", "name" => name.to_string()).increment(1);
    }

    pub(super) fn phantom_members(group: &str, count: u64) {
        gauge!("leader_election_phantom_members", "group" => group.to_string()).set(count as f64);
    }
}
