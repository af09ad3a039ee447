//! Every prompt archivist sends, in one place, each with the version that
//! every summary written from it records (`prompt_version`). Change a text,
//! bump its version.

use super::RecapInput;
use crate::model::Entry;

/// A system prompt and its version.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Prompt {
    pub(crate) version: &'static str,
    pub(crate) system: &'static str,
}

/// A level-1 recap: a segment of entries, with the summary of what came
/// before it as context.
pub(crate) const RECAP: Prompt = Prompt {
    version: "recap-v3",
    system: "You write recaps of conversation segments for an AI agent's long-term memory. \
Keep every fact, decision, open question, name, number and commitment the agent may need later; \
drop greetings and filler. Say who said or decided what, by the speaker's name where a line \
gives one, and when, by the date the lines give (\"On 14 Nov 2023 Maya said ...\"). Write plain \
sentences in the past tense, in the language of the conversation, with no preamble. When the \
message gives earlier context, use it only to keep names and threads straight: do not retell it.",
};

/// Folding the recaps of consecutive parts of one oversized segment.
pub(crate) const FOLD: Prompt = Prompt {
    version: "fold-v1",
    system: "You merge recaps of consecutive parts of one conversation into a single recap for \
an AI agent's long-term memory. Keep every fact, decision, open question, name, number and \
commitment; remove repetition. Write plain sentences in the past tense, with no preamble.",
};

/// A roll-up: one recap of consecutive recaps of a conversation, for the
/// level above them in the memory tree.
pub(crate) const ROLLUP: Prompt = Prompt {
    version: "rollup-v2",
    system: "You condense consecutive recaps of one long conversation into one shorter recap for \
an AI agent's long-term memory, which will stand in for all of them. It must be no longer than \
the longest of them, however many there are. Keep the facts, decisions, open questions, names, \
numbers and commitments that still matter, at least one from every recap; drop detail that a \
later recap supersedes. Write plain sentences in the past tense, with no preamble.",
};

/// The size a roll-up is asked for: about as long as the longest recap it
/// condenses, so that a node is the size of one whatever its level.
fn rollup_target(children: &[String]) -> String {
    let words = children
        .iter()
        .map(|c| c.split_whitespace().count())
        .max()
        .unwrap_or(0)
        .max(20);
    words_line(words)
}

fn words_line(words: usize) -> String {
    format!("Write one recap of at most {words} words.")
}

/// What introduces carried context in a recap request.
const CARRY_HEADER: &str = "Earlier in this conversation (context only; do not retell it):";
/// What introduces the segment after carried context.
const SEGMENT_HEADER: &str = "The conversation segment to recap:";

/// The prompt and the user message of one request.
pub(crate) fn request(input: &RecapInput<'_>) -> (Prompt, String) {
    match input {
        RecapInput::Entries { entries, carry } => {
            let transcript = render_entries(entries);
            let user = match carry {
                Some(carry) => format!("{CARRY_HEADER}\n{carry}\n\n{SEGMENT_HEADER}\n{transcript}"),
                None => transcript,
            };
            (RECAP, user)
        }
        RecapInput::Parts(parts) => (FOLD, render_numbered("Part", parts)),
        RecapInput::Children(children) => (
            ROLLUP,
            format!(
                "{}\n\n{}",
                render_numbered("Recap", children),
                rollup_target(children)
            ),
        ),
    }
}

/// The longest system prompt and framing, in estimated tokens: what every
/// request spends before its content.
pub(crate) fn overhead_tokens() -> u32 {
    let longest = [RECAP.system, FOLD.system, ROLLUP.system]
        .into_iter()
        .map(crate::model::estimate_tokens)
        .max()
        .unwrap_or(0);
    longest
        + crate::model::estimate_tokens(CARRY_HEADER)
        + crate::model::estimate_tokens(SEGMENT_HEADER)
        + crate::model::estimate_tokens(&words_line(usize::MAX))
}

/// A transcript as a provider reads it: one line an entry, labelled with
/// its role, its speaker's name when it has one, and, on the first line
/// and wherever the day changes, when it was said: `user Maya (14 Nov 2023
/// 09:12): ...`, then `assistant: ...`.
pub(crate) fn render_entries(entries: &[Entry]) -> String {
    let mut out = String::new();
    let mut last_day = None;
    for (i, e) in entries.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(e.role.as_str());
        if let Some(name) = &e.name {
            out.push(' ');
            out.push_str(name);
        }
        let (day, time) = crate::text::day_and_time(e.occurred_at);
        if last_day.as_ref() != Some(&day) {
            out.push_str(&format!(" ({day} {time})"));
            last_day = Some(day);
        }
        out.push_str(": ");
        out.push_str(&e.content);
    }
    out
}

/// What an entry's label may cost beyond what its own estimate allows for
/// (`estimate_tokens` counts four tokens for a role): its speaker's name
/// and its day and time, so planning keeps every request within budget.
pub(crate) fn label_tokens(e: &Entry) -> u32 {
    const STAMP: u32 = 6;
    STAMP + e.name.as_ref().map_or(0, |n| n.len() as u32 / 3 + 1)
}

fn render_numbered(label: &str, texts: &[String]) -> String {
    let mut out = String::new();
    for (i, text) in texts.iter().enumerate() {
        if i > 0 {
            out.push_str("\n\n");
        }
        out.push_str(&format!("{label} {}:\n{text}", i + 1));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Millis, Role};

    #[test]
    fn a_transcript_names_speakers_and_dates_each_day_once() {
        let said = |role, name: Option<&str>, at: i64, text: &str| Entry {
            seq: 1,
            client_entry_id: None,
            role,
            content: text.to_owned(),
            created_at: Millis(0),
            tokens: crate::model::estimate_tokens(text),
            occurred_at: Millis(at),
            name: name.map(str::to_owned),
            metadata: Default::default(),
        };
        let monday = 1_699_953_120_000;
        let text = render_entries(&[
            said(Role::User, Some("Maya"), monday, "Where is the key?"),
            said(
                Role::Assistant,
                None,
                monday + 60_000,
                "Under the flowerpot.",
            ),
            said(Role::User, Some("Tom"), monday + 86_400_000, "I moved it."),
        ]);
        assert_eq!(
            text,
            "user Maya (14 Nov 2023 09:12): Where is the key?\n\
             assistant: Under the flowerpot.\n\
             user Tom (15 Nov 2023 09:12): I moved it."
        );
    }
}
