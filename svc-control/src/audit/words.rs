//! Reading back the fixed words of a record (`decision`, `verdict`, `credential`, …), which the
//! writers hold as `&'static str`: each distinct word read is kept once for the life of the
//! process, up to [`MAX_WORDS`] of them (svcd writes a few dozen), so a reader following the
//! log never grows with it.

use std::{
    collections::BTreeSet,
    sync::{Mutex, PoisonError},
};

use serde::{Deserialize as _, Deserializer, de::Error as _};

/// A fixed word of a record, as its writer holds it (an alias, so that serde reads it with
/// [`word`] rather than borrowing it from the line).
pub type Word = &'static str;

/// Distinct words kept at most; a record with a word past them does not read as a record.
pub const MAX_WORDS: usize = 512;

/// The words read so far.
static WORDS: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());

/// `word`, as a `&'static str` (the same one each time it is asked for), or `None` when
/// [`MAX_WORDS`] other words are kept already.
pub fn intern(word: &str) -> Option<&'static str> {
    let mut words = WORDS.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(kept) = words.get(word) {
        return Some(kept);
    }
    if words.len() >= MAX_WORDS {
        return None;
    }
    let kept: &'static str = Box::leak(word.to_owned().into_boxed_str());
    words.insert(kept);
    Some(kept)
}

/// A fixed word of a record (serde's `deserialize_with`).
pub fn word<'de, D: Deserializer<'de>>(d: D) -> Result<&'static str, D::Error> {
    let s = std::borrow::Cow::<str>::deserialize(d)?;
    intern(&s).ok_or_else(|| D::Error::custom(format!("word {s:?}: too many distinct words")))
}

/// An optional fixed word of a record (serde's `deserialize_with`).
pub fn optional_word<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'static str>, D::Error> {
    Option::<std::borrow::Cow<str>>::deserialize(d)?
        .map(|s| {
            intern(&s)
                .ok_or_else(|| D::Error::custom(format!("word {s:?}: too many distinct words")))
        })
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_word_is_kept_once() {
        let a = intern("websocket-closed").expect("room");
        let b = intern(&String::from("websocket-closed")).expect("room");
        assert!(std::ptr::eq(a, b));
    }
}
