//! Text from the outside (file names, `comm`, command lines, kernel and error messages
//! quoting them) made safe for a terminal: every control character is shown as an escape
//! instead of being sent raw, so a file named `evil\e]0;pwned\a.gguf` cannot retitle the
//! terminal or recolour the screen. JSON never goes through here (serde escapes it).
//!
//! Escapes: `\e` (ESC), `\a`, `\b`, `\t`, `\n`, `\r`, `\v`, `\f`, other C0 controls and
//! DEL as `\x1f`, C1 controls (U+0080–U+009F) and bidirectional overrides and isolates
//! (U+202A–U+202E, U+2066–U+2069, which reorder what follows them) as `\u{9b}`, and bytes
//! that are not UTF-8 as `\xff`. A backslash is left as it is, so escaping twice changes
//! nothing. See ECMA-48 for the C0 and C1 sets, Unicode UAX #9 for the bidi controls.

use std::borrow::Cow;
use std::fmt::Write as _;

fn needs_escape(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

fn push_escaped(out: &mut String, c: char) {
    match c {
        '\u{1b}' => out.push_str("\\e"),
        '\u{07}' => out.push_str("\\a"),
        '\u{08}' => out.push_str("\\b"),
        '\t' => out.push_str("\\t"),
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\u{0b}' => out.push_str("\\v"),
        '\u{0c}' => out.push_str("\\f"),
        c if (c as u32) < 0x80 => {
            let _ = write!(out, "\\x{:02x}", c as u32);
        }
        c => {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
    }
}

fn escape(s: &str, keep_newlines: bool) -> Cow<'_, str> {
    let bad = |c: char| needs_escape(c) && !(keep_newlines && c == '\n');
    if !s.chars().any(bad) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if bad(c) {
            push_escaped(&mut out, c);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// One line's worth of outside text (a table cell, a path, a `comm`): every control
/// character escaped, newlines included.
/// A command line as a shell would take it back: each word that is not plain
/// (`[A-Za-z0-9_@%+=:,./-]`) in single quotes, a quote in it as `'\''`.
pub fn shell_words(words: &[String]) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_@%+=:,./-".contains(c);
    words
        .iter()
        .map(|w| {
            if !w.is_empty() && w.chars().all(plain) {
                w.clone()
            } else {
                format!("'{}'", w.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

pub fn safe(s: &str) -> Cow<'_, str> {
    escape(s, false)
}

/// Like [`safe`] for raw bytes (a file name as the kernel gave it): bytes that are not
/// UTF-8 are shown as `\xNN` rather than lost to U+FFFD.
pub fn safe_bytes(b: &[u8]) -> String {
    let mut out = String::with_capacity(b.len());
    for chunk in b.utf8_chunks() {
        out.push_str(&safe(chunk.valid()));
        for byte in chunk.invalid() {
            let _ = write!(out, "\\x{byte:02x}");
        }
    }
    out
}

/// A path for people: [`safe_bytes`] of its bytes.
pub fn safe_path(p: &std::path::Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    safe_bytes(p.as_os_str().as_bytes())
}

/// A file name for people: its raw bytes escaped when it has them (a name that is not
/// UTF-8), else its text.
pub fn shown(path: &str, raw: Option<&[u8]>) -> String {
    raw.map_or_else(|| safe(path).into_owned(), safe_bytes)
}

/// A whole human document (many lines) before it is written to a terminal: control
/// characters escaped, its line breaks kept. The last guard behind [`safe`]: what the
/// renderers did not escape cannot reach the terminal raw.
pub fn terminal(s: &str) -> Cow<'_, str> {
    escape(s, true)
}

/// A writer for human output written piece by piece (`writeln!` after `writeln!`): each
/// piece goes through [`terminal`] (bytes that are not UTF-8 as `\xNN`).
pub struct Terminal<'a>(pub &'a mut dyn std::io::Write);

impl std::io::Write for Terminal<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = match std::str::from_utf8(buf) {
            Ok(s) => terminal(s).into_owned(),
            Err(_) => buf
                .split(|b| *b == b'\n')
                .map(safe_bytes)
                .collect::<Vec<_>>()
                .join("\n"),
        };
        self.0.write_all(text.as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// Columns a string takes on a terminal (wide CJK characters take two, combining marks
/// none), as the table measures its cells.
pub fn width(s: &str) -> usize {
    unicode_width::UnicodeWidthStr::width(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_line_keeps_its_quoting() {
        let w = |v: &[&str]| shell_words(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(
            w(&["python3", "-c", "import x; x.load('m')"]),
            "python3 -c 'import x; x.load('\\''m'\\'')'"
        );
        assert_eq!(
            w(&["llama-cli", "-m", "/m/a.gguf", ""]),
            "llama-cli -m /m/a.gguf ''"
        );
    }

    #[test]
    fn escapes_c0_del_and_c1() {
        assert_eq!(
            safe("evil\u{1b}]0;pwned\u{07}\u{1b}[31m.gguf"),
            "evil\\e]0;pwned\\a\\e[31m.gguf"
        );
        assert_eq!(safe("a\tb\nc\rd\u{0}e\u{7f}"), "a\\tb\\nc\\rd\\x00e\\x7f");
        assert_eq!(safe("csi\u{9b}31m nel\u{85}"), "csi\\u{9b}31m nel\\u{85}");
        assert_eq!(safe("\u{202e}fdp.exe"), "\\u{202e}fdp.exe");
    }

    #[test]
    fn leaves_printable_text_alone() {
        for s in [
            "/models/llama-3 8B.gguf",
            "模型.safetensors",
            "≥ 1.00 times →",
            "a\\e",
        ] {
            assert!(matches!(safe(s), Cow::Borrowed(_)), "{s}");
            assert_eq!(safe(s), s);
        }
        // Escaping twice changes nothing.
        let once = safe("x\u{1b}[2J").into_owned();
        assert_eq!(safe(&once), once);
    }

    #[test]
    fn invalid_utf8_is_shown_byte_by_byte() {
        assert_eq!(safe_bytes(b"m\xff\xfe.gguf"), "m\\xff\\xfe.gguf");
        assert_eq!(safe_bytes(b"a\x1b\xc2\x9b\xc2"), "a\\e\\u{9b}\\xc2");
        assert_eq!(safe_bytes("模型".as_bytes()), "模型");
    }

    #[test]
    fn terminal_keeps_line_breaks_only() {
        assert_eq!(terminal("a\nb\u{1b}c\n"), "a\nb\\ec\n");
    }

    #[test]
    fn terminal_writer_escapes_each_piece() {
        use std::io::Write;
        let mut buf = Vec::new();
        let mut t = Terminal(&mut buf);
        let name = "x\u{1b}[2J";
        writeln!(t, "run '{name}'").unwrap();
        t.write_all(b"\xff\n").unwrap();
        assert_eq!(String::from_utf8(buf).unwrap(), "run 'x\\e[2J'\n\\xff\n");
    }

    #[test]
    fn width_counts_columns() {
        assert_eq!(width("模型"), 4);
        assert_eq!(width("abc"), 3);
        assert_eq!(width("\\e"), 2);
    }
}
