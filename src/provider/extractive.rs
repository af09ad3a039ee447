//! The built-in `extractive` summariser: no LLM, no network. It picks the
//! sentences that carry the segment (those dense in the segment's most
//! frequent content words), keeps them in their original order and labels
//! each with its speaker. Deterministic: the same entries give the same
//! recap, byte for byte.

use std::collections::{HashMap, HashSet};

use super::Recap;
use crate::model::{Entry, estimate_tokens};
use crate::text::prefix;

pub const NAME: &str = "extractive";
pub const MODEL: &str = "extractive-v1";
pub const PROMPT_VERSION: &str = "extractive-1";

/// Most sentences a recap keeps, whatever the output budget.
const MAX_SENTENCES: usize = 8;

#[derive(Clone, Copy, Debug, Default)]
pub struct Extractive;

struct Sentence<'a> {
    entry: usize,
    text: &'a str,
    words: Vec<String>,
}

impl Extractive {
    /// The recap of a transcript: each sentence kept says who said it.
    pub fn summarise(&self, entries: &[Entry], max_output_tokens: u32) -> Recap {
        self.pick(entries, max_output_tokens, true)
    }

    /// The recap of recaps (a fold or a roll-up): their lines already say
    /// who said what, so they are kept as they are.
    pub fn summarise_recaps(&self, recaps: &[Entry], max_output_tokens: u32) -> Recap {
        self.pick(recaps, max_output_tokens, false)
    }

    fn pick(&self, entries: &[Entry], max_output_tokens: u32, labelled: bool) -> Recap {
        let render = |entry: &Entry, sentence: &str| match labelled {
            true => render(entry, sentence),
            false => sentence.to_owned(),
        };
        let sentences: Vec<Sentence<'_>> = entries
            .iter()
            .enumerate()
            .flat_map(|(i, e)| {
                split_sentences(&e.content).map(move |text| Sentence {
                    entry: i,
                    text,
                    words: content_words(text),
                })
            })
            .collect();

        let mut freq: HashMap<&str, u32> = HashMap::new();
        for s in &sentences {
            for w in &s.words {
                *freq.entry(w.as_str()).or_default() += 1;
            }
        }

        // Score: the mean frequency of a sentence's distinct content words,
        // damped for very short sentences so that a lone keyword does not win.
        let mut ranked: Vec<(usize, f64)> = sentences
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let mut distinct: Vec<&str> = s.words.iter().map(String::as_str).collect();
                distinct.sort_unstable();
                distinct.dedup();
                let sum: u32 = distinct
                    .iter()
                    .map(|w| freq.get(w).copied().unwrap_or(0))
                    .sum();
                let n = distinct.len() as f64;
                let score = if n == 0.0 {
                    0.0
                } else {
                    f64::from(sum) / n * (n / (n + 2.0))
                };
                (i, score)
            })
            .collect();
        // Highest score first; ties go to the earlier sentence.
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));

        let budget = max_output_tokens.max(16);
        // Short segments keep up to three sentences; longer ones about a third.
        let wanted = sentences
            .len()
            .min(3)
            .max(sentences.len().div_ceil(3))
            .clamp(1, MAX_SENTENCES);
        let mut chosen: Vec<usize> = Vec::new();
        let mut used = 0u32;
        let mut seen: HashSet<&str> = HashSet::new();
        for (i, _) in ranked {
            if chosen.len() == wanted {
                break;
            }
            // A sentence said again (a repeated instruction, a pasted log
            // line) is worth one place in the recap, not several.
            if !seen.insert(sentences[i].text) {
                continue;
            }
            let line = render(&entries[sentences[i].entry], sentences[i].text);
            let cost = estimate_tokens(&line);
            if used + cost > budget && !chosen.is_empty() {
                continue;
            }
            used += cost;
            chosen.push(i);
        }
        chosen.sort_unstable();

        let text = if chosen.is_empty() {
            // Entries with no sentence-like text at all (say, only symbols):
            // keep the first entry, cut to the budget.
            entries
                .first()
                .map(|e| render(e, prefix(e.content.trim(), budget as usize * 4)))
                .unwrap_or_default()
        } else {
            chosen
                .iter()
                .map(|&i| render(&entries[sentences[i].entry], sentences[i].text))
                .collect::<Vec<_>>()
                .join("\n")
        };
        let input_tokens = entries.iter().map(|e| e.tokens).sum();
        Recap {
            output_tokens: estimate_tokens(&text),
            text,
            model: MODEL.to_owned(),
            prompt_version: PROMPT_VERSION.to_owned(),
            input_tokens,
        }
    }
}

fn render(entry: &Entry, sentence: &str) -> String {
    format!("{}: {}", entry.role.as_str(), sentence)
}

/// Sentences: split after `.`, `!` or `?` followed by white space, and at
/// line breaks; trimmed, empty ones dropped.
fn split_sentences(text: &str) -> impl Iterator<Item = &str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let end_here = match c {
            '\n' => true,
            '.' | '!' | '?' => chars.peek().is_none_or(|(_, next)| next.is_whitespace()),
            _ => false,
        };
        if end_here {
            let end = i + c.len_utf8();
            out.push(&text[start..end]);
            start = end;
        }
    }
    out.push(&text[start..]);
    out.into_iter()
        .map(str::trim)
        .filter(|s| s.chars().any(char::is_alphanumeric))
}

/// Lower-cased words of three letters or more that are not stop words.
fn content_words(sentence: &str) -> Vec<String> {
    sentence
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.chars().count() >= 3)
        .map(str::to_lowercase)
        .filter(|w| !STOP_WORDS.contains(&w.as_str()))
        .collect()
}

const STOP_WORDS: &[&str] = &[
    "about", "after", "again", "all", "also", "and", "any", "are", "because", "been", "before",
    "being", "but", "can", "could", "did", "does", "doing", "for", "from", "had", "has", "have",
    "her", "here", "him", "his", "how", "into", "its", "just", "let", "like", "may", "more",
    "most", "not", "now", "off", "once", "one", "only", "other", "our", "out", "over", "own",
    "please", "same", "she", "should", "some", "such", "than", "that", "the", "their", "them",
    "then", "there", "these", "they", "this", "those", "through", "too", "under", "until", "very",
    "was", "way", "were", "what", "when", "where", "which", "while", "who", "whom", "why", "will",
    "with", "would", "yes", "you", "your", "thanks", "thank", "okay",
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Millis, Role};

    fn entry(seq: u64, role: Role, content: &str) -> Entry {
        Entry {
            seq,
            client_entry_id: None,
            role,
            content: content.to_owned(),
            created_at: Millis(0),
            tokens: estimate_tokens(content),
        }
    }

    #[test]
    fn keeps_the_sentences_that_carry_the_segment() {
        let entries = vec![
            entry(
                1,
                Role::User,
                "Hi there. The deploy of the billing service failed last night.",
            ),
            entry(
                2,
                Role::Assistant,
                "The billing service deploy failed because the billing database migration timed out. Nice weather.",
            ),
            entry(
                3,
                Role::User,
                "Can you rerun the billing migration with a longer timeout? Cheers.",
            ),
        ];
        let recap = Extractive.summarise(&entries, 512);
        assert!(recap.text.contains("billing"), "{}", recap.text);
        assert!(!recap.text.contains("Nice weather"), "{}", recap.text);
        assert!(!recap.text.contains("Hi there"), "{}", recap.text);
        // Original order is kept.
        let first = recap.text.find("deploy").expect("deploy kept");
        let last = recap.text.find("rerun").unwrap_or(usize::MAX);
        assert!(first < last, "{}", recap.text);
        assert_eq!(
            recap.input_tokens,
            entries.iter().map(|e| e.tokens).sum::<u32>()
        );
    }

    #[test]
    fn is_deterministic_and_bounded() {
        let long: Vec<Entry> = (0..200)
            .map(|i| {
                entry(
                    i,
                    Role::User,
                    &format!(
                        "Sentence number {i} mentions topic{} and more words here.",
                        i % 7
                    ),
                )
            })
            .collect();
        let a = Extractive.summarise(&long, 64);
        let b = Extractive.summarise(&long, 64);
        assert_eq!(a, b);
        assert!(a.text.lines().count() <= MAX_SENTENCES);
        assert!(a.output_tokens <= 64 + 40, "{}", a.output_tokens);
    }

    #[test]
    fn a_repeated_sentence_is_kept_once() {
        let entries: Vec<Entry> = (0..10)
            .map(|i| entry(i, Role::User, "Run the billing migration again."))
            .chain([entry(10, Role::Assistant, "The billing migration ran.")])
            .collect();
        let recap = Extractive.summarise(&entries, 512);
        assert_eq!(
            recap
                .text
                .matches("Run the billing migration again.")
                .count(),
            1,
            "{}",
            recap.text
        );
    }

    #[test]
    fn never_empty_for_non_empty_input() {
        let entries = vec![entry(1, Role::Tool, "{}")];
        let recap = Extractive.summarise(&entries, 16);
        assert_eq!(recap.text, "tool: {}");
    }

    #[test]
    fn a_recap_of_recaps_keeps_their_lines_as_they_are() {
        let recaps = [
            entry(
                1,
                Role::Assistant,
                "user: The deploy failed.\nassistant: I will rerun it.",
            ),
            entry(2, Role::Assistant, "user: The rerun worked."),
        ];
        let recap = Extractive.summarise_recaps(&recaps, 512);
        assert!(!recap.text.contains("assistant: user:"), "{}", recap.text);
        assert!(
            recap
                .text
                .lines()
                .all(|l| l.starts_with("user: ") || l.starts_with("assistant: ")),
            "{}",
            recap.text
        );
    }
}
