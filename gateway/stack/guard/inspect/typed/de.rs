//! How the typed view's fields are read from JSON: every field accepts any JSON type
//! (keeping what the tree path would read of it), and only what the view refuses is an
//! error (a choice that is not an object, a duplicate key, a `message` or `delta` that is
//! neither an object nor null).

use serde::de::value::MapAccessDeserializer;
use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::borrow::Cow;
use std::fmt;

use super::{Choice, Choices, Loose, Message, ObjectField};

/// `visit_*` for every scalar a visitor reads as the same value.
macro_rules! scalars_as {
    ($value:expr) => {
        fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok($value)
        }
    };
}

/// `visit_unit` and `visit_none` (JSON null).
macro_rules! null_as {
    ($value:expr) => {
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok($value)
        }
    };
}

fn skip_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element::<IgnoredAny>()?.is_some() {}
    Ok(())
}

fn skip_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
    Ok(())
}

impl<'de: 'a, 'a> Deserialize<'de> for Loose<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct LooseVisitor;
        impl<'de> Visitor<'de> for LooseVisitor {
            type Value = Loose<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Loose::Str(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Loose::Str(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Loose::Str(Cow::Owned(v)))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(Loose::U64(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                // serde_json gives non-negative integers to visit_u64.
                Ok(u64::try_from(v).map_or(Loose::Other, Loose::U64))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(Loose::Other)
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
                Ok(Loose::Other)
            }
            null_as!(Loose::Null);
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                skip_seq(seq).map(|()| Loose::Other)
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                skip_map(map).map(|()| Loose::Other)
            }
        }
        deserializer.deserialize_any(LooseVisitor)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for ObjectField<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ObjectVisitor<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjectVisitor<T> {
            type Value = ObjectField<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                T::deserialize(MapAccessDeserializer::new(map)).map(ObjectField::Object)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                skip_seq(seq).map(|()| ObjectField::Other)
            }
            null_as!(ObjectField::Null);
            scalars_as!(ObjectField::Other);
        }
        d.deserialize_any(ObjectVisitor(std::marker::PhantomData))
    }
}

/// `choices`: an array of objects, null, or anything else (the tree path reads no choices
/// from a non-array). A non-object element makes the whole view refuse.
impl<'de: 'a, 'a> Deserialize<'de> for Choices<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ChoicesVisitor;
        impl<'de> Visitor<'de> for ChoicesVisitor {
            type Value = Choices<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("choices")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(1));
                while let Some(choice) = seq.next_element::<ChoiceSeen<'de>>()? {
                    out.push(choice.0);
                }
                Ok(Choices::Array(out))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                skip_map(map).map(|()| Choices::Other)
            }
            null_as!(Choices::Null);
            scalars_as!(Choices::Other);
        }
        d.deserialize_any(ChoicesVisitor)
    }
}

/// The keys of a choice the checks read.
enum ChoiceKey {
    FinishReason,
    Message,
    Text,
    Delta,
    Index,
    Other,
}

impl<'de> Deserialize<'de> for ChoiceKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = ChoiceKey;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(match v {
                    "finish_reason" => ChoiceKey::FinishReason,
                    "message" => ChoiceKey::Message,
                    "text" => ChoiceKey::Text,
                    "delta" => ChoiceKey::Delta,
                    "index" => ChoiceKey::Index,
                    _ => ChoiceKey::Other,
                })
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

/// A choice: an object (anything else refuses the view), each key at most once.
struct ChoiceSeen<'a>(Choice<'a>);

impl<'de: 'a, 'a> Deserialize<'de> for ChoiceSeen<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ChoiceVisitor;
        impl<'de> Visitor<'de> for ChoiceVisitor {
            type Value = ChoiceSeen<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a choice object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut choice = Choice::default();
                let mut seen = [false; 5];
                while let Some(key) = map.next_key::<ChoiceKey>()? {
                    let slot = match key {
                        ChoiceKey::FinishReason => 0,
                        ChoiceKey::Message => 1,
                        ChoiceKey::Text => 2,
                        ChoiceKey::Delta => 3,
                        ChoiceKey::Index => 4,
                        ChoiceKey::Other => {
                            map.next_value::<IgnoredAny>()?;
                            continue;
                        }
                    };
                    // The tree keeps the last of duplicate keys; refuse rather than differ.
                    if std::mem::replace(&mut seen[slot], true) {
                        return Err(de::Error::custom("duplicate key"));
                    }
                    match slot {
                        0 => choice.finish_reason = map.next_value()?,
                        1 => choice.message = message(map.next_value()?)?,
                        2 => choice.text = map.next_value()?,
                        3 => choice.delta = message(map.next_value()?)?,
                        _ => choice.index = map.next_value()?,
                    }
                }
                Ok(ChoiceSeen(choice))
            }
        }
        d.deserialize_any(ChoiceVisitor)
    }
}

/// `message` / `delta`: an object, or null (the tree path's `get("content")` on null is
/// none, so it falls back to `text` as when the key is absent); anything else refuses.
fn message<E: de::Error>(field: ObjectField<Message<'_>>) -> Result<Option<Message<'_>>, E> {
    match field {
        ObjectField::Object(m) => Ok(Some(m)),
        ObjectField::Missing | ObjectField::Null => Ok(None),
        ObjectField::Other => Err(E::custom("a message that is not an object")),
    }
}
