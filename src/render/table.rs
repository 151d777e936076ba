//! A minimal column-aligned text table.

/// Column alignment.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

pub struct Table {
    header: Vec<String>,
    align: Vec<Align>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(columns: &[(&str, Align)]) -> Self {
        Table {
            header: columns.iter().map(|c| c.0.to_string()).collect(),
            align: columns.iter().map(|c| c.1).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Renders with `indent` spaces before each line; the last column is never padded.
    pub fn render(&self, indent: usize) -> String {
        let n = self.header.len();
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for r in &self.rows {
            for (i, c) in r.iter().enumerate().take(n) {
                widths[i] = widths[i].max(c.chars().count());
            }
        }
        let mut out = String::new();
        for r in std::iter::once(&self.header).chain(self.rows.iter()) {
            let mut line = " ".repeat(indent);
            for (i, c) in r.iter().enumerate().take(n) {
                let pad = widths[i].saturating_sub(c.chars().count());
                let last = i + 1 == n;
                match self.align[i] {
                    Align::Right => {
                        line.push_str(&" ".repeat(pad));
                        line.push_str(c);
                    }
                    Align::Left => {
                        line.push_str(c);
                        if !last {
                            line.push_str(&" ".repeat(pad));
                        }
                    }
                }
                if !last {
                    line.push_str("  ");
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligns() {
        let mut t = Table::new(&[("name", Align::Left), ("size", Align::Right)]);
        t.row(vec!["a".into(), "1.0 KiB".into()]);
        t.row(vec!["long-name".into(), "3 B".into()]);
        assert_eq!(
            t.render(2),
            "  name          size\n  a          1.0 KiB\n  long-name      3 B\n"
        );
    }
}
