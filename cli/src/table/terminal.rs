//! Escaping for the terminal: every stored string the CLI prints for people goes through [`escape`], so that no
//! control character in it reaches the operator's terminal, and a long one is cut at a bound and marked.

use std::fmt::Write as _;

/// The most characters of escaped text a table cell or a value in a text line shows; longer values are cut
/// there and marked (see [`escape`]). Long enough for a full lease name (400 characters) with a few escapes
/// in it; short enough that one 70,000-character holder does not push every other column off the screen.
pub(crate) const VALUE_CHARS: usize = 512;

/// The most characters of escaped text an error message shows (it may quote several values).
pub(crate) const MESSAGE_CHARS: usize = 4096;

/// Whether `c` would act on a terminal instead of being shown: every Unicode control character (C0, DEL,
/// C1: `char::is_control`), the bidirectional controls that reorder the text around them (ALM U+061C, LRM
/// U+200E, RLM U+200F, LRE..RLO U+202A–U+202E, LRI..PDI U+2066–U+2069) and the line and paragraph
/// separators U+2028/U+2029, which some terminals break lines at.
pub(crate) fn is_terminal_control(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061C}'
                | '\u{200E}'
                | '\u{200F}'
                | '\u{202A}'..='\u{202E}'
                | '\u{2066}'..='\u{2069}'
                | '\u{2028}'
                | '\u{2029}'
        )
}

/// `text` as the CLI prints it: a backslash becomes `\\` and every terminal control (see
/// [`is_terminal_control`]) becomes its Rust escape `\u{…}` in lowercase hex (ESC is `\u{1b}`, CR `\u{d}`), so
/// the output holds no control and reads back unambiguously. When the escaped text would be longer than `max`
/// characters, the first `max` are kept (never half an escape) and `…(+N chars)` follows, N counting the
/// characters of `text` left out.
pub(crate) fn escape(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max.saturating_mul(4)));
    let mut shown = 0;
    for (at, c) in text.char_indices() {
        let escaped = c == '\\' || is_terminal_control(c);
        let width = if c == '\\' {
            2
        } else if escaped {
            c.escape_unicode().len()
        } else {
            1
        };
        if shown + width > max {
            let left = text[at..].chars().count();
            let _ = write!(out, "…(+{left} char{})", if left == 1 { "" } else { "s" });
            return out;
        }
        if c == '\\' {
            out.push_str("\\\\");
        } else if escaped {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
        shown += width;
    }
    out
}

/// A stored value as a table cell or a text line shows it: [`escape`] with [`VALUE_CHARS`].
pub(crate) fn value(text: &str) -> String {
    escape(text, VALUE_CHARS)
}

/// For tests: whether `c` is a terminal control other than the newline that ends a line of output.
#[cfg(test)]
pub(super) fn is_terminal_control_but_newline(c: char) -> bool {
    c != '\n' && is_terminal_control(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_writes_controls_and_backslashes_as_rust_escapes() {
        assert_eq!(escape("pod-a", 64), "pod-a");
        assert_eq!(escape("\u{1b}[2J", 64), "\\u{1b}[2J");
        assert_eq!(escape("a\rb\u{7}", 64), "a\\u{d}b\\u{7}");
        assert_eq!(escape("\u{9b}\u{7f}", 64), "\\u{9b}\\u{7f}");
        assert_eq!(escape("\u{202e}evil\u{2066}", 64), "\\u{202e}evil\\u{2066}");
        // The backslash is escaped too, so a stored `\u{1b}` reads differently from an escaped ESC.
        assert_eq!(escape("\\u{1b}", 64), "\\\\u{1b}");
        // Printable non-ASCII, combining marks included, is kept.
        assert_eq!(escape("e\u{301} ¥ Ѩ", 64), "e\u{301} ¥ Ѩ");
    }

    #[test]
    fn escape_cuts_long_text_whole_escapes_only_and_says_how_much_was_left_out() {
        let long = "x".repeat(70_000);
        assert_eq!(
            escape(&long, VALUE_CHARS),
            format!(
                "{}…(+{} chars)",
                "x".repeat(VALUE_CHARS),
                70_000 - VALUE_CHARS
            )
        );
        // The 6-character escape of ESC does not fit in 7 characters after `ab`, so it is left out whole.
        assert_eq!(escape("ab\u{1b}c", 7), "ab…(+2 chars)");
        assert_eq!(escape("ab\u{1b}c", 8), "ab\\u{1b}…(+1 char)");
        assert_eq!(escape("ab\u{1b}c", 9), "ab\\u{1b}c");
        assert_eq!(escape("", 0), "");
    }
}
