//! A minimal column-aligned text table.

use super::safe::{safe, width};

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
    /// Cells are escaped ([`safe`]: a cell may hold a file name or a command line) and
    /// measured in terminal columns, so wide characters keep the columns aligned.
    pub fn render(&self, indent: usize) -> String {
        let n = self.header.len();
        let rows: Vec<Vec<String>> = std::iter::once(&self.header)
            .chain(self.rows.iter())
            .map(|r| r.iter().take(n).map(|c| safe(c).into_owned()).collect())
            .collect();
        let mut widths = vec![0; n];
        for r in &rows {
            for (i, c) in r.iter().enumerate() {
                widths[i] = widths[i].max(width(c));
            }
        }
        let mut out = String::new();
        for r in &rows {
            let mut line = " ".repeat(indent);
            for (i, c) in r.iter().enumerate() {
                let pad = widths[i].saturating_sub(width(c));
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

    #[test]
    fn escapes_cells_and_aligns_by_display_width() {
        let mut t = Table::new(&[("name", Align::Left), ("n", Align::Right)]);
        t.row(vec!["模型".into(), "1".into()]);
        t.row(vec!["a\u{1b}[31m".into(), "22".into()]);
        t.row(vec!["ab".into(), "3".into()]);
        assert_eq!(
            t.render(0),
            "name      n\n模型      1\na\\e[31m  22\nab        3\n"
        );
    }
}
