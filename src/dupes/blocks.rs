//! Small reads of a model file served from whole blocks read at once.
//!
//! The index reads 2 KiB every 2 KiB (or every few pages) of a file; one `O_DIRECT` read
//! per 4 KiB block made the index of an evicted 1 GiB file take 17 s. So a small read is
//! served from a block of [`BLOCK`] bytes read at once (out of the page cache where every
//! page of it is cached, else with one `O_DIRECT` read: [`super::filebytes`]).
//!
//! The blocks belong to the opened file and live in anonymous mappings of their own, not
//! on the heap: [`Blocks::clear`] (when a caller is done with the file) and dropping the
//! file unmap them, so no copy of the model's bytes outlives its use in twofold's memory
//! (a test that searches a fork of its own process would find a freed block there).

use std::io;
use std::sync::Mutex;

/// Bytes of a block (and its alignment in the file).
pub const BLOCK: u64 = 1 << 20;
/// Reads up to this size are served from blocks.
pub const SMALL_READ: usize = 64 << 10;
/// Blocks kept per file: one or two per reading thread.
const KEPT: usize = 8;

struct Block {
    start: u64,
    len: usize,
    data: memmap2::MmapMut,
}

#[derive(Default)]
pub struct Blocks {
    kept: Mutex<Vec<Block>>,
}

impl Blocks {
    /// Fills `buf` from `off` (at most [`SMALL_READ`] bytes): from a kept block, else with
    /// `cached(part, offset)` where it can (true: done; the page cache's pages copied as
    /// they are, no block needed), else from a block read with `fill(block, offset)`;
    /// `size` is the file's.
    pub fn read(
        &self,
        buf: &mut [u8],
        off: u64,
        size: u64,
        cached: impl Fn(&mut [u8], u64) -> io::Result<bool>,
        fill: impl Fn(&mut [u8], u64) -> io::Result<()>,
    ) -> io::Result<()> {
        let mut done = 0usize;
        while done < buf.len() {
            let at = off + done as u64;
            let start = at / BLOCK * BLOCK;
            // This block if kept, taken out while it is read (other threads go on).
            let found = {
                let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
                let i = kept.iter().position(|b| b.start == start);
                i.map(|i| kept.swap_remove(i))
            };
            let b = match found {
                Some(b) => b,
                None => {
                    // The rest of this read within the block, straight from the cache.
                    let end = (start + BLOCK).min(off + buf.len() as u64);
                    let part = &mut buf[done..(end - off) as usize];
                    if cached(part, at)? {
                        done += part.len();
                        continue;
                    }
                    let len = BLOCK.min(size - start) as usize;
                    let mut data = memmap2::MmapMut::map_anon(BLOCK as usize)?;
                    fill(&mut data[..len], start)?;
                    Block { start, len, data }
                }
            };
            let from = (at - b.start) as usize;
            let take = (b.len - from).min(buf.len() - done);
            buf[done..done + take].copy_from_slice(&b.data[from..from + take]);
            done += take;
            let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
            if kept.len() >= KEPT {
                kept.remove(0);
            }
            kept.push(b);
        }
        Ok(())
    }

    /// Blocks kept now (tests).
    #[cfg(test)]
    pub fn kept(&self) -> usize {
        self.kept.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Unmaps every block kept.
    pub fn clear(&self) {
        self.kept.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}
