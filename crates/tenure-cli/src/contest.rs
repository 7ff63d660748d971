//! What `tenure run` campaigns in: one election, or the permits of a
//! semaphore (`--slots N`), which lets up to N instances run CMD at once.
//!
//! A permit is the term of one of N elections (`NAME/permit-0` ..), so a
//! term is a term either way: the loop of `tenure run` supervises it, stops
//! CMD before its deadline and releases it the same. Only campaigning, and
//! what a message says about the others, differ.

use std::time::Duration;

use futures_util::StreamExt;
use tenure::{Election, Leadership, Result, Semaphore};
use tokio::time::timeout;

/// One election, or a semaphore's permits.
pub enum Contest {
    Election(Election),
    Slots(Semaphore),
}

impl Contest {
    /// What `builder` builds: its election, or with `slots` a semaphore of
    /// that many permits under its name (`--slots N`).
    pub async fn build(builder: tenure::ElectionBuilder, slots: Option<u32>) -> Result<Contest> {
        Ok(match slots {
            Some(slots) => Contest::Slots(builder.semaphore(slots as usize).await?),
            None => Contest::Election(builder.build().await?),
        })
    }

    /// The elections a term may be of: the one, or every permit's.
    pub fn elections(&self) -> &[Election] {
        match self {
            Contest::Election(election) => std::slice::from_ref(election),
            Contest::Slots(semaphore) => semaphore.elections(),
        }
    }

    /// The election whose settings every term shares (ttl, margin, id).
    pub fn first(&self) -> &Election {
        &self.elections()[0]
    }

    /// The election of `term`.
    pub fn of(&self, term: &Leadership) -> &Election {
        self.elections()
            .iter()
            .find(|election| election.name() == term.election())
            .unwrap_or_else(|| self.first())
    }

    /// Campaign until elected (a permit, with `--slots`).
    pub async fn campaign(&self) -> Result<Leadership> {
        match self {
            Contest::Election(election) => election.campaign().await,
            Contest::Slots(semaphore) => semaphore.acquire().await,
        }
    }

    /// One attempt: the term if one was free.
    pub async fn try_campaign(&self) -> Result<Option<Leadership>> {
        match self {
            Contest::Election(election) => election.try_campaign().await,
            Contest::Slots(semaphore) => semaphore.try_acquire().await,
        }
    }

    /// [`Contest::campaign`] for at most `wait`; a lease the abandoned
    /// campaign may have won is released before `None` is returned.
    pub async fn campaign_timeout(&self, wait: Duration) -> Result<Option<Leadership>> {
        match self {
            Contest::Election(election) => election.campaign_timeout(wait).await,
            Contest::Slots(_) => match timeout(wait, self.campaign()).await {
                Ok(term) => term.map(Some),
                Err(_elapsed) => {
                    self.release_if_held().await;
                    Ok(None)
                }
            },
        }
    }

    /// Give back any lease an abandoned campaign won (best effort: left
    /// alone, it lapses at its ttl).
    pub async fn release_if_held(&self) {
        for election in self.elections() {
            if let Err(err) = election.release_if_held().await {
                tracing::warn!(election = %election.name(), error = %err, "could not check for a lease won by the abandoned campaign; it lapses at its ttl");
            }
        }
    }

    /// Who holds what, for a message: `ID (token T) leads`, or how many
    /// permits are held; `None` when nothing is held.
    pub async fn holders(&self) -> Option<String> {
        match self {
            Contest::Election(election) => {
                let leader = election.leader().await.ok().flatten()?;
                Some(format!("{} (token {}) leads", leader.id, leader.token))
            }
            Contest::Slots(semaphore) => {
                let holders = semaphore.holders().await.ok()?;
                let held = holders.iter().flatten().count();
                (held > 0).then(|| format!("{held} of {} permits are held", holders.len()))
            }
        }
    }

    /// Resolves once no term is to be had without waiting: another
    /// instance leads the election, or every permit is held by others.
    pub async fn taken_by_others(&self) {
        let elections = self.elections();
        let mut changes = futures_util::stream::select_all(
            elections
                .iter()
                .enumerate()
                .map(|(index, election)| Box::pin(election.watch().map(move |c| (index, c)))),
        );
        let mut others = vec![false; elections.len()];
        while let Some((index, change)) = changes.next().await {
            if let Ok(holder) = change {
                others[index] = holder.is_some_and(|h| h.id != elections[index].id());
                if others.iter().all(|held| *held) {
                    return;
                }
            }
        }
        std::future::pending::<()>().await;
    }
}
