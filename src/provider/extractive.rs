//! The built-in `extractive` summariser: no LLM, no network. It keeps the
//! sentences that carry information — terms rare in what it summarises,
//! names, numbers and codes, first-person statements, decisions and
//! changes — and drops acknowledgements and filler. Each message it keeps
//! from stays one line, labelled with its speaker, in the original order.
//! A recap of recaps (a roll-up) keeps the best line of every child before
//! any child's second line, and is about as long as one child's recap, so
//! a roll-up is no longer at level 5 than at level 2. Deterministic: the
//! same input gives the same recap, byte for byte.

use std::collections::{HashMap, HashSet};

use super::Recap;
use crate::model::{Entry, Millis, estimate_tokens};
use crate::text::prefix;

pub const NAME: &str = "extractive";
/// Part of the provider's identity (and fingerprint): kept as it is across
/// versions of the method, which `PROMPT_VERSION` tells apart.
pub const MODEL: &str = "extractive-v1";
pub const PROMPT_VERSION: &str = "extractive-5";

/// The most a recap holds, in estimated tokens, whatever the output budget
/// and whatever its level: about a tenth of a segment of the default size.
const RECAP_TOKENS: u32 = 150;
/// The least a recap is allowed, so that a short segment keeps a line or
/// two.
const MIN_RECAP_TOKENS: u32 = 48;
/// A sentence worth less than this share of the best one is left out.
const FLOOR: f64 = 0.3;
/// A level-1 recap is about this share of what it summarises.
const RECAP_SHARE: u32 = 10;

#[derive(Clone, Copy, Debug, Default)]
pub struct Extractive;

/// A sentence of the input and what it is worth.
struct Sentence<'a> {
    /// The message (or child recap line) it is from.
    unit: usize,
    text: &'a str,
    score: f64,
    /// Its terms but numbers: what it is about, to tell an update.
    keys: HashSet<String>,
    /// A change of a named value ("my locker code is now VM248D"): kept
    /// before anything else of its child, so that the value it replaces,
    /// which another node may keep, never comes back alone.
    correction: bool,
}

impl Extractive {
    /// The recap of a transcript: each message kept is one line that says
    /// who said it.
    pub fn summarise(&self, entries: &[Entry], max_output_tokens: u32) -> Recap {
        let input_tokens: u32 = entries.iter().map(|e| e.tokens).sum();
        let target = (input_tokens / RECAP_SHARE).clamp(MIN_RECAP_TOKENS, RECAP_TOKENS);
        let units: Vec<Unit<'_>> = entries
            .iter()
            .map(|e| Unit {
                label: Some(e.name.as_deref().unwrap_or(e.role.as_str())),
                at: Some(e.occurred_at),
                day: None,
                text: &e.content,
                group: 0,
            })
            .collect();
        let text = pick(&units, target.min(max_output_tokens.max(16)), false);
        recap(text, input_tokens)
    }

    /// The recap of recaps (a roll-up, or a fold of a segment's parts):
    /// their lines already say who said what and are kept as they are, the
    /// best line of every child first, within about one child's length.
    pub fn summarise_recaps(&self, recaps: &[Entry], max_output_tokens: u32) -> Recap {
        let input_tokens: u32 = recaps.iter().map(|e| e.tokens).sum();
        // What one recap may hold: a roll-up is no longer than a child may
        // be.
        let target = RECAP_TOKENS;
        let units: Vec<Unit<'_>> = recaps
            .iter()
            .enumerate()
            .flat_map(|(child, r)| {
                // Each line carries the day its recap last dated: a line
                // kept without the one that dated it still says when.
                let mut day: Option<String> = None;
                r.content
                    .lines()
                    .filter(|l| l.chars().any(char::is_alphanumeric))
                    .map(move |line| {
                        if let Some(d) = dated(line) {
                            day = Some(d.to_owned());
                        }
                        Unit {
                            label: None,
                            at: None,
                            day: day.clone(),
                            text: line.trim(),
                            group: child,
                        }
                    })
            })
            .collect();
        let text = pick(&units, target.min(max_output_tokens.max(16)), true);
        recap(text, input_tokens)
    }
}

fn recap(text: String, input_tokens: u32) -> Recap {
    Recap {
        output_tokens: estimate_tokens(&text),
        text,
        model: MODEL.to_owned(),
        prompt_version: PROMPT_VERSION.to_owned(),
        input_tokens,
    }
}

/// One message (or one line of a child's recap) of the input.
struct Unit<'a> {
    /// Who said it (its name, else its role), to label a kept line with;
    /// None for a line of a child's recap, which says it already.
    label: Option<&'a str>,
    /// When a message was said.
    at: Option<Millis>,
    /// The day a child's line was said on, as its recap last dated it.
    day: Option<String>,
    text: &'a str,
    /// The child it belongs to (a roll-up's); 0 for a transcript.
    group: usize,
}

impl Unit<'_> {
    /// The kept line. `last_day` is the day of the line kept before it: a
    /// line names its day when it is another, so a recap says who and
    /// when (`Maya (14 Nov 2023): ...`) without repeating
    /// the date on every line of one sitting.
    fn line(&self, sentences: &[&str], last_day: &mut Option<String>) -> String {
        let body = sentences.join(" ");
        match (self.label, self.at, &self.day) {
            (Some(label), Some(at), _) => {
                // The day, not the time: a recap stands for a stretch of
                // the day, its node carries the exact times, and every
                // byte of a label is a byte less of what was said.
                let (day, _) = crate::text::day_and_time(at);
                if last_day.as_deref() == Some(day.as_str()) {
                    return format!("{label}: {body}");
                }
                let line = format!("{label} ({day}): {body}");
                *last_day = Some(day);
                line
            }
            (Some(label), None, _) => format!("{label}: {body}"),
            (None, _, Some(day)) if last_day.as_ref() != Some(day) => {
                *last_day = Some(day.clone());
                match dated(&body) {
                    Some(_) => body,
                    None => with_day(&body, day),
                }
            }
            (None, _, _) => body,
        }
    }
}

/// The day of a recap line labelled `Speaker (14 Nov 2023): ...` (or, as
/// extractive-4 wrote it, `Speaker (14 Nov 2023 09:12): ...`).
fn dated(line: &str) -> Option<&str> {
    let (label, _) = line.split_once("): ")?;
    let (_, stamp) = label.rsplit_once(" (")?;
    let day = match stamp.rsplit_once(' ') {
        Some((day, time)) if time.len() == 5 && time.as_bytes()[2] == b':' => day,
        _ => stamp,
    };
    let mut parts = day.split(' ');
    let looks = day.split(' ').count() == 3
        && parts.next().is_some_and(|d| d.parse::<u8>().is_ok())
        && parts.nth(1).is_some_and(|y| y.parse::<i32>().is_ok());
    (looks && label.len() <= 100).then_some(day)
}

/// A recap line given its day: `Tom: ...` becomes `Tom (14 Nov 2023):
/// ...`, a line with no speaker `(14 Nov 2023) ...`.
fn with_day(line: &str, day: &str) -> String {
    match line.split_once(": ") {
        Some((speaker, rest))
            if !speaker.is_empty() && speaker.len() <= 64 && !speaker.contains(['(', ':']) =>
        {
            format!("{speaker} ({day}): {rest}")
        }
        _ => format!("({day}) {line}"),
    }
}

/// The recap's text: the sentences worth the most, within `target`
/// estimated tokens, each unit's kept sentences as one line, in order.
/// With `per_group`, every group's best line comes before any group's
/// second, and a unit is kept whole (a child's line is not cut again).
fn pick(units: &[Unit<'_>], target: u32, per_group: bool) -> String {
    let sentences = score(units, per_group);
    // Best first; ties go to the earlier sentence.
    let mut ranked: Vec<usize> = (0..sentences.len())
        .filter(|&i| sentences[i].score > 0.0)
        .collect();
    ranked.sort_by(|&a, &b| {
        let (x, y) = (&sentences[a], &sentences[b]);
        y.correction
            .cmp(&x.correction)
            .then(y.score.total_cmp(&x.score))
            .then(a.cmp(&b))
    });
    // What is worth far less than the best is filler, even where it fits.
    let best = ranked
        .iter()
        .map(|&i| sentences[i].score)
        .fold(0.0, f64::max);
    ranked.retain(|&i| sentences[i].correction || sentences[i].score >= best * FLOOR);
    // Round by round: a group's (a roll-up's child's) n-th best line is
    // ranked after every group's (n-1)-th; in a transcript, a
    // message's second sentence after every message's best, so that a
    // message's best sentence speaks for it before any takes two
    // places. Corrections come before every round: a child holding two
    // of them must not lose the second to another child's best line, or
    // the old value (kept further up the tree) comes back alone.
    let mut round: HashMap<usize, usize> = HashMap::new();
    let mut rounds: Vec<(usize, usize)> = ranked
        .iter()
        .map(|&i| {
            if sentences[i].correction {
                return (0, i);
            }
            let key = match per_group {
                true => units[sentences[i].unit].group,
                false => sentences[i].unit,
            };
            let n = round.entry(key).or_default();
            *n += 1;
            (*n, i)
        })
        .collect();
    rounds.sort_by_key(|&(n, _)| n);
    ranked = rounds.into_iter().map(|(_, i)| i).collect();

    // Each kept sentence, as kept: the first may be cut to fit.
    let mut chosen: Vec<(usize, &str)> = Vec::new();
    let mut used = 0u32;
    let mut seen: HashSet<&str> = HashSet::new();
    let mut opened: HashSet<usize> = HashSet::new();
    for i in ranked {
        let s = &sentences[i];
        // A sentence said again (a repeated instruction, a pasted log
        // line) is worth one place in the recap, not several.
        if !seen.insert(s.text) {
            continue;
        }
        // A sentence joining a line already kept costs its words; one that
        // opens a line costs its label too.
        let cost = match opened.contains(&s.unit) {
            true => estimate_tokens(s.text).saturating_sub(3),
            // The first line's label carries its day and time too (a
            // segment seldom spans two days: `segment.max_gap`).
            false if opened.is_empty() && units[s.unit].at.is_some() => estimate_tokens(s.text) + 6,
            false => estimate_tokens(s.text) + 2,
        };
        let text = match (used + cost > target, chosen.is_empty()) {
            (false, _) => s.text,
            (true, false) => continue,
            // The best sentence alone is over the target (a pasted log, a
            // wall of text with no full stop): what fits of it, so that no
            // recap, and no roll-up above it, is larger than the target.
            (true, true) => prefix(s.text, target.saturating_sub(14) as usize * 4),
        };
        used += cost.min(target);
        opened.insert(s.unit);
        chosen.push((i, text));
    }
    chosen.sort_unstable_by_key(|&(i, _)| i);

    if chosen.is_empty() {
        // Nothing sentence-like at all (say, only symbols): keep the first
        // unit, cut to the budget.
        return units
            .first()
            .map(|u| {
                u.line(
                    &[prefix(
                        u.text.trim(),
                        target.saturating_sub(14) as usize * 4,
                    )],
                    &mut None,
                )
            })
            .unwrap_or_default();
    }
    let mut lines = Vec::new();
    let mut last_day = None;
    let mut k = 0;
    while k < chosen.len() {
        let unit = sentences[chosen[k].0].unit;
        let mut parts = Vec::new();
        while k < chosen.len() && sentences[chosen[k].0].unit == unit {
            parts.push(chosen[k].1);
            k += 1;
        }
        lines.push(units[unit].line(&parts, &mut last_day));
    }
    lines.join("\n")
}

/// Every sentence of `units` with its score (a unit is one sentence with
/// `whole`). What a sentence is worth: its distinct terms, each weighted by
/// how rare it is in the input (a term in one sentence of forty weighs
/// most, one in half of them next to nothing); more for numbers, codes and
/// names; more for a first-person statement, a decision or a change;
/// divided by the square root of its length, so that a long sentence is
/// not worth more for being long. Acknowledgements and filler are worth
/// nothing, a question less than a statement, and a statement a later one
/// updates (it shares its terms and says "now", "changed", ...) less than
/// the update.
fn score<'a>(units: &'a [Unit<'a>], whole: bool) -> Vec<Sentence<'a>> {
    let mut sentences: Vec<(Sentence<'a>, Vec<Term>)> = Vec::new();
    for (u, unit) in units.iter().enumerate() {
        let texts: Vec<&str> = match whole {
            true => vec![unit.text],
            false => split_sentences(unit.text).collect(),
        };
        for text in texts {
            sentences.push((
                Sentence {
                    unit: u,
                    text,
                    score: 0.0,
                    keys: HashSet::new(),
                    correction: false,
                },
                terms(text),
            ));
        }
    }
    let mut df: HashMap<String, u32> = HashMap::new();
    for (_, terms) in &sentences {
        let distinct: HashSet<&str> = terms.iter().map(|t| t.word.as_str()).collect();
        for w in distinct {
            *df.entry(w.to_owned()).or_default() += 1;
        }
    }
    let n = sentences.len() as f64;
    let mut scored: Vec<(Sentence<'a>, bool, Option<String>)> = Vec::new();
    for (mut s, terms) in sentences {
        let mut seen = HashSet::new();
        let mut total = 0.0;
        for t in &terms {
            if !seen.insert(t.word.as_str()) {
                continue;
            }
            let rarity = (1.0 + n / f64::from(df.get(&t.word).copied().unwrap_or(1))).ln();
            let kind = match (t.digits, t.letters, t.capital) {
                (true, true, _) => 2.5,  // a code: K7-4417, A320, v2
                (true, false, _) => 1.5, // a number: 4417, 2025
                (false, _, true) => 1.5, // a name: Ingrid, Tallinn
                (false, _, false) => 1.0,
            };
            total += rarity * kind;
        }
        let lower = s.text.to_lowercase();
        let words: Vec<&str> = lower
            .split(|c: char| !c.is_alphanumeric() && c != '\'')
            .filter(|w| !w.is_empty())
            .collect();
        let has = |set: &[&str]| words.iter().any(|w| set.contains(w));
        let mut cue = 1.0;
        if has(FIRST_PERSON) {
            cue += 0.3;
        }
        if has(MEMO) {
            cue += 0.3;
        }
        // "My sister's name is Ingrid", "your locker code is K7-4417": a
        // statement of what something of the speaker's is, with a value
        // that names it, is what a memory is for.
        let specific = terms.iter().any(|t| (t.digits && t.letters) || t.capital);
        if specific && has(POSSESSIVE) && has(COPULA) {
            cue *= 1.8;
        }
        if has(DECISION) {
            cue += 0.3;
        }
        let update = has(UPDATE) || says_now(&words) || lower.contains("no longer");
        // A correction of a value is what a memory must not lose: the
        // value it replaces may already be kept elsewhere in the tree.
        // Change words alone ("the dashboards were never updated") say
        // nothing has changed.
        s.correction = update && terms.iter().any(|t| t.digits || t.capital);
        if s.correction {
            cue *= 1.6;
        }
        if s.text.trim_end().ends_with('?') {
            cue *= 0.6;
        }
        let filler = terms.is_empty() || words.iter().all(|w| is_filler(w));
        s.score = match filler {
            true => 0.0,
            false => total * cue / (words.len() as f64 + 8.0),
        };
        // One plain word ("Nice weather.") says little.
        if let [only] = terms.as_slice()
            && !only.digits
            && !only.capital
        {
            s.score *= 0.5;
        }
        let frame = frame(s.text);
        s.keys = terms
            .into_iter()
            .filter(|t| !t.digits)
            .map(|t| t.word)
            .collect();
        scored.push((s, update, frame));
    }
    // The same statement said again with another value ("Our budget is
    // about $1800" ... "Our budget is about $650"): the newest holds, the
    // earlier ones are what it replaced. Grouping by frame keeps this
    // linear in the sentences.
    let mut newest: HashMap<&str, usize> = HashMap::new();
    for (i, (_, _, frame)) in scored.iter().enumerate() {
        if let Some(frame) = frame {
            newest.insert(frame.as_str(), i);
        }
    }
    let restated: Vec<bool> = scored
        .iter()
        .enumerate()
        .map(|(i, (s, _, frame))| {
            frame
                .as_deref()
                .and_then(|f| newest.get(f))
                .is_some_and(|&j| j != i && scored[j].0.unit != s.unit)
        })
        .collect();
    // A statement that a later update shares two terms with is worth less
    // than the update: the update is what holds now.
    // Only the updates are compared with what came before them: the work
    // is the sentences times the updates, not the sentences squared.
    let updates: Vec<usize> = (0..scored.len()).filter(|&j| scored[j].1).collect();
    for i in 0..scored.len() {
        let superseded = restated[i]
            || updates.iter().filter(|&&j| j > i).any(|&j| {
                let (later, earlier) = (&scored[j].0, &scored[i].0);
                later.unit != earlier.unit && later.keys.intersection(&earlier.keys).count() >= 2
            });
        if superseded {
            scored[i].0.score *= 0.1;
        }
    }
    scored.into_iter().map(|(s, _, _)| s).collect()
}

/// What a statement of a value is about, to tell it said again with
/// another value: its terms up to its first "is" (all of them: "the order
/// for client 2" is not "the order for client 3"), and after it those
/// that are no value (no number, code or name). None for a sentence that
/// states no value, or whose frame is a single word.
fn frame(sentence: &str) -> Option<String> {
    let words: Vec<&str> = sentence.split_whitespace().collect();
    let cut = words.iter().position(|w| {
        let w = w.trim_matches(|c: char| !c.is_alphanumeric() && c != '\'');
        COPULA.contains(&w.to_lowercase().as_str())
    })?;
    let subject = terms(&words[..cut].join(" "));
    let rest = terms(&words[cut + 1..].join(" "));
    let frame: Vec<String> = subject
        .into_iter()
        .chain(rest.into_iter().filter(|t| !t.digits && !t.capital))
        .map(|t| t.word)
        .collect();
    (frame.len() >= 2).then(|| frame.join(" "))
}

/// A content word of a sentence, lower-cased, and what it looks like.
struct Term {
    word: String,
    digits: bool,
    letters: bool,
    /// Capitalised where a sentence does not start: a name.
    capital: bool,
}

/// A sentence's content words: runs of letters, digits and inner `-`, `_`
/// or `.` (so a code such as `K7-4417` or a version `2.4.1` is one term),
/// of three letters or more or holding a digit, stop words and speaker
/// labels left out.
fn terms(sentence: &str) -> Vec<Term> {
    // A recap line's dated label (`Tom (14 Nov 2023): `) is who and
    // when, not what: its words and numbers are no terms.
    let sentence = match dated(sentence) {
        Some(_) => sentence
            .split_once("): ")
            .map_or(sentence, |(_, rest)| rest),
        None => sentence,
    };
    let mut out = Vec::new();
    let mut first = true;
    for raw in sentence.split(|c: char| !(c.is_alphanumeric() || "-_.'".contains(c))) {
        let word = raw.trim_matches(|c: char| !c.is_alphanumeric());
        let word = word.strip_suffix("'s").unwrap_or(word);
        if word.is_empty() {
            continue;
        }
        let starts = std::mem::replace(&mut first, false);
        let digits = word.chars().any(|c| c.is_ascii_digit());
        let letters = word.chars().any(char::is_alphabetic);
        let lower = word.to_lowercase();
        if !digits
            && (word.chars().count() < 3
                || STOP_WORDS.contains(&lower.as_str())
                || ACKS.contains(&lower.as_str()))
        {
            continue;
        }
        if LABELS.contains(&lower.as_str()) && !starts {
            continue;
        }
        let capital = !starts && word.chars().next().is_some_and(char::is_uppercase);
        out.push(Term {
            word: lower,
            digits,
            letters,
            capital,
        });
    }
    // A recap line's speaker label ("user:", "assistant:") is no term.
    if let Some(t) = out.first()
        && LABELS.contains(&t.word.as_str())
        && sentence
            .trim_start()
            .to_lowercase()
            .starts_with(&format!("{}:", t.word))
    {
        out.remove(0);
    }
    out
}

/// A word that carries nothing: a stop word, an acknowledgement or a
/// greeting.
fn is_filler(word: &str) -> bool {
    STOP_WORDS.contains(&word) || ACKS.contains(&word) || LABELS.contains(&word) || word.len() < 3
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
            '.' if abbreviation(&text[start..i]) => false,
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

/// Whether `before` (a sentence so far) ends in a title or an initial
/// whose full stop ends no sentence: "Dr. Lysander", "J. Smith".
fn abbreviation(before: &str) -> bool {
    let word = before
        .rsplit(|c: char| !c.is_alphabetic())
        .next()
        .unwrap_or("");
    let mut letters = word.chars();
    match (letters.next(), letters.next()) {
        (Some(c), None) => c.is_uppercase(),
        _ => TITLES.contains(&word.to_lowercase().as_str()),
    }
}

const TITLES: &[&str] = &[
    "dr", "mr", "mrs", "ms", "prof", "st", "mt", "jr", "sr", "vs",
];

const LABELS: &[&str] = &["user", "assistant", "system", "tool"];

/// Words of a first-person statement.
const FIRST_PERSON: &[&str] = &[
    "i", "i'm", "i've", "i'd", "my", "mine", "we", "we're", "our",
];
/// Whose something is.
const POSSESSIVE: &[&str] = &["my", "your", "our", "his", "her", "their"];
/// What something is.
const COPULA: &[&str] = &["is", "are", "was", "were", "be", "it's", "that's"];
/// Words of a thing to be remembered.
const MEMO: &[&str] = &[
    "remember", "noted", "note", "keep", "written", "forget", "mind",
];
/// Words of a decision or commitment.
const DECISION: &[&str] = &[
    "decided",
    "decide",
    "agreed",
    "chose",
    "chosen",
    "going",
    "settled",
    "plan",
    "will",
    "we'll",
    "i'll",
    "must",
    "deadline",
    "confirmed",
];
/// Words of a change to something said before.
const UPDATE: &[&str] = &[
    "changed",
    "change",
    "instead",
    "anymore",
    "moved",
    "switched",
    "updated",
    "update",
    "actually",
    "correction",
    "replaced",
];

/// "It is now K7", "from now on", "... is Lisbon now": a value that holds
/// from now; not "now the tests fail" or "I'll tell you now".
/// ("No longer" is a change too; "a longer timeout" is not.)
fn says_now(words: &[&str]) -> bool {
    words.iter().enumerate().any(|(i, &w)| {
        w == "now"
            && (i + 1 == words.len()
                || words.get(i + 1) == Some(&"on")
                || i.checked_sub(1)
                    .and_then(|p| words.get(p))
                    .is_some_and(|p| COPULA.contains(p)))
    })
}

/// Acknowledgements and greetings: a sentence of these alone is filler.
const ACKS: &[&str] = &[
    "sounds",
    "good",
    "great",
    "thanks",
    "thank",
    "okay",
    "sure",
    "cool",
    "nice",
    "got",
    "perfect",
    "awesome",
    "hello",
    "hey",
    "cheers",
    "right",
    "yeah",
    "yep",
    "noted",
    "understood",
    "welcome",
    "fine",
    "alright",
    "glad",
    "help",
    "helps",
    "makes",
    "sense",
    "appreciate",
    "lot",
    "much",
    "will",
    "do",
    "see",
    "know",
    "let",
    "me",
    "anything",
    "else",
    "happy",
    "hope",
];

const STOP_WORDS: &[&str] = &[
    "about",
    "after",
    "again",
    "all",
    "also",
    "and",
    "any",
    "are",
    "because",
    "been",
    "before",
    "being",
    "but",
    "can",
    "could",
    "did",
    "does",
    "doing",
    "for",
    "from",
    "had",
    "has",
    "have",
    "her",
    "here",
    "him",
    "his",
    "how",
    "into",
    "its",
    "just",
    "let",
    "like",
    "may",
    "more",
    "most",
    "not",
    "now",
    "off",
    "once",
    "one",
    "only",
    "other",
    "our",
    "out",
    "over",
    "own",
    "please",
    "same",
    "she",
    "should",
    "some",
    "such",
    "than",
    "that",
    "the",
    "their",
    "them",
    "then",
    "there",
    "these",
    "they",
    "this",
    "those",
    "through",
    "too",
    "under",
    "until",
    "very",
    "was",
    "way",
    "were",
    "what",
    "when",
    "where",
    "which",
    "while",
    "who",
    "whom",
    "why",
    "will",
    "with",
    "would",
    "yes",
    "you",
    "your",
    "thanks",
    "thank",
    "okay",
    "it's",
    "i'm",
    "i've",
    "that's",
    "there's",
    "we're",
    "you're",
    "don't",
    "didn't",
    "can't",
    "won't",
    "isn't",
    "let's",
    "get",
    "got",
    "going",
    "know",
    "think",
    "want",
    "need",
    "really",
    "well",
    "much",
    "many",
    "still",
    "even",
    "back",
    "make",
    "made",
    "see",
    "look",
    "take",
    "yet",
    "each",
    "every",
    "both",
    "few",
    "lot",
    "thing",
    "things",
    "something",
    "anything",
    "everything",
    "today",
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
            occurred_at: Millis(0),
            name: None,
            metadata: Default::default(),
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
    fn recaps_and_roll_ups_say_who_and_when() {
        const DAY: i64 = 86_400_000;
        // 14 Nov 2023 09:12 UTC.
        let monday = 1_699_953_120_000;
        let said = |seq, name: &str, at: i64, text: &str| Entry {
            name: Some(name.to_owned()),
            occurred_at: Millis(at),
            ..entry(seq, Role::User, text)
        };
        let day1 = [
            said(1, "Maya", monday, "The spare key is under the flowerpot."),
            said(2, "Tom", monday + 60_000, "My locker code is 4711."),
        ];
        let recap1 = Extractive.summarise(&day1, 512);
        let lines: Vec<&str> = recap1.text.lines().collect();
        assert_eq!(
            lines,
            [
                "Maya (14 Nov 2023): The spare key is under the flowerpot.",
                "Tom: My locker code is 4711.",
            ]
        );
        let day2 = [said(
            3,
            "Tom",
            monday + DAY,
            "I moved the key to Mrs Lindqvist.",
        )];
        let recap2 = Extractive.summarise(&day2, 512);
        assert!(
            recap2.text.starts_with("Tom (15 Nov 2023): "),
            "{}",
            recap2.text
        );
        // A roll-up keeps every child's day, even for a line kept without
        // the one that dated it.
        let child = |seq, text: &str| Entry {
            content: text.to_owned(),
            tokens: estimate_tokens(text),
            ..entry(seq, Role::Assistant, "")
        };
        let undated = "Maya (14 Nov 2023 09:12): Okay.\nTom: My locker code is 4711.";
        let roll_up =
            Extractive.summarise_recaps(&[child(1, undated), child(2, &recap2.text)], 512);
        let lines: Vec<&str> = roll_up.text.lines().collect();
        assert!(
            lines.contains(&"Tom (14 Nov 2023): My locker code is 4711."),
            "{}",
            roll_up.text
        );
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("Tom (15 Nov 2023): I moved")),
            "{}",
            roll_up.text
        );
        // The labels' numbers are no terms: the code still ranks as one.
        assert!(roll_up.text.contains("4711"));
    }

    #[test]
    fn never_empty_for_non_empty_input() {
        let entries = vec![entry(1, Role::Tool, "{}")];
        let recap = Extractive.summarise(&entries, 16);
        assert_eq!(recap.text, "tool (1 Jan 1970): {}");
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

    fn filler(i: u64) -> Entry {
        let lines = [
            "Sounds good, thanks!",
            "Let me check the build again and get back to you.",
            "The sprint needs another look tomorrow.",
            "Okay.",
            "We could move the standup to 10 on Thursday if the team agrees.",
            "I think the sprint review went fine overall.",
        ];
        let role = if i.is_multiple_of(2) {
            Role::User
        } else {
            Role::Assistant
        };
        entry(i, role, lines[i as usize % lines.len()])
    }

    #[test]
    fn a_fact_among_filler_is_kept_and_acknowledgements_are_not() {
        let mut entries: Vec<Entry> = (1..=50).map(filler).collect();
        entries[23] = entry(
            24,
            Role::User,
            "By the way, my sister's name is Ingrid and she lives in Tallinn.",
        );
        let recap = Extractive.summarise(&entries, 512);
        assert!(recap.text.contains("Ingrid"), "{}", recap.text);
        assert!(!recap.text.contains("Sounds good"), "{}", recap.text);
        assert!(
            !recap.text.lines().any(|l| l == "user: Okay."),
            "{}",
            recap.text
        );
        assert!(
            recap.output_tokens <= RECAP_TOKENS + 20,
            "{}",
            recap.output_tokens
        );
    }

    #[test]
    fn one_message_stays_one_line() {
        let entries = vec![
            entry(
                1,
                Role::User,
                "My flight is AF-1742 on Monday. The gate code is 8812.",
            ),
            entry(2, Role::Assistant, "Sounds good, thanks!"),
        ];
        let recap = Extractive.summarise(&entries, 512);
        let lines: Vec<&str> = recap.text.lines().collect();
        assert!(lines.len() <= 2, "{}", recap.text);
        assert!(
            lines[0].starts_with("user (1 Jan 1970): ")
                && lines[0].contains("AF-1742")
                && lines[0].contains("8812"),
            "{}",
            recap.text
        );
    }

    #[test]
    fn an_update_outranks_the_value_it_replaces() {
        let recaps = [
            entry(1, Role::Assistant, "user: My locker code is K7-4417."),
            entry(
                2,
                Role::Assistant,
                "user: The sprint review went fine overall.",
            ),
            entry(
                3,
                Role::Assistant,
                "user: I changed my locker code, it is now K9-2093.",
            ),
        ];
        let recap = Extractive.summarise_recaps(&recaps, 512);
        let new = recap.text.find("K9-2093").expect("the update kept");
        if let Some(old) = recap.text.find("K7-4417") {
            assert!(old < new, "{}", recap.text);
        }
        // When only one fits, it is the update.
        let tight = Extractive.summarise_recaps(&recaps, 24);
        assert!(tight.text.contains("K9-2093"), "{}", tight.text);
        assert!(!tight.text.contains("K7-4417"), "{}", tight.text);
    }

    #[test]
    fn a_roll_up_keeps_the_best_line_of_every_child_before_a_second() {
        // Four children of three lines each; room for about five lines.
        let recaps: Vec<Entry> = (1..=4u64)
            .map(|k| {
                entry(
                    k,
                    Role::Assistant,
                    &format!(
                        "user: The order for client {k} is PO-{k}{k}71.\n\
                         assistant: The sprint needs another look tomorrow, part {k}.\n\
                         user: The review went fine, part {k}."
                    ),
                )
            })
            .collect();
        let recap = Extractive.summarise_recaps(&recaps, 80);
        for k in 1..=4 {
            assert!(
                recap.text.contains(&format!("PO-{k}{k}71")),
                "{}",
                recap.text
            );
        }
        assert!(recap.output_tokens <= 80, "{}", recap.output_tokens);
    }

    /// A recap is never longer than its target, however long the best
    /// sentence: a wall of text with no full stop is cut, and so is a
    /// roll-up of such recaps.
    #[test]
    fn a_huge_sentence_is_cut_to_the_target() {
        let wall = "Ingrid code K7-4417 ".repeat(3000);
        let recap = Extractive.summarise(&[entry(1, Role::User, &wall)], 512);
        assert!(
            recap.output_tokens <= RECAP_TOKENS,
            "{}",
            recap.output_tokens
        );
        assert!(
            recap
                .text
                .starts_with("user (1 Jan 1970): Ingrid code K7-4417"),
            "{}",
            &recap.text[..40]
        );
        let children: Vec<Entry> = (1..=4)
            .map(|i| entry(i, Role::Assistant, &format!("user: {wall}")))
            .collect();
        let roll_up = Extractive.summarise_recaps(&children, 512);
        assert!(
            roll_up.output_tokens <= RECAP_TOKENS,
            "{}",
            roll_up.output_tokens
        );
        let digits = "7".repeat(64 * 1024);
        let recap = Extractive.summarise(&[entry(1, Role::Tool, &digits)], 512);
        assert!(
            recap.output_tokens <= RECAP_TOKENS,
            "{}",
            recap.output_tokens
        );
    }

    #[test]
    fn a_longer_timeout_is_no_update() {
        let entries = vec![
            entry(
                1,
                Role::User,
                "The billing deploy failed last night; the migration timed out.",
            ),
            entry(
                2,
                Role::Assistant,
                "I will rerun the billing migration with a longer timeout.",
            ),
        ];
        let recap = Extractive.summarise(&entries, 512);
        assert!(recap.text.contains("deploy failed"), "{}", recap.text);
        assert!(recap.text.contains("longer timeout"), "{}", recap.text);
    }

    #[test]
    fn a_title_or_an_initial_ends_no_sentence() {
        let sentences: Vec<&str> = split_sentences(
            "I switched practices, so my doctor will be Dr. Lysander. J. R. Smith agreed.",
        )
        .collect();
        assert_eq!(
            sentences,
            [
                "I switched practices, so my doctor will be Dr. Lysander.",
                "J. R. Smith agreed."
            ]
        );
    }

    #[test]
    fn every_message_s_best_sentence_comes_before_a_second_one() {
        // The first message's tip is worth more than the other messages'
        // facts, but comes only after each of them: with room for three
        // lines, it is left out.
        let entries = vec![
            entry(
                1,
                Role::User,
                "My gym locker code is K7-4417. Stretching the Achilles and calves before the Tuesday run at Lakeside helps a lot.",
            ),
            entry(2, Role::User, "My sister's name is Ingrid."),
            entry(3, Role::User, "The staging server is VM248D."),
        ];
        let recap = Extractive.summarise(&entries, 512);
        for value in ["K7-4417", "Ingrid", "VM248D"] {
            assert!(recap.text.contains(value), "{value}: {}", recap.text);
        }
        assert!(!recap.text.contains("Stretching"), "{}", recap.text);
    }

    #[test]
    fn the_same_statement_with_a_newer_value_replaces_the_older() {
        let mut entries: Vec<Entry> = (1..=30).map(filler).collect();
        entries.push(entry(
            31,
            Role::User,
            "Our budget is about $1800 for the whole trip.",
        ));
        entries.push(entry(
            32,
            Role::User,
            "Our budget is about $650 for the whole trip.",
        ));
        let recap = Extractive.summarise(&entries, 512);
        assert!(recap.text.contains("$650"), "{}", recap.text);
        assert!(!recap.text.contains("$1800"), "{}", recap.text);
    }

    #[test]
    fn a_correction_is_a_childs_first_line_in_a_roll_up() {
        // Every child has a line worth more than the correction in the
        // third; with room for a line a child, the correction is the one
        // kept of its child (the old value may be kept by another node).
        let recaps: Vec<Entry> = (1..=4u64)
            .map(|k| {
                let mut text = format!(
                    "assistant: Sure, I've written down that your hotel booking reference is C{k}-5248 for the Ljubljana trip."
                );
                if k == 3 {
                    text.push_str("\nassistant: Okay, I've replaced the old one; your dentist appointment is 12 May now.");
                }
                entry(k, Role::Assistant, &text)
            })
            .collect();
        let recap = Extractive.summarise_recaps(&recaps, 112);
        assert!(recap.text.contains("12 May"), "{}", recap.text);
        assert!(!recap.text.contains("C3-5248"), "{}", recap.text);
    }

    #[test]
    fn a_childs_second_correction_comes_before_other_childrens_best_lines() {
        // The third child holds two corrections: with room for about four
        // lines, both are kept, before the other children's own lines (the
        // old values, kept further up the tree, must not come back alone).
        let recaps: Vec<Entry> = (1..=4u64)
            .map(|k| {
                let what = ["gym locker code", "hotel booking reference", "passport number", "parking spot"];
                let mut text = format!(
                    "assistant: Sure, I've written down that your {} is C{k}-5248 for the Ljubljana trip.",
                    what[k as usize - 1]
                );
                if k == 3 {
                    text.push_str("\nassistant: Okay, I've replaced the old one; your dentist appointment is 12 May now.");
                    text.push_str("\nuser: Small change, my landlord's name is now Oksana.");
                }
                entry(k, Role::Assistant, &text)
            })
            .collect();
        let recap = Extractive.summarise_recaps(&recaps, 80);
        assert!(recap.text.contains("12 May"), "{}", recap.text);
        assert!(recap.text.contains("Oksana"), "{}", recap.text);
    }

    #[test]
    fn now_is_a_change_only_where_a_value_holds_from_now() {
        let words = |s: &'static str| s.split(' ').collect::<Vec<_>>();
        assert!(says_now(&words("my locker code is now vm248d")));
        assert!(says_now(&words("it is vm248d from now on")));
        assert!(says_now(&words("your appointment is 12 may now")));
        assert!(!says_now(&words("i upgraded and now the tests fail")));
        assert!(!says_now(&words(
            "i'll tell you my code now so you can remember it"
        )));
    }
}
