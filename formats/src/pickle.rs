//! A restricted pickle walker for `torch.save`'s `data.pkl`. It executes nothing: it
//! simulates the pickle machine's stack with inert values (strings, integers, global
//! *names*, tuples; everything else is an opaque placeholder) and records the persistent
//! ids of the shape `('storage', torch.<X>Storage, key, location, numel)` that
//! `torch.save` writes for every storage.
//!
//! Memory is bounded by the pickle's length: each opcode pushes at most one value, and
//! shared values (memo, `DUP`) are reference-counted, never deep-copied.
//! Opcodes: CPython `Lib/pickletools.py`; torch's persistent ids: `torch/serialization.py`.

use std::collections::HashMap;
use std::rc::Rc;

/// A storage reference found in the pickle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageRef {
    /// The storage's key: its entry is `<archive>/data/<key>`.
    pub key: String,
    /// Class name under `torch`, e.g. `FloatStorage`.
    pub class: String,
    pub location: String,
    /// Elements of the storage's dtype.
    pub numel: u64,
}

#[derive(Debug, Clone)]
enum V {
    Mark,
    Str(Rc<str>),
    Int(i64),
    Global(Rc<(String, String)>),
    Tuple(Rc<[V]>),
    Other,
}

struct Walker<'a> {
    b: &'a [u8],
    pos: usize,
    stack: Vec<V>,
    memo: HashMap<u64, V>,
    found: Vec<StorageRef>,
}

type R<T> = Result<T, String>;

/// Walks the pickle to its `STOP`, returning the storages it references.
pub fn storages(pickle: &[u8]) -> Result<Vec<StorageRef>, String> {
    let mut w = Walker {
        b: pickle,
        pos: 0,
        stack: Vec::new(),
        memo: HashMap::new(),
        found: Vec::new(),
    };
    w.run()?;
    Ok(w.found)
}

fn int_le(b: &[u8]) -> V {
    if b.len() > 8 {
        return V::Other;
    }
    let fill = if b.last().is_some_and(|&x| x & 0x80 != 0) {
        0xff
    } else {
        0
    };
    let mut a = [fill; 8];
    a.iter_mut().zip(b).for_each(|(d, s)| *d = *s);
    V::Int(i64::from_le_bytes(a))
}

fn text(b: &[u8]) -> V {
    V::Str(String::from_utf8_lossy(b).into())
}

impl Walker<'_> {
    fn take(&mut self, n: u64) -> R<&[u8]> {
        let start = self.pos;
        let end = usize::try_from(n)
            .ok()
            .and_then(|n| start.checked_add(n))
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| format!("truncated at byte '{start}'"))?;
        self.pos = end;
        Ok(self.b.get(start..end).unwrap_or_default())
    }

    fn uint(&mut self, n: u64) -> R<u64> {
        Ok(self
            .take(n)?
            .iter()
            .rev()
            .fold(0u64, |acc, b| (acc << 8) | u64::from(*b)))
    }

    fn line(&mut self) -> R<&[u8]> {
        let start = self.pos;
        let rest = self.b.get(start..).unwrap_or_default();
        let n = rest
            .iter()
            .position(|&c| c == b'\n')
            .ok_or_else(|| format!("unterminated line at byte '{start}'"))?;
        self.pos = start + n + 1;
        Ok(rest.get(..n).unwrap_or_default())
    }

    fn pop(&mut self) -> R<V> {
        self.stack
            .pop()
            .ok_or_else(|| format!("stack underflow at byte '{}'", self.pos))
    }

    fn pop_mark(&mut self) -> R<Vec<V>> {
        let at = self
            .stack
            .iter()
            .rposition(|v| matches!(v, V::Mark))
            .ok_or_else(|| format!("no mark at byte '{}'", self.pos))?;
        let items = self.stack.split_off(at + 1);
        self.stack.pop();
        Ok(items)
    }

    fn top(&self) -> R<V> {
        self.stack
            .last()
            .cloned()
            .ok_or_else(|| format!("empty stack at byte '{}'", self.pos))
    }

    fn get(&mut self, idx: u64) -> R<()> {
        let v = self
            .memo
            .get(&idx)
            .cloned()
            .ok_or_else(|| format!("memo '{idx}' unset"))?;
        self.stack.push(v);
        Ok(())
    }

    fn put(&mut self, idx: u64) -> R<()> {
        let v = self.top()?;
        self.memo.insert(idx, v);
        Ok(())
    }

    fn line_int(&mut self) -> R<u64> {
        let l = self.line()?;
        std::str::from_utf8(l)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .ok_or_else(|| "bad memo index".to_string())
    }

    fn persistent(&mut self, pid: V) {
        let V::Tuple(t) = pid else { return };
        if let [V::Str(tag), V::Global(g), V::Str(key), V::Str(location), V::Int(numel)] = &t[..] {
            if &**tag == "storage" && g.0 == "torch" && *numel >= 0 {
                self.found.push(StorageRef {
                    key: key.to_string(),
                    class: g.1.clone(),
                    location: location.to_string(),
                    numel: *numel as u64,
                });
            }
        }
    }

    fn run(&mut self) -> R<()> {
        loop {
            let at = self.pos;
            let op = *self.take(1)?.first().unwrap_or(&b'.');
            if op == b'.' {
                return Ok(());
            }
            if let Some(v) = self.literal(op)? {
                self.stack.push(v);
            } else if !self.memo_op(op)? {
                self.structural(op, at)?;
            }
        }
    }

    /// Opcodes that push a constant: numbers, strings, globals, empty containers.
    fn literal(&mut self, op: u8) -> R<Option<V>> {
        Ok(Some(match op {
            b'F' | b'P' => {
                self.line()?;
                V::Other
            }
            b'I' | b'L' => {
                let l = String::from_utf8_lossy(self.line()?).into_owned();
                l.trim_end_matches('L').parse().map_or(V::Other, V::Int)
            }
            b'J' => V::Int(i64::from(self.uint(4)? as u32 as i32)),
            b'K' => V::Int(self.uint(1)? as i64),
            b'M' => V::Int(self.uint(2)? as i64),
            0x8a | 0x8b => {
                let n = self.uint(if op == 0x8a { 1 } else { 4 })?;
                int_le(self.take(n)?)
            }
            b'N' | 0x88 | 0x89 | b']' | b'}' | b')' | 0x8f | 0x97 => V::Other,
            b'G' => {
                self.take(8)?;
                V::Other
            }
            b'S' => {
                let l = self.line()?;
                text(
                    l.strip_prefix(b"'")
                        .and_then(|l| l.strip_suffix(b"'"))
                        .unwrap_or(l),
                )
            }
            b'V' => text(self.line()?),
            b'T' | b'X' | b'B' => {
                let n = self.uint(4)?;
                text(self.take(n)?)
            }
            b'U' | b'C' | 0x8c => {
                let n = self.uint(1)?;
                text(self.take(n)?)
            }
            0x8d | 0x8e | 0x96 => {
                let n = self.uint(8)?;
                text(self.take(n)?)
            }
            b'c' => {
                let module = String::from_utf8_lossy(self.line()?).into_owned();
                let name = String::from_utf8_lossy(self.line()?).into_owned();
                V::Global(Rc::new((module, name)))
            }
            0x82..=0x84 => {
                self.take([1, 2, 4][usize::from(op - 0x82)])?;
                V::Other
            }
            _ => return Ok(None),
        }))
    }

    /// Memo opcodes; `false` if `op` is not one.
    fn memo_op(&mut self, op: u8) -> R<bool> {
        match op {
            b'g' => {
                let i = self.line_int()?;
                self.get(i)?;
            }
            b'h' | b'j' => {
                let i = self.uint(if op == b'h' { 1 } else { 4 })?;
                self.get(i)?;
            }
            b'p' => {
                let i = self.line_int()?;
                self.put(i)?;
            }
            b'q' | b'r' => {
                let i = self.uint(if op == b'q' { 1 } else { 4 })?;
                self.put(i)?;
            }
            0x94 => {
                let i = self.memo.len() as u64;
                self.put(i)?;
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Opcodes that rearrange the stack or build objects (which stay opaque).
    fn structural(&mut self, op: u8, at: usize) -> R<()> {
        let v = match op {
            b'(' => V::Mark,
            b'2' => self.top()?,
            b't' => V::Tuple(self.pop_mark()?.into()),
            0x85..=0x87 => {
                let n = usize::from(op - 0x84);
                let Some(from) = self.stack.len().checked_sub(n) else {
                    return Err(format!("stack underflow at byte '{at}'"));
                };
                V::Tuple(self.stack.split_off(from).into())
            }
            b'Q' => {
                let pid = self.pop()?;
                self.persistent(pid);
                V::Other
            }
            0x93 => {
                let name = self.pop()?;
                match (self.pop()?, name) {
                    (V::Str(m), V::Str(n)) => V::Global(Rc::new((m.to_string(), n.to_string()))),
                    _ => V::Other,
                }
            }
            b'i' => {
                self.line()?;
                self.line()?;
                self.pop_mark()?;
                V::Other
            }
            b'R' | 0x81 | 0x92 => {
                for _ in 0..(if op == 0x92 { 3 } else { 2 }) {
                    self.pop()?;
                }
                V::Other
            }
            b'd' | b'l' | b'o' | 0x91 => {
                self.pop_mark()?;
                V::Other
            }
            b'0' | b'a' | b'b' => {
                self.pop()?;
                return Ok(());
            }
            b's' => {
                self.pop()?;
                self.pop()?;
                return Ok(());
            }
            b'1' | b'e' | b'u' | 0x90 => {
                self.pop_mark()?;
                return Ok(());
            }
            0x80 => {
                self.take(1)?;
                return Ok(());
            }
            0x95 => {
                self.take(8)?;
                return Ok(());
            }
            0x98 => return Ok(()),
            other => return Err(format!("unknown opcode '0x{other:02x}' at byte '{at}'")),
        };
        self.stack.push(v);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What Python's pickler (protocol 2) emits for
    /// `{'w': _rebuild_tensor_v2(<pid ('storage', torch.FloatStorage, '0', 'cpu', 6)>, 0, (2, 3), (3, 1), False, OrderedDict())}`
    /// followed by a second tensor sharing the memoised `'storage'` string and class.
    fn torch_like() -> Vec<u8> {
        let mut p = vec![
            0x80, 2, b'}', b'q', 0, b'(', b'X', 1, 0, 0, 0, b'w', b'q', 1,
        ];
        p.extend_from_slice(b"ctorch._utils\n_rebuild_tensor_v2\nq\x02(");
        p.extend_from_slice(b"(X\x07\x00\x00\x00storageq\x03ctorch\nFloatStorage\nq\x04");
        p.extend_from_slice(b"X\x01\x00\x00\x000q\x05X\x03\x00\x00\x00cpuq\x06K\x06tq\x07Q");
        p.extend_from_slice(b"K\x00K\x02K\x03\x86q\x08K\x03K\x01\x86q\x09\x89");
        p.extend_from_slice(b"ccollections\nOrderedDict\nq\x0a)Rq\x0btq\x0cRq\x0d");
        p.extend_from_slice(b"X\x01\x00\x00\x00vq\x0eh\x02((h\x03h\x04X\x01\x00\x00\x001h\x06");
        p.extend_from_slice(b"\x8a\x05\x00\x00\x00\x00\x01tQK\x00K\x01\x85K\x01\x85\x89h\x0a)RtR");
        p.extend_from_slice(b"u.");
        p
    }

    #[test]
    fn finds_storages() {
        let s = storages(&torch_like()).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(
            s[0],
            StorageRef {
                key: "0".into(),
                class: "FloatStorage".into(),
                location: "cpu".into(),
                numel: 6
            }
        );
        assert_eq!(s[1].key, "1");
        assert_eq!(s[1].numel, 1 << 32);
    }

    #[test]
    fn never_panics_on_prefixes_or_garbage() {
        let p = torch_like();
        for cut in 0..p.len() {
            assert!(storages(&p[..cut]).is_err(), "prefix {cut}");
        }
        assert!(storages(b"\xff").unwrap_err().contains("unknown opcode"));
        assert!(storages(b"0.").unwrap_err().contains("underflow"));
        assert!(storages(b"h\x05.").unwrap_err().contains("memo"));
        // Memo sharing keeps a doubling tuple chain linear in memory.
        let mut bomb = b"K\x01".to_vec();
        for _ in 0..64 {
            bomb.extend_from_slice(b"q\x00h\x00\x86");
        }
        bomb.push(b'.');
        assert!(storages(&bomb).unwrap().is_empty());
    }
}
