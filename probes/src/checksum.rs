//! The CPU side of the pass checksum ([`Checksum`]): every GPU pass must reproduce it
//! over the same bytes, or its arm is invalid.

use crate::types::Checksum;

/// Checksum of `bytes` (a multiple of 4 long) whose first word is word `first_word` of
/// the working set.
pub fn of(bytes: &[u8], first_word: u64) -> Checksum {
    let mut sum = 0u32;
    let mut weighted = 0u32;
    // The weight of word i is 2i+1 mod 2^32: only i mod 2^31 matters.
    let mut k = (first_word as u32).wrapping_mul(2).wrapping_add(1);
    for w in bytes.chunks_exact(4) {
        let v = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        sum = sum.wrapping_add(v);
        weighted = weighted.wrapping_add(v.wrapping_mul(k));
        k = k.wrapping_add(2);
    }
    Checksum { sum, weighted }
}

/// [`of`] over `bytes` from word 0, split across threads.
pub fn parallel(bytes: &[u8]) -> Checksum {
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(16);
    let per = (bytes.len() / threads)
        .next_multiple_of(1 << 20)
        .max(1 << 20);
    std::thread::scope(|s| {
        let handles: Vec<_> = bytes
            .chunks(per)
            .enumerate()
            .map(|(i, chunk)| s.spawn(move || of(chunk, (i * per / 4) as u64)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .fold(Checksum::default(), Checksum::combine)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_follow_the_word_index() {
        let mut b = Vec::new();
        for v in [1u32, 2, 3] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        let c = of(&b, 0);
        assert_eq!(c.sum, 6);
        assert_eq!(c.weighted, 1 + 2 * 3 + 3 * 5);
        // The same words further into the working set.
        let d = of(&b, 10);
        assert_eq!(d.weighted, 21 + 2 * 23 + 3 * 25);
    }

    #[test]
    fn split_sums_combine() {
        let b: Vec<u8> = (0..(3 << 20) + 64).map(|i| (i * 7 + 3) as u8).collect();
        let whole = of(&b, 0);
        let cut = 1 << 20;
        let parts = of(&b[..cut], 0).combine(of(&b[cut..], (cut / 4) as u64));
        assert_eq!(whole, parts);
        assert_eq!(parallel(&b), whole);
    }
}
