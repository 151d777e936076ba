//! Which file a copy of bytes two files share is credited to: the one the process came to.

impl super::sweep::Sweep<'_> {
    /// A copy confirmed as piece `p` of a file the process has no relation to, when a piece
    /// of the same length and kind of a file it came to ([`super::sweep::Sweep::prefer`]:
    /// its command line names it, it maps or holds it) is confirmed at the same place too:
    /// that piece, its bytes and whether whole. Tensors two files share (a `.pt` and the
    /// `.safetensors` of the same weights) are the copy of the file the process loaded,
    /// whichever of the two the search met first.
    pub(super) fn preferred<'p>(
        &self,
        buf: &mut super::compare::Buffers,
        pm: &super::pagemap::PageMap,
        p: usize,
        place: &impl Fn(usize) -> super::compare::Placed<'p>,
    ) -> std::io::Result<Option<(usize, u64, bool)>> {
        let piece = &self.grid.pieces[p];
        if self.prefer.is_empty() || self.prefer.contains(&piece.file) {
            return Ok(None);
        }
        for (q, other) in self.grid.pieces.iter().enumerate() {
            if other.mem_len == piece.mem_len
                && other.kind == piece.kind
                && self.prefer.contains(&other.file)
            {
                if let Some((bytes, whole)) = self.compare().confirm(buf, pm, &place(q))? {
                    return Ok(Some((q, bytes, whole)));
                }
            }
        }
        Ok(None)
    }
}
