//! The ensemble's state as its members report it: who leads, whether the
//! quorum serves, and the waits on both.
//!
//! Each member is asked `srvr`, whose `Mode:` line (`leader`, `follower`,
//! `standalone`) a member gives only while it serves: after its leader is
//! lost, a follower answers "not currently serving" until a new leader has
//! synced it, and a leader that has lost its quorum steps down within 5
//! ticks.

use std::time::{Duration, Instant};

use crate::ensemble::ZkEnsemble;
use crate::member::Member;
use crate::{Error, POLL_INTERVAL};

/// A member's `Mode:`, or why there is none (`"not running"`, `"paused"`,
/// `"not serving"`, a connection error).
type Answers = Vec<(usize, Result<String, String>)>;

impl ZkEnsemble {
    /// The member that leads now, as the running, unpaused members report
    /// it: the one live member whose `srvr` says `Mode: leader` (or
    /// `standalone`). An error when none does (an election is under way, or
    /// the leader is killed or paused) or when more than one does (a leader
    /// cut off from its quorum has not yet stepped down). After a fault, use
    /// [`ZkEnsemble::wait_for_leader`].
    pub fn leader(&self) -> Result<usize, Error> {
        let answers = self.modes();
        let leaders = leaders(&answers);
        match leaders.as_slice() {
            [leader] => Ok(*leader),
            [] => Err(Error::Topology(format!(
                "no live ZooKeeper member leads ({})",
                describe(&answers)
            ))),
            _ => Err(Error::Topology(format!(
                "more than one live ZooKeeper member says it leads ({})",
                describe(&answers)
            ))),
        }
    }

    /// Wait until exactly one live member leads and a quorum (a majority of
    /// all members, the leader included) of live members serve, and return
    /// the leader. Polls every 20 ms.
    pub fn wait_for_leader(&self, timeout: Duration) -> Result<usize, Error> {
        let quorum = self.members() / 2 + 1;
        let what =
            format!("one live ZooKeeper member leads a quorum ({quorum}) of serving members");
        poll(timeout, &what, || {
            let answers = self.modes();
            let serving = answers.iter().filter(|(_, mode)| mode.is_ok()).count();
            match leaders(&answers).as_slice() {
                [leader] if serving >= quorum => Ok(*leader),
                _ => Err(describe(&answers)),
            }
        })
    }

    /// Wait until every running, unpaused member serves (answers `srvr`
    /// with a `Mode:`), one of them as the leader: the quorum has formed
    /// and each live member has joined it. Polls every 20 ms.
    pub fn wait_serving(&self, timeout: Duration) -> Result<(), Error> {
        let what = "every live ZooKeeper member serves, one of them leading";
        poll(timeout, what, || {
            let answers = self.modes();
            let live = self.all_members().iter().filter(|m| m.is_live()).count();
            let serving = answers.iter().filter(|(_, mode)| mode.is_ok()).count();
            if live > 0 && serving == live && leaders(&answers).len() == 1 {
                Ok(())
            } else {
                Err(describe(&answers))
            }
        })
    }

    /// Every member's `Mode:`, or why there is none: `Err("not running")`
    /// or `Err("paused")` for members not asked.
    fn modes(&self) -> Answers {
        let members = self.all_members();
        let live: Vec<usize> = (0..members.len())
            .filter(|&i| members[i].is_live())
            .collect();
        let mut answers = self.ask(&live, Member::mode);
        for (index, member) in members.iter().enumerate() {
            if !live.contains(&index) {
                let why = if member.is_paused() {
                    "paused"
                } else {
                    "not running"
                };
                answers.push((index, Err(why.to_owned())));
            }
        }
        answers.sort_by_key(|(index, _)| *index);
        answers
    }
}

/// The members that say they lead.
fn leaders(answers: &Answers) -> Vec<usize> {
    answers
        .iter()
        .filter(|(_, mode)| {
            mode.as_deref()
                .is_ok_and(|mode| mode == "leader" || mode == "standalone")
        })
        .map(|(index, _)| *index)
        .collect()
}

/// What each member said, for error messages: `m0: follower; m1: not
/// running; m2: leader`.
fn describe(answers: &Answers) -> String {
    answers
        .iter()
        .map(|(index, answer)| match answer {
            Ok(mode) => format!("m{index}: {mode}"),
            Err(why) => format!("m{index}: {why}"),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Check `condition` every [`POLL_INTERVAL`] until it holds or `timeout`
/// has passed; `Err` says why it does not hold yet.
fn poll<T>(
    timeout: Duration,
    what: &str,
    mut condition: impl FnMut() -> Result<T, String>,
) -> Result<T, Error> {
    let started = Instant::now();
    loop {
        match condition() {
            Ok(value) => return Ok(value),
            Err(why) if started.elapsed() >= timeout => {
                return Err(Error::Timeout {
                    what: what.to_owned(),
                    waited: started.elapsed(),
                    last: why,
                })
            }
            Err(_) => std::thread::sleep(POLL_INTERVAL),
        }
    }
}
