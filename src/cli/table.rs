//! A small plain-text table printer for the human output of the CLI (no colours, no borders):
//! columns separated by two spaces, numbers right-aligned, cells kept on one line.

/// A table: a header row and data rows, rendered with aligned columns.
#[derive(Debug, Clone)]
pub struct Table {
    headers: Vec<String>,
    right: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column headers, all left-aligned.
    pub fn new(headers: &[&str]) -> Self {
        Self {
            headers: headers.iter().map(|h| h.to_string()).collect(),
            right: vec![false; headers.len()],
            rows: Vec::new(),
        }
    }

    /// Right-aligns the columns at these indexes (numbers).
    pub fn right_align(mut self, columns: &[usize]) -> Self {
        for &c in columns {
            if let Some(r) = self.right.get_mut(c) {
                *r = true;
            }
        }
        self
    }

    /// Adds a row; missing cells are blank, extra cells are dropped, and every cell is made
    /// single-line.
    pub fn row(&mut self, cells: Vec<String>) {
        let mut cells: Vec<String> = cells.into_iter().map(|c| one_line(&c)).collect();
        cells.resize(self.headers.len(), String::new());
        self.rows.push(cells);
    }

    /// Whether the table has no data rows.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The table as text, one line per row, each ending in a newline.
    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.headers.iter().map(|h| width(h)).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(width(cell));
            }
        }
        let mut out = String::new();
        for row in std::iter::once(&self.headers).chain(&self.rows) {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate() {
                if i > 0 {
                    line.push_str("  ");
                }
                let pad = " ".repeat(widths[i] - width(cell));
                if self.right[i] {
                    line.push_str(&pad);
                    line.push_str(cell);
                } else {
                    line.push_str(cell);
                    line.push_str(&pad);
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// Aligned `key: value` lines (detail views such as `dockhand show`).
pub fn key_values(pairs: &[(&str, String)]) -> String {
    let w = pairs.iter().map(|(k, _)| width(k)).max().unwrap_or(0);
    let mut out = String::new();
    for (k, v) in pairs {
        out.push_str(&format!(
            "{k}:{}  {}\n",
            " ".repeat(w - width(k)),
            one_line(v)
        ));
    }
    out
}

/// Shortens `text` to at most `max` characters, ending with `…` when cut; also single-line.
pub fn truncate(text: &str, max: usize) -> String {
    let line = one_line(text);
    if width(&line) <= max {
        return line;
    }
    let mut cut: String = line.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// Replaces control characters (newlines, tabs, escapes) by spaces so a cell stays on its line
/// and stored text cannot drive the terminal.
pub fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// The displayed width of a cell, counted in characters.
fn width(text: &str) -> usize {
    text.chars().count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligns_columns() {
        let mut t = Table::new(&["ID", "HOOK"]).right_align(&[0]);
        t.row(vec!["7".into(), "email.send".into()]);
        t.row(vec!["123".into(), "x\ny".into()]);
        assert_eq!(t.render(), " ID  HOOK\n  7  email.send\n123  x y\n");
    }

    #[test]
    fn truncates_with_ellipsis() {
        assert_eq!(truncate("abcdef", 4), "abc…");
        assert_eq!(truncate("abc", 4), "abc");
        assert_eq!(truncate("a\tb", 4), "a b");
    }

    #[test]
    fn key_values_align() {
        let s = key_values(&[("id", "1".into()), ("status", "pending".into())]);
        assert_eq!(s, "id:      1\nstatus:  pending\n");
    }
}
