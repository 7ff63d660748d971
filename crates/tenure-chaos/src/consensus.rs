//! Faults of a consensus store's members, written once for etcd and
//! ZooKeeper.
//!
//! Both stores are a few member processes that elect a leader among
//! themselves and serve only while a quorum follows it, and both test
//! crates (`etcd-process`, `zk-process`) kill, pause, restart, back up and
//! restore members the same way. What differs is how the harness learns
//! that the store serves again, which [`Members::wait_for_leader`] hides:
//! every fault here waits for it before it counts the store as serving.
//!
//! A fault of the members is recorded as a store outage only while the
//! store could not serve: from the kill or pause of its leader until
//! another member leads, and from the kill of every member until a leader
//! is back. Killing or pausing a follower should cost no leader at all.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use etcd_process::EtcdCluster;
use zk_process::ZkEnsemble;

use crate::log::now_ns;
use crate::outage::{blocking, Outage, TOPOLOGY_WAIT};

/// The members of an etcd cluster or a ZooKeeper ensemble, as the faults
/// here use them (each method is the test crate's own of that name).
pub trait Members: Send + 'static {
    type Error: std::fmt::Display + Send + 'static;
    type Backup: Send + 'static;
    fn members(&self) -> usize;
    fn is_running(&self, member: usize) -> bool;
    fn is_paused(&self, member: usize) -> bool;
    fn pid(&self, member: usize) -> Option<u32>;
    fn client_port(&self, member: usize) -> u16;
    fn wait_for_leader(&self, timeout: Duration) -> Result<usize, Self::Error>;
    fn kill(&mut self, member: usize);
    fn restart(&mut self, member: usize) -> Result<(), Self::Error>;
    fn pause(&self, member: usize) -> Result<(), Self::Error>;
    fn resume(&self, member: usize) -> Result<(), Self::Error>;
    fn kill_all(&mut self);
    fn restart_all(&mut self) -> Result<(), Self::Error>;
    fn back_up(&mut self) -> Result<Self::Backup, Self::Error>;
    fn restore(&mut self, backup: &Self::Backup) -> Result<(), Self::Error>;
}

macro_rules! members {
    ($store:ty, $error:ty, $backup:ty) => {
        impl Members for $store {
            type Error = $error;
            type Backup = $backup;
            fn members(&self) -> usize {
                <$store>::members(self)
            }
            fn is_running(&self, member: usize) -> bool {
                <$store>::is_running(self, member)
            }
            fn is_paused(&self, member: usize) -> bool {
                <$store>::is_paused(self, member)
            }
            fn pid(&self, member: usize) -> Option<u32> {
                <$store>::pid(self, member)
            }
            fn client_port(&self, member: usize) -> u16 {
                <$store>::client_port(self, member)
            }
            fn wait_for_leader(&self, timeout: Duration) -> Result<usize, Self::Error> {
                <$store>::wait_for_leader(self, timeout)
            }
            fn kill(&mut self, member: usize) {
                <$store>::kill(self, member)
            }
            fn restart(&mut self, member: usize) -> Result<(), Self::Error> {
                <$store>::restart(self, member)
            }
            fn pause(&self, member: usize) -> Result<(), Self::Error> {
                <$store>::pause(self, member)
            }
            fn resume(&self, member: usize) -> Result<(), Self::Error> {
                <$store>::resume(self, member)
            }
            fn kill_all(&mut self) {
                <$store>::kill_all(self)
            }
            fn restart_all(&mut self) -> Result<(), Self::Error> {
                <$store>::restart_all(self)
            }
            fn back_up(&mut self) -> Result<Self::Backup, Self::Error> {
                <$store>::back_up(self)
            }
            fn restore(&mut self, backup: &Self::Backup) -> Result<(), Self::Error> {
                <$store>::restore(self, backup)
            }
        }
    };
}

members!(EtcdCluster, etcd_process::Error, etcd_process::Backup);
members!(ZkEnsemble, zk_process::Error, zk_process::Backup);

/// The members, shared between the harness and the blocking calls that
/// fault them (killing and restarting needs `&mut`, and is done off the
/// runtime: see [`blocking`]).
pub type Shared<C> = Arc<Mutex<C>>;

pub fn lock<C>(members: &Mutex<C>) -> MutexGuard<'_, C> {
    members.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Which member a fault stops.
#[derive(Debug, Clone, Copy)]
pub enum Whom {
    /// The store's own leader.
    Leader,
    /// The follower at this index among the followers (modulo their
    /// number); the leader when there is none.
    Follower(usize),
}

/// Kill (`kill`) or pause one member, wait for another leader if it was
/// the leader, hold, then restart or resume it. The store is down only
/// when the leader stopped.
pub async fn stop_member<C: Members>(
    members: &Shared<C>,
    kill: bool,
    whom: Whom,
    hold: Duration,
) -> Result<Outage, String> {
    let c = members.clone();
    let (member, leader) = blocking("the store's leader", move || {
        let c = lock(&c);
        let leader = c.wait_for_leader(TOPOLOGY_WAIT)?;
        let followers: Vec<usize> = (0..c.members()).filter(|m| *m != leader).collect();
        let member = match whom {
            Whom::Follower(pick) if !followers.is_empty() => followers[pick % followers.len()],
            _ => leader,
        };
        Ok::<_, C::Error>((member, leader))
    })
    .await?;
    let c = members.clone();
    let t = now_ns();
    blocking("stopping a member", move || {
        if kill {
            lock(&c).kill(member);
            Ok(())
        } else {
            lock(&c).pause(member)
        }
    })
    .await?;
    // The store's leader gone, nobody can lead until the others have
    // elected another; a follower gone costs nothing.
    let (until, elected) = if member == leader {
        let c = members.clone();
        let elected = blocking("another member leads", move || {
            lock(&c).wait_for_leader(TOPOLOGY_WAIT).map(|_| ())
        })
        .await;
        (now_ns(), elected)
    } else {
        (t, Ok(()))
    };
    let store_down = Some(member == leader);
    if elected.is_ok() {
        tokio::time::sleep(hold).await;
    }
    let c = members.clone();
    let back = blocking("the member runs again", move || {
        if kill {
            lock(&c).restart(member)
        } else {
            lock(&c).resume(member)
        }
    })
    .await;
    elected?;
    back?;
    Ok(Outage::of((t, until), store_down))
}

/// Kill every member, hold, start them all again and wait for a leader;
/// the store is down throughout.
pub async fn restart_all<C: Members>(
    members: &Shared<C>,
    hold: Duration,
) -> Result<Outage, String> {
    let c = members.clone();
    let t = now_ns();
    blocking("killing every member", move || {
        lock(&c).kill_all();
        Ok::<_, C::Error>(())
    })
    .await?;
    tokio::time::sleep(hold).await;
    let c = members.clone();
    blocking("every member starts again", move || {
        let mut c = lock(&c);
        c.restart_all()?;
        c.wait_for_leader(TOPOLOGY_WAIT)
    })
    .await?;
    Ok(Outage::of((t, now_ns()), Some(true)))
}

/// Pause the follower at `pick`, hold, resume it; the store keeps serving.
pub async fn pause_minority_member<C: Members>(
    members: &Shared<C>,
    pick: usize,
    hold: Duration,
) -> Result<Outage, String> {
    let c = members.clone();
    let member = blocking("a follower member", move || {
        let c = lock(&c);
        let leader = c.wait_for_leader(TOPOLOGY_WAIT)?;
        let followers: Vec<usize> = (0..c.members()).filter(|m| *m != leader).collect();
        Ok::<_, C::Error>(followers.get(pick % followers.len().max(1)).copied())
    })
    .await?
    .ok_or("the store has no follower member to pause")?;
    let c = members.clone();
    let t = now_ns();
    blocking("pausing a follower member", move || lock(&c).pause(member)).await?;
    tokio::time::sleep(hold).await;
    let c = members.clone();
    blocking("the follower member runs again", move || {
        lock(&c).resume(member)
    })
    .await?;
    Ok(Outage::of((t, now_ns()), Some(false)))
}

/// Stop every member and copy its data (a cold backup), start them again,
/// and wait for a leader.
pub async fn back_up<C: Members>(members: &Shared<C>) -> Result<C::Backup, String> {
    let c = members.clone();
    blocking("backing the store up", move || {
        let mut c = lock(&c);
        let backup = c.back_up()?;
        c.wait_for_leader(TOPOLOGY_WAIT)?;
        Ok::<_, C::Error>(backup)
    })
    .await
}

/// Restore every member from `backup` and wait for a leader.
pub async fn restore<C: Members>(members: &Shared<C>, backup: C::Backup) -> Result<(), String> {
    let c = members.clone();
    blocking("restoring the store from the backup", move || {
        let mut c = lock(&c);
        c.restore(&backup)?;
        c.wait_for_leader(TOPOLOGY_WAIT).map(|_| ())
    })
    .await
}

/// Every member's client port.
pub fn client_ports<C: Members>(members: &Shared<C>) -> Vec<u16> {
    let c = lock(members);
    (0..c.members())
        .map(|member| c.client_port(member))
        .collect()
}

/// Every running member's PID.
pub fn pids<C: Members>(members: &Shared<C>) -> Vec<Option<u32>> {
    let c = lock(members);
    (0..c.members()).map(|member| c.pid(member)).collect()
}

/// Why the members are not all running, unpaused (`Err`), or `Ok`.
pub fn all_running<C: Members>(members: &C) -> Result<(), String> {
    for member in 0..members.members() {
        if !members.is_running(member) || members.is_paused(member) {
            return Err(format!("m{member} is not running"));
        }
    }
    Ok(())
}
