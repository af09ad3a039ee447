//! The query language of `Search`: web-search syntax parsed into our own
//! AST, never handed to an engine as the caller wrote it.
//!
//! - words are runs of letters and digits (what the index's tokenizer
//!   keeps); every other character separates words, so `NEAR(`, `*`,
//!   `col:`, `^`, quotes inside words, NUL and SQL fragments are just the
//!   words in them;
//! - `"a phrase"` is its words in order (an unbalanced quote runs to the
//!   end of the query);
//! - `or` (any case) between two terms makes them alternatives;
//! - `-word` / `-"a phrase"` excludes the documents that have it.
//!
//! At most [`MAX_TERMS`] terms and [`MAX_WORDS`] words are read (the rest
//! are ignored, as the proto says: a phrase that reaches the word cap is
//! cut there), and a query longer than [`MAX_QUERY_BYTES`] is refused.
//! Rendering quotes every word itself: FTS5 strings (`"` doubled, though
//! a word never holds one) and a `websearch_to_tsquery` string made only of
//! words, quotes, `or` and `-`, which that function never fails on.

/// The longest query accepted, in bytes.
pub(crate) const MAX_QUERY_BYTES: usize = 4096;
/// The most terms (words or phrases) read from one query.
pub(crate) const MAX_TERMS: usize = 32;
/// The most words read from one query, over all its terms. A phrase's
/// match walks the positions of each of its words in every text that holds
/// them all, inside one step of SQLite's engine (where the work bound
/// cannot count it): `"b a b a …"` of 1,023 words over 20,000 texts
/// holding both took 9 s. The search's budget still bounds what is left.
pub(crate) const MAX_WORDS: usize = 64;

/// A word or a phrase: its words, in order, lowercased.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Term(pub(crate) Vec<String>);

/// A parsed query: every group must match (a group is alternatives
/// joined by `or`), and no excluded term may.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Query {
    pub(crate) all: Vec<Vec<Term>>,
    pub(crate) none: Vec<Term>,
    /// Words the caller quoted alone (`"grew"`): matched as written, never
    /// by their other forms.
    pub(crate) as_written: Vec<String>,
}

/// Why a query cannot be run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum QueryError {
    /// Longer than [`MAX_QUERY_BYTES`].
    TooLong,
    /// No word to look for (empty, only punctuation, or only exclusions).
    NoWords,
}

enum Token {
    Term {
        negated: bool,
        term: Term,
        quoted: bool,
    },
    Or,
}

/// A text's words as the query reads them: runs of letters and digits,
/// lowercased.
pub(crate) fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

/// A word without an English clitic ending (`sister's`, `don't`, `I'm`,
/// `we'll`): the index splits at the apostrophe, and a lone `s` or `t`
/// in a question only ranks texts that hold some other `'s` above the
/// ones that answer it. Phrases keep them (their words must line up).
fn without_clitic(chunk: &str) -> &str {
    let word = chunk.trim_end_matches(|c: char| !c.is_alphanumeric());
    let Some(at) = word.rfind(['\'', '\u{2019}']) else {
        return chunk;
    };
    let ending = word[at..].trim_start_matches(['\'', '\u{2019}']);
    match ending.to_lowercase().as_str() {
        "s" | "t" | "d" | "m" | "ll" | "re" | "ve" => &word[..at],
        _ => chunk,
    }
}

fn tokens(text: &str) -> Vec<Token> {
    let mut out = Vec::new();
    let mut rest = text;
    let (mut terms, mut words_read) = (0, 0);
    while terms < MAX_TERMS && words_read < MAX_WORDS {
        rest = rest.trim_start_matches(|c: char| !c.is_alphanumeric() && c != '"' && c != '-');
        if rest.is_empty() {
            break;
        }
        let negated = rest.starts_with('-');
        if negated {
            rest = &rest[1..];
        }
        let (chunk, phrase) = if let Some(after) = rest.strip_prefix('"') {
            match after.find('"') {
                Some(end) => {
                    rest = &after[end + 1..];
                    (&after[..end], true)
                }
                None => {
                    rest = "";
                    (after, true)
                }
            }
        } else {
            let end = rest
                .find(|c: char| c.is_whitespace() || c == '"')
                .unwrap_or(rest.len());
            let chunk = &rest[..end];
            rest = &rest[end..];
            (chunk, false)
        };
        if !phrase && !negated && chunk.eq_ignore_ascii_case("or") {
            out.push(Token::Or);
            continue;
        }
        let mut found = if phrase {
            words(chunk)
        } else {
            words(without_clitic(chunk))
        };
        if found.is_empty() {
            continue;
        }
        if phrase {
            found.truncate(MAX_WORDS - words_read);
            words_read += found.len();
            terms += 1;
            out.push(Token::Term {
                negated,
                term: Term(found),
                quoted: true,
            });
        } else {
            // `foo-bar` or `a.b`: each word its own term, as the index
            // tokenizes it; a `-` in front negates only the first.
            for (i, w) in found.into_iter().enumerate() {
                if terms == MAX_TERMS || words_read == MAX_WORDS {
                    break;
                }
                terms += 1;
                words_read += 1;
                out.push(Token::Term {
                    negated: negated && i == 0,
                    term: Term(vec![w]),
                    quoted: false,
                });
            }
        }
    }
    out
}

impl Query {
    /// Parses `text`.
    pub(crate) fn parse(text: &str) -> Result<Query, QueryError> {
        if text.len() > MAX_QUERY_BYTES {
            return Err(QueryError::TooLong);
        }
        let mut all: Vec<Vec<Term>> = Vec::new();
        let mut none = Vec::new();
        let mut as_written = Vec::new();
        // An `or` joins the next positive term to the last group, if
        // there is one; anywhere else it is dropped.
        let mut join = false;
        for token in tokens(text) {
            if let Token::Term {
                term, quoted: true, ..
            } = &token
                && let [word] = term.0.as_slice()
            {
                as_written.push(word.clone());
            }
            match token {
                Token::Or => join = !all.is_empty(),
                Token::Term {
                    negated: true,
                    term,
                    ..
                } => {
                    none.push(term);
                    join = false;
                }
                Token::Term {
                    negated: false,
                    term,
                    ..
                } => {
                    match (join, all.last_mut()) {
                        (true, Some(group)) => group.push(term),
                        _ => all.push(vec![term]),
                    }
                    join = false;
                }
            }
        }
        if all.is_empty() {
            return Err(QueryError::NoWords);
        }
        Ok(Query {
            all,
            none,
            as_written,
        })
    }

    /// What the semantic leg embeds: the positive words in their order,
    /// the excluded ones left out. Not the question as typed: measured
    /// with multilingual-e5-small (docs/benchmarks.md, "Search by meaning
    /// with a real embedder"), the words found more of the paraphrased
    /// questions' facts than the question as written (0.500 against 0.383
    /// at 1,000 entries, 0.383 against 0.217 at 10,000).
    pub(crate) fn text(&self) -> String {
        let words: Vec<&str> = self
            .positive()
            .flat_map(|t| t.0.iter().map(String::as_str))
            .collect();
        words.join(" ")
    }

    /// The relaxed form: any one of the positive terms, outside `common`,
    /// with the exclusions kept; `None` when nothing is left.
    pub(crate) fn relaxed(&self, common: &dyn Fn(&Term) -> bool) -> Option<Query> {
        let any: Vec<Term> = self
            .all
            .iter()
            .flatten()
            .filter(|t| !common(t))
            .cloned()
            .collect();
        if any.is_empty() {
            return None;
        }
        Some(Query {
            all: vec![any],
            none: self.none.clone(),
            as_written: self.as_written.clone(),
        })
    }

    /// The query without the groups that hold a term in `common` (an
    /// alternative that is common makes its whole group match almost
    /// anything), the exclusions kept; `None` when no group is left.
    pub(crate) fn without(&self, common: &dyn Fn(&Term) -> bool) -> Option<Query> {
        let all: Vec<Vec<Term>> = self
            .all
            .iter()
            .filter(|g| !g.iter().any(common))
            .cloned()
            .collect();
        if all.is_empty() {
            return None;
        }
        Some(Query {
            all,
            none: self.none.clone(),
            as_written: self.as_written.clone(),
        })
    }

    /// The query with each word's other forms (`forms.rs`) that `keep`
    /// keeps as its alternatives, and excluded with it, while the query
    /// holds fewer than [`MAX_TERMS`] terms (an exclusion's forms first: a
    /// text left out must not come back for want of room); a word quoted
    /// alone keeps to its own form. What the lexical legs look for.
    pub(crate) fn with_forms(&self, keep: &dyn Fn(&Term) -> bool) -> Query {
        let mut out = self.clone();
        let mut terms = out.all.iter().map(Vec::len).sum::<usize>() + out.none.len();
        let as_written = self.as_written.clone();
        let mut room = |list: &mut Vec<Term>, word: &str| {
            if as_written.iter().any(|w| w == word) {
                return;
            }
            for form in super::forms::others(word) {
                let term = Term(vec![form.to_owned()]);
                if terms < MAX_TERMS && keep(&term) && !list.contains(&term) {
                    list.push(term);
                    terms += 1;
                }
            }
        };
        let single = |list: &[Term]| -> Vec<String> {
            (list.iter())
                .filter(|t| t.0.len() == 1)
                .map(|t| t.0[0].clone())
                .collect()
        };
        for word in single(&out.none) {
            room(&mut out.none, &word);
        }
        for group in &mut out.all {
            for word in single(group) {
                room(group, &word);
            }
        }
        out
    }

    /// Every positive term.
    pub(crate) fn positive(&self) -> impl Iterator<Item = &Term> {
        self.all.iter().flatten()
    }

    /// The FTS5 MATCH expression over the column `body`.
    pub(crate) fn fts5(&self) -> String {
        let groups: Vec<String> = self
            .all
            .iter()
            .map(|g| {
                let alts: Vec<String> = g.iter().map(fts5_term).collect();
                format!("({})", alts.join(" OR "))
            })
            .collect();
        let mut out = format!("body : ({})", groups.join(" AND "));
        for t in &self.none {
            out.push_str(" NOT body : ");
            out.push_str(&fts5_term(t));
        }
        out
    }

    /// The text for PostgreSQL's `websearch_to_tsquery`.
    pub(crate) fn websearch(&self) -> String {
        let groups: Vec<String> = self
            .all
            .iter()
            .map(|g| {
                let alts: Vec<String> = g.iter().map(websearch_term).collect();
                alts.join(" or ")
            })
            .collect();
        let mut out = groups.join(" ");
        for t in &self.none {
            out.push_str(" -");
            out.push_str(&websearch_term(t));
        }
        out
    }
}

/// One FTS5 string: the words, each `"` doubled (none can hold one, as
/// `words` splits on it, but the quoting does not rely on that).
pub(crate) fn fts5_term(term: &Term) -> String {
    format!("\"{}\"", term.0.join(" ").replace('"', "\"\""))
}

fn websearch_term(term: &Term) -> String {
    // Words hold only letters and digits, so the quotes cannot be broken.
    format!("\"{}\"", term.0.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(w: &str) -> Term {
        Term(w.split(' ').map(str::to_owned).collect())
    }

    #[test]
    fn words_phrases_or_and_exclusions() {
        let q = Query::parse("Coffee \"oat milk\" tea OR juice -decaf -\"green tea\"").unwrap();
        assert_eq!(
            q.all,
            vec![
                vec![t("coffee")],
                vec![t("oat milk")],
                vec![t("tea"), t("juice")]
            ]
        );
        assert_eq!(q.none, vec![t("decaf"), t("green tea")]);
        assert_eq!(
            q.fts5(),
            "body : ((\"coffee\") AND (\"oat milk\") AND (\"tea\" OR \"juice\")) \
             NOT body : \"decaf\" NOT body : \"green tea\""
        );
        assert_eq!(
            q.websearch(),
            "\"coffee\" \"oat milk\" \"tea\" or \"juice\" -\"decaf\" -\"green tea\""
        );
    }

    #[test]
    fn hostile_input_is_words() {
        let q =
            Query::parse("NEAR(a b) col:x * ^y \"unbalanced '; DROP TABLE entries;--\0").unwrap();
        assert_eq!(
            q.all,
            vec![
                vec![t("near")],
                vec![t("a")],
                vec![t("b")],
                vec![t("col")],
                vec![t("x")],
                vec![t("y")],
                vec![t("unbalanced drop table entries")],
            ]
        );
        assert!(
            q.fts5()
                .chars()
                .all(|c| c.is_alphanumeric() || " ():\"".contains(c))
        );
    }

    #[test]
    fn empty_or_wordless_or_only_negative_is_refused() {
        for q in ["", "   ", "*** ()", "-a -b", "or", "\"\""] {
            assert_eq!(Query::parse(q), Err(QueryError::NoWords), "{q:?}");
        }
        let long = "a ".repeat(MAX_QUERY_BYTES);
        assert_eq!(Query::parse(&long), Err(QueryError::TooLong));
    }

    #[test]
    fn terms_past_the_cap_are_ignored() {
        let text: Vec<String> = (0..100).map(|i| format!("w{i}")).collect();
        let q = Query::parse(&text.join(" ")).unwrap();
        assert_eq!(q.all.len(), MAX_TERMS);
    }

    #[test]
    fn words_past_the_cap_are_ignored_and_a_long_phrase_is_cut() {
        let hostile = format!("\"{}\" tail", "b a ".repeat(1020));
        let q = Query::parse(&hostile).unwrap();
        assert_eq!(
            q.all.len(),
            1,
            "the phrase reached the cap: `tail` is past it"
        );
        assert_eq!(q.all[0][0].0.len(), MAX_WORDS);
        let q = Query::parse(&format!("one two \"{}\"", "x ".repeat(100))).unwrap();
        let counts: Vec<usize> = q.positive().map(|t| t.0.len()).collect();
        assert_eq!(counts, vec![1, 1, MAX_WORDS - 2]);
        let q = Query::parse(&"w ".repeat(40)).unwrap();
        assert_eq!(q.all.len(), MAX_TERMS);
        let phrases = format!("\"{}\" ", "p q r s t u v w x y").repeat(10);
        let q = Query::parse(&phrases).unwrap();
        assert_eq!(q.positive().map(|t| t.0.len()).sum::<usize>(), MAX_WORDS);
    }

    #[test]
    fn clitic_endings_are_not_terms_outside_phrases() {
        let q = Query::parse("What is my sister\u{2019}s name? Don't I'm rock'n'roll").unwrap();
        let all: Vec<Term> = q.all.into_iter().flatten().collect();
        let expected: Vec<Term> = [
            "what", "is", "my", "sister", "name", "don", "i", "rock", "n", "roll",
        ]
        .into_iter()
        .map(t)
        .collect();
        assert_eq!(all, expected);
        let q = Query::parse("\"my sister's name\"").unwrap();
        assert_eq!(q.all, vec![vec![t("my sister s name")]]);
    }

    #[test]
    fn the_semantic_text_is_the_positive_words() {
        let q = Query::parse("  Where do I swim? -pool").unwrap();
        assert_eq!(q.text(), "where do i swim");
    }

    #[test]
    fn without_drops_groups_with_a_common_term() {
        let q = Query::parse("what is my sister OR brother name -dog").unwrap();
        let common = |t: &Term| ["what", "is", "my", "brother"].contains(&t.0[0].as_str());
        let w = q.without(&common).unwrap();
        assert_eq!(w.all, vec![vec![t("name")]]);
        assert_eq!(w.none, vec![t("dog")]);
        assert!(q.without(&|_| true).is_none());
    }

    #[test]
    fn a_words_other_forms_are_its_alternatives_and_excluded_with_it() {
        let q = Query::parse("where did I grow up -went")
            .unwrap()
            .with_forms(&|_| true);
        assert_eq!(
            q.all,
            vec![
                vec![t("where")],
                vec![t("did")],
                vec![t("i")],
                vec![t("grow"), t("grew"), t("grown")],
                vec![t("up")]
            ]
        );
        assert_eq!(q.none, vec![t("went"), t("go"), t("gone")]);
        // A phrase's words must line up as written, and a word quoted
        // alone is that word.
        for quoted in ["\"grow up\"", "\"grew\"", "\"grew\" -\"went\""] {
            let q = Query::parse(quoted).unwrap();
            assert_eq!(q.with_forms(&|_| true), q, "{quoted}");
        }
        // Only the forms kept: "go" left out where it is common.
        let q = Query::parse("gone")
            .unwrap()
            .with_forms(&|t| t.0[0] != "go");
        assert_eq!(q.all, vec![vec![t("gone"), t("went")]]);
        // Never past the term cap, and an exclusion's forms come first.
        let many = format!("{}-went", "grow ".repeat(MAX_TERMS - 3));
        let q = Query::parse(&many).unwrap().with_forms(&|_| true);
        assert_eq!(q.none, vec![t("went"), t("go"), t("gone")]);
        assert_eq!(q.positive().count() + q.none.len(), MAX_TERMS);
    }

    #[test]
    fn relaxed_drops_common_terms_and_keeps_exclusions() {
        let q = Query::parse("where is the cat -dog").unwrap();
        let r = q.relaxed(&|t| t.0[0] == "the" || t.0[0] == "is").unwrap();
        assert_eq!(r.all, vec![vec![t("where"), t("cat")]]);
        assert_eq!(r.none, vec![t("dog")]);
        assert!(q.relaxed(&|_| true).is_none());
    }
}
