//! The other forms of a query's word that no tokenizer relates: English
//! irregular verbs and plurals ("Where did I grow up?" and "I grew up in
//! Bilbao" share no word but "I" and "up"; porter stemming leaves `grew`
//! apart from `grow` as the plain tokenizer does). A word found here is
//! looked for in any of its forms, as if the caller had written them with
//! `or`. Regular forms are the stemmer's (`search.language = "english"`).
//!
//! Only verbs whose forms are not also a common word of their own are
//! listed: `left` (a side), `saw`, `rose`, `ring`, `sink`, `fly`, `stick`
//! and `shot` (things), `fell`, `felt`, `lent`, `won`, `sat`, `bent`,
//! `lost` and `mean` (words or senses of their own), `lay`/`lie`,
//! `bound`/`ground` and `lead`/`led` are left out, as are the auxiliaries
//! (be, have, do) and modals, which say nothing of what a text is about.

/// Each entry: one verb's or noun's forms.
const FORMS: &[&[&str]] = &[
    &["arise", "arose", "arisen"],
    &["awake", "awoke", "awoken"],
    &["become", "became"],
    &["begin", "began", "begun"],
    &["blow", "blew", "blown"],
    &["break", "broke", "broken"],
    &["breed", "bred"],
    &["bring", "brought"],
    &["build", "built"],
    &["burn", "burnt"],
    &["buy", "bought"],
    &["catch", "caught"],
    &["choose", "chose", "chosen"],
    &["come", "came"],
    &["creep", "crept"],
    &["dig", "dug"],
    &["draw", "drew", "drawn"],
    &["dream", "dreamt"],
    &["drink", "drank", "drunk"],
    &["drive", "drove", "driven"],
    &["eat", "ate", "eaten"],
    &["feed", "fed"],
    &["fight", "fought"],
    &["find", "found"],
    &["flee", "fled"],
    &["forbid", "forbade", "forbidden"],
    &["forget", "forgot", "forgotten"],
    &["forgive", "forgave", "forgiven"],
    &["freeze", "froze", "frozen"],
    &["get", "got", "gotten"],
    &["give", "gave", "given"],
    &["go", "went", "gone"],
    &["grow", "grew", "grown"],
    &["hang", "hung"],
    &["hear", "heard"],
    &["hide", "hid", "hidden"],
    &["hold", "held"],
    &["keep", "kept"],
    &["kneel", "knelt"],
    &["know", "knew", "known"],
    &["learn", "learnt"],
    &["make", "made"],
    &["meet", "met"],
    &["pay", "paid"],
    &["ride", "rode", "ridden"],
    &["run", "ran"],
    &["say", "said"],
    &["see", "seen"],
    &["seek", "sought"],
    &["sell", "sold"],
    &["send", "sent"],
    &["shake", "shook", "shaken"],
    &["show", "shown"],
    &["shrink", "shrank", "shrunk"],
    &["sing", "sang", "sung"],
    &["sleep", "slept"],
    &["speak", "spoke", "spoken"],
    &["spend", "spent"],
    &["stand", "stood"],
    &["steal", "stole", "stolen"],
    &["strike", "struck"],
    &["swear", "swore", "sworn"],
    &["sweep", "swept"],
    &["swim", "swam", "swum"],
    &["take", "took", "taken"],
    &["teach", "taught"],
    &["tell", "told"],
    &["think", "thought"],
    &["throw", "threw", "thrown"],
    &["understand", "understood"],
    &["wake", "woke", "woken"],
    &["wear", "wore", "worn"],
    &["write", "wrote", "written"],
    &["child", "children"],
    &["foot", "feet"],
    &["goose", "geese"],
    &["knife", "knives"],
    &["man", "men"],
    &["mouse", "mice"],
    &["person", "people"],
    &["thief", "thieves"],
    &["tooth", "teeth"],
    &["wife", "wives"],
    &["woman", "women"],
];

/// The other forms of `word` (lowercased), none when it has none listed.
pub(crate) fn others(word: &str) -> impl Iterator<Item = &'static str> + '_ {
    FORMS
        .iter()
        .find(|forms| forms.contains(&word))
        .into_iter()
        .flat_map(|forms| forms.iter().copied())
        .filter(move |form| *form != word)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_form_finds_the_others_and_an_unlisted_word_none() {
        assert_eq!(others("grow").collect::<Vec<_>>(), ["grew", "grown"]);
        assert_eq!(others("grew").collect::<Vec<_>>(), ["grow", "grown"]);
        assert_eq!(others("children").collect::<Vec<_>>(), ["child"]);
        assert_eq!(others("left").count(), 0);
        assert_eq!(others("ring").count(), 0);
        assert_eq!(others("garden").count(), 0);
    }

    #[test]
    fn every_form_belongs_to_one_entry() {
        let mut all: Vec<&str> = FORMS.iter().flat_map(|f| f.iter().copied()).collect();
        let listed = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), listed, "a form listed twice");
        assert!(FORMS.iter().all(|f| f.len() > 1));
    }
}
