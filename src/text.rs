//! Small text helpers shared across the crate: cutting UTF-8 at a byte
//! bound without splitting a character, lowercase hex, and durations and
//! counts as a person reads them.

use std::time::Duration;

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

/// A duration as a person reads it, to the precision that matters at its
/// size: "250 ms", "9.7 s", "42 s", "3 min 5 s", "2 h 10 min", "3 d 4 h".
pub(crate) fn human_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms} ms");
    }
    if ms < 10_000 {
        let tenths = (ms + 50) / 100;
        return match tenths % 10 {
            0 => format!("{} s", tenths / 10),
            t => format!("{}.{t} s", tenths / 10),
        };
    }
    let secs = (ms + 500) / 1000;
    let (d_, h, m, s) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    let two = |a: u128, ua: &str, b: u128, ub: &str| match b {
        0 => format!("{a} {ua}"),
        b => format!("{a} {ua} {b} {ub}"),
    };
    match (d_, h, m) {
        (0, 0, 0) => format!("{s} s"),
        (0, 0, m) => two(m, "min", s, "s"),
        (0, h, m) => two(h, "h", m, "min"),
        (d_, h, _) => two(d_, "d", h, "h"),
    }
}

/// `n` and the noun, singular for one: "1 entry", "3 entries".
pub(crate) fn count(n: u64, one: &str, many: &str) -> String {
    match n {
        1 => format!("1 {one}"),
        n => format!("{n} {many}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_a_person_would_say_them() {
        let cases = [
            (Duration::ZERO, "0 ms"),
            (Duration::from_millis(250), "250 ms"),
            (Duration::from_millis(9_668), "9.7 s"),
            (Duration::from_millis(2_000), "2 s"),
            (Duration::from_millis(30_000), "30 s"),
            (Duration::from_secs(185), "3 min 5 s"),
            (Duration::from_secs(1800), "30 min"),
            (Duration::from_secs(7800), "2 h 10 min"),
            (Duration::from_secs(3 * 86_400 + 4 * 3600 + 59), "3 d 4 h"),
        ];
        for (d, want) in cases {
            assert_eq!(human_duration(d), want, "{d:?}");
        }
        assert_eq!(count(1, "entry", "entries"), "1 entry");
        assert_eq!(count(0, "entry", "entries"), "0 entries");
    }

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
