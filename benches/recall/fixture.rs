//! The recall fixture: long, deterministic conversations between a user
//! and an assistant, with facts planted in them whose answers are
//! distinctive strings, some of them changed later.
//!
//! Made for every benchmark that asks "what came back": GetContext's
//! cover today, Search tomorrow. Each `Fact` knows its session, the seq it
//! was said at (and its update's), the question that asks for it in the
//! fact's own words, a paraphrased question in other words, and the answer
//! string a reader looks for. `generate` is a pure function of its
//! arguments (its own PRNG, no dependency whose stream could change), so
//! every build, run and later benchmark sees the same sessions.
//!
//! What a session holds:
//! - `FACTS` planted facts whatever its length, one in each of `FACTS`
//!   equal slices of the session, at a random place in its slice; each
//!   worded one of three ways: a first-person statement by the user, the
//!   assistant confirming what the user asked it to keep (the user's ask
//!   just before carries no answer), or a decision said by either side;
//!   often with a sentence of the current topic before or after it.
//! - `UPDATES` of those facts changed later ("I changed my gym locker code:
//!   it is now K7-4417"); an update never repeats the old value, so an old
//!   value returned without its update is a stale answer.
//! - Filler everywhere else: a rotation of topics, user messages of one to
//!   three sentences, assistant explanations of one to four, and short
//!   acknowledgements; about 15 to 60 estimated tokens an entry. The filler
//!   has its own names, cities, numbers, times, weekdays and months, and
//!   first-person sentences, none of them an answer: generation checks that
//!   no entry but a fact's own contains any answer.

use super::pools::{self, Kind, SLOTS, Topic};

/// Facts planted in every session, whatever its length.
pub const FACTS: usize = 20;
/// How many of them are changed later.
pub const UPDATES: usize = 5;
/// The shortest session that holds them.
pub const MIN_ENTRIES: usize = 100;
/// Longest entry the filler writes, in bytes (60 estimated tokens).
const MAX_BYTES: usize = 224;

/// Who says an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Speaker {
    User,
    Assistant,
}

/// One entry of a session, at seq `index + 1`.
#[derive(Clone, Debug)]
pub struct Message {
    pub speaker: Speaker,
    pub content: String,
}

/// How a fact was worded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    /// The user, in the first person.
    Statement,
    /// The assistant confirming what the user asked it to keep.
    Confirmed,
    /// A decision, said by either side.
    Decision,
}

impl Style {
    pub fn label(self) -> &'static str {
        match self {
            Style::Statement => "statement",
            Style::Confirmed => "confirmed",
            Style::Decision => "decision",
        }
    }
}

/// A later change of a fact's value.
#[derive(Clone, Debug)]
pub struct Update {
    pub seq: u64,
    pub answer: String,
}

/// A fact planted in a session.
#[derive(Clone, Debug)]
pub struct Fact {
    pub session: String,
    /// Index into `pools::SLOTS`: what the fact is about.
    pub slot: usize,
    pub kind: Kind,
    pub style: Style,
    /// Where it was said.
    pub seq: u64,
    /// The value as first said.
    pub answer: String,
    /// Its change, if it changed.
    pub update: Option<Update>,
    /// The question that asks for it, in the fact's own words.
    pub question: &'static str,
    /// The question in other words.
    pub paraphrase: &'static str,
}

impl Fact {
    /// What the answer is now.
    pub fn current(&self) -> &str {
        self.update.as_ref().map_or(&self.answer, |u| &u.answer)
    }

    /// The value that no longer holds, if the fact changed.
    pub fn stale(&self) -> Option<&str> {
        self.update.as_ref().map(|_| self.answer.as_str())
    }

    /// Where the current value was said.
    pub fn current_seq(&self) -> u64 {
        self.update.as_ref().map_or(self.seq, |u| u.seq)
    }

    /// What the fact is about, for a person ("my gym locker code").
    pub fn about(&self) -> &'static str {
        SLOTS[self.slot].mine
    }
}

/// A generated session.
pub struct Session {
    pub id: String,
    pub seed: u64,
    /// Oldest first: `entries[i]` is seq `i + 1`.
    pub entries: Vec<Message>,
    pub facts: Vec<Fact>,
}

/// One subject's memory: a timeline cut into sessions.
pub struct Subject {
    pub name: String,
    pub timeline: Session,
    /// The index of each session's first entry in the timeline, then the
    /// timeline's length.
    cuts: Vec<usize>,
}

impl Subject {
    /// `generate`'s timeline of `entries` for `name`, cut into `sessions`.
    pub fn new(name: String, entries: usize, seed: u64, sessions: usize) -> Subject {
        let timeline = generate(&name, entries, seed);
        let cuts = cuts(entries, sessions);
        Subject {
            name,
            timeline,
            cuts,
        }
    }

    pub fn session_name(&self, k: usize) -> String {
        format!("{}-{k:02}", self.name)
    }

    pub fn session(&self, k: usize) -> &[Message] {
        &self.timeline.entries[self.cuts[k]..self.cuts[k + 1]]
    }

    /// Whether `session` is one of this subject's.
    pub fn owns(&self, session: &str) -> bool {
        session
            .strip_prefix(self.name.as_str())
            .is_some_and(|rest| rest.starts_with('-'))
    }
}

/// Where a timeline of `entries` is cut into `sessions`: each session's
/// first index, then `entries`. Cuts fall at even seqs, so a session opens
/// with the user and a confirmed fact's ask stays beside it.
pub fn cuts(entries: usize, sessions: usize) -> Vec<usize> {
    (0..sessions)
        .map(|k| (k * entries / sessions) & !1)
        .chain(std::iter::once(entries))
        .collect()
}

/// The seed of the `k`th session of `entries` entries in a run seeded
/// with `seed`: sessions of each size and index differ, runs with one seed
/// repeat.
pub fn session_seed(seed: u64, entries: usize, k: usize) -> u64 {
    let mut rng = Rng(seed ^ (entries as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    rng.next();
    rng.0 ^= (k as u64).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    rng.next()
}

/// The session `id` of `entries` entries (at least `MIN_ENTRIES`).
pub fn generate(id: &str, entries: usize, seed: u64) -> Session {
    assert!(
        entries >= MIN_ENTRIES,
        "a recall session holds at least {MIN_ENTRIES} entries"
    );
    let mut rng = Rng(seed);
    let facts = plant(id, entries, &mut rng);
    let answers: Vec<String> = facts
        .iter()
        .flat_map(|f| {
            std::iter::once(f.answer.clone()).chain(f.update.iter().map(|u| u.answer.clone()))
        })
        .map(|a| a.to_lowercase())
        .collect();
    for (i, a) in answers.iter().enumerate() {
        for (j, b) in answers.iter().enumerate() {
            assert!(
                i == j || !b.contains(a.as_str()),
                "answer {a} is inside {b}"
            );
        }
    }
    // What the facts say, and whether a sentence of the topic may join it
    // (not a user's ask, which says nothing of its own).
    let mut said: Vec<Option<(Message, bool)>> = vec![None; entries];
    for fact in &facts {
        let slot = &SLOTS[fact.slot];
        let i = fact.seq as usize - 1;
        let speaker = speaker_at(i);
        let core = match fact.style {
            Style::Statement => {
                let frame = *rng.pick(pools::USER_FRAMES);
                let statement = slot.statement.replace("{A}", &fact.answer);
                frame.replace("{S}", &within(frame, &statement))
            }
            Style::Decision => slot.decision.replace("{A}", &fact.answer),
            Style::Confirmed => {
                let ask = rng.pick(pools::USER_ASKS).replace("{M}", slot.mine);
                said[i - 1] = Some((
                    Message {
                        speaker: Speaker::User,
                        content: ask,
                    },
                    false,
                ));
                rng.pick(pools::ASSISTANT_FRAMES)
                    .replace("{Y}", slot.yours)
                    .replace("{A}", &fact.answer)
            }
        };
        said[i] = Some((
            Message {
                speaker,
                content: core,
            },
            true,
        ));
        if let Some(update) = &fact.update {
            let j = update.seq as usize - 1;
            let content = match speaker_at(j) {
                Speaker::User => rng.pick(pools::UPDATES).replace("{M}", slot.mine),
                Speaker::Assistant => rng.pick(ASSISTANT_UPDATES).replace("{M}", slot.yours),
            };
            said[j] = Some((
                Message {
                    speaker: speaker_at(j),
                    content: content.replace("{A}", &update.answer),
                },
                true,
            ));
        }
    }
    // Filler around and inside the facts' entries, topic by topic.
    let clean = |text: &str| {
        let lower = text.to_lowercase();
        !answers.iter().any(|a| lower.contains(a.as_str()))
    };
    let mut topic = rng.below(pools::TOPICS.len());
    let mut left_in_topic = 6 + rng.below(15);
    let mut out = Vec::with_capacity(entries);
    for (i, planted) in said.into_iter().enumerate() {
        if left_in_topic == 0 {
            topic = (topic + 1 + rng.below(pools::TOPICS.len() - 1)) % pools::TOPICS.len();
            left_in_topic = 6 + rng.below(15);
        }
        left_in_topic -= 1;
        let t = &pools::TOPICS[topic];
        let message = match planted {
            Some((mut m, joinable)) => {
                // A fact among the talk: a sentence of the topic before or
                // after it, half the time, if it stays short enough.
                if joinable && rng.below(2) == 0 {
                    let extra = loop {
                        let s = sentence(t, m.speaker, &mut rng);
                        if clean(&s) {
                            break s;
                        }
                    };
                    if m.content.len() + extra.len() < MAX_BYTES + 40 {
                        m.content = match rng.below(2) {
                            0 => format!("{extra} {}", m.content),
                            _ => format!("{} {extra}", m.content),
                        };
                    }
                }
                m
            }
            None => loop {
                let m = filler(t, speaker_at(i), &mut rng);
                if clean(&m.content) {
                    break m;
                }
            },
        };
        out.push(message);
    }
    Session {
        id: id.to_owned(),
        seed,
        entries: out,
        facts,
    }
}

const ASSISTANT_UPDATES: &[&str] = &[
    "Updated: {M} is now {A}.",
    "Okay, I've replaced the old one; {M} is {A} now.",
];

/// `sentence` as it reads inside `frame`: lower-cased after a lead-in
/// that ends in a colon or a comma ("Oh, before I forget: my ..."),
/// unless it starts with "I".
fn within(frame: &str, sentence: &str) -> String {
    let lead = frame.split("{S}").next().unwrap_or("");
    if !(lead.ends_with(": ") || lead.ends_with(", "))
        || sentence.starts_with("I ")
        || sentence.starts_with("I'")
    {
        return sentence.to_owned();
    }
    let mut chars = sentence.chars();
    chars
        .next()
        .map(|c| c.to_lowercase().chain(chars).collect())
        .unwrap_or_default()
}

/// Users speak at even indices (odd seqs), the assistant at odd ones.
fn speaker_at(index: usize) -> Speaker {
    match index % 2 {
        0 => Speaker::User,
        _ => Speaker::Assistant,
    }
}

/// Where the facts go, what they are and what they say.
fn plant(id: &str, entries: usize, rng: &mut Rng) -> Vec<Fact> {
    let mut slots: Vec<usize> = (0..SLOTS.len()).collect();
    rng.shuffle(&mut slots);
    slots.truncate(FACTS);
    let mut taken = vec![false; entries];
    let mut used_answers: Vec<String> = Vec::new();
    let slice = entries / FACTS;
    let mut facts = Vec::with_capacity(FACTS);
    for (n, &slot) in slots.iter().enumerate() {
        // A place in this fact's slice, never the first entry (a confirmed
        // fact needs the user's ask before it).
        let i = loop {
            let i = (n * slice + rng.below(slice)).max(1);
            if !taken[i] && !taken[i - 1] {
                break i;
            }
        };
        let style = match (speaker_at(i), rng.below(3)) {
            (Speaker::User, 0) => Style::Decision,
            (Speaker::User, _) => Style::Statement,
            (Speaker::Assistant, 0) => Style::Decision,
            (Speaker::Assistant, _) => Style::Confirmed,
        };
        taken[i] = true;
        if style == Style::Confirmed {
            taken[i - 1] = true;
        }
        let answer = answer(SLOTS[slot].kind, &used_answers, rng);
        used_answers.push(answer.clone());
        facts.push(Fact {
            session: id.to_owned(),
            slot,
            kind: SLOTS[slot].kind,
            style,
            seq: i as u64 + 1,
            answer,
            update: None,
            question: SLOTS[slot].question,
            paraphrase: SLOTS[slot].paraphrase,
        });
    }
    // The updates: facts said in the first 70 % of the session whose value
    // can change, changed somewhere after it, at least half a slice later.
    let mut candidates: Vec<usize> = (0..facts.len())
        .filter(|&f| SLOTS[facts[f].slot].updatable && (facts[f].seq as usize) < entries * 7 / 10)
        .collect();
    rng.shuffle(&mut candidates);
    for &f in candidates.iter().take(UPDATES) {
        let from = facts[f].seq as usize + slice / 2;
        let j = loop {
            let j = from + rng.below(entries - from);
            if !taken[j] {
                break j;
            }
        };
        taken[j] = true;
        let answer = answer(facts[f].kind, &used_answers, rng);
        used_answers.push(answer.clone());
        facts[f].update = Some(Update {
            seq: j as u64 + 1,
            answer,
        });
    }
    facts
}

/// A distinctive answer of `kind`, not one of `used`.
fn answer(kind: Kind, used: &[String], rng: &mut Rng) -> String {
    loop {
        let a = match kind {
            Kind::Name => rng.pick(pools::ANSWER_NAMES).to_string(),
            Kind::City => rng.pick(pools::ANSWER_CITIES).to_string(),
            Kind::Date => format!("{} {}", 10 + rng.below(19), rng.pick(pools::MONTHS)),
            Kind::Code => {
                let mut letter = || char::from(*rng.pick(pools::CODE_LETTERS));
                let (a, b, c) = (letter(), letter(), letter());
                match rng.below(3) {
                    0 => format!("{a}{}-{:04}", rng.below(10), rng.below(10_000)),
                    1 => format!("{a}{b}{:03}{c}", rng.below(1000)),
                    _ => format!("{:04}-{a}{b}", 1000 + rng.below(9000)),
                }
            }
        };
        if !used.contains(&a) {
            return a;
        }
    }
}

/// One sentence of `topic` for `speaker`, placeholders filled.
fn sentence(topic: &Topic, speaker: Speaker, rng: &mut Rng) -> String {
    let pool = match speaker {
        Speaker::User => topic.user,
        Speaker::Assistant => topic.assistant,
    };
    let template = *rng.pick(pool);
    let text = fill(template, topic, rng);
    // A sentence that opens with a thing ("{X} adds flavour") starts with
    // a capital all the same.
    let mut chars = text.chars();
    chars
        .next()
        .map(|c| c.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}

/// A filler entry: an acknowledgement now and then, otherwise a few
/// sentences of the topic, at most `MAX_BYTES`.
fn filler(topic: &Topic, speaker: Speaker, rng: &mut Rng) -> Message {
    let (acks, most) = match speaker {
        Speaker::User => (pools::USER_ACKS, 3),
        Speaker::Assistant => (pools::ASSISTANT_ACKS, 4),
    };
    let content = if rng.below(9) == 0 {
        rng.pick(acks).to_string()
    } else {
        let n = 1 + rng.below(most);
        let mut text = String::new();
        let mut said = Vec::new();
        for _ in 0..n {
            // Distinct sentences: a person does not say one thing twice in
            // a message.
            let s = sentence(topic, speaker, rng);
            let head: String = s.chars().take(12).collect();
            if said.contains(&head) {
                continue;
            }
            if !text.is_empty() && text.len() + 1 + s.len() > MAX_BYTES {
                break;
            }
            said.push(head);
            if !text.is_empty() {
                text.push(' ');
            }
            text.push_str(&s);
        }
        text
    };
    Message { speaker, content }
}

/// `template` with its placeholders filled with the filler's own
/// distractors and `topic`'s things.
fn fill(template: &str, topic: &Topic, rng: &mut Rng) -> String {
    let mut out = String::with_capacity(template.len() + 16);
    let mut rest = template;
    while let Some(start) = rest.find('{') {
        out.push_str(&rest[..start]);
        let end = start + rest[start..].find('}').expect("closed placeholder");
        let value = match &rest[start + 1..end] {
            "N" => (2 + rng.below(59)).to_string(),
            "T" => format!("{}:{:02}", 6 + rng.below(6), 15 * rng.below(4)),
            "P" => rng.pick(pools::FILLER_NAMES).to_string(),
            "C" => rng.pick(pools::FILLER_PLACES).to_string(),
            "D" => rng.pick(pools::WEEKDAYS).to_string(),
            "Mo" => rng.pick(pools::MONTHS).to_string(),
            "V" => format!("{}.{}", 1 + rng.below(5), rng.below(13)),
            "$" => format!("${}", 100 + 50 * rng.below(60)),
            "X" => rng.pick(topic.things).to_string(),
            other => panic!("unknown placeholder {{{other}}}"),
        };
        out.push_str(&value);
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out
}

/// splitmix64: small, fast, and the same stream forever.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.below(i + 1));
        }
    }
}
