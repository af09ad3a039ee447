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

/// A time as a person reads it in a recap, in UTC: the day
/// (`14 Nov 2023`) and the time of day (`09:12`).
pub(crate) fn day_and_time(at: crate::model::Millis) -> (String, String) {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let secs = at.0.div_euclid(1000);
    let (days, of_day) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (
        format!("{day} {} {year}", MONTHS[(month - 1) as usize]),
        format!("{:02}:{:02}", of_day / 3600, of_day % 3600 / 60),
    )
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

    #[test]
    fn days_and_times_read_as_a_calendar_does() {
        use crate::model::Millis;
        assert_eq!(
            day_and_time(Millis(0)),
            ("1 Jan 1970".to_owned(), "00:00".to_owned())
        );
        // 2023-11-14T09:12:00Z, and a leap day.
        assert_eq!(
            day_and_time(Millis(1_699_953_120_000)),
            ("14 Nov 2023".to_owned(), "09:12".to_owned())
        );
        assert_eq!(
            day_and_time(Millis(1_709_208_000_000)),
            ("29 Feb 2024".to_owned(), "12:00".to_owned())
        );
    }
}
