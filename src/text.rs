//! Small text helpers shared across the crate: cutting UTF-8 at a byte
//! bound without splitting a character, and lowercase hex.

/// The longest prefix of `text` that is at most `max_bytes` long and ends on
/// a character boundary (empty when the first character alone is longer).
pub(crate) fn prefix(text: &str, max_bytes: usize) -> &str {
    if text.len() <= max_bytes {
        return text;
    }
    let mut end = max_bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Lowercase hex of `bytes`, two digits a byte.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        // Writing to a String cannot fail.
        let _ = write!(out, "{b:02x}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_never_splits_a_character() {
        assert_eq!(prefix("héllo", 2), "h");
        assert_eq!(prefix("héllo", 3), "hé");
        assert_eq!(prefix("héllo", 99), "héllo");
        assert_eq!(prefix("é", 1), "");
    }

    #[test]
    fn hex_is_two_lowercase_digits_a_byte() {
        assert_eq!(hex(&[0, 0xab, 0x10]), "00ab10");
    }
}
