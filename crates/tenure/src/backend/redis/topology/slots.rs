//! Redis Cluster's hash slots: the slot of a key, and a hash tag for
//! each slot. Pure arithmetic, apart from the nodes that serve the slots.

use std::sync::OnceLock;

/// The number of hash slots of a Redis Cluster.
pub(crate) const SLOTS: u16 = 16_384;

/// The slot of a key: CRC16 (XMODEM) of its hash tag, or of the whole key
/// when it has none, modulo [`SLOTS`].
pub(crate) fn slot_of(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes
        .iter()
        .position(|b| *b == b'{')
        .and_then(|open| {
            let rest = &bytes[open + 1..];
            let close = rest.iter().position(|b| *b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(bytes);
    crc16::State::<crc16::XMODEM>::calculate(tagged) % SLOTS
}

/// A short hash tag for every slot: `slot_of("{TAG}") == slot`. Keys that
/// must share a slot with an election but not its name (the cluster's
/// stand-in for the prefix's epoch) use it.
pub(crate) fn tag_of_slot(slot: u16) -> &'static str {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    let tags = TAGS.get_or_init(|| {
        let mut tags = vec![String::new(); usize::from(SLOTS)];
        let mut missing = usize::from(SLOTS);
        let mut n: u64 = 0;
        while missing > 0 {
            let tag = format!("s{n:x}");
            let slot = usize::from(slot_of(&tag));
            if tags[slot].is_empty() {
                tags[slot] = tag;
                missing -= 1;
            }
            n += 1;
        }
        tags
    });
    &tags[usize::from(slot % SLOTS)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_cluster_spec() {
        assert_eq!(slot_of("123456789"), 12739);
        assert_eq!(slot_of("foo"), 12182);
        assert_eq!(
            slot_of("{user1000}.following"),
            slot_of("{user1000}.followers")
        );
        assert_eq!(slot_of("foo{}{bar}"), slot_of("foo{}{bar}"));
        assert_ne!(slot_of("foo{}{bar}"), slot_of("bar"));
        assert_eq!(slot_of("foo{{bar}}zap"), slot_of("{bar"));
        assert_eq!(slot_of("tenure:{reports}:lease"), slot_of("reports"));
    }

    #[test]
    fn every_slot_has_a_tag() {
        for slot in [0, 1, 777, 12739, SLOTS - 1] {
            assert_eq!(slot_of(&format!("x:{{{}}}:y", tag_of_slot(slot))), slot);
        }
    }
}
