//! Failing-mode switches: fixed bugs that tests turn back on.
//!
//! Each bug tenure fixed that a checker should catch (tenure-chaos's,
//! tenure-sim's) can be switched back on, so that a failing-mode test shows
//! the checker does catch it: a checker that never fails proves nothing.
//! [`Bugs`] is always compiled (all off, the production code reads it);
//! the builder switches that turn them on exist only with the crate's
//! `testing` feature (as tokio's `test-util`), so that the default public
//! surface is what users need. The memory store's fault controls live
//! behind the same feature.

/// Fixed bugs that the `testing` feature's **unsafe** builder switches
/// turn back on, so that failing-mode tests (tenure-chaos, tenure-sim) can
/// show their checkers catch them. All off by default; never for
/// production.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Bugs {
    /// A lease found under this instance's id is adopted, whatever attempt
    /// wrote it (issue 9).
    pub adopt_earlier_lease: bool,
    /// The start-up hold-off covers only this instance's own ttl (issue 9).
    pub hold_off_own_ttl: bool,
    /// Renewal announcements push a follower's wait back without bound,
    /// and trigger attempts without pacing (issue 9).
    pub unbounded_announcements: bool,
    /// A renewal's reply moves the deadline from when it arrived, not from
    /// when the request was sent (issue 16).
    pub late_renewal_moves_deadline: bool,
    /// A partition's resign is routed by partition name only, so a stale
    /// handle's resign ends this member's later term (issue 16).
    pub resign_by_name: bool,
    /// A leader does not renew early when a release of its election is
    /// announced (as before issue 22), so a term that lost its lease
    /// believes until its next renewal.
    pub no_early_renewal: bool,
    /// The stores' own (see [`crate::backend::StoreBugs`]).
    pub store: crate::backend::StoreBugs,
}

#[cfg(feature = "testing")]
impl crate::ElectionBuilder {
    /// **Unsafe; for tenure-chaos's failing-mode tests only.** Switches
    /// back on the bugs issue 9 fixed, so the chaos suite can show that its
    /// checker catches them:
    /// - a lease found under this instance's id is adopted (keeping its
    ///   token) whatever attempt wrote it, before the start-up hold-off:
    ///   an earlier term being released, a lease restored by a rollback, or
    ///   another process using the same id;
    /// - the hold-off covers only this instance's own ttl;
    /// - a renewal announcement pushes a follower's wait back as far as it
    ///   says, and announcements trigger attempts without pacing;
    /// - and, as before issue 22, a leader does not renew early when a
    ///   release of its election is announced (that early renewal would
    ///   end an adopted term within milliseconds and hide the overlap the
    ///   first bug causes).
    pub fn unsafe_issue_9_bugs(mut self, on: bool) -> Self {
        let bugs = &mut self.settings.bugs;
        bugs.adopt_earlier_lease = on;
        bugs.hold_off_own_ttl = on;
        bugs.unbounded_announcements = on;
        bugs.no_early_renewal = on;
        self
    }

    /// **Unsafe; for failing-mode tests only.** The first bug of
    /// [`ElectionBuilder::unsafe_issue_9_bugs`] alone: a lease found under
    /// this instance's id is adopted (keeping its token) whatever attempt
    /// wrote it, as the drop-then-campaign bug did.
    pub fn unsafe_adopt_earlier_lease(mut self, on: bool) -> Self {
        self.settings.bugs.adopt_earlier_lease = on;
        self
    }

    /// **Unsafe; for failing-mode tests only.** The second bug of
    /// [`ElectionBuilder::unsafe_issue_9_bugs`] alone: the start-up
    /// hold-off covers only this instance's own ttl, not the largest ttl in
    /// use ([`ElectionBuilder::max_ttl`], the leases seen).
    pub fn unsafe_hold_off_own_ttl(mut self, on: bool) -> Self {
        self.settings.bugs.hold_off_own_ttl = on;
        self
    }

    /// **Unsafe; for tenure-chaos's failing-mode tests only.** On a
    /// `redis+sentinel://` URL, listen for `+switch-master` on the first
    /// sentinel of the URL only and ask only it for the primary, as tenure
    /// followed one sentinel before issue 22 fixed it. With that sentinel
    /// hung, a failover through another one never reaches the leader: it
    /// keeps renewing on the old primary, which stays writable (without
    /// `min-replicas-to-write`) while candidates that follow a healthy
    /// sentinel are elected on the new one. Applies to a URL given with
    /// [`ElectionBuilder::redis`], not to a shared [`crate::Store`].
    pub fn unsafe_first_sentinel_only(mut self, on: bool) -> Self {
        self.settings.bugs.store.first_sentinel_only = on;
        self
    }

    /// **Unsafe; for failing-mode tests only.** A successful renewal moves
    /// the local deadline to one ttl (less the margin) after its reply
    /// *arrived* instead of after its request was sent, so a slow reply
    /// lets the leader believe past the lease's expiry on the store.
    pub fn unsafe_late_renewal_moves_deadline(mut self, on: bool) -> Self {
        self.settings.bugs.late_renewal_moves_deadline = on;
        self
    }

    /// **Unsafe; for failing-mode tests only.** On etcd, a term's token is
    /// the election's token counter plus one, without the candidate's
    /// clock, so a restore from an older backup issues the tokens of
    /// earlier terms again (as tokens taken from etcd's revision did before
    /// issue 22). Nothing else is affected.
    pub fn unsafe_etcd_tokens_without_clock(mut self, on: bool) -> Self {
        self.settings.bugs.store.etcd.tokens_without_clock = on;
        self
    }

    /// **Unsafe; for failing-mode tests only.** On etcd, a call is sent
    /// once and waits for its answer, never hedged to another member, so a
    /// paused minority member holds the calls the balanced client gives it
    /// and costs leaders their terms (tenure's first etcd backend did so).
    pub fn unsafe_etcd_no_hedges(mut self, on: bool) -> Self {
        self.settings.bugs.store.etcd.no_hedges = on;
        self
    }

    /// **Unsafe; for failing-mode tests only.** On ZooKeeper, a candidate
    /// that finds the lease gone takes the election at once, even while the
    /// witness of a term whose lease was deleted by hand says its holder
    /// may still act (tenure's ZooKeeper backend without its witness).
    pub fn unsafe_zk_ignore_witness(mut self, on: bool) -> Self {
        self.settings.bugs.store.zk.ignore_witness = on;
        self
    }

    /// **Unsafe; for failing-mode tests only.** On ZooKeeper, a term's
    /// token is the counter plus one, without the candidate's clock, so a
    /// restore from an older copy of the data issues the tokens of earlier
    /// terms again.
    pub fn unsafe_zk_tokens_without_clock(mut self, on: bool) -> Self {
        self.settings.bugs.store.zk.tokens_without_clock = on;
        self
    }

    /// **Unsafe; for failing-mode tests only.** On SQLite, a file that
    /// went back to an older copy (restored in place, or an older file put
    /// in its place) grants new terms at once, while the holders of the
    /// leases it lost still lead (tenure's SQLite backend before it kept a
    /// mark beside the file).
    pub fn unsafe_sqlite_ignore_rollback(mut self, on: bool) -> Self {
        self.settings.bugs.store.sqlite.ignore_rollback = on;
        self
    }

    /// **Unsafe; for failing-mode tests only.** On PostgreSQL, a server
    /// process new to an election (restarted, restored from an older copy,
    /// a promoted replica) grants new terms at once, while the holders of
    /// the leases it lost still lead (tenure's PostgreSQL backend without
    /// its epoch).
    pub fn unsafe_postgres_ignore_epoch(mut self, on: bool) -> Self {
        self.settings.bugs.store.postgres.ignore_epoch = on;
        self
    }

    /// Seed the small random delay (jitter) a candidate adds before
    /// retrying, so that a run under tokio's paused clock replays exactly
    /// (tenure-sim). Without it the jitter comes from the thread's RNG.
    pub fn jitter_seed(mut self, seed: u64) -> Self {
        self.settings.jitter_seed = Some(seed);
        self
    }
}

#[cfg(feature = "testing")]
impl crate::PartitionSetBuilder {
    /// **Unsafe; for failing-mode tests only.** Route a partition's
    /// resign by its name alone, not by (name, token): a handle of an
    /// earlier term then ends, and releases, this member's later term of
    /// the same partition.
    pub fn unsafe_resign_by_name(mut self, on: bool) -> Self {
        self.settings.bugs.resign_by_name = on;
        self
    }
}
