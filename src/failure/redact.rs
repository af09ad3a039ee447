//! Redaction: the one place that keeps secrets (API keys, bearer tokens,
//! credentials in URLs, key-like query parameters) out of every cause, log
//! line, stored failure and summary.

/// The marker that stands where a secret was.
pub(crate) const REDACTED: &str = "[REDACTED]";

/// Removes secrets from a text bound for a caller, a log or the store: the
/// given secrets (an API key) wherever they appear, bearer tokens, the
/// credentials of URLs, and key-like query parameters.
pub(crate) fn redact(text: &str, secrets: &[&str]) -> String {
    let mut out = text.to_owned();
    for secret in secrets {
        // Very short "secrets" would blank out ordinary words.
        if secret.len() >= 6 {
            out = out.replace(secret, REDACTED);
        }
    }
    out = redact_after(&out, "Bearer ", |c| {
        !c.is_whitespace() && c != '"' && c != '\''
    });
    out = redact_url_credentials(&out);
    for param in [
        "key=",
        "api_key=",
        "api-key=",
        "apikey=",
        "token=",
        "access_token=",
    ] {
        out = redact_after(&out, param, |c| {
            !matches!(c, '&' | ' ' | ')' | '"' | '\'' | '#')
        });
    }
    out
}

/// Replaces the run of `keep` characters after each `marker` with REDACTED.
fn redact_after(text: &str, marker: &str, keep: impl Fn(char) -> bool) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = find_ignore_case(rest, marker) {
        let value_start = at + marker.len();
        out.push_str(&rest[..value_start]);
        let tail = &rest[value_start..];
        let len = tail.find(|c: char| !keep(c)).unwrap_or(tail.len());
        if len > 0 && !tail.starts_with(REDACTED) {
            out.push_str(REDACTED);
        } else {
            out.push_str(&tail[..len]);
        }
        rest = &tail[len..];
    }
    out.push_str(rest);
    out
}

fn find_ignore_case(haystack: &str, needle: &str) -> Option<usize> {
    haystack.char_indices().map(|(i, _)| i).find(|&i| {
        haystack
            .get(i..i + needle.len())
            .is_some_and(|s| s.eq_ignore_ascii_case(needle))
    })
}

/// `scheme://user:password@host` loses its `user:password`.
fn redact_url_credentials(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let host_start = at + 3;
        out.push_str(&rest[..host_start]);
        let tail = &rest[host_start..];
        let authority_end = tail
            .find(['/', '?', '#', ' ', ')', '"'])
            .unwrap_or(tail.len());
        match tail[..authority_end].rfind('@') {
            Some(userinfo_end) => {
                out.push_str(REDACTED);
                rest = &tail[userinfo_end..];
            }
            None => rest = tail,
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_redacted() {
        let key = "sk-test-ABCDEF123456";
        let text = format!(
            "error sending request for url (https://user:pa55@api.example/v1/chat?key={key}&x=1): Authorization: Bearer {key} rejected"
        );
        let red = redact(&text, &[key]);
        assert!(!red.contains(key), "{red}");
        assert!(!red.contains("pa55"), "{red}");
        assert!(
            red.contains("https://[REDACTED]@api.example/v1/chat"),
            "{red}"
        );
        assert!(red.contains("x=1"), "{red}");
        assert_eq!(redact("plain words stay", &[key]), "plain words stay");
        assert_eq!(redact("bearer abc.def", &[]), "bearer [REDACTED]");
    }

    #[test]
    fn a_key_is_redacted_wherever_it_stands() {
        let key = "sk-live-0123456789abcdef";
        let cases = [
            format!("{key} was refused"),
            format!("refused: {key}"),
            format!("{key}{key} and {key} again"),
            format!("(\"{key}\"), [{key}]; {key}."),
            format!("https://api.example/v1?api_key={key}&stream=false"),
            format!("wss://{key}@gateway.example/path"),
            format!("Authorization: Bearer {key}"),
            format!("bearer {key}\nnext line"),
        ];
        for text in &cases {
            let out = redact(text, &[key]);
            assert!(!out.contains(key), "{text:?} -> {out:?}");
            assert!(!out.contains("0123456789abcdef"), "{text:?} -> {out:?}");
            assert!(out.contains(REDACTED), "{text:?} -> {out:?}");
        }
        // What surrounds a key is kept.
        assert_eq!(
            redact(&format!("(\"{key}\"), next"), &[key]),
            "(\"[REDACTED]\"), next"
        );
        assert_eq!(
            redact(&format!("{key}{key} x"), &[key]),
            "[REDACTED][REDACTED] x"
        );
        assert_eq!(
            redact("https://api.example/v1?key=abc123&model=m#frag", &[]),
            "https://api.example/v1?key=[REDACTED]&model=m#frag"
        );
        assert_eq!(
            redact("see https://user:pw@host.example/x and http://other/y", &[]),
            "see https://[REDACTED]@host.example/x and http://other/y"
        );
        // Token-like parameters by name, any case, and only their value.
        assert_eq!(
            redact("GET /v1?Access_Token=t0k3n1 HTTP/1.1", &[]),
            "GET /v1?Access_Token=[REDACTED] HTTP/1.1"
        );
        assert_eq!(redact("token= (nothing)", &[]), "token= (nothing)");
        // A short "secret" would blank ordinary words, so it is not used.
        assert_eq!(redact("abc is fine", &["abc"]), "abc is fine");
        assert_eq!(
            redact("abcdef is a key", &["abcdef"]),
            "[REDACTED] is a key"
        );
        // Credentials in a URL at the very start of the text.
        assert_eq!(redact("ws://u:pw@h/x", &[]), "ws://[REDACTED]@h/x");
        assert_eq!(redact("a://b", &[]), "a://b");
        // A bearer token ends at white space or at the quote around it.
        assert_eq!(
            redact(r#"{"auth":"Bearer abc123","next":1}"#, &[]),
            r#"{"auth":"Bearer [REDACTED]","next":1}"#
        );
        assert_eq!(
            redact("headers={'Authorization': 'Bearer abc123', 'x': 1}", &[]),
            "headers={'Authorization': 'Bearer [REDACTED]', 'x': 1}"
        );
        // Already redacted text stays as it is.
        assert_eq!(redact("Bearer [REDACTED]", &[]), "Bearer [REDACTED]");
    }
}
