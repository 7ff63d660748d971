//! The target: which member should own which partition. Every member
//! computes it alike from the sorted list of live members (rendezvous
//! hashing under the fair share); apart from the run loop, because it is a
//! pure function, tested on its own.

use std::collections::{BTreeMap, BTreeSet};

/// The target owner of every partition: rendezvous hashing with a cap of
/// `ceil(partitions / members)` per member. Every member computes the same
/// answer from the same sorted member list. Returns member -> partition indexes.
pub(crate) fn assign<'m>(
    partitions: &[String],
    members: &'m [String],
) -> BTreeMap<&'m str, BTreeSet<usize>> {
    let mut target: BTreeMap<&str, BTreeSet<usize>> = BTreeMap::new();
    if members.is_empty() {
        return target;
    }
    let cap = partitions.len().div_ceil(members.len());
    for (index, partition) in partitions.iter().enumerate() {
        let mut ranked: Vec<(u64, &str)> = members
            .iter()
            .map(|m| (rendezvous(m, partition), m.as_str()))
            .collect();
        ranked.sort_unstable_by(|a, b| b.cmp(a));
        if let Some((_, member)) = ranked
            .into_iter()
            .find(|(_, m)| target.get(m).map_or(0, BTreeSet::len) < cap)
        {
            target.entry(member).or_default().insert(index);
        }
    }
    target
}

/// FNV-1a over `member \0 partition`: a stable hash that every build and
/// platform computes alike (std's hashers make no such promise).
fn rendezvous(member: &str, partition: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in member.bytes().chain([0]).chain(partition.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    // FNV's low bits mix poorly for short keys; finish with a xorshift.
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash ^ (hash >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(prefix: &str, n: usize) -> Vec<String> {
        (0..n).map(|i| format!("{prefix}{i}")).collect()
    }

    #[test]
    fn every_partition_gets_one_owner_within_the_fair_share() {
        let partitions = names("p", 32);
        for m in 1..=7 {
            let members = names("m", m);
            let target = assign(&partitions, &members);
            let cap = 32usize.div_ceil(m);
            let total: usize = target.values().map(BTreeSet::len).sum();
            assert_eq!(total, 32);
            assert!(
                target.values().all(|owned| owned.len() <= cap),
                "{m} members: {target:?}"
            );
            let mut all: Vec<usize> = target.values().flatten().copied().collect();
            all.sort();
            all.dedup();
            assert_eq!(all.len(), 32, "no partition twice");
        }
    }

    #[test]
    fn a_joining_member_moves_few_partitions() {
        let partitions = names("orders-", 64);
        let (four, five) = (names("m", 4), names("m", 5));
        let before = assign(&partitions, &four);
        let after = assign(&partitions, &five);
        let owner = |t: &BTreeMap<&str, BTreeSet<usize>>, p: usize| {
            t.iter()
                .find(|(_, s)| s.contains(&p))
                .map(|(m, _)| m.to_string())
        };
        let moved = (0..64)
            .filter(|p| owner(&before, *p) != owner(&after, *p))
            .count();
        // The newcomer's fair share is 13; a stable assignment moves about that many.
        assert!(moved <= 24, "moved {moved} of 64");
        assert!(moved >= 10);
    }

    #[test]
    fn no_members_means_no_target() {
        assert!(assign(&names("p", 3), &[]).is_empty());
    }
}
