//! A parser for the few Python literals a NumPy header dict holds: strings, integers,
//! `True`/`False`/`None`, tuples, lists and dicts. It evaluates nothing; anything else
//! is an error. Nesting is bounded so hostile input cannot exhaust the stack.

/// A parsed literal.
#[derive(Debug, Clone, PartialEq)]
pub enum Lit {
    Str(String),
    Int(i64),
    Bool(bool),
    None,
    Tuple(Vec<Lit>),
    List(Vec<Lit>),
    Dict(Vec<(Lit, Lit)>),
}

impl Lit {
    /// The value of `key` in a dict with string keys.
    pub fn get(&self, key: &str) -> Option<&Lit> {
        match self {
            Lit::Dict(pairs) => pairs.iter().find_map(|(k, v)| match k {
                Lit::Str(s) if s == key => Some(v),
                _ => None,
            }),
            _ => None,
        }
    }
}

const MAX_DEPTH: usize = 32;

struct Parser<'a> {
    b: &'a [u8],
    pos: usize,
    /// Strings are UTF-8 (NumPy format 3) rather than latin-1 (formats 1 and 2).
    utf8: bool,
}

/// Parses one literal that fills `text` (surrounding whitespace allowed).
pub fn parse(text: &[u8], utf8: bool) -> Result<Lit, String> {
    let mut p = Parser {
        b: text,
        pos: 0,
        utf8,
    };
    let v = p.value(0)?;
    p.ws();
    if p.pos != p.b.len() {
        return Err(format!("unexpected text at byte '{}'", p.pos));
    }
    Ok(v)
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.pos).copied()
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    fn eat(&mut self, c: u8) -> bool {
        self.ws();
        if self.peek() == Some(c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn value(&mut self, depth: usize) -> Result<Lit, String> {
        if depth > MAX_DEPTH {
            return Err(format!("nested deeper than '{MAX_DEPTH}'"));
        }
        self.ws();
        match self.peek() {
            Some(b'\'' | b'"') => self.string(),
            Some(b'u' | b'b') if matches!(self.b.get(self.pos + 1), Some(b'\'' | b'"')) => {
                self.pos += 1;
                self.string()
            }
            Some(b'(') => {
                self.pos += 1;
                self.items(b')', depth).map(Lit::Tuple)
            }
            Some(b'[') => {
                self.pos += 1;
                self.items(b']', depth).map(Lit::List)
            }
            Some(b'{') => {
                self.pos += 1;
                self.dict(depth)
            }
            Some(b'-' | b'0'..=b'9') => self.int(),
            Some(b'A'..=b'Z' | b'a'..=b'z') => self.word(),
            Some(c) => Err(format!("unexpected '{}' at byte '{}'", c as char, self.pos)),
            None => Err("unexpected end".to_string()),
        }
    }

    fn items(&mut self, close: u8, depth: usize) -> Result<Vec<Lit>, String> {
        let mut out = Vec::new();
        loop {
            if self.eat(close) {
                return Ok(out);
            }
            out.push(self.value(depth + 1)?);
            if !self.eat(b',') {
                if self.eat(close) {
                    return Ok(out);
                }
                return Err(format!(
                    "expected ',' or '{}' at byte '{}'",
                    close as char, self.pos
                ));
            }
        }
    }

    fn dict(&mut self, depth: usize) -> Result<Lit, String> {
        let mut out = Vec::new();
        loop {
            if self.eat(b'}') {
                return Ok(Lit::Dict(out));
            }
            let k = self.value(depth + 1)?;
            if !self.eat(b':') {
                return Err(format!("expected ':' at byte '{}'", self.pos));
            }
            let v = self.value(depth + 1)?;
            out.push((k, v));
            if !self.eat(b',') {
                if self.eat(b'}') {
                    return Ok(Lit::Dict(out));
                }
                return Err(format!("expected ',' or '}}' at byte '{}'", self.pos));
            }
        }
    }

    fn string(&mut self) -> Result<Lit, String> {
        let start = self.pos;
        let quote = self.b.get(self.pos).copied();
        self.pos += 1;
        let mut bytes = Vec::new();
        loop {
            let c = self
                .peek()
                .ok_or(format!("unterminated string at byte '{start}'"))?;
            self.pos += 1;
            match c {
                b'\\' => {
                    let e = self
                        .peek()
                        .ok_or(format!("unterminated string at byte '{start}'"))?;
                    self.pos += 1;
                    match e {
                        b'n' => bytes.push(b'\n'),
                        b't' => bytes.push(b'\t'),
                        b'\\' | b'\'' | b'"' => bytes.push(e),
                        other => bytes.extend_from_slice(&[b'\\', other]),
                    }
                }
                c if Some(c) == quote => break,
                c => bytes.push(c),
            }
        }
        let s = if self.utf8 {
            String::from_utf8(bytes)
                .map_err(|_| format!("string at byte '{start}' is not utf-8"))?
        } else {
            bytes.iter().map(|&b| b as char).collect()
        };
        Ok(Lit::Str(s))
    }

    fn int(&mut self) -> Result<Lit, String> {
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.pos += 1;
        }
        let digits = self.b.get(start..self.pos).unwrap_or_default();
        let text = std::str::from_utf8(digits).unwrap_or_default();
        let v = text
            .parse::<i64>()
            .map_err(|_| format!("bad integer '{text}' at byte '{start}'"))?;
        // Python 2 wrote long integers with an `L` suffix.
        if matches!(self.peek(), Some(b'L' | b'l')) {
            self.pos += 1;
        }
        Ok(Lit::Int(v))
    }

    fn word(&mut self) -> Result<Lit, String> {
        let start = self.pos;
        while matches!(
            self.peek(),
            Some(b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_')
        ) {
            self.pos += 1;
        }
        match self.b.get(start..self.pos).unwrap_or_default() {
            b"True" => Ok(Lit::Bool(true)),
            b"False" => Ok(Lit::Bool(false)),
            b"None" => Ok(Lit::None),
            w => Err(format!(
                "unexpected name '{}' at byte '{start}'",
                String::from_utf8_lossy(w)
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_numpy_headers() {
        let h = b"{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }          \n";
        let d = parse(h, false).unwrap();
        assert_eq!(d.get("descr"), Some(&Lit::Str("<f4".into())));
        assert_eq!(d.get("fortran_order"), Some(&Lit::Bool(false)));
        assert_eq!(
            d.get("shape"),
            Some(&Lit::Tuple(vec![Lit::Int(3), Lit::Int(4)]))
        );
        let d = parse(
            b"{\"shape\": (7L,), 'descr': [('a', '<i4'), ('b', '|u1', (2,))]}",
            false,
        )
        .unwrap();
        assert_eq!(d.get("shape"), Some(&Lit::Tuple(vec![Lit::Int(7)])));
        assert!(matches!(d.get("descr"), Some(Lit::List(v)) if v.len() == 2));
        assert_eq!(parse(b"()", false).unwrap(), Lit::Tuple(vec![]));
        assert_eq!(parse(b"'\xe9'", false).unwrap(), Lit::Str("\u{e9}".into()));
    }

    #[test]
    fn rejects_everything_else() {
        for bad in [
            &b"{'a': 1"[..],
            b"__import__('os')",
            b"{'a' 1}",
            b"(1 2)",
            b"'open",
            b"99999999999999999999",
            b"{} x",
            b"",
            b"\xff",
        ] {
            assert!(parse(bad, false).is_err(), "{bad:?}");
        }
        let deep = "[".repeat(10_000);
        assert!(parse(deep.as_bytes(), false)
            .unwrap_err()
            .contains("nested"));
        assert!(parse(b"'\xff'", true).is_err());
    }
}
