//! The words and sentences the recall fixture is made of.
//!
//! Two disjoint vocabularies: the answers of planted facts (unusual first
//! names, codes of a shape no filler uses, cities and dates the filler
//! never mentions) and the filler's own distractors (common names, other
//! cities, plain numbers, times, weekdays), so that a summariser that
//! keeps "anything with a digit or a capital" gains nothing for free.
//! `fixture.rs` checks at generation time that no filler entry contains
//! any answer.

/// What kind of string answers a fact.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Name,
    Code,
    City,
    Date,
}

/// One kind of fact a person mentions once and asks about later.
pub struct Slot {
    pub kind: Kind,
    /// As the user says it ("my gym locker code").
    pub mine: &'static str,
    /// The question that asks for it, worded as the fact was.
    pub question: &'static str,
    /// Whether the value may change later in a conversation (a code, a
    /// date, a place; not a sister's name).
    pub updatable: bool,
    /// As the assistant says it back ("your gym locker code").
    pub yours: &'static str,
    /// A user stating the fact in the first person; `{A}` is the answer.
    pub statement: &'static str,
    /// A decision taken in the conversation, said by either side.
    pub decision: &'static str,
    /// The same thing asked in other words than the fact's.
    pub paraphrase: &'static str,
}

pub const SLOTS: &[Slot] = &[
    Slot {
        kind: Kind::Code,
        mine: "my gym locker code",
        question: "What is my gym locker code?",
        updatable: true,
        yours: "your gym locker code",
        statement: "My gym locker code is {A}, I keep forgetting it.",
        decision: "We agreed the gym locker code stays {A} for the season.",
        paraphrase: "Which combination opens the locker where I work out?",
    },
    Slot {
        kind: Kind::Name,
        mine: "my sister's name",
        question: "What is my sister's name?",
        updatable: false,
        yours: "your sister's name",
        statement: "My sister is called {A}, she is visiting next month.",
        decision: "We agreed that my sister {A} hosts the family dinner this year.",
        paraphrase: "Who is the sibling of mine coming to visit?",
    },
    Slot {
        kind: Kind::Code,
        mine: "my cabin wifi password",
        question: "What is the wifi password at our cabin?",
        updatable: true,
        yours: "your cabin wifi password",
        statement: "The wifi password at our cabin is {A}, write it down somewhere.",
        decision: "Decision made: the cabin wifi password will be {A} from now on.",
        paraphrase: "What do I type to get online at the cabin?",
    },
    Slot {
        kind: Kind::Date,
        mine: "my dentist appointment",
        question: "When is my dentist appointment?",
        updatable: true,
        yours: "your dentist appointment",
        statement: "My dentist appointment is on {A}, first thing in the morning.",
        decision: "Let's book it: the dentist appointment goes on {A}.",
        paraphrase: "When am I supposed to see the person who checks my teeth?",
    },
    Slot {
        kind: Kind::City,
        mine: "the city of my conference",
        question: "Which city am I flying to for the conference?",
        updatable: true,
        yours: "the city of your conference",
        statement: "I'm flying to {A} for the conference this year.",
        decision: "We chose {A} as the city for the conference trip.",
        paraphrase: "Where do I travel for the yearly industry event?",
    },
    Slot {
        kind: Kind::Name,
        mine: "the project codename",
        question: "What is the project codename?",
        updatable: true,
        yours: "the project codename",
        statement: "I named the new project {A} on the planning board.",
        decision: "Final answer on naming: the project codename is {A}.",
        paraphrase: "What did we end up calling the new initiative?",
    },
    Slot {
        kind: Kind::Name,
        mine: "my new manager's name",
        question: "Who is my new manager?",
        updatable: true,
        yours: "your new manager's name",
        statement: "My new manager is {A}, who joined the team last week.",
        decision: "HR confirmed it: {A} becomes my new manager.",
        paraphrase: "Who is the boss I report to now?",
    },
    Slot {
        kind: Kind::Code,
        mine: "my office parking spot",
        question: "Which spot do I park in at the office garage?",
        updatable: true,
        yours: "your office parking spot",
        statement: "I park in spot {A} at the office garage.",
        decision: "Facilities assigned it: my office parking spot is {A}.",
        paraphrase: "Where do I leave the car at work?",
    },
    Slot {
        kind: Kind::Name,
        mine: "my cat's name",
        question: "What is our cat named?",
        updatable: false,
        yours: "your cat's name",
        statement: "Our cat is named {A}, and turns four this year.",
        decision: "The kids voted and the cat's name is {A}.",
        paraphrase: "What do we call our pet at home?",
    },
    Slot {
        kind: Kind::Code,
        mine: "my hotel booking reference",
        question: "What is the hotel booking reference?",
        updatable: true,
        yours: "your hotel booking reference",
        statement: "The hotel booking reference is {A}, in case they ask at the desk.",
        decision: "I went ahead and booked: the hotel reference is {A}.",
        paraphrase: "What number confirms where I'm staying on the trip?",
    },
    Slot {
        kind: Kind::City,
        mine: "my hometown",
        question: "Where did I grow up?",
        updatable: false,
        yours: "your hometown",
        statement: "I grew up in {A}, my parents still live there.",
        decision: "For the form we put down {A} as my hometown.",
        paraphrase: "Where did I spend my childhood?",
    },
    Slot {
        kind: Kind::Date,
        mine: "our wedding anniversary",
        question: "When is our wedding anniversary?",
        updatable: false,
        yours: "your wedding anniversary",
        statement: "Our wedding anniversary is {A}, please don't let me forget.",
        decision: "We decided to celebrate the anniversary on {A} this time.",
        paraphrase: "On what day did my partner and I get married?",
    },
    Slot {
        kind: Kind::Name,
        mine: "my doctor's name",
        question: "Who is my doctor?",
        updatable: false,
        yours: "your doctor's name",
        statement: "My doctor is Dr. {A} at the clinic on the corner.",
        decision: "I switched practices, so my doctor will be Dr. {A}.",
        paraphrase: "Which physician looks after me?",
    },
    Slot {
        kind: Kind::Code,
        mine: "the staging server",
        question: "Which staging server do we deploy to?",
        updatable: true,
        yours: "the staging server",
        statement: "The staging server we deploy to is {A}.",
        decision: "Ops decided the staging server is {A} going forward.",
        paraphrase: "Which machine do test releases go to?",
    },
    Slot {
        kind: Kind::Name,
        mine: "my landlord's name",
        question: "Who is my landlord?",
        updatable: true,
        yours: "your landlord's name",
        statement: "My landlord is {A}, who lives upstairs.",
        decision: "The building was sold, and the new landlord is {A}.",
        paraphrase: "Who owns the flat I rent?",
    },
    Slot {
        kind: Kind::City,
        mine: "the city we're moving to",
        question: "Which city are we moving to?",
        updatable: true,
        yours: "the city you're moving to",
        statement: "We're moving to {A} in the spring.",
        decision: "After a long talk we picked {A} as the city to move to.",
        paraphrase: "Where is my family relocating?",
    },
    Slot {
        kind: Kind::Date,
        mine: "the grant deadline",
        question: "When is the grant deadline?",
        updatable: true,
        yours: "the grant deadline",
        statement: "The grant deadline is {A}, and the budget part is not written yet.",
        decision: "The committee fixed the grant deadline for {A}.",
        paraphrase: "By when must the funding application be in?",
    },
    Slot {
        kind: Kind::Code,
        mine: "my building gate code",
        question: "What is the gate code for my building?",
        updatable: true,
        yours: "your building gate code",
        statement: "The gate code for my building is {A}, the courier will need it.",
        decision: "The residents chose {A} as the new building gate code.",
        paraphrase: "What do I punch in to get through the front gate at home?",
    },
    Slot {
        kind: Kind::Code,
        mine: "my insurance policy number",
        question: "What is my insurance policy number?",
        updatable: true,
        yours: "your insurance policy number",
        statement: "My insurance policy number is {A}, it's on the green card.",
        decision: "I signed the renewal, and the insurance policy number is {A}.",
        paraphrase: "Which number identifies my cover with the insurer?",
    },
    Slot {
        kind: Kind::Name,
        mine: "my daughter's teacher",
        question: "Who is my daughter's teacher?",
        updatable: true,
        yours: "your daughter's teacher",
        statement: "My daughter's teacher is {A}, very patient with the class.",
        decision: "The school placed her with {A} as her teacher this year.",
        paraphrase: "Who teaches my girl at school?",
    },
    Slot {
        kind: Kind::City,
        mine: "the town of our wedding venue",
        question: "Where is our wedding venue?",
        updatable: true,
        yours: "the town of your wedding venue",
        statement: "Our wedding venue is in {A}, by the old harbour.",
        decision: "We signed the contract: the wedding venue will be in {A}.",
        paraphrase: "In which town are we getting married?",
    },
    Slot {
        kind: Kind::Date,
        mine: "my passport renewal date",
        question: "By when does my passport have to be renewed?",
        updatable: true,
        yours: "your passport renewal date",
        statement: "My passport has to be renewed by {A}.",
        decision: "I booked the embassy slot, so the passport renewal is on {A}.",
        paraphrase: "When does my travel document run out?",
    },
    Slot {
        kind: Kind::Name,
        mine: "my contractor's name",
        question: "Who is the contractor doing our kitchen?",
        updatable: true,
        yours: "your contractor's name",
        statement: "The contractor doing our kitchen is {A}.",
        decision: "We hired {A} as the contractor for the kitchen.",
        paraphrase: "Who is renovating the kitchen for us?",
    },
    Slot {
        kind: Kind::Date,
        mine: "the day of my half marathon",
        question: "When is my half marathon?",
        updatable: true,
        yours: "the day of your half marathon",
        statement: "My half marathon is on {A}, so I'm tapering before it.",
        decision: "I registered: the half marathon is on {A}.",
        paraphrase: "When is the long race I'm training for?",
    },
];

/// First person, said by the user: `{S}` is `Slot::statement` filled in.
pub const USER_FRAMES: &[&str] = &[
    "{S}",
    "Oh, before I forget: {S}",
    "Quick note for later. {S}",
    "{S} Just so you have it.",
    "For the record, {S}",
];

/// The user asks the assistant to keep something, without saying it.
pub const USER_ASKS: &[&str] = &[
    "Can you keep track of {M} for me? I'll need it later.",
    "Remind me what I told you about {M} if I ask, okay?",
    "I'll tell you {M} now so you can remember it.",
];

/// The assistant confirming a fact: `{Y}` the slot as it is said back.
pub const ASSISTANT_FRAMES: &[&str] = &[
    "Noted: {Y} is {A}. I'll keep that in mind.",
    "Got it, {Y} is {A}.",
    "Understood. To confirm, {Y} is {A}.",
    "Sure, I've written down that {Y} is {A}.",
];

/// A later change of a fact's value; the old value is never repeated.
pub const UPDATES: &[&str] = &[
    "I changed {M}: it is now {A}.",
    "Update on {M}: it's {A} now, the old one no longer applies.",
    "Correction: {M} is {A} from now on.",
    "Small change, {M} is now {A}.",
];

pub const ANSWER_NAMES: &[&str] = &[
    "Ingrid",
    "Thaddeus",
    "Oksana",
    "Ferdinand",
    "Saoirse",
    "Leopold",
    "Ysolde",
    "Casimir",
    "Henrike",
    "Bartholomew",
    "Ottoline",
    "Radomir",
    "Wilhelmina",
    "Evander",
    "Solveig",
    "Anselm",
    "Marisol",
    "Leocadia",
    "Torvald",
    "Philippa",
    "Quillon",
    "Zenobia",
    "Ignatius",
    "Rosalind",
    "Lysander",
    "Eulalia",
    "Barnaby",
    "Ottilie",
    "Cornelius",
    "Henrietta",
    "Aurelio",
    "Gwendolyn",
];

pub const ANSWER_CITIES: &[&str] = &[
    "Ljubljana",
    "Valparaiso",
    "Tbilisi",
    "Trondheim",
    "Cartagena",
    "Hobart",
    "Bratislava",
    "Ushuaia",
    "Windhoek",
    "Tallinn",
    "Asuncion",
    "Oaxaca",
    "Dubrovnik",
    "Bergen",
    "Salzburg",
    "Bilbao",
    "Nagasaki",
    "Antofagasta",
    "Tromso",
    "Plovdiv",
    "Cuenca",
    "Ballarat",
    "Ghent",
    "Aarhus",
];

pub const MONTHS: &[&str] = &[
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// Letters of answer codes: no vowels, so no code spells a word.
pub const CODE_LETTERS: &[u8] = b"BCDFGHJKLMNPQRSTVWXZ";

// ---- filler -------------------------------------------------------------

/// Names the filler mentions: common ones, none an answer.
pub const FILLER_NAMES: &[&str] = &[
    "Marcus", "Priya", "Sam", "Alex", "Jordan", "Chen", "Maria", "Tom", "Lucy", "Dave", "Nina",
    "Raj", "Emma", "Jake", "Sofia", "Ben", "Olivia", "Leo", "Hannah", "Omar",
];

/// Cities the filler mentions, none an answer.
pub const FILLER_PLACES: &[&str] = &[
    "London", "Paris", "Berlin", "Chicago", "Boston", "Madrid", "Toronto", "Sydney", "Denver",
    "Seattle", "Lisbon", "Rome", "Dublin", "Austin", "Vienna", "Prague",
];

pub const WEEKDAYS: &[&str] = &[
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// Short replies that carry nothing.
pub const USER_ACKS: &[&str] = &[
    "Sounds good, thanks!",
    "Perfect, that works.",
    "Great, thank you.",
    "Okay, will do.",
    "Got it, thanks.",
    "Makes sense.",
    "Nice, appreciate it!",
];

pub const ASSISTANT_ACKS: &[&str] = &[
    "You're welcome!",
    "Happy to help.",
    "Anytime, let me know how it goes.",
    "Glad that helped.",
    "Of course!",
];

/// A topic of filler: what the user says and asks, what the assistant
/// explains. Placeholders: `{N}` a small number, `{T}` a time, `{P}` a
/// person, `{C}` a city, `{D}` a weekday, `{Mo}` a month alone, `{V}` a
/// version, `{$}` an amount.
pub struct Topic {
    pub user: &'static [&'static str],
    pub assistant: &'static [&'static str],
}

pub const TOPICS: &[Topic] = &[
    Topic {
        user: &[
            "I want to bake bread this weekend but my oven runs hot.",
            "How long should I knead the dough?",
            "My last loaf came out dense in the middle.",
            "Is {N} grams of salt too much for a kilo of flour?",
            "{P} gave me a sourdough starter on {D}.",
            "Can I proof it overnight in the fridge?",
            "I only have whole wheat flour at the moment.",
        ],
        assistant: &[
            "Knead for about {N} minutes, until the dough is smooth and springs back when you press it.",
            "A dense crumb usually means it was underproofed, so give it more time at room temperature.",
            "Bake at 230 degrees for the first {N} minutes with steam, then lower the heat.",
            "An overnight proof in the fridge develops flavour and makes the dough easier to score.",
            "Whole wheat absorbs more water, so add a little extra and expect a tighter crumb.",
            "An oven thermometer will tell you how far off your dial is.",
        ],
    },
    Topic {
        user: &[
            "I'm planning a weekend in {C} with {P}.",
            "Should we take the train or fly?",
            "We land around {T} on {D}.",
            "What neighbourhoods are nice for walking?",
            "Our budget is about {$} for the whole trip.",
            "I've been to {C} once before, back in {Mo}.",
        ],
        assistant: &[
            "The train is often faster door to door once you count security and the trip from the airport.",
            "For walking, look at the old town and the river front, both are compact and lively in the evening.",
            "With {$} you can manage a mid-range hotel for two nights and still eat out.",
            "Book museum tickets online ahead of time, the queues on weekends can take an hour.",
            "If you arrive at {T}, you'll have time to check in and catch dinner before the rush.",
        ],
    },
    Topic {
        user: &[
            "My Python script crashes with a key error on line {N}.",
            "I upgraded to version {V} and now the tests fail.",
            "{P} on my team says we should use a dataclass here.",
            "How do I read a large CSV without running out of memory?",
            "The build takes {N} minutes on the CI machine.",
            "Should I catch the exception or let it propagate?",
        ],
        assistant: &[
            "A key error means the dictionary has no such key; use get with a default or check membership first.",
            "Read the file in chunks with an iterator so only a few thousand rows are in memory at once.",
            "Let it propagate unless you can do something useful about it at that level.",
            "Pin the dependency to the previous version while you read the changelog for {V}.",
            "Caching the dependencies between runs usually cuts the build time by half.",
            "A dataclass gives you equality and a readable repr for free, which helps in tests.",
        ],
    },
    Topic {
        user: &[
            "The tomatoes in my garden have yellow leaves.",
            "I water them every morning around {T}.",
            "Should I prune the lower branches?",
            "{P} next door grows huge peppers, I don't know how.",
            "We had frost last {D}, I'm worried about the basil.",
            "Last {Mo} the whole bed got blight.",
        ],
        assistant: &[
            "Yellow lower leaves are often just age, but a spreading yellow can mean too much water.",
            "Watering deeply every {N} days is better than a little each morning.",
            "Pruning the lowest branches improves airflow and keeps soil off the leaves.",
            "Basil hates cold; cover it overnight or bring the pots inside when frost is forecast.",
            "Peppers like warm soil and steady feeding, so a dark mulch and a weekly feed go a long way.",
        ],
    },
    Topic {
        user: &[
            "I started running three times a week.",
            "My knees hurt after about {N} kilometres.",
            "Is it better to run in the morning or after work?",
            "{P} wants me to join a running club on {D}.",
            "I did {N} push-ups today, a new record.",
        ],
        assistant: &[
            "Knee pain early on often comes from doing too much too soon, so keep the weekly distance steady for a while.",
            "Strength work for the hips and thighs protects the knees more than new shoes do.",
            "The best time is the one you can keep doing; consistency matters more than the hour.",
            "A club is a good way to stay motivated and to learn pacing from people with more miles.",
            "Increase your total by no more than about ten percent a week.",
        ],
    },
    Topic {
        user: &[
            "I want to save more each month.",
            "Rent is {$} and it keeps going up.",
            "Should I pay off the credit card first or build savings?",
            "{P} uses a spreadsheet for every expense.",
            "I spent too much on takeaway last month.",
        ],
        assistant: &[
            "Pay off high-interest debt first, but keep a small buffer so a surprise bill doesn't go back on the card.",
            "Automating a transfer on payday makes saving the default rather than a decision.",
            "Track spending for a month before setting a budget, so the numbers are real.",
            "Cooking in batches on {D} evenings is an easy way to cut takeaway costs.",
            "A simple rule is to split income into needs, wants and savings, then adjust.",
        ],
    },
    Topic {
        user: &[
            "I'm reading a long novel and keep losing track of the characters.",
            "{P} recommended a mystery set in {C}.",
            "I read about {N} pages a night before bed.",
            "Do audiobooks count as reading?",
            "Our book club meets on {D} at {T}.",
            "The sequel comes out in {Mo}, I think.",
        ],
        assistant: &[
            "A short list of names on a bookmark helps a lot with big casts.",
            "Audiobooks absolutely count; comprehension is similar for most people.",
            "Reading a little every night adds up to a surprising number of books a year.",
            "Mysteries are a good pick for a club, there is always something to argue about.",
            "If a book isn't working after {N} pages, it's fine to put it down.",
        ],
    },
    Topic {
        user: &[
            "The bathroom tap keeps dripping.",
            "I have a leak under the sink, just a few drops a day.",
            "{P} said I need a new washer.",
            "The hardware store closes at {T} on {D}.",
            "Do I need to turn off the water at the mains?",
        ],
        assistant: &[
            "A dripping tap usually needs a new washer or cartridge, both cheap and quick to replace.",
            "Turn off the isolation valve under the sink if there is one; otherwise use the main stopcock.",
            "Take the old part with you to the shop so you get the right size.",
            "A slow leak under the sink is often a loose compression nut, so try tightening it a quarter turn.",
            "Put a towel in the basin so small parts don't go down the drain.",
        ],
    },
    Topic {
        user: &[
            "I'm learning guitar and my fingers hurt.",
            "I practise about {N} minutes a day.",
            "{P} showed me a song with only four chords.",
            "The barre chords sound muffled.",
            "There's an open mic in {C} on {D}.",
        ],
        assistant: &[
            "Sore fingertips are normal for the first weeks; calluses form if you practise a little every day.",
            "For barre chords, roll the index finger slightly so the bony edge presses the strings.",
            "Short daily sessions beat one long session at the weekend.",
            "Four-chord songs are a great way to practise changing chords in time.",
            "Play it slowly with a metronome at {N} beats per minute and speed up later.",
        ],
    },
    Topic {
        user: &[
            "I have a job interview on {D} at {T}.",
            "It's for a data analyst role in {C}.",
            "{P} offered to do a mock interview with me.",
            "How do I answer the question about my weaknesses?",
            "The salary range they gave is around {$}.",
            "They want someone who can start in {Mo}.",
        ],
        assistant: &[
            "Pick a real weakness, show what you're doing about it, and keep it short.",
            "Prepare two or three stories about problems you solved, with the result in numbers.",
            "A mock interview is the best practice there is, so take {P} up on it.",
            "Research the team's recent work so you can ask a specific question at the end.",
            "Arrive ten minutes early and bring a printed copy of your CV.",
        ],
    },
];
