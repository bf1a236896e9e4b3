//! Making names from disk or from the peer safe to print.

/// Escapes a file name for display: control characters, backslashes and bytes that are not
/// UTF-8 become `\n`, `\\`, `\xff`-style escapes, so that a hostile name cannot move the
/// cursor or rewrite a terminal line (scp's CVE-2019-6109). Printable Unicode is kept.
///
/// ```
/// use fastcp_stream::escape;
///
/// assert_eq!(escape(b"ok name"), "ok name");
/// assert_eq!(escape("née".as_bytes()), "née");
/// assert_eq!(escape(b"a\nb\x1b[2J\xff"), r"a\nb\x1b[2J\xff");
/// ```
pub fn escape(name: &[u8]) -> String {
    let mut out = String::with_capacity(name.len());
    for chunk in name.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\t' => out.push_str("\\t"),
                '\r' => out.push_str("\\r"),
                c if c.is_control() && (c as u32) < 0x80 => {
                    out.push_str(&format!("\\x{:02x}", c as u32));
                }
                c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}
