//! Writing to standard output: human text that ends quietly when the reader went away, and JSON (`--json`,
//! the event lines of `pgfence replica`) escaped for terminals.

use std::io::Write;

use crate::{table, CliResult, Failure};

/// Writes human output to standard output. A reader that went away (`pgfence status | head -1`) ends the
/// output quietly, where `println!` would panic; any other write error is exit 1.
pub(crate) fn emit(text: &str) -> CliResult {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(Failure::new(
            1,
            format!("cannot write to standard output: {e}"),
        )),
    }
}

/// `--json` output: pretty JSON that parses back to exactly the values read, with no character in it that a
/// terminal would act on.
pub(crate) fn print_json<T: serde::Serialize>(value: &T) -> CliResult {
    let mut text = Vec::new();
    let mut serializer = serde_json::Serializer::with_formatter(
        &mut text,
        TerminalJson(serde_json::ser::PrettyFormatter::new()),
    );
    value
        .serialize(&mut serializer)
        .map_err(|e| Failure::new(1, e.to_string()))?;
    text.push(b'\n');
    // serde_json writes UTF-8 only.
    emit(&String::from_utf8_lossy(&text))
}

/// `value` as one line of JSON (no newline in it), escaped for terminals as `--json` output is: the event lines
/// of `pgfence replica`.
pub(crate) fn json_line<T: serde::Serialize>(value: &T) -> Result<String, Failure> {
    let mut text = Vec::new();
    let mut serializer = serde_json::Serializer::with_formatter(
        &mut text,
        TerminalJson(serde_json::ser::CompactFormatter),
    );
    value
        .serialize(&mut serializer)
        .map_err(|e| Failure::new(1, e.to_string()))?;
    // serde_json writes UTF-8 only.
    Ok(String::from_utf8_lossy(&text).into_owned())
}

/// A serde_json formatter (pretty for `--json`, compact for event lines), escaping for terminals: serde_json
/// itself writes the C0 controls, `"` and `\` as escapes; this writes every other terminal control (DEL, C1,
/// the bidirectional controls: see [`table::is_terminal_control`]) as `\uXXXX` too. JSON decodes those
/// escapes, so the strings stay exact.
struct TerminalJson<F>(F);

impl<F: serde_json::ser::Formatter> serde_json::ser::Formatter for TerminalJson<F> {
    fn write_string_fragment<W: ?Sized + Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        let mut start = 0;
        for (at, c) in fragment.char_indices() {
            if table::is_terminal_control(c) {
                writer.write_all(&fragment.as_bytes()[start..at])?;
                for unit in c.encode_utf16(&mut [0; 2]) {
                    write!(writer, "\\u{unit:04x}")?;
                }
                start = at + c.len_utf8();
            }
        }
        writer.write_all(&fragment.as_bytes()[start..])
    }

    // The layout is the inner formatter's.
    fn begin_array<W: ?Sized + Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.0.begin_array(writer)
    }
    fn end_array<W: ?Sized + Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.0.end_array(writer)
    }
    fn begin_array_value<W: ?Sized + Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.0.begin_array_value(writer, first)
    }
    fn end_array_value<W: ?Sized + Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.0.end_array_value(writer)
    }
    fn begin_object<W: ?Sized + Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.0.begin_object(writer)
    }
    fn end_object<W: ?Sized + Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.0.end_object(writer)
    }
    fn begin_object_key<W: ?Sized + Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.0.begin_object_key(writer, first)
    }
    fn end_object_key<W: ?Sized + Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.0.end_object_key(writer)
    }
    fn begin_object_value<W: ?Sized + Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.0.begin_object_value(writer)
    }
    fn end_object_value<W: ?Sized + Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.0.end_object_value(writer)
    }
}
