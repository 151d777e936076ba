//! Private memory that is no known form of a model, but is distributed like it.
//!
//! A runtime may keep a transformed copy of a model twofold cannot recompute (a repacked
//! or prepacked layout it does not know, an interleaving, an XOR-ed quant block). Such a
//! copy holds the model's bytes in another order, or each byte relabelled by one constant
//! (llama.cpp's `q4_0x8` blocks XOR their quants with `0x88`): its *byte distribution* is
//! the model's, up to that relabelling. What is no form of the model (a KV cache of
//! activations, a heap of Python objects, random bytes) is distributed otherwise.
//!
//! A [`Signature`] is a file's byte distribution (256 bins, from up to [`SPOTS`] samples of
//! 2 KiB of its tensors, read without touching its page cache) and a threshold calibrated
//! on those same samples: a sample of the file itself lies within it (the 99th
//! percentile of their divergences, times 1.25). A sampled page of memory is *like* the
//! file when the Kullback-Leibler divergence of its bytes' distribution from the file's is
//! under the threshold, as it is or with every byte XOR-ed by one constant (the constants
//! that map its most frequent bytes onto the file's). A file whose own distribution is too
//! close to uniform (random bytes would pass) has no usable signature, and nothing is
//! estimated for it ([`Signature::usable`]).
//!
//! This is a suspicion, never a proof: `model::unexplained` shows it beside the count.

use super::grid::Grid;
use super::index::CopyKind;

/// Bytes of a sample (the first 2 KiB of a sampled page, as the sweep reads it).
pub const SAMPLE: usize = 2048;
/// Samples of a file its signature is made from.
pub const SPOTS: usize = 256;
/// Files of one grid that get a signature (the largest): the check costs about 256
/// operations per file per sampled page.
pub const MAX_FILES: usize = 8;

/// One file's byte distribution and the divergence within which a sample is like it.
#[derive(Debug, Clone)]
pub struct Signature {
    /// ln p(b), smoothed (one count added to each byte value).
    ln_p: [f64; 256],
    /// The file's most frequent bytes, most first.
    top: [u8; 2],
    /// Entropy of the distribution, nats.
    entropy: f64,
    /// Divergence (nats) within which a sample is like the file.
    pub threshold: f64,
    /// Whether uniformly random bytes stay out of it (else nothing is estimated).
    pub usable: bool,
}

/// `n ln n` for the counts of one sample (a table up to a page: one lookup per bin on
/// every sampled page).
fn nln(n: u32) -> f64 {
    static TABLE: std::sync::OnceLock<Vec<f64>> = std::sync::OnceLock::new();
    let t = TABLE.get_or_init(|| {
        (0..=4096u32)
            .map(|n| {
                if n == 0 {
                    0.0
                } else {
                    f64::from(n) * f64::from(n).ln()
                }
            })
            .collect()
    });
    match t.get(n as usize) {
        Some(v) => *v,
        None => f64::from(n) * f64::from(n).ln(),
    }
}

/// The byte histogram of `s`.
pub fn histogram(s: &[u8]) -> [u32; 256] {
    let mut h = [0u32; 256];
    for &b in s {
        h[b as usize] += 1;
    }
    h
}

/// The two most frequent byte values of `h`.
fn top2(h: &[u32; 256]) -> [u8; 2] {
    let (mut a, mut b) = (0usize, 1usize);
    if h[b] > h[a] {
        std::mem::swap(&mut a, &mut b);
    }
    for (i, &c) in h.iter().enumerate().skip(2) {
        if c > h[a] {
            b = a;
            a = i;
        } else if c > h[b] {
            b = i;
        }
    }
    [a as u8, b as u8]
}

impl Signature {
    /// From the histograms of samples of the file (each [`SAMPLE`] bytes).
    pub fn from_samples(samples: &[[u32; 256]]) -> Option<Signature> {
        if samples.len() < 8 {
            return None;
        }
        let mut all = [0u64; 256];
        for s in samples {
            for (a, &c) in all.iter_mut().zip(s.iter()) {
                *a += u64::from(c);
            }
        }
        let n: u64 = all.iter().sum::<u64>() + 256;
        let mut ln_p = [0.0; 256];
        let mut entropy = 0.0;
        for (l, &c) in ln_p.iter_mut().zip(all.iter()) {
            let p = (c + 1) as f64 / n as f64;
            *l = p.ln();
            entropy -= p * *l;
        }
        let mut sig = Signature {
            ln_p,
            top: [0, 0],
            entropy,
            threshold: 0.0,
            usable: false,
        };
        let mut h = [0u32; 256];
        for (i, &c) in all.iter().enumerate() {
            h[i] = u32::try_from(c).unwrap_or(u32::MAX);
        }
        sig.top = top2(&h);
        let mut d: Vec<f64> = samples.iter().map(|s| sig.divergence(s, 0)).collect();
        d.sort_by(f64::total_cmp);
        let p99 = d[(d.len() * 99 / 100).min(d.len() - 1)];
        sig.threshold = p99 * 1.25;
        // Uniformly random bytes (xorshift samples of the same length) must lie well
        // beyond the threshold, else random memory would pass for the model.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let random = (0..8)
            .map(|_| {
                let mut h = [0u32; 256];
                for _ in 0..SAMPLE {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    h[(x >> 56) as usize] += 1;
                }
                sig.divergence(&h, 0)
            })
            .fold(f64::INFINITY, f64::min);
        sig.usable = random > 1.5 * sig.threshold;
        Some(sig)
    }

    /// KL divergence (nats) of the sample `h` (its bytes XOR-ed with `key`) from the file.
    fn divergence(&self, h: &[u32; 256], key: u8) -> f64 {
        let n: u32 = h.iter().sum();
        if n == 0 {
            return f64::INFINITY;
        }
        let nf = f64::from(n);
        let mut sum = 0.0;
        for (b, &c) in h.iter().enumerate() {
            if c > 0 {
                sum += nln(c) - f64::from(c) * self.ln_p[b ^ key as usize];
            }
        }
        sum / nf - nf.ln()
    }

    /// Whether the sample `h` is like the file: its divergence under the threshold, as
    /// it is or relabelled by one XOR constant. `entropy`: the sample's own (nats), a
    /// quick test first (a sample like the file has about its entropy).
    pub fn like(&self, h: &[u32; 256], entropy: f64) -> bool {
        if !self.usable || (entropy - self.entropy).abs() > 0.5 {
            return false;
        }
        if self.divergence(h, 0) <= self.threshold {
            return true;
        }
        let t = top2(h);
        let mut keys = [0u8; 4];
        let mut k = 0;
        for a in t {
            for b in self.top {
                keys[k] = a ^ b;
                k += 1;
            }
        }
        keys.iter()
            .filter(|&&key| key != 0)
            .any(|&key| self.divergence(h, key) <= self.threshold)
    }
}

/// Entropy (nats) of a sample's histogram.
pub fn entropy(h: &[u32; 256]) -> f64 {
    let n: u32 = h.iter().sum();
    if n == 0 {
        return 0.0;
    }
    let nf = f64::from(n);
    nf.ln() - h.iter().map(|&c| nln(c)).sum::<f64>() / nf
}

/// The usable signatures of a grid's files, largest file first: a sampled page is
/// attributed to the first file it is like.
#[derive(Debug, Clone, Default)]
pub struct Likeness {
    pub files: Vec<(usize, Signature)>,
}

impl Likeness {
    /// The signatures of `grid`'s [`MAX_FILES`] largest files that have a usable one.
    /// Samples are spread over each file's tensors by their bytes.
    pub fn of(grid: &Grid) -> Likeness {
        let mut order: Vec<usize> = (0..grid.files.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(grid.files[i].bytes.size));
        let files = order
            .into_iter()
            .take(MAX_FILES)
            .filter_map(|fi| signature(grid, fi).filter(|s| s.usable).map(|s| (fi, s)))
            .collect();
        Likeness { files }
    }

    /// The file (grid index) the sample `s` is like, if any.
    pub fn like(&self, s: &[u8]) -> Option<usize> {
        if self.files.is_empty() {
            return None;
        }
        let h = histogram(&s[..s.len().min(SAMPLE)]);
        let e = entropy(&h);
        self.files
            .iter()
            .find(|(_, sig)| sig.like(&h, e))
            .map(|(fi, _)| *fi)
    }
}

fn signature(grid: &Grid, fi: usize) -> Option<Signature> {
    let gf = &grid.files[fi];
    let spans: Vec<(u64, u64)> = grid
        .pieces
        .iter()
        .filter(|p| p.file == fi && p.kind == CopyKind::Identical && p.mem_len >= SAMPLE as u64)
        .map(|p| (p.file_offset, p.mem_len))
        .collect();
    let total: u64 = spans.iter().map(|s| s.1).sum();
    if total < (SAMPLE * SPOTS) as u64 / 4 {
        return None;
    }
    let mut buf = vec![0u8; SAMPLE];
    let mut samples = Vec::with_capacity(SPOTS);
    let (mut si, mut before) = (0usize, 0u64);
    for k in 0..SPOTS as u64 {
        let at = total * (2 * k + 1) / (2 * SPOTS as u64);
        while si < spans.len() && before + spans[si].1 <= at {
            before += spans[si].1;
            si += 1;
        }
        let (off, len) = *spans.get(si)?;
        let within = (at - before).min(len - SAMPLE as u64);
        gf.bytes.read_exact_at(&mut buf, off + within).ok()?;
        samples.push(histogram(&buf));
    }
    Signature::from_samples(&samples)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// xorshift bytes.
    fn noise(seed: u64, n: usize) -> Vec<u8> {
        let mut s = seed | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 24) as u8
            })
            .collect()
    }

    /// F16 values of about N(0, sigma²), from noise (sum of uniforms).
    fn f16_normal(seed: u64, n: usize, sigma: f32) -> Vec<u8> {
        let u = noise(seed, n * 4);
        let mut out = Vec::with_capacity(n * 2);
        for c in u.chunks(4) {
            let x = (c.iter().map(|&b| f32::from(b) / 255.0).sum::<f32>() - 2.0) * 1.73 * sigma;
            out.extend_from_slice(&half::f16::from_f32(x).to_le_bytes());
        }
        out
    }

    fn sig_of(bytes: &[u8]) -> Signature {
        let samples: Vec<[u32; 256]> = bytes
            .chunks_exact(SAMPLE)
            .take(SPOTS)
            .map(histogram)
            .collect();
        Signature::from_samples(&samples).unwrap()
    }

    fn likes(s: &Signature, bytes: &[u8]) -> usize {
        bytes
            .chunks_exact(SAMPLE)
            .filter(|c| {
                let h = histogram(c);
                s.like(&h, entropy(&h))
            })
            .count()
    }

    /// F16 weights (sigma 0.02): their own samples, the same XOR-ed with a constant and
    /// byte-permuted are like them; uniform noise, zeros and activations of another scale
    /// (a KV cache, sigma 1) are not; a file of uniform noise has no usable signature.
    #[test]
    fn transforms_of_the_model_are_like_it_and_other_memory_is_not() {
        let model = f16_normal(1, SAMPLE * 256, 0.02);
        let s = sig_of(&model);
        assert!(s.usable, "{s:?}");
        let other = f16_normal(2, SAMPLE * 64, 0.02);
        assert!(likes(&s, &other) >= 62, "{}", likes(&s, &other));
        let xored: Vec<u8> = other.iter().map(|b| b ^ 0x5a).collect();
        assert!(likes(&s, &xored) >= 62, "{}", likes(&s, &xored));
        let mut permuted = other.clone();
        for c in permuted.chunks_mut(64) {
            c.reverse();
            c.rotate_left(7);
        }
        assert!(likes(&s, &permuted) >= 62);
        assert_eq!(likes(&s, &noise(3, SAMPLE * 64)), 0);
        assert_eq!(likes(&s, &vec![0u8; SAMPLE * 8]), 0);
        let kv = f16_normal(4, SAMPLE * 64, 1.0);
        assert_eq!(likes(&s, &kv), 0);
        // F32 weights (three of four bytes near uniform): still usable, still apart.
        let f32s: Vec<u8> = f16_normal(7, SAMPLE * 256, 0.02)
            .chunks_exact(2)
            .flat_map(|h| {
                let x = half::f16::from_le_bytes([h[0], h[1]]).to_f32();
                (x * (1.0 + f32::from(h[0]) / 4096.0)).to_le_bytes()
            })
            .collect();
        let s32 = sig_of(&f32s);
        assert!(s32.usable, "{s32:?}");
        assert_eq!(likes(&s32, &noise(8, SAMPLE * 64)), 0);
        assert_eq!(likes(&s32, &other), 0);
        let flat = sig_of(&noise(5, SAMPLE * 256));
        assert!(!flat.usable);
        assert_eq!(likes(&flat, &noise(6, SAMPLE * 8)), 0);
    }
}
